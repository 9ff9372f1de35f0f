"""RunAgent on the DirectRunner with the example agent: end to end through the real effector in
rounds, in one stream, and byte for byte again on a retried round."""

from __future__ import annotations

import json
import signal

from beam_agents._protos import (
    AgentEnvelope,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.examples.support_triage import TOOLS
from beam_agents.intents.effector import INQUIRY_TOOL, Effector, Route, VerifyMode
from beam_agents.intents.identity import intent_id
from beam_agents.intents.signing import Verification, verify
from beam_agents.ops.demo import approve, demo_approver_keyring, demo_effector_keyring
from beam_agents.ops.rounds import Advance, ManualClock, run_round
from beam_agents.testing.effectors import killed_inside
from beam_agents.testing.probe import (
    CHARGED_TWICE,
    DAY,
    KEY,
    RING,
    SEQ,
    T0,
    approval,
    converse,
    event,
    export,
    message_bytes,
    run_agent,
)


def test_the_example_agent_runs_end_to_end_through_the_effector_in_rounds(tmp_path):
    """Rounds chained through export and restore; the effector executes every intent between
    them, verifying the runtime's signatures, and a scripted approver answers the approval."""
    effector = Effector(
        TOOLS,
        mode=VerifyMode.REQUIRE,
        store=tmp_path / "effector.sqlite",
        keyring=RING,
        clock=ManualClock(T0 + 500),
    )
    inputs: list = [event(T0, CHARGED_TWICE)]
    seen_intents, completions, traces = [], [], []
    for round_number in range(1, 6):
        at = T0 + round_number * 1000
        outputs = run_round(run_agent(), [*inputs, export(at, f"r{round_number}")], tmp_path)
        outputs = outputs.before(at + 1)
        assert outputs.errors == []
        completions += outputs.values("completions")
        traces += outputs.values("traces")
        if completions:
            break
        (snapshot,) = outputs.values("snapshots")
        assert snapshot.request_id == f"r{round_number}"
        answers = []
        for emitted in outputs.values("intents"):
            seen_intents.append(emitted)
            assert verify(emitted, RING) is Verification.VALID
            decided = effector(emitted.SerializeToString())
            if decided.route is Route.APPROVAL:
                answers.append(approval(at + 10, decided.approval))
            else:
                assert decided.route is Route.RESULT
                answers.append(decided.result)
                answers[-1].event_time_ms = at + 10
        inputs = [snapshot, *answers]
    assert [i.tool_name for i in seen_intents] == [
        "crm.lookup",
        "human.approval",
        "payments.refund",
    ]
    assert [i.intent_id for i in seen_intents] == [intent_id(KEY, SEQ, step) for step in range(3)]
    (summary,) = completions
    refund_id = intent_id(KEY, SEQ, 2)
    assert json.loads(summary) == {
        "amount_cents": 4200,
        "category": "refund",
        "customer_id": "c-1",
        "outcome": "refunded",
        "receipt": f"r-{refund_id}",
        "ticket_id": "t-1",
    }
    llm_calls = [t for t in traces if t.event_type == TraceEvent.LLM_CALL]
    # The model answered once; every later resume replayed the recorded answer.
    assert [t.attributes["beam_agents.replayed"] for t in llm_calls] == ["false", "true", "true"]
    assert {t.trace_id for t in traces} == {traces[0].trace_id}
    # Every span is its own, replayed calls included; only an activation's end shares its span.
    spans = [t.span_id for t in traces if t.event_type != TraceEvent.ACTIVATION_END]
    assert len(spans) == len(set(spans))


def _scripted_stream(refund_payload: bytes):
    """The same conversation in one streaming run: deterministic ids let the test script the
    answers the effector and the approver will give."""
    lookup, ask, refund = (intent_id(KEY, SEQ, step) for step in range(3))
    profile = TOOLS["crm.lookup"]({"customer_id": "c-1"}, ToolIntent())
    result = AgentEnvelope(entity_key=KEY, event_time_ms=T0 + 2000)
    result.tool_result.CopyFrom(
        ToolResult(intent_id=lookup, entity_key=KEY, seq=SEQ, status=ToolResult.OK, payload=profile)
    )
    approved = approval(T0 + 4000, ToolIntent(intent_id=ask, entity_key=KEY))
    refunded = AgentEnvelope(entity_key=KEY, event_time_ms=T0 + 6000)
    refunded.tool_result.CopyFrom(
        ToolResult(
            intent_id=refund, entity_key=KEY, seq=SEQ, status=ToolResult.OK, payload=refund_payload
        )
    )
    return [
        event(T0, CHARGED_TWICE),
        Advance(T0 + 1000),
        result,
        Advance(T0 + 3000),
        approved,
        Advance(T0 + 5000),
        refunded,
        Advance(T0 + 7000),
    ]


def test_the_example_agent_runs_end_to_end_in_one_stream(tmp_path):
    receipt = json.dumps({"amount_cents": 4200, "receipt": "r-x"}).encode()
    outputs = run_round(run_agent(), _scripted_stream(receipt), tmp_path).before(T0 + 7000)
    assert outputs.errors == []
    assert [i.tool_name for i in outputs.values("intents")] == [
        "crm.lookup",
        "human.approval",
        "payments.refund",
    ]
    (summary,) = outputs.values("completions")
    assert json.loads(summary)["outcome"] == "refunded"


def test_a_retried_round_emits_byte_identical_intents_and_traces(tmp_path):
    receipt = json.dumps({"amount_cents": 4200, "receipt": "r-x"}).encode()
    first, second = (
        run_round(run_agent(), _scripted_stream(receipt), tmp_path / str(n)).before(T0 + 7000)
        for n in range(2)
    )
    for tag in ("intents", "traces", "completions"):
        assert sorted(message_bytes(first.values(tag))) == sorted(message_bytes(second.values(tag)))
        assert first.values(tag)


def _verifying_run_agent():
    return run_agent(
        result_keyring_loader=demo_effector_keyring, approval_keyring_loader=demo_approver_keyring
    )


def test_a_refund_its_effector_lost_and_a_person_confirmed_completes_the_key(tmp_path):
    """The effector is killed inside payments.refund after the refund was paid; the intent's
    copy finds the claim dead, and the person asked answers that it took effect. The agent gets
    an answer it can use (ok, its payload unknown) and the key completes, refunded once."""
    store, ledger, clock = tmp_path / "effector.sqlite", tmp_path / "ledger", ManualClock(T0)
    effector = Effector(
        TOOLS,
        mode=VerifyMode.REQUIRE,
        store=store,
        keyring=RING,
        result_keyring=demo_effector_keyring(),
        approval_keyring=demo_approver_keyring(),
        clock=clock,
    )

    def answer(emitted: ToolIntent, at: int) -> list[AgentEnvelope]:
        data = emitted.SerializeToString(deterministic=True)
        clock.now_ms = at + 5
        if emitted.tool_name == "payments.refund":
            tools = "beam_agents.examples.support_triage:TOOLS"
            status = killed_inside(store, data, tools=tools, keyring=RING, now=at, ledger=ledger)
            assert status == -signal.SIGKILL
            clock.now_ms = emitted.expires_at_ms + DAY
            asked = effector(data)
            assert asked.route is Route.APPROVAL and asked.approval.tool_name == INQUIRY_TOOL
            reply = effector.resolve(approve(asked.approval)).result
        else:
            decided = effector(data)
            reply = approve(decided.approval) if decided.route is Route.APPROVAL else decided.result
        reply.event_time_ms = at + 10
        return [reply]

    first = event(T0, CHARGED_TWICE)
    completions, intents = converse(_verifying_run_agent, first, answer, tmp_path)
    assert [i.tool_name for i in intents] == ["crm.lookup", "human.approval", "payments.refund"]
    (summary,) = completions
    summary = json.loads(summary)
    assert (summary["outcome"], summary["receipt"]) == ("refunded", None)
    assert "ops@example.com confirmed" in summary["detail"]
    (paid,) = ledger.read_bytes().splitlines()  # by the killed process; nobody paid again
    assert json.loads(paid)["receipt"] == f"r-{intents[-1].intent_id}"
