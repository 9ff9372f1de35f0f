"""Checks that need to know what the rules at their pinned versions do, on machines without Bazel.

tools/build_files.py stands in for Bazel's loading phase; these checks stand in for the parts of
analysis and execution that failed `bazel test //...` although every label resolved (issue 17):

* toolchains: every toolchain type that a rule we use resolves must be registered by some module
  of the pinned graph (this one included). CI cannot read the rule sources, so
  tools/bazel_facts.json records, per module version, which types each module registers and
  which types each rule resolves, each fact citing tag, file and line. A proto rule without a
  fact is a finding, and so is a fact recorded for another version than MODULE.bazel pins.
* the `go` directive of every go.mod that `go_sdk.from_file` reads is a full release version:
  rules_go downloads exactly that key of go.dev's release list, which has 1.24.0, never 1.24.
* Java sources use no language feature above the level `.bazelrc` configures (rules_java's
  default when unset), and the runtimes are pinned to a JDK at least that new.
* no `args` entry is split by Bazel's Bourne-shell tokenization into several words.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from tools.build_files import Workspace

__all__ = ["FACTS", "bazelrc_flags", "check", "java_features", "tokenize"]

FACTS = Path(__file__).with_name("bazel_facts.json")
_PROTO_FLAG = "incompatible_enable_proto_toolchain_resolution"
_FULL_GO_VERSION = re.compile(r"^(go)?1\.\d+(\.\d+|rc\d+|beta\d+)$")


def bazelrc_flags(root: Path) -> dict[str, str]:
    """`--name[=value]` of .bazelrc's common/build/test lines; `--noname` as "false"."""
    flags: dict[str, str] = {}
    rc = root / ".bazelrc"
    for line in rc.read_text().splitlines() if rc.exists() else []:
        words = line.split("#", 1)[0].split()
        if not words or words[0].split(":")[0] not in ("common", "build", "test"):
            continue
        for word in words[1:]:
            name, has_value, value = word.removeprefix("--").partition("=")
            if has_value:
                flags[name] = value
            elif name.startswith("no"):
                flags[name[2:]] = "false"
            else:
                flags[name] = "true"
    return flags


def check(ws: Workspace, facts: dict | None = None) -> list[str]:
    """Every problem found in `ws` against the facts (tools/bazel_facts.json by default)."""
    facts = facts if facts is not None else json.loads(FACTS.read_text())
    flags = bazelrc_flags(ws.root)
    return [
        *_toolchains(ws, facts, flags),
        *_go_directives(ws),
        *_java_levels(ws, facts, flags),
        *_split_args(ws),
    ]


def _canonical(ws: Workspace, label: str, package: str) -> str:
    """`label` as @module//package:name, resolving the root module's apparent repository names."""
    if label.startswith("@"):
        repo, _, rest = label[1:].partition("//")
        return f"@{ws.repo_modules.get(repo, repo)}//{rest}"
    if label.startswith("//"):
        return f"@//{label[2:]}"
    return f"@//{package}:{label.lstrip(':')}"


def _where(package: str) -> str:
    return f"{package}/BUILD.bazel" if package else "BUILD.bazel"


def _toolchains(ws: Workspace, facts: dict, flags: dict[str, str]) -> list[str]:
    problems = []
    for module, fact in facts["modules"].items():
        pinned = ws.versions.get(module)
        if pinned is not None and pinned != fact["version"]:
            problems.append(
                f"MODULE.bazel: {module} is pinned at {pinned}, but tools/bazel_facts.json "
                f"records {module} {fact['version']}: re-read its sources"
            )
    registered = {r["toolchain_type"] for m in facts["modules"].values() for r in m["registers"]}
    for label in ws.toolchains:
        _, _, rest = label.partition("//")
        package, _, name = rest.partition(":")
        target = ws.packages.get(package, {}).get(name)
        if target is None or target.rule != "toolchain":
            continue  # build_files.check reports a missing one
        declared = target.attrs.get("toolchain_type")
        if declared is None:
            macro = facts["rules"].get(target.attrs.get("declared_by", ""), {})
            declared = macro.get("declares")
        if declared:
            registered.add(_canonical(ws, declared, package))
    proto_resolution = flags.get(_PROTO_FLAG) == "true"
    for package, targets in ws.packages.items():
        for target in targets.values():
            if target.origin is None:
                continue
            origin = _canonical(ws, target.origin, package)
            key = f"{origin}%{target.rule}"
            fact = facts["rules"].get(key)
            if fact is None:
                if "proto" in origin:
                    problems.append(
                        f"{_where(package)} {target.name}: no fact in tools/bazel_facts.json "
                        f"says which toolchain types {key} resolves"
                    )
                continue
            for need in fact["resolves"]:
                if need.get("with_flag") == _PROTO_FLAG and not proto_resolution:
                    continue
                if need["toolchain_type"] not in registered:
                    problems.append(
                        f"{_where(package)} {target.name}: {target.rule} resolves "
                        f"{need['toolchain_type']}, which no module of the pinned graph "
                        f"registers ({need['cite']})"
                    )
    return problems


def _go_mod_versions(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        words = line.split("//", 1)[0].split()
        if len(words) == 2 and words[0] in ("go", "toolchain"):
            found[words[0]] = words[1]
    return found


def _go_directives(ws: Workspace) -> list[str]:
    problems = []
    for _bzl, extension, tag, kwargs in ws.extension_tags:
        if extension != "go_sdk" or tag != "from_file" or "go_mod" not in kwargs:
            continue
        _, _, rest = kwargs["go_mod"].partition("//")
        package, _, name = rest.partition(":")
        path = ws.root / package / name
        versions = _go_mod_versions(path.read_text()) if path.is_file() else {}
        # rules_go takes the toolchain directive's version if there is one, else the go one.
        directive = "toolchain" if "toolchain" in versions else "go"
        version = versions.get(directive)
        if version is None or not _FULL_GO_VERSION.match(version):
            problems.append(
                f"{package}/{name}: `{directive} {version}` is not a full Go release; "
                "go_sdk.from_file downloads exactly that version (e.g. 1.24.0, not 1.24)"
            )
    return problems


# The Java release that introduced each feature as a standard (non-preview) one.
_JAVA_FEATURES = (
    ("a record", 16, re.compile(r"\brecord\s+[A-Z]\w*\s*(<[^>]*>\s*)?\(")),
    (
        "a pattern instanceof",
        16,
        re.compile(r"\binstanceof\s+(final\s+)?[\w.]+(\s*<[^>]*>)?\s+[a-z_]\w*"),
    ),
    (
        "a switch expression",
        14,
        re.compile(r"\bcase\b[^:;{}]*->|(?<!\.)\byield\b(?!\s*\()|(=|return|\()\s*switch\s*\("),
    ),
    ("a sealed type", 17, re.compile(r"\b(sealed|non-sealed)\s+(\w+\s+)*(class|interface)\b")),
)
# Text blocks first, so that their quotes are not read as strings; then comments and literals.
_LEXEMES = re.compile(
    r'"""[\s\S]*?"""|//[^\n]*|/\*[\s\S]*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\''
)


def java_features(source: str) -> list[tuple[str, int]]:
    """(feature, the Java release that made it standard) for each feature `source` uses."""
    found: list[tuple[str, int]] = []

    def blank(match: re.Match) -> str:
        lexeme = match.group()
        if lexeme.startswith('"""') and ("a text block", 15) not in found:
            found.append(("a text block", 15))
        return " " if lexeme.startswith("/") else '""'

    code = _LEXEMES.sub(blank, source)
    found.extend(
        (feature, release) for feature, release, pattern in _JAVA_FEATURES if pattern.search(code)
    )
    return found


def _jdk_release(value: str | None) -> int | None:
    match = re.fullmatch(r"(?:remotejdk_|remote_jdk)?(\d+)", value or "")
    return int(match.group(1)) if match else None


def _java_levels(ws: Workspace, facts: dict, flags: dict[str, str]) -> list[str]:
    java_targets = [
        (package, target)
        for package, targets in ws.packages.items()
        for target in targets.values()
        if target.rule in ("java_library", "java_test", "java_binary")
    ]
    if not java_targets:
        return []
    defaults = facts["defaults"]
    default = defaults["java_language_version"]
    problems = []
    levels = {}
    for prefix in ("", "tool_"):
        language = flags.get(f"{prefix}java_language_version", default["value"])
        levels[prefix] = int(language)
        runtime = flags.get(
            f"{prefix}java_runtime_version", defaults[f"{prefix}java_runtime_version"]["value"]
        )
        release = _jdk_release(runtime)
        if release is None or release < int(language):
            # local_jdk is whatever JDK the machine has: no release to compare.
            problems.append(
                f".bazelrc: --{prefix}java_runtime_version={runtime} is not a JDK of release "
                f"{language} or newer (--{prefix}java_language_version)"
            )
    level = levels[""]
    source = (
        ".bazelrc --java_language_version"
        if "java_language_version" in flags
        else (f"rules_java's default, {default['cite']}")
    )
    for package, target in java_targets:
        for src in target.attrs.get("srcs", []):
            path = ws.root / package / src
            if not src.endswith(".java") or not path.is_file():
                continue
            for feature, release in java_features(path.read_text()):
                if release > level:
                    problems.append(
                        f"{package}/{src}: {feature} needs Java {release}; {target.name} is "
                        f"compiled at Java {level} ({source})"
                    )
    return problems


def tokenize(value: str) -> list[str]:
    """Bazel's Bourne-shell tokenization of one `args` entry (ShellUtils.tokenize)."""
    tokens: list[str] = []
    token, force, quote, i = [], False, "", 0
    while i < len(value):
        c = value[i]
        if quote:
            if c == quote:
                quote = ""
            elif c == "\\" and quote == '"':
                i += 1
                if i == len(value):
                    raise ValueError("backslash at end of string")
                if value[i] not in '\\"':
                    token.append("\\")
                token.append(value[i])
            else:
                token.append(c)
        elif c in "'\"":
            quote, force = c, True
        elif c in " \t":
            if force or token:
                tokens.append("".join(token))
                token, force = [], False
        elif c == "\\":
            i += 1
            if i == len(value):
                raise ValueError("backslash at end of string")
            token.append(value[i])
        else:
            token.append(c)
        i += 1
    if quote:
        raise ValueError("unterminated quotation")
    if force or token:
        tokens.append("".join(token))
    return tokens


def _split_args(ws: Workspace) -> list[str]:
    problems = []
    for package, targets in ws.packages.items():
        for target in targets.values():
            for entry in target.attrs.get("args", []):
                try:
                    words = tokenize(entry)
                except ValueError as e:
                    problems.append(f"{_where(package)} {target.name}: args {entry!r}: {e}")
                    continue
                if len(words) != 1:
                    problems.append(
                        f"{_where(package)} {target.name}: args entry {entry!r} reaches the test "
                        f"as {words}: Bazel splits args like a shell; quote it"
                    )
    return problems
