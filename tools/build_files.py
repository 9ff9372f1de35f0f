"""Checks the Bazel files the way Bazel's loading phase would, on machines without Bazel.

Every BUILD.bazel (and MODULE.bazel) is Starlark, whose syntax is a subset of Python's, so it is
evaluated here with recorders in place of rules. A rule used without `load` fails with a
NameError exactly where Bazel would fail. The recorded targets are then checked:

* every label in srcs, deps, data, tools, main, file1/file2, runtime and genrule `$(...)`
  expansions, and every toolchain MODULE.bazel registers, resolves: to a target or an existing
  source file of an existing package, to a package of the `@pypi` hub (the lock file), or to a
  repository that MODULE.bazel declares;
* a single_version_override pins a module that is a bazel_dep, at that dep's version;
* a file or target of another package is visible to the package that uses it;
* every `*_test.py` of a package has a py_test of the same name whose first src is that file;
* every symbol loaded from one of this repository's .bzl files is defined there.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

__all__ = ["Target", "Workspace", "check", "load_workspace"]

_LABEL_ATTRS = ("srcs", "deps", "data", "tools", "main", "file1", "file2", "runtime")
_BUILTINS = ("genrule", "filegroup", "alias", "test_suite", "toolchain")
_EXPANSION = re.compile(
    r"\$\((?:location|locations|execpath|execpaths|rootpath|rootpaths) ([^)]+)\)"
)


@dataclasses.dataclass
class Target:
    package: str
    name: str
    rule: str
    attrs: dict
    visibility: list[str]
    #: The .bzl label the rule was loaded from, as written in the BUILD file (None: a builtin).
    origin: str | None = None


@dataclasses.dataclass
class Workspace:
    root: Path
    packages: dict[str, dict[str, Target]]
    exported_files: dict[str, dict[str, list[str]]]
    generated_files: dict[str, set[str]]
    repos: set[str]
    pypi: set[str]
    problems: list[str]
    #: Labels MODULE.bazel passes to register_toolchains.
    toolchains: list[str] = dataclasses.field(default_factory=list)
    #: bazel_dep module name -> version, and apparent repository name -> module name.
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    repo_modules: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Module extension tags MODULE.bazel calls: (extension .bzl label, extension, tag, kwargs).
    extension_tags: list[tuple[str, str, str, dict]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class _Module:
    repos: set[str]
    toolchains: list[str]
    versions: dict[str, str]
    repo_modules: dict[str, str]
    extension_tags: list[tuple[str, str, str, dict]]


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _evaluate_module(root: Path, problems: list[str]) -> _Module:
    """What MODULE.bazel declares: repositories, toolchains, versions, extension tags."""
    repos: set[str] = set()
    versions: dict[str, str] = {}
    repo_modules: dict[str, str] = {}
    overrides: dict[str, str] = {}
    toolchains: list[str] = []
    tags: list[tuple[str, str, str, dict]] = []

    class _Extension:
        def __init__(self, bzl, name):
            self.bzl, self.name = bzl, name

        def __getattr__(self, tag):
            return lambda **kwargs: tags.append((self.bzl, self.name, tag, kwargs))

    def bazel_dep(name, version, repo_name=None, **_):
        repos.add(repo_name or name)
        versions[name] = version
        repo_modules[repo_name or name] = name

    def use_repo(_extension, *names, **aliases):
        repos.update(names)
        repos.update(aliases)

    def single_version_override(module_name, version="", **_):
        overrides[module_name] = version

    namespace = {
        "module": lambda **_: None,
        "bazel_dep": bazel_dep,
        "use_extension": lambda bzl, name, **_: _Extension(bzl, name),
        "use_repo": use_repo,
        "register_toolchains": lambda *labels, **_: toolchains.extend(labels),
        "single_version_override": single_version_override,
    }
    try:
        exec(compile((root / "MODULE.bazel").read_text(), "MODULE.bazel", "exec"), namespace)
    except Exception as e:  # any evaluation failure is a finding, not a crash
        problems.append(f"MODULE.bazel: {type(e).__name__}: {e}")
    for module, version in overrides.items():
        if module not in versions:
            problems.append(f"MODULE.bazel: single_version_override of {module}, no bazel_dep")
        elif version and version != versions[module]:
            problems.append(
                f"MODULE.bazel: {module} is a bazel_dep at {versions[module]} but pinned at "
                f"{version}"
            )
    return _Module(repos, toolchains, versions, repo_modules, tags)


def _lock_packages(root: Path) -> set[str]:
    lock = root / "requirements_lock.txt"
    names = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", lock.read_text(), re.MULTILINE)
    return {_normalize(n) for n in names}


def _bzl_symbols(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    symbols = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            symbols.add(node.name)
        elif isinstance(node, ast.Assign):
            symbols.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return symbols


def _package_dirs(root: Path) -> list[Path]:
    bazelignore = root / ".bazelignore"
    lines = bazelignore.read_text().splitlines() if bazelignore.exists() else []
    ignored = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    found = []
    for build in sorted(root.rglob("BUILD.bazel")):
        relative = build.parent.relative_to(root)
        if relative.parts and (relative.parts[0] in ignored or relative.parts[0].startswith(".")):
            continue
        found.append(build.parent)
    return found


def load_workspace(root: Path) -> Workspace:
    """Evaluates MODULE.bazel and every BUILD.bazel under `root`."""
    problems: list[str] = []
    module = _evaluate_module(root, problems)
    ws = Workspace(
        root=root,
        packages={},
        exported_files={},
        generated_files={},
        repos=module.repos,
        pypi=_lock_packages(root),
        problems=problems,
        toolchains=module.toolchains,
        versions=module.versions,
        repo_modules=module.repo_modules,
        extension_tags=module.extension_tags,
    )
    for directory in _package_dirs(root):
        package = "" if directory == root else directory.relative_to(root).as_posix()
        _evaluate_build_file(ws, directory, package)
    return ws


def _evaluate_build_file(ws: Workspace, directory: Path, package: str) -> None:
    build = directory / "BUILD.bazel"
    where = build.relative_to(ws.root).as_posix()
    targets: dict[str, Target] = {}
    exported: dict[str, list[str]] = {}
    generated: set[str] = set()
    defaults = {"visibility": ["//visibility:private"]}
    ws.packages[package] = targets
    ws.exported_files[package] = exported
    ws.generated_files[package] = generated

    def record(rule, origin=None):
        def call(name, **attrs):
            if name in targets:
                ws.problems.append(f"{where}: two targets named {name!r}")
            visibility = attrs.pop("visibility", defaults["visibility"])
            targets[name] = Target(package, name, rule, attrs, visibility, origin)
            if rule == "genrule":
                generated.update(attrs.get("outs", []))
            if rule in ("proto_lang_toolchain", "proto_toolchain") and (
                rule == "proto_toolchain" or attrs.get("toolchain_type")
            ):
                # protobuf's macros also declare toolchain(name = name + "_toolchain"), of the
                # given type (proto_lang_toolchain) or of protobuf's own (proto_toolchain).
                toolchain = f"{name}_toolchain"
                declared = {"toolchain": f":{name}", "declared_by": f"{origin}%{rule}"}
                if attrs.get("toolchain_type"):
                    declared["toolchain_type"] = attrs["toolchain_type"]
                targets[toolchain] = Target(package, toolchain, "toolchain", declared, visibility)

        return call

    def load(label, *symbols, **aliases):
        if label.startswith("//"):
            bzl_package, _, bzl_file = label[2:].partition(":")
            bzl = ws.root / bzl_package / bzl_file
            if not bzl.is_file():
                ws.problems.append(f"{where}: load of missing file {label}")
            else:
                missing = (set(symbols) | set(aliases.values())) - _bzl_symbols(bzl)
                if missing:
                    ws.problems.append(f"{where}: {label} defines no {sorted(missing)}")
        elif label.startswith("@"):
            repo = label[1:].split("//", 1)[0]
            if repo not in ws.repos:
                ws.problems.append(f"{where}: load from undeclared repository @{repo}")
        for symbol in symbols:
            namespace[symbol] = record(symbol, label)
        for alias, symbol in aliases.items():
            namespace[alias] = record(symbol, label)

    def exports_files(files, visibility=("//visibility:public",), **_):
        for file in files:
            exported[file] = list(visibility)

    def glob(include, exclude=(), **_):
        matched = set()
        for pattern in include:
            for path in directory.glob(pattern):
                relative = path.relative_to(directory)
                inside_subpackage = any(
                    (directory / Path(*relative.parts[: i + 1]) / "BUILD.bazel").exists()
                    for i in range(len(relative.parts) - 1)
                )
                if path.is_file() and not inside_subpackage:
                    matched.add(relative.as_posix())
        for pattern in exclude:
            matched -= {m for m in matched if Path(m).match(pattern)}
        return sorted(matched)

    def package_fn(default_visibility=None, **_):
        if default_visibility is not None:
            defaults["visibility"] = default_visibility

    namespace = {
        "load": load,
        "exports_files": exports_files,
        "glob": glob,
        "package": package_fn,
        **{rule: record(rule) for rule in _BUILTINS},
    }
    try:
        exec(compile(build.read_text(), where, "exec"), namespace)
    except NameError as e:
        ws.problems.append(f"{where}: {e} (a rule used without load?)")
    except Exception as e:  # any evaluation failure is a finding, not a crash
        ws.problems.append(f"{where}: {type(e).__name__}: {e}")


def _parse_label(label: str, package: str) -> tuple[str | None, str, str]:
    """(repo or None, package, name) of `label` used in `package`."""
    repo = None
    if label.startswith("@"):
        repo, _, label = label[1:].partition("//")
        label = "//" + label
    if label.startswith("//"):
        target_package, _, name = label[2:].partition(":")
        return repo, target_package, name or target_package.rsplit("/", 1)[-1]
    return repo, package, label.lstrip(":")


def _visible(visibility: list[str], from_package: str, owner: str) -> bool:
    if from_package == owner:
        return True
    for rule in visibility:
        if rule == "//visibility:public":
            return True
        scope, _, kind = rule[2:].partition(":")
        if kind == "__pkg__" and from_package == scope:
            return True
        if kind == "__subpackages__" and (
            from_package == scope or from_package.startswith(scope + "/") or scope == ""
        ):
            return True
    return False


def _resolve(ws: Workspace, label: str, package: str, where: str) -> str | None:
    repo, target_package, name = _parse_label(label, package)
    if repo == "pypi":
        return (
            None
            if _normalize(target_package) in ws.pypi
            else f"{where}: {label}: not in requirements_lock.txt"
        )
    if repo is not None:
        return (
            None
            if repo in ws.repos
            else f"{where}: {label}: repository @{repo} is not declared in MODULE.bazel"
        )
    if target_package not in ws.packages:
        return f"{where}: {label}: no package //{target_package}"
    target = ws.packages[target_package].get(name)
    if target is not None:
        if not _visible(target.visibility, package, target_package):
            return f"{where}: {label} is not visible to //{package}"
        return None
    if name in ws.generated_files[target_package]:
        return None
    source = ws.root / target_package / name
    if not source.is_file():
        return f"{where}: {label}: no target or file {name!r} in //{target_package}"
    if target_package != package:
        exported = ws.exported_files[target_package].get(name)
        if exported is None:
            return f"{where}: {label}: file is not exported by //{target_package}"
        if not _visible(exported, package, target_package):
            return f"{where}: {label} is not visible to //{package}"
    return None


def check(ws: Workspace) -> list[str]:
    """Every problem found, each naming its BUILD file and label."""
    problems = list(ws.problems)
    for label in ws.toolchains:
        # Registration is not subject to visibility; the target must exist.
        _, package, name = _parse_label(label, "")
        if name not in ws.packages.get(package, {}):
            problems.append(f"MODULE.bazel register_toolchains: no target {label}")
    for package, targets in ws.packages.items():
        where = f"{package}/BUILD.bazel" if package else "BUILD.bazel"
        for target in targets.values():
            labels = []
            for attr in _LABEL_ATTRS:
                value = target.attrs.get(attr)
                if isinstance(value, str):
                    labels.append(value)
                elif isinstance(value, list | tuple | dict):
                    labels.extend(value)
            for attr in ("cmd", "args", "env"):
                value = target.attrs.get(attr, "")
                if isinstance(value, dict):
                    value = list(value.values())
                text = " ".join(value) if isinstance(value, list) else value
                labels.extend(_EXPANSION.findall(text))
            for label in labels:
                problem = _resolve(ws, label, package, f"{where} {target.name}")
                if problem:
                    problems.append(problem)
        directory = ws.root / package
        for test_file in sorted(directory.glob("*_test.py")):
            name = test_file.stem
            target = targets.get(name)
            if target is None or target.rule != "py_test":
                problems.append(f"{where}: {test_file.name} has no py_test named {name!r}")
            elif target.attrs.get("srcs", [None])[0] != test_file.name:
                problems.append(f"{where}: py_test {name!r} does not run {test_file.name} first")
    return problems
