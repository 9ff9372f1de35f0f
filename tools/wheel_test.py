"""The wheel installs anywhere and imports its bindings with no sys.path help.

Under pytest the wheel is built from pyproject.toml (`pip wheel`); under Bazel the test is
given //:wheel through BEAM_AGENTS_WHEEL. Either way it is installed into a fresh virtual
environment outside the source tree, next to the pinned protobuf runtime only (importing the
messages needs nothing else), and exercised from there in isolated mode (-I: no cwd, no
PYTHONPATH, no user site).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from beam_agents._protos import __all__ as MESSAGE_NAMES

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    given = os.environ.get("BEAM_AGENTS_WHEEL")
    if given:
        return Path(given).resolve()
    # setuptools builds in the source folder; a copy keeps build/ out of the work tree.
    source = tmp_path_factory.mktemp("source") / "beam_agents"
    shutil.copytree(
        REPO,
        source,
        ignore=shutil.ignore_patterns(".*", "node_modules", "build", "*.egg-info"),
    )
    out = tmp_path_factory.mktemp("dist")
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
    subprocess.run(
        [*pip_wheel, "--no-build-isolation", "--wheel-dir", str(out), str(source)], check=True
    )
    (built,) = out.glob("beam_agents-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("fresh-venv")
    venv.create(home, with_pip=True)
    python = home / "bin" / "python"
    protobuf = importlib.metadata.version("protobuf")
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True, cwd=home)
    subprocess.run(
        [*pip, "--no-deps", "--only-binary=:all:", f"protobuf=={protobuf}"], check=True, cwd=home
    )
    return python


def _run_isolated(python: Path, code: str) -> subprocess.CompletedProcess:
    """Runs `code` in the fresh environment, outside the source tree, in isolated mode."""
    return subprocess.run(
        [str(python), "-I", "-c", code],
        cwd=python.parent.parent,
        capture_output=True,
        text=True,
    )


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
        "from beam_agents.core.migration import default_registry\n"
        "assert 'site-packages' in beam_agents_migrations.__file__\n"
        "assert default_registry().missing_steps() == []\n"
        "print(beam_agents_migrations.__name__, beam_agents_migrations.STEP_MODULES)\n"
    )
    result = _run_isolated(installed, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "beam_agents_migrations ()\n"


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
    )
    assert result.returncode == 0, result.stderr
    assert 'intent_id: "i-1"' in result.stdout


def test_the_wheel_holds_the_packages_and_no_plain_migrations_package(wheel):
    files = _wheel_files(wheel)
    top_level = {name.split("/", 1)[0] for name in files}
    assert top_level == {"beam_agents", "beam_agents_migrations"}
    assert "beam_agents/_protos/beam_agents_pb2.pyi" in files
    assert "beam_agents/py.typed" in files
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
