"""The checks that need the pinned rules' behaviour catch each failure of issue 17 when broken.

Each test copies the source tree, puts back the form that failed `bazel test //...` (or a new
one of the same class), and expects exactly that finding; the real tree has none.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tools.build_files import load_workspace
from tools.pinned_rules import FACTS, check, java_features, tokenize
from tools.workspace import source_root


def test_the_repository_satisfies_the_pinned_rules():
    problems = check(load_workspace(source_root()))
    assert problems == [], "\n".join(problems)


def test_every_fact_cites_its_source():
    facts = json.loads(FACTS.read_text())
    for module, fact in facts["modules"].items():
        assert fact["version"] in fact["source"], module
        for registration in fact["registers"]:
            assert registration["cite"], (module, registration)
    for rule, fact in facts["rules"].items():
        for need in fact["resolves"]:
            assert ".bzl:" in need["cite"] or ".bzl " in need["cite"], (rule, need)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    copy = tmp_path / "tree"
    shutil.copytree(
        source_root(),
        copy,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "node_modules", ".*_cache", "__pycache__", "bazel-*", ".cache"
        ),
    )
    return copy


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, (old, path)
    path.write_text(text.replace(old, new))


def _problems(tree: Path) -> list[str]:
    return check(load_workspace(tree))


def test_a_copy_of_the_tree_passes(tree):
    assert _problems(tree) == []


def test_a_toolchain_type_no_module_registers_is_reported(tree):
    # Issue 17's analysis failure: nothing registers @rules_proto//proto:toolchain_type.
    _edit(
        tree / "MODULE.bazel",
        'register_toolchains("//polyglot/go:rules_proto_protoc_toolchain")',
        "",
    )
    (problem,) = _problems(tree)
    assert problem.startswith(
        "protos/BUILD.bazel beam_agents_go_proto: go_proto_library resolves "
        "@rules_proto//proto:toolchain_type, which no module of the pinned graph registers"
    )


def test_without_proto_toolchain_resolution_the_proto_types_are_not_needed(tree):
    _edit(
        tree / "MODULE.bazel",
        'register_toolchains("//polyglot/go:rules_proto_protoc_toolchain")',
        "",
    )
    _edit(tree / ".bazelrc", "common --incompatible_enable_proto_toolchain_resolution", "")
    assert _problems(tree) == []


def test_a_registered_toolchain_of_another_type_does_not_count(tree):
    _edit(
        tree / "polyglot/go/BUILD.bazel",
        'toolchain_type = "@rules_proto//proto:toolchain_type"',
        'toolchain_type = "@protobuf//bazel/private:proto_toolchain_type"',
    )
    (problem,) = _problems(tree)
    assert "resolves @rules_proto//proto:toolchain_type" in problem


def test_facts_of_another_version_and_unrecorded_proto_rules_are_reported(tree):
    _edit(
        tree / "MODULE.bazel",
        'name = "rules_go", version = "0.62.0"',
        'name = "rules_go", version = "0.63.0"',
    )
    _edit(
        tree / "protos/BUILD.bazel",
        '"java_proto_library")',
        '"java_proto_library")\nload("@protobuf//bazel:cc_proto_library.bzl", "cc_proto_library")',
    )
    (tree / "protos/BUILD.bazel").write_text(
        (tree / "protos/BUILD.bazel").read_text()
        + 'cc_proto_library(name = "cc", deps = [":beam_agents_proto"])\n'
    )
    assert _problems(tree) == [
        "MODULE.bazel: rules_go is pinned at 0.63.0, but tools/bazel_facts.json records rules_go "
        "0.62.0: re-read its sources",
        "protos/BUILD.bazel cc: no fact in tools/bazel_facts.json says which toolchain types "
        "@protobuf//bazel:cc_proto_library.bzl%cc_proto_library resolves",
    ]


@pytest.mark.parametrize(("version", "ok"), [("1.24", False), ("1.24.0", True), ("1.25rc1", True)])
def test_a_go_directive_must_be_a_full_release(tree, version, ok):
    _edit(tree / "polyglot/go/go.mod", "\ngo 1.24.0\n", f"\ngo {version}\n")
    expected = (
        []
        if ok
        else [
            f"polyglot/go/go.mod: `go {version}` is not a full Go release; go_sdk.from_file "
            "downloads exactly that version (e.g. 1.24.0, not 1.24)"
        ]
    )
    assert _problems(tree) == expected


def test_a_toolchain_directive_wins_over_the_go_one(tree):
    _edit(tree / "polyglot/go/go.mod", "\ngo 1.24.0\n", "\ngo 1.24.0\n\ntoolchain go1.25\n")
    assert _problems(tree) == [
        "polyglot/go/go.mod: `toolchain go1.25` is not a full Go release; go_sdk.from_file "
        "downloads exactly that version (e.g. 1.24.0, not 1.24)"
    ]


def test_java_features_above_the_configured_level_are_reported(tree):
    # Issue 17's javac failure: rules_java's default level 11 under Golden.java's record.
    rc = tree / ".bazelrc"
    _edit(rc, "build --java_language_version=17\n", "")
    _edit(rc, "build --java_runtime_version=remotejdk_17\n", "")
    problems = _problems(tree)
    assert problems == [
        ".bazelrc: --java_runtime_version=local_jdk is not a JDK of release 11 or newer "
        "(--java_language_version)",
        "polyglot/java/src/test/java/beam_agents/polyglot/Golden.java: a record needs Java 16; "
        "signatures_test is compiled at Java 11 (rules_java's default, "
        + json.loads(FACTS.read_text())["defaults"]["java_language_version"]["cite"]
        + ")",
        "polyglot/java/src/test/java/beam_agents/polyglot/GoldenTest.java: a pattern instanceof "
        "needs Java 16; signatures_test is compiled at Java 11 (rules_java's default, "
        + json.loads(FACTS.read_text())["defaults"]["java_language_version"]["cite"]
        + ")",
    ]


def test_a_runtime_older_than_the_language_level_is_reported(tree):
    _edit(
        tree / ".bazelrc",
        "--tool_java_runtime_version=remotejdk_17",
        "--tool_java_runtime_version=remotejdk_11",
    )
    _edit(tree / ".bazelrc", "--tool_java_language_version=17", "--tool_java_language_version=21")
    assert _problems(tree) == [
        ".bazelrc: --tool_java_runtime_version=remotejdk_11 is not a JDK of release 21 or newer "
        "(--tool_java_language_version)"
    ]


@pytest.mark.parametrize(
    ("source", "feature", "release"),
    [
        ("record Point(int x, int y) {}", "a record", 16),
        ("if (o instanceof String s) {}", "a pattern instanceof", 16),
        ("int y = switch (x) { case 1 -> 2; default -> 3; };", "a switch expression", 14),
        ('String s = """\n  text\n  """;', "a text block", 15),
        ("public sealed interface Shape permits Circle {}", "a sealed type", 17),
    ],
)
def test_each_java_feature_is_recognised_and_hidden_in_comments_and_strings(
    tree, source, feature, release
):
    assert java_features(source) == [(feature, release)]
    commented = "".join(f"// {line}\n" for line in source.splitlines())
    assert java_features(f"{commented}/* {source} */") == []
    if feature != "a text block":
        assert java_features(f'String s = "{source}";'.replace("\n", " ")) == []
    java = tree / "polyglot/java/src/main/java/beam_agents/polyglot/Signatures.java"
    java.write_text(java.read_text() + f"\nclass Extra {{ void f() {{ {source} }} }}\n")
    _edit(tree / ".bazelrc", "--java_language_version=17", "--java_language_version=13")
    _edit(tree / ".bazelrc", "--tool_java_language_version=17", "--tool_java_language_version=13")
    problems = [p for p in _problems(tree) if "Signatures.java" in p]
    assert problems == [
        f"polyglot/java/src/main/java/beam_agents/polyglot/Signatures.java: {feature} needs "
        f"Java {release}; signatures is compiled at Java 13 (.bazelrc --java_language_version)"
    ]


def test_older_code_and_lookalikes_are_not_features():
    assert (
        java_features("Thread.yield(); switch (x) { case 1: break; } if (o instanceof A) {}") == []
    )


def test_an_args_entry_a_shell_splits_is_reported(tree):
    # Issue 17's kafka_bus_test: "not engines" reached pytest as two words.
    _edit(tree / "beam_agents/ops/console/BUILD.bazel", '"engines",', '"not engines",')
    assert _problems(tree) == [
        "beam_agents/ops/console/BUILD.bazel kafka_test: args entry 'not engines' reaches the "
        "test as ['not', 'engines']: Bazel splits args like a shell; quote it"
    ]


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("'not engines'", ["not engines"]),
        ('"not engines"', ["not engines"]),
        ("not\\ engines", ["not engines"]),
        ("-mnot\\ engines", ["-mnot engines"]),
        ("''", [""]),
        ('"a\\"b\\c"', ['a"b\\c']),
        ("a  b", ["a", "b"]),
    ],
)
def test_the_tokenizer_follows_bazels_shell_utils(entry, words):
    assert tokenize(entry) == words


def test_an_unterminated_quote_is_reported(tree):
    _edit(tree / "beam_agents/ops/console/BUILD.bazel", '"engines",', '"\'not engines",')
    assert _problems(tree) == [
        "beam_agents/ops/console/BUILD.bazel kafka_test: "
        'args "\'not engines": unterminated quotation'
    ]
