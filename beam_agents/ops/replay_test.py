"""Replaying recorded activations offline: reproduced, diverged, or not reproducible."""

from __future__ import annotations

import pytest

from beam_agents._protos import AgentEnvelope, ToolResult
from beam_agents.examples.support_triage import TOOLS, scripted_model, ticket, triage
from beam_agents.intents.identity import intent_id
from beam_agents.ops.cli import main
from beam_agents.ops.replay import DIVERGED, REPRODUCED, UNREPRODUCIBLE, replay
from beam_agents.ops.rounds import Advance, run_round
from beam_agents.runtime import INTENTS, SNAPSHOTS, TRACES, RunAgent, agent
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION, MigrationRegistry
from beam_agents.wire.fields import join_delimited

KEY, T0 = b"c-1", 1_764_460_800_000
SEQ = T0 * 1000


def _export(at: int) -> AgentEnvelope:
    envelope = AgentEnvelope(entity_key=KEY, event_time_ms=at)
    envelope.export_request.request_id = f"at-{at}"
    return envelope


def _lookup_answer(at: int) -> AgentEnvelope:
    answer = AgentEnvelope(entity_key=KEY, event_time_ms=at)
    answer.tool_result.CopyFrom(
        ToolResult(
            intent_id=intent_id(KEY, SEQ, 0),
            entity_key=KEY,
            status=ToolResult.OK,
            payload=TOOLS["crm.lookup"]({"customer_id": "c-1"}, None),
        )
    )
    return answer


def _approval(at: int) -> AgentEnvelope:
    answer = AgentEnvelope(entity_key=KEY, event_time_ms=at)
    answer.approval.intent_id = intent_id(KEY, SEQ, 1)
    answer.approval.approved = True
    return answer


@pytest.fixture(scope="module")
def production(tmp_path_factory):
    """A recorded conversation: the state before the approval's resume, the approval, and
    what that resume emitted in production (the model called in the resume before it)."""
    workdir = tmp_path_factory.mktemp("production")
    event = AgentEnvelope(
        entity_key=KEY,
        event_time_ms=T0,
        external_event=ticket("t-1", "c-1", "charged twice, refund please"),
    )
    outputs = run_round(
        RunAgent(triage, llm_client=scripted_model()),
        [
            event,
            Advance(T0 + 1),
            _lookup_answer(T0 + 10),
            Advance(T0 + 11),
            _export(T0 + 12),
            Advance(T0 + 13),
            _approval(T0 + 20),
            Advance(T0 + 21),
        ],
        workdir,
    ).before(T0 + 21)
    (before_approval,) = outputs.values(SNAPSHOTS)
    resume = [t for t in outputs.values(TRACES) if t.start_ms == T0 + 20]
    refund = [i for i in outputs.values(INTENTS) if i.created_at_ms == T0 + 20]
    before_lookup_answer = run_round(
        RunAgent(triage, llm_client=scripted_model()),
        [event, Advance(T0 + 1), _export(T0 + 2), Advance(T0 + 3)],
        workdir,
    ).values(SNAPSHOTS)[0]
    return before_lookup_answer, before_approval, resume, refund


def test_a_resume_answered_from_the_cache_reproduces_its_recording(production):
    _, snapshot, traces, intents = production
    result = replay(
        snapshot, _approval(T0 + 20), triage, recorded_intents=intents, recorded_traces=traces
    )
    assert result.verdict == REPRODUCED, result.report
    assert [i.tool_name for i in result.intents] == ["payments.refund"]


@agent(name="examples.support_triage/v1")
def refunds_elsewhere(ctx, event: bytes) -> bytes:
    """The triage agent after a change that sends refunds to another tool."""
    wrapped = _Renaming(ctx, {"payments.refund": "billing.refund"})
    return triage.function(wrapped, event)


class _Renaming:
    def __init__(self, ctx, names):
        self._ctx, self._names = ctx, names

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def call_tool(self, name, args):
        return self._ctx.call_tool(self._names.get(name, name), args)


def test_a_changed_agent_diverges_with_a_diff(production):
    _, snapshot, traces, intents = production
    result = replay(
        snapshot,
        _approval(T0 + 20),
        refunds_elsewhere,
        recorded_intents=intents,
        recorded_traces=traces,
    )
    assert result.verdict == DIVERGED
    assert '-tool_name: "payments.refund"' in result.report
    assert '+tool_name: "billing.refund"' in result.report


def test_an_activation_that_needs_the_model_cannot_be_reproduced(production):
    snapshot, *_ = production  # before the lookup's answer: the classification is not cached
    result = replay(snapshot, _lookup_answer(T0 + 10), triage)
    assert result.verdict == UNREPRODUCIBLE and "called the model" in result.report


def test_a_digest_only_cache_entry_cannot_be_reproduced(production):
    _, snapshot, *_ = production
    digested = type(snapshot)()
    digested.CopyFrom(snapshot)
    for entry in digested.llm_cache.entries:
        entry.digest_only, entry.response = True, b""
    result = replay(digested, _approval(T0 + 20), triage)
    assert result.verdict == UNREPRODUCIBLE and "digests only" in result.report


def test_state_from_a_newer_binary_cannot_be_reproduced(production):
    _, snapshot, *_ = production
    future = type(snapshot)()
    future.CopyFrom(snapshot)
    future.memory.state_schema_version = 9
    result = replay(future, _approval(T0 + 20), triage)
    assert result.verdict == UNREPRODUCIBLE and "roll the newer binary forward" in result.report


def test_the_command_line_reports_and_exits_with_the_verdict(production, tmp_path, capsys):
    _, snapshot, traces, intents = production
    files = {
        "snapshot": snapshot.SerializeToString(),
        "envelope": _approval(T0 + 20).SerializeToString(),
        "intents": join_delimited(intents),
        "traces": join_delimited(traces),
    }
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    args = [
        str(tmp_path / "snapshot"),
        str(tmp_path / "envelope"),
        "--recorded-intents",
        str(tmp_path / "intents"),
        "--recorded-traces",
        str(tmp_path / "traces"),
    ]
    assert main(["replay", *args, "--agent", "beam_agents.examples.support_triage:triage"]) == 0
    assert "reproduced the recording" in capsys.readouterr().out
    assert main(["replay", *args, "--agent", "beam_agents.ops.replay_test:refunds_elsewhere"]) == 1
    assert main(["replay", *args, "--agent", "no.such.module:agent"]) == 2
    assert main(["replay", *args, "--agent", "json:dumps"]) == 2
    assert "is not an agent" in capsys.readouterr().err


def test_state_that_needs_a_missing_migration_step_cannot_be_reproduced(production):
    _, snapshot, *_ = production
    # The next version's binary, without the steps from this one.
    without_steps = MigrationRegistry(current_version=CURRENT_STATE_SCHEMA_VERSION + 1)
    result = replay(snapshot, _approval(T0 + 20), triage, registry=without_steps)
    assert result.verdict == UNREPRODUCIBLE and "no migration registered" in result.report


@pytest.mark.parametrize(
    "recorded", [b"\x02\xff\xff", b"\x05ab"], ids=["not an intent", "truncated"]
)
def test_a_corrupt_recording_is_a_usage_error_not_a_traceback(
    production, tmp_path, capsys, recorded
):
    _, snapshot, *_ = production
    (tmp_path / "snapshot").write_bytes(snapshot.SerializeToString())
    (tmp_path / "envelope").write_bytes(_approval(T0 + 20).SerializeToString())
    (tmp_path / "intents").write_bytes(recorded)
    args = [str(tmp_path / "snapshot"), str(tmp_path / "envelope")]
    agent_ = ["--agent", "beam_agents.examples.support_triage:triage"]
    assert main(["replay", *args, *agent_, "--recorded-intents", str(tmp_path / "intents")]) == 2
    assert "beam-agents replay: " in capsys.readouterr().err


def test_an_envelope_for_another_key_than_the_snapshots_is_a_usage_error(
    production, tmp_path, capsys
):
    """Not a divergence: the activation would run on another key's (empty) state and fail."""
    _, snapshot, *_ = production
    elsewhere = _approval(T0 + 20)
    elsewhere.entity_key = b"c-2"
    with pytest.raises(ValueError, match="the envelope is for key b'c-2'"):
        replay(snapshot, elsewhere, triage)
    (tmp_path / "snapshot").write_bytes(snapshot.SerializeToString())
    (tmp_path / "envelope").write_bytes(elsewhere.SerializeToString())
    args = [str(tmp_path / "snapshot"), str(tmp_path / "envelope")]
    assert main(["replay", *args, "--agent", "beam_agents.examples.support_triage:triage"]) == 2
    assert "give the snapshot of the key the envelope activates" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("field", "at"),
    [("event_time_ms", 2**62), ("event_time_ms", -(2**63)), ("snapshot_at_ms", -(2**63))],
)
def test_times_the_pipeline_cannot_stamp_are_a_usage_error_not_a_beam_assertion(
    production, tmp_path, capsys, field, at
):
    _, snapshot, *_ = production
    envelope = _approval(T0 + 20)
    setattr(envelope if field == "event_time_ms" else snapshot, field, at)
    (tmp_path / "snapshot").write_bytes(snapshot.SerializeToString())
    (tmp_path / "envelope").write_bytes(envelope.SerializeToString())
    args = [str(tmp_path / "snapshot"), str(tmp_path / "envelope")]
    assert main(["replay", *args, "--agent", "beam_agents.examples.support_triage:triage"]) == 2
    assert "outside the times Beam stamps" in capsys.readouterr().err
