"""Old module paths still import, as the very module at the new path, with a warning that
names the new path; nothing else is redirected."""

from __future__ import annotations

import importlib
import pickle
import subprocess
import sys
import warnings

import pytest

from beam_agents._moved import MOVED, new_path
from beam_agents.ops.loading import load_object
from tools.workspace import source_root


def _forget(monkeypatch, old: str) -> None:
    """Makes the next import of `old` (and of the modules under it) go through the finder."""
    for name in list(sys.modules):
        if name == old or name.startswith(old + "."):
            monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize("old", sorted(o for o, n in MOVED.items() if n is not None))
def test_an_old_path_imports_the_module_at_its_new_path_with_a_warning(monkeypatch, old):
    _forget(monkeypatch, old)
    with pytest.warns(DeprecationWarning, match=f"^{old} is now {MOVED[old]};") as caught:
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert module.__spec__.name == MOVED[old]  # its own spec, not the alias's
    assert len(caught) == 1


def test_the_warning_points_at_the_import_statement(monkeypatch):
    old = next(o for o, n in MOVED.items() if n is not None)
    _forget(monkeypatch, old)
    with pytest.warns(DeprecationWarning) as caught:
        exec(f"import {old}", {"__name__": "users_job"})
    assert caught[0].filename == "<string>"


def test_the_old_paths_are_gone_from_the_source_tree():
    root = source_root()
    for old in MOVED:
        path = root / old.replace(".", "/")
        # A moved package's folder may linger with its __pycache__: the finder comes first.
        assert not path.with_suffix(".py").exists() and not list(path.glob("*.py")), old


def test_a_moved_packages_modules_follow_it(monkeypatch):
    _forget(monkeypatch, "beam_agents.effector")
    with pytest.warns(DeprecationWarning):
        from beam_agents.effector import gate
    assert gate is importlib.import_module("beam_agents.intents.effector.gate")


def test_a_split_package_is_empty_and_its_modules_import_from_their_new_homes(monkeypatch):
    _forget(monkeypatch, "beam_agents.core")
    core = importlib.import_module("beam_agents.core")
    assert not [name for name in vars(core) if not name.startswith("__")]
    with pytest.warns(DeprecationWarning, match="beam_agents.core.signing is now"):
        from beam_agents.core import signing
    assert signing.sign is importlib.import_module("beam_agents.intents.signing").sign


def test_a_pickle_naming_a_class_at_its_old_path_loads_the_class_at_its_new_path(monkeypatch):
    _forget(monkeypatch, "beam_agents.effector")
    with pytest.warns(DeprecationWarning):
        loaded = pickle.loads(b"cbeam_agents.effector.spec\nToolSpec\n.")
    assert loaded is importlib.import_module("beam_agents.intents.effector.spec").ToolSpec


def test_an_object_named_module_colon_name_at_its_old_path_loads(monkeypatch):
    """A service still started with `--keyring beam_agents.demo:demo_keyring` after an upgrade."""
    _forget(monkeypatch, "beam_agents.demo")
    with pytest.warns(DeprecationWarning, match="beam_agents.demo is now beam_agents.ops.demo"):
        loaded = load_object("beam_agents.demo:demo_keyring")
    assert loaded is importlib.import_module("beam_agents.ops.demo").demo_keyring


def test_python_dash_m_runs_the_module_at_its_new_path():
    result = subprocess.run(
        [sys.executable, "-W", "default", "-m", "beam_agents.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "update-check" in result.stdout
    assert "beam_agents.cli is now beam_agents.ops.cli; run python -m beam_agents.ops.cli" in (
        result.stderr
    )


def test_paths_that_did_not_move_are_left_alone():
    assert new_path("beam_agents.runtime") is None
    assert new_path("beam_agents.core_extra") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("beam_agents.never_was")
