"""Every py_test, and every py_library's sources, import with only the declared deps on the
path, as under Bazel.

The broken forms are put back into a copy of the source tree: a test whose @pypi dep is gone,
one whose workspace library is gone, and bump_drill_test without the packages its
`pytest --collect-only` imports (issue 17).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools.build_files import load_workspace
from tools.import_coverage import check, pypi_closure, runfiles
from tools.workspace import source_root


def test_every_py_test_and_py_library_of_the_repository_imports_with_only_its_deps():
    problems = check(load_workspace(source_root()))
    assert problems == [], "\n".join(problems)


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


def _edit_block(build: Path, test: str, old: str, new: str) -> None:
    text = build.read_text()
    start = text.index(f'name = "{test}"')
    end = text.index("\n)\n", start)
    block = text[start:end]
    assert old in block, (old, block)
    build.write_text(text[:start] + block.replace(old, new, 1) + text[end:])


def _drop_dep(build: Path, test: str, dep: str) -> None:
    _edit_block(build, test, f'"{dep}",', "")


def test_a_missing_pypi_dep_is_reported(tree):
    _drop_dep(tree / "beam_agents/intents/BUILD.bazel", "identity_test", "@pypi//hypothesis")
    (problem,) = check(load_workspace(tree), ["identity_test"])
    assert problem == (
        "beam_agents/intents/BUILD.bazel identity_test: importing "
        "beam_agents/intents/identity_test.py with only its deps: "
        "ModuleNotFoundError: No module named 'hypothesis'"
    )


def test_a_missing_workspace_library_is_reported(tree):
    build = tree / "tools/BUILD.bazel"
    _edit_block(build, "check_breaking_test", 'deps = [":tools"]', 'deps = ["@pypi//protobuf"]')
    (problem,) = check(load_workspace(tree), ["check_breaking_test"])
    assert problem.startswith(
        "tools/BUILD.bazel check_breaking_test: importing tools/check_breaking_test.py with only "
        "its deps: ImportError: cannot import name 'check_breaking' from 'tools'"
    )


def test_a_library_missing_a_workspace_dep_is_reported(tree):
    """Its tests may bring the dep, but a binary built on the library alone would not."""
    _drop_dep(tree / "beam_agents/ops/BUILD.bazel", "replay", ":ops")
    (problem,) = check(load_workspace(tree), ["replay"])
    assert problem == (
        "beam_agents/ops/BUILD.bazel replay: importing beam_agents/ops/replay.py with only its "
        "deps: ModuleNotFoundError: No module named 'beam_agents.ops.preflight'"
    )


def test_a_test_collecting_every_test_needs_every_tests_packages(tree):
    build = tree / "beam_agents/state/BUILD.bazel"
    for dep in ("@pypi//langgraph", "@pypi//hypothesis", "@pypi//openai"):
        _drop_dep(build, "bump_drill_test", dep)
    (problem,) = check(load_workspace(tree), ["bump_drill_test"])
    assert problem == (
        "beam_agents/state/BUILD.bazel bump_drill_test: runs or imports every test, but its deps "
        "lack the packages other py_tests declare: @pypi//hypothesis, @pypi//langgraph, "
        "@pypi//openai"
    )


def test_the_runfiles_follow_deps_transitively_and_add_what_the_macro_adds():
    ws = load_workspace(source_root())
    files, pypi = runfiles(ws, ws.packages["tools"]["gen_golden_test"])
    assert {"tools/gen_golden_test.py", "tools/pytest_main.py", "tools/golden.py"} <= files
    assert "beam_agents/intents/signing.py" in files  # //tools -> //beam_agents/intents
    assert {"pytest", "protobuf", "rfc8785"} <= pypi
    assert "hypothesis" not in pypi


def test_a_distribution_brings_its_requirements_but_not_its_extras():
    import importlib.metadata

    from tools.build_files import _normalize

    installed = {_normalize(d.metadata["Name"]): d for d in importlib.metadata.distributions()}
    closure, missing = pypi_closure({"pytest", "no_such_package"}, installed)
    assert {"pytest", "pluggy", "iniconfig"} <= closure
    assert missing == {"no_such_package"}
    # pytest's "dev" extra (hypothesis among them) stays out.
    assert "hypothesis" not in closure
