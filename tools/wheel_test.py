"""The wheel installs anywhere and imports its bindings with no sys.path help.

Under pytest the wheel is built from pyproject.toml (`pip wheel`); under Bazel the test is
given //:wheel through BEAM_AGENTS_WHEEL. Either way it is installed into a fresh virtual
environment outside the source tree, next to the pinned protobuf and rfc8785 only (importing
the messages and the CLI needs nothing else), and exercised from there in isolation.

Bazel's Python launcher exports PYTHONPATH with every runfiles entry (the @pypi packages
among them), PYTHONSAFEPATH and RUNFILES_*. Inherited by pip in the fresh environment, they
make it see protobuf as installed already and skip it. So pip and the installed console script
run isolated (-I, and none of those variables in their environment), and the pytest run first
sets the same variables the launcher would, so that both paths prove the isolation.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from beam_agents._protos import __all__ as MESSAGE_NAMES
from tools.workspace import build_wheel, data_root

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((data_root() / "pyproject.toml").read_text())["project"]
#: The interpreter variables Bazel's launcher sets; none may reach the fresh environment.
LAUNCHER_VARIABLES = ("PYTHONPATH", "PYTHONSAFEPATH", "PYTHONHOME", "PYTHONUSERBASE")
#: Wheels installed beside ours, at the versions pinned here: what importing needs.
RUNTIME = ("protobuf", "rfc8785")


@pytest.fixture(scope="module", autouse=True)
def launcher_environment(tmp_path_factory):
    """The environment of a py_test under Bazel, reproduced when pytest runs this file."""
    with pytest.MonkeyPatch.context() as patch:
        if "RUNFILES_DIR" not in os.environ:
            patch.setenv("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
            patch.setenv("PYTHONSAFEPATH", "1")
            patch.setenv("RUNFILES_DIR", str(tmp_path_factory.mktemp("runfiles")))
        yield


def _isolated_env() -> dict[str, str]:
    return {
        name: value
        for name, value in os.environ.items()
        if name not in LAUNCHER_VARIABLES
        and not name.startswith("RUNFILES_")
        and name not in ("PYTHON_RUNFILES", "VIRTUAL_ENV")
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    given = os.environ.get("BEAM_AGENTS_WHEEL")
    if given:
        return Path(given).resolve()
    return build_wheel(REPO, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("fresh-venv")
    venv.create(home, with_pip=True)
    python = home / "bin" / "python"
    pinned = [f"{name}=={importlib.metadata.version(name)}" for name in RUNTIME]
    pip = [str(python), "-I", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for args in (["--no-deps", str(wheel)], ["--no-deps", "--only-binary=:all:", *pinned]):
        subprocess.run([*pip, *args], check=True, cwd=home, env=_isolated_env())
    return python


def _run_isolated(python: Path, code: str) -> subprocess.CompletedProcess:
    """Runs `code` in the fresh environment, outside the source tree, in isolated mode."""
    return subprocess.run(
        [str(python), "-I", "-c", code],
        cwd=python.parent.parent,
        capture_output=True,
        text=True,
        env=_isolated_env(),
    )


def test_the_launcher_environment_is_in_force():
    # What makes the isolation below necessary, under Bazel and under pytest alike.
    assert os.environ.get("PYTHONPATH") and "RUNFILES_DIR" in os.environ


def test_the_runtime_is_installed_in_the_fresh_environment_itself(installed):
    code = (
        "import google.protobuf, rfc8785, sys\n"
        "for module in (google.protobuf, rfc8785):\n"
        "    assert module.__file__.startswith(sys.prefix), module.__file__\n"
        "print(sys.prefix)\n"
    )
    result = _run_isolated(installed, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(installed.parent.parent)


def _wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {n for n in archive.namelist() if ".dist-info/" not in n}


def test_every_message_class_imports_from_the_installed_wheel(installed):
    """Scenario: Bindings are importable from the installed package."""
    names = ", ".join(MESSAGE_NAMES)
    code = (
        f"from beam_agents._protos import {names}\n"
        "import beam_agents\n"
        "assert 'site-packages' in beam_agents.__file__, beam_agents.__file__\n"
        f"for cls in ({names}):\n"
        "    assert cls.FromString(cls().SerializeToString()) == cls()\n"
        "print(beam_agents.__file__)\n"
    )
    result = _run_isolated(installed, code)
    assert result.returncode == 0, result.stderr
    assert str(REPO) not in result.stdout


def test_migration_steps_import_from_the_installed_wheel_by_the_bazel_path(installed):
    code = (
        "import beam_agents_migrations\n"
        "from beam_agents.state.migration import default_registry\n"
        "assert 'site-packages' in beam_agents_migrations.__file__\n"
        "assert default_registry().missing_steps() == []\n"
        "print(*(step.__name__ for step in beam_agents_migrations.STEP_MODULES))\n"
    )
    result = _run_isolated(installed, code)
    assert result.returncode == 0, result.stderr
    assert "beam_agents_migrations.memory_blob_v1_to_v2" in result.stdout.split()


def test_the_console_script_runs_from_the_installed_wheel(installed, tmp_path):
    from beam_agents._protos import ToolIntent

    blob = tmp_path / "intent.binpb"
    blob.write_bytes(ToolIntent(intent_id="i-1", tool_name="search").SerializeToString())
    script = installed.parent / "beam-agents"
    result = subprocess.run(
        [str(script), "inspect", str(blob), "--type", "ToolIntent"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=_isolated_env(),
    )
    assert result.returncode == 0, result.stderr
    assert 'intent_id: "i-1"' in result.stdout


def test_the_wheel_holds_the_packages_and_no_plain_migrations_package(wheel):
    files = _wheel_files(wheel)
    top_level = {name.split("/", 1)[0] for name in files}
    assert top_level == {"beam_agents", "beam_agents_migrations"}
    assert "beam_agents/_protos/beam_agents_pb2.pyi" in files
    assert "beam_agents/py.typed" in files
    assert "beam_agents/ops/state_manifest.json" in files
    assert not [name for name in files if name.endswith("_test.py")]


@pytest.mark.skipif("BEAM_AGENTS_WHEEL" in os.environ, reason="the source tree is not in a sandbox")
def test_the_wheel_holds_every_non_test_module_of_the_source_tree(wheel):
    sources = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "beam_agents").rglob("*.py")
        if not path.name.endswith("_test.py")
    } | {
        path.relative_to(REPO / "migrations").as_posix()
        for path in (REPO / "migrations" / "beam_agents_migrations").rglob("*.py")
        if not path.name.endswith("_test.py")
    }
    modules = {name for name in _wheel_files(wheel) if name.endswith(".py")}
    assert modules == sources


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name).decode()


def test_the_wheel_metadata_names_the_project_and_its_licence(wheel):
    lines = _metadata(wheel).splitlines()
    assert "Name: beam-agents" in lines
    assert {"License-Expression: Apache-2.0", "License: Apache-2.0"} & set(lines)
    requires = {
        str(Requirement(line.removeprefix("Requires-Dist: ")))
        for line in lines
        if line.startswith("Requires-Dist: ")
    }
    extras = {
        f'{line}; extra == "{extra}"'
        for extra, lines in PROJECT["optional-dependencies"].items()
        for line in lines
    }
    assert requires == {str(Requirement(line)) for line in [*PROJECT["dependencies"], *extras]}
    assert {
        line.removeprefix("Provides-Extra: ")
        for line in lines
        if line.startswith("Provides-Extra: ")
    } == set(PROJECT["optional-dependencies"])
