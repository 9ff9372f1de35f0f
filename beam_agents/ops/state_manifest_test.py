"""The stateful DoFns match the committed state manifest (what Dataflow --update relies on)."""

from __future__ import annotations

import json

from beam_agents.ops import state_manifest
from beam_agents.ops.update_check import differences
from beam_agents.runtime.run_agent import _AgentDoFn


def test_the_stateful_dofns_match_the_committed_manifest():
    committed = json.loads(state_manifest.MANIFEST.read_text())
    problems = differences(committed, state_manifest.describe())
    assert problems == [], (
        "The keyed state differs from beam_agents/ops/state_manifest.json:\n  "
        + "\n  ".join(problems)
        + "\nA pipeline running the old binary cannot be --update'd to this one without losing"
        " state. If that is intended (a drained release), run"
        " `python -m beam_agents.ops.state_manifest --write`."
    )


def test_the_manifest_is_what_beam_sees_state_specs_coders_and_timers():
    manifest = state_manifest.describe()
    activate = manifest["RunAgent/Activate/ParDo(_AgentDoFn)"]
    assert set(activate["state"]) == {"memory", "continuation", "llm_cache", "seq", "pending"}
    assert activate["state"]["continuation"]["coder"] == (
        "DeterministicProtoCoder(beam_agents.v1.Continuation)"
    )
    assert activate["timers"] == {
        "deadline": {"domain": "EVENT_TIME"},
        "ttl": {"domain": "EVENT_TIME"},
    }
    execute = manifest["ExecuteIntents/ExecuteOnce/ParDo(_ExecuteOnce)"]
    assert execute["state"]["execution"]["coder"] == (
        "DeterministicProtoCoder(beam_agents.v1.ExecutionRecord)"
    )


def test_a_renamed_dofn_class_renames_its_step_and_is_named():
    committed = state_manifest.describe()
    _AgentDoFn.__name__ = "_RenamedDoFn"  # monkeypatch cannot undo a class's __name__
    try:
        renamed = state_manifest.describe()
    finally:
        _AgentDoFn.__name__ = "_AgentDoFn"
    problems = differences(committed, renamed)
    assert problems[0].startswith("RunAgent/Activate/ParDo(_AgentDoFn) is gone:")
    assert problems[1].startswith("RunAgent/Activate/ParDo(_RenamedDoFn) is new:")


def test_the_committed_names_cover_both_composites():
    names = json.loads(state_manifest.MANIFEST.read_text())["transform_names"]
    assert "Activate/ParDo(_AgentDoFn)" in names["RunAgent"]
    assert "ExecuteOnce/ParDo(_ExecuteOnce)" in names["ExecuteIntents"]
