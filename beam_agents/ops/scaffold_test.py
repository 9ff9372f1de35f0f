"""`beam-agents new NAME`: the project it writes passes its own test, as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import beam_agents
from beam_agents.ops.cli import EXIT_OK, EXIT_USAGE, main

#: The checkout under test, first on the generated project's path (not an older install).
_SOURCES = str(Path(beam_agents.__file__).resolve().parents[1])


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([_SOURCES, os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env
    )


def test_the_new_project_passes_its_own_test(tmp_path, capsys):
    assert main(["new", "order-desk", "--dir", str(tmp_path)]) == EXIT_OK
    assert "cd " in capsys.readouterr().out
    project = tmp_path / "order-desk"
    assert sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()) == [
        "README.md",
        "launch.py",
        "order_desk/__init__.py",
        "order_desk/agent.py",
        "pyproject.toml",
        "tests/test_agent.py",
        "tests/test_launch.py",
    ]
    tested = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider"], project)
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-3000:]
    assert "4 passed" in tested.stdout
    launcher = _run(["launch.py", "--help"], project)
    assert launcher.returncode == 0 and "--bus" in launcher.stdout, launcher.stderr[-2000:]


def test_new_overwrites_nothing_and_refuses_names_that_are_no_module(tmp_path, capsys):
    (tmp_path / "taken").mkdir()
    assert main(["new", "taken", "--dir", str(tmp_path)]) == EXIT_USAGE
    assert "exists" in capsys.readouterr().err
    assert main(["new", "9lives", "--dir", str(tmp_path)]) == EXIT_USAGE
    assert main(["new", "class", "--dir", str(tmp_path)]) == EXIT_USAGE
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
