"""Old module paths still import, as the very module at the new path, with a warning that
names the new path; nothing else is redirected."""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import warnings

import pytest

from beam_agents._moved import MOVED, new_path
from beam_agents.ops.loading import load_object
from tools.workspace import source_root

#: Every module of beam_agents at 260e133, the last commit before the package was cut by concept
#: (`git ls-tree -r --name-only 260e133 beam_agents`, tests left out): users may name any of them.
BASE_MODULES = (
    "beam_agents",
    "beam_agents._protos",
    "beam_agents._protos.beam_agents_pb2",
    "beam_agents.adapters",
    "beam_agents.adapters.langgraph",
    "beam_agents.beam_support",
    "beam_agents.cli",
    "beam_agents.console",
    "beam_agents.console.app",
    "beam_agents.console.auth",
    "beam_agents.console.bus",
    "beam_agents.console.config",
    "beam_agents.console.db",
    "beam_agents.console.inbox",
    "beam_agents.console.observed",
    "beam_agents.console.service",
    "beam_agents.console.timeline",
    "beam_agents.core",
    "beam_agents.core.intent",
    "beam_agents.core.migration",
    "beam_agents.core.signing",
    "beam_agents.core.wire",
    "beam_agents.decoding",
    "beam_agents.demo",
    "beam_agents.demo.__main__",
    "beam_agents.demo.account",
    "beam_agents.demo.bus",
    "beam_agents.demo.command",
    "beam_agents.demo.local",
    "beam_agents.demo.parts",
    "beam_agents.effector",
    "beam_agents.effector.gate",
    "beam_agents.effector.spec",
    "beam_agents.effector.stores",
    "beam_agents.effector.transform",
    "beam_agents.errors",
    "beam_agents.examples",
    "beam_agents.examples.support_triage",
    "beam_agents.flink",
    "beam_agents.kafka_bus",
    "beam_agents.kafka_bus.loop",
    "beam_agents.kafka_bus.records",
    "beam_agents.kafka_bus.service",
    "beam_agents.kafka_bus.topics",
    "beam_agents.llm",
    "beam_agents.llm.anthropic_messages",
    "beam_agents.llm.gemini",
    "beam_agents.llm.openai_chat",
    "beam_agents.llm.resilience",
    "beam_agents.loading",
    "beam_agents.mcp_tools",
    "beam_agents.preflight",
    "beam_agents.processes",
    "beam_agents.replay",
    "beam_agents.rounds",
    "beam_agents.runtime",
    "beam_agents.runtime.budget",
    "beam_agents.runtime.config",
    "beam_agents.runtime.context",
    "beam_agents.runtime.dead_letters",
    "beam_agents.runtime.function_agent",
    "beam_agents.runtime.machine",
    "beam_agents.runtime.machine_activations",
    "beam_agents.runtime.machine_answers",
    "beam_agents.runtime.machine_budgets",
    "beam_agents.runtime.machine_deadlines",
    "beam_agents.runtime.machine_events",
    "beam_agents.runtime.machine_state",
    "beam_agents.runtime.memory",
    "beam_agents.runtime.react",
    "beam_agents.runtime.run_agent",
    "beam_agents.runtime.tool_calling",
    "beam_agents.runtime.trace_ids",
    "beam_agents.state_manifest",
    "beam_agents.telemetry",
    "beam_agents.testing",
    "beam_agents.testing.broker",
    "beam_agents.testing.chaos",
    "beam_agents.testing.console",
    "beam_agents.testing.console_loop",
    "beam_agents.testing.effectors",
    "beam_agents.testing.engines",
    "beam_agents.testing.flink_loop",
    "beam_agents.testing.llm_servers",
    "beam_agents.testing.local_http",
    "beam_agents.testing.machine_harness",
    "beam_agents.testing.mcp_servers",
    "beam_agents.testing.probe",
    "beam_agents.testing.samples",
    "beam_agents.testing.schema_variants",
    "beam_agents.testing.simulation",
    "beam_agents.testing.simulation_agents",
    "beam_agents.testing.simulation_checks",
    "beam_agents.testing.simulation_state",
    "beam_agents.testing.simulation_world",
    "beam_agents.testing.synthetic_v2",
    "beam_agents.testing.triage_loop",
    "beam_agents.update_check",
)


#: Test support renamed without an alias (nothing outside beam_agents.testing may name it, so
#: _moved cannot redirect it): each old name and the module that took its place.
RENAMED_TEST_SUPPORT = {
    # A synthetic version 2 was the next binary's until 2 became current; it is CURRENT + 1 now.
    "beam_agents.testing.synthetic_v2": "beam_agents.testing.synthetic_next",
}


def _in_source_tree(module: str) -> bool:
    path = source_root().joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


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


def test_a_warning_for_a_module_imported_by_name_points_at_who_named_it(monkeypatch):
    """Not at importlib's frames, or the default filters (which show a DeprecationWarning only
    where __main__ caused it) would hide it from the script that asked for the old path."""
    from beam_agents.ops import loading

    _forget(monkeypatch, "beam_agents.demo")
    _forget(monkeypatch, "beam_agents.flink")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        load_object("beam_agents.demo:demo_keyring")
        importlib.import_module("beam_agents.flink")
    assert [(w.category, w.filename) for w in caught] == [
        (DeprecationWarning, loading.__file__),
        (DeprecationWarning, __file__),
    ]


def test_the_default_filters_show_a_scripts_import_by_name_of_an_old_path():
    script = "import importlib\nimportlib.import_module('beam_agents.decoding')"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env
    )
    assert result.returncode == 0, result.stderr
    assert "<string>:2: DeprecationWarning: beam_agents.decoding is now" in result.stderr


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


def test_every_module_of_the_layout_before_still_exists_or_has_moved():
    lost = []
    for old in BASE_MODULES:
        new = new_path(old) or RENAMED_TEST_SUPPORT.get(old)
        if new is None and old not in MOVED and not _in_source_tree(old):
            lost.append(f"{old}: gone, and not in MOVED")
        elif new is not None and not _in_source_tree(new):
            lost.append(f"{old}: moved to {new}, which is not there")
    assert lost == []


def test_a_pickled_memory_naming_its_old_module_loads(monkeypatch):
    """Memory and ReplayCache lived in beam_agents.runtime.memory; a pickle made there loads."""
    from beam_agents.state.memory import Memory, ReplayCache

    memory = Memory(budget_bytes=64)
    memory.put("k", b"v")
    old = pickle.dumps(memory, protocol=0).replace(
        b"beam_agents.state.memory\n", b"beam_agents.runtime.memory\n"
    )
    assert b"beam_agents.runtime.memory\nMemory\n" in old
    _forget(monkeypatch, "beam_agents.runtime.memory")
    with pytest.warns(DeprecationWarning, match="beam_agents.runtime.memory is now"):
        loaded = pickle.loads(old)
    assert type(loaded) is Memory and loaded.get("k") == b"v"
    assert pickle.loads(b"cbeam_agents.runtime.memory\nReplayCache\n.") is ReplayCache


def test_the_runtime_still_exports_memory_and_the_replay_cache():
    import beam_agents.runtime as runtime
    from beam_agents.state.memory import Memory, ReplayCache

    assert (runtime.Memory, runtime.ReplayCache) == (Memory, ReplayCache)
