"""The Bazel files hold together: labels resolve, files exist, every test file has a py_test.

Bazel cannot run on these machines, so tools/build_files.py stands in for its loading phase.
The fixture workspaces below prove each kind of defect is caught.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tools.build_files import check, load_workspace
from tools.workspace import source_root


def test_the_repository_bazel_files_have_no_problems():
    problems = check(load_workspace(source_root()))
    assert problems == [], "\n".join(problems)


def test_every_py_test_is_the_pytest_wrapper():
    """A test file holds functions for pytest and no __main__ block: rules_python's own py_test
    would run it as a script, which defines them, runs none and passes. //tools:pytest.bzl's
    py_test runs it under pytest."""
    root = source_root()
    direct = [
        str(build.relative_to(root))
        for build in root.glob("**/BUILD.bazel")
        if not any(part.startswith(".") or part == "node_modules" for part in build.parts)
        and "python:py_test.bzl" in build.read_text()
    ]
    assert direct == []


def test_every_python_package_has_a_build_file():
    root = source_root()
    for init in root.glob("**/__init__.py"):
        if any(part.startswith(".") or part == "node_modules" for part in init.parts):
            continue
        assert (
            init.parent / "BUILD.bazel"
        ).exists() or init.parent.name == "beam_agents_migrations", init


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    files = {
        "MODULE.bazel": """
            module(name = "demo")
            bazel_dep(name = "rules_python", version = "1.6.3")
            pip = use_extension("@rules_python//python/extensions:pip.bzl", "pip")
            use_repo(pip, "pypi")
        """,
        "requirements_lock.txt": "protobuf==6.33.6 \\\n    --hash=sha256:00\n",
        ".bazelignore": "node_modules\n",
        "lib/BUILD.bazel": """
            load("@rules_python//python:py_library.bzl", "py_library")
            load("@rules_python//python:py_test.bzl", "py_test")
            py_library(name = "lib", srcs = ["lib.py"], deps = ["@pypi//protobuf"],
                       visibility = ["//app:__pkg__"])
            py_test(name = "lib_test", srcs = ["lib_test.py"], deps = [":lib"])
        """,
        "lib/lib.py": "",
        "lib/lib_test.py": "",
        "app/BUILD.bazel": """
            load("@rules_python//python:py_binary.bzl", "py_binary")
            py_binary(name = "app", srcs = ["app.py"], deps = ["//lib"])
        """,
        "app/app.py": "",
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_a_clean_fixture_workspace_passes(workspace):
    assert check(load_workspace(workspace)) == []


def test_a_test_file_without_py_test_is_reported(workspace):
    (workspace / "lib" / "extra_test.py").write_text("")
    assert check(load_workspace(workspace)) == [
        "lib/BUILD.bazel: extra_test.py has no py_test named 'extra_test'"
    ]


def test_a_missing_src_file_is_reported(workspace):
    (workspace / "app" / "app.py").unlink()
    assert check(load_workspace(workspace)) == [
        "app/BUILD.bazel app: app.py: no target or file 'app.py' in //app"
    ]


def test_an_unresolved_label_is_reported(workspace):
    _edit(workspace / "app" / "BUILD.bazel", '"//lib"', '"//lib:nope", "//missing", "@pypi//numpy"')
    problems = check(load_workspace(workspace))
    assert "app/BUILD.bazel app: //lib:nope: no target or file 'nope' in //lib" in problems
    assert "app/BUILD.bazel app: //missing: no package //missing" in problems
    assert "app/BUILD.bazel app: @pypi//numpy: not in requirements_lock.txt" in problems


def test_a_rule_used_without_load_is_reported(workspace):
    _edit(
        workspace / "app" / "BUILD.bazel",
        'load("@rules_python//python:py_binary.bzl", "py_binary")\n',
        "",
    )
    (problem,) = check(load_workspace(workspace))
    assert problem.startswith("app/BUILD.bazel: name 'py_binary' is not defined")


def test_an_invisible_dependency_is_reported(workspace):
    _edit(workspace / "lib" / "BUILD.bazel", '"//app:__pkg__"', '"//other:__pkg__"')
    assert check(load_workspace(workspace)) == [
        "app/BUILD.bazel app: //lib is not visible to //app"
    ]


def test_an_undeclared_repository_is_reported(workspace):
    _edit(workspace / "lib" / "BUILD.bazel", '":lib"', '":lib", "@protobuf//:protobuf_python"')
    assert check(load_workspace(workspace)) == [
        "lib/BUILD.bazel lib_test: @protobuf//:protobuf_python: "
        "repository @protobuf is not declared in MODULE.bazel"
    ]


def test_an_override_of_a_module_that_is_no_dep_or_at_another_version_is_reported(workspace):
    module = workspace / "MODULE.bazel"
    module.write_text(
        module.read_text()
        + 'single_version_override(module_name = "rules_python", version = "1.6.3")\n'
    )
    assert check(load_workspace(workspace)) == []
    module.write_text(
        module.read_text()
        + 'single_version_override(module_name = "rules_python", version = "1.7.0")\n'
        + 'single_version_override(module_name = "protobuf", version = "31.1")\n'
    )
    assert check(load_workspace(workspace)) == [
        "MODULE.bazel: rules_python is a bazel_dep at 1.6.3 but pinned at 1.7.0",
        "MODULE.bazel: single_version_override of protobuf, no bazel_dep",
    ]


def test_a_registered_toolchain_must_exist(workspace):
    module = workspace / "MODULE.bazel"
    module.write_text(module.read_text() + 'register_toolchains("//lib:py_toolchain")\n')
    assert check(load_workspace(workspace)) == [
        "MODULE.bazel register_toolchains: no target //lib:py_toolchain"
    ]
    build = workspace / "lib" / "BUILD.bazel"
    build.write_text(
        'load("@rules_python//python:proto.bzl", "proto_lang_toolchain")\n'
        + build.read_text()
        + 'proto_lang_toolchain(name = "py", runtime = "@pypi//protobuf", toolchain_type = "t")\n'
    )
    module.write_text(module.read_text().replace("//lib:py_toolchain", "//lib:py_toolchain"))
    assert check(load_workspace(workspace)) == []


def test_the_pip_and_bazel_wheels_declare_the_same_project():
    import tomllib

    project = tomllib.loads((source_root() / "pyproject.toml").read_text())["project"]
    (wheel,) = [
        t for t in load_workspace(source_root()).packages[""].values() if t.rule == "py_wheel"
    ]
    assert wheel.attrs["distribution"] == project["name"]
    assert wheel.attrs["version"] == project["version"]
    assert wheel.attrs["license"] == project["license"]
    assert sorted(wheel.attrs["requires"]) == sorted(project["dependencies"])
    assert wheel.attrs["extra_requires"] == project["optional-dependencies"]
    assert wheel.attrs["python_requires"] == project["requires-python"]
