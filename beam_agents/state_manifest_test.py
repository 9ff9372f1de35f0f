"""The stateful DoFns match the committed state manifest (what Dataflow --update relies on)."""

from __future__ import annotations

import copy
import json

from apache_beam.coders import BytesCoder
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from beam_agents import state_manifest
from beam_agents.runtime.run_agent import _AgentDoFn


def test_the_stateful_dofns_match_the_committed_manifest():
    committed = json.loads(state_manifest.MANIFEST.read_text())
    problems = state_manifest.differences(committed, state_manifest.describe())
    assert problems == [], (
        "The keyed state differs from beam_agents/state_manifest.json:\n  "
        + "\n  ".join(problems)
        + "\nA pipeline running the old binary cannot be --update'd to this one without losing"
        " state. If that is intended (a drained release), run"
        " `python -m beam_agents.state_manifest --write`."
    )


def test_a_renamed_spec_a_swapped_coder_or_another_timer_domain_is_named(monkeypatch):
    committed = state_manifest.describe()
    monkeypatch.setattr(_AgentDoFn, "MEMORY", ReadModifyWriteStateSpec("mem", BytesCoder()))
    renamed = state_manifest.describe()
    problems = state_manifest.differences(committed, renamed)
    assert [p.split(":")[0] for p in problems] == [
        "RunAgent/Activate state 'mem' added",
        "RunAgent/Activate state 'memory' removed",
    ]
    swapped = copy.deepcopy(committed)
    swapped["RunAgent/Activate"]["state"]["seq"]["coder"] = "apache_beam.coders.coders.BytesCoder"
    swapped["RunAgent/Activate"]["timers"]["ttl"]["domain"] = "REAL_TIME"
    problems = state_manifest.differences(committed, swapped)
    assert "state 'seq' changed" in problems[0] and "lost or misread on --update" in problems[0]
    assert "timers 'ttl' changed" in problems[1]


def test_a_renamed_dofn_class_renames_its_step_and_is_named():
    committed = state_manifest.describe()
    _AgentDoFn.__name__ = "_RenamedDoFn"  # monkeypatch cannot undo a class's __name__
    try:
        renamed = state_manifest.describe()
    finally:
        _AgentDoFn.__name__ = "_AgentDoFn"
    problems = state_manifest.differences(committed, renamed)
    assert problems[0].startswith("RunAgent/Activate/ParDo(_AgentDoFn) is gone:")
    assert problems[1].startswith("RunAgent/Activate/ParDo(_RenamedDoFn) is new:")


def test_the_committed_names_cover_both_composites():
    names = json.loads(state_manifest.MANIFEST.read_text())["transform_names"]
    assert "Activate/ParDo(_AgentDoFn)" in names["RunAgent"]
    assert "ExecuteOnce/ParDo(_ExecuteOnce)" in names["ExecuteIntents"]
