"""RunAgent on the DirectRunner: the example agent end to end with the real effector, and the
runtime's guarantees, each proven on real pipelines and real protobuf bytes."""

from __future__ import annotations

import json
import re

import apache_beam as beam
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

from beam_agents._protos import (
    AgentEnvelope,
    Continuation,
    MemoryBlob,
    StateSnapshot,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.core.intent import intent_id
from beam_agents.core.migration import MigrationRegistry
from beam_agents.core.signing import Keyring, Verification, verify
from beam_agents.decoding import message_type
from beam_agents.effector import Effector, Route, VerifyMode
from beam_agents.errors import LlmCallError
from beam_agents.examples.support_triage import TOOLS, scripted_model, ticket, triage
from beam_agents.rounds import Advance, ManualClock, run_round
from beam_agents.runtime import (
    AtDeadline,
    DeadlinePolicy,
    LlmResponse,
    RunAgent,
    RuntimeConfig,
    ScriptedLlmClient,
)
from beam_agents.testing.synthetic_v2 import registry_v2
from tools import golden
from tools.workspace import data_root

KEY = b"c-1"
T0 = 1_764_460_800_000
SEQ = T0 * 1000  # a fresh key's first seq: its first event time in microsecond steps
RING = Keyring({"runtime-2026-11": bytes(range(32))}, active="runtime-2026-11")
CHARGED_TWICE = ticket("t-1", "c-1", "I was charged twice, please refund me")


def load_ring() -> Keyring:
    return RING


def run_agent(**overrides) -> RunAgent:
    return RunAgent(triage, llm_client=scripted_model(), keyring_loader=load_ring, **overrides)


def event(at: int, data: bytes, key: bytes = KEY) -> AgentEnvelope:
    return AgentEnvelope(entity_key=key, event_time_ms=at, external_event=data)


def export(at: int, request_id: str, key: bytes = KEY) -> AgentEnvelope:
    envelope = AgentEnvelope(entity_key=key, event_time_ms=at)
    envelope.export_request.request_id = request_id
    return envelope


def approval(at: int, approved_intent: ToolIntent, approved: bool = True) -> AgentEnvelope:
    envelope = AgentEnvelope(entity_key=approved_intent.entity_key, event_time_ms=at)
    envelope.approval.intent_id = approved_intent.intent_id
    envelope.approval.approved = approved
    envelope.approval.approver = "ops@example.com"
    envelope.approval.decided_at_ms = at
    return envelope


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
        assert sorted(_bytes(first.values(tag))) == sorted(_bytes(second.values(tag)))
        assert first.values(tag)


def _bytes(values) -> list[bytes]:
    return [v if isinstance(v, bytes) else v.SerializeToString(deterministic=True) for v in values]


# A probe agent: the low-level contract, driven by JSON commands in its event -----------------


class Probe:
    """start: puts memory, asks the model, calls tools / asks approval (then suspends), or
    completes; resume: completes with the answers it got. `raise_at` fails on purpose."""

    adapter = "tests.probe/v1"

    def start(self, ctx, event: bytes):
        command = json.loads(event)
        self._maybe_raise(command, "start")
        for key, value in command.get("put", {}).items():
            ctx.memory.put(key, value.encode())
        self._maybe_raise(command, "after_put")
        if "llm" in command:
            ctx.llm([{"role": "user", "content": command["llm"]}], model="probe-model")
        self._maybe_raise(command, "after_llm")
        if command.get("calls"):
            ctx.call_tools([(name, {"n": i}) for i, name in enumerate(command["calls"])])
        if command.get("approval"):
            ctx.request_approval("ok?")
        self._maybe_raise(command, "after_call")
        if ctx.intents:
            deadline = command.get("deadline_ms")
            return ctx.suspend(snapshot=event, deadline_ms=deadline)
        if command.get("return") == "not bytes":
            return ctx.complete("a str")
        if command.get("return") == "nothing":
            return None
        return ctx.complete(b"done")

    def resume(self, ctx, answers):
        command = json.loads(ctx.resume_of.snapshot)
        self._maybe_raise(command, "resume")
        if "llm_on_resume" in command:
            ctx.llm([{"role": "user", "content": command["llm_on_resume"]}], model="probe-model")
        summary = [
            (
                a.intent.tool_name,
                ToolResult.Status.Name(a.result.status)
                if a.result
                else ("approved" if a.ok else "declined"),
            )
            for a in answers
        ]
        summary.append(("escalations", ctx.resume_of.escalations))
        return ctx.complete(json.dumps(summary).encode())

    @staticmethod
    def _maybe_raise(command, point):
        if command.get("raise_at") == point:
            raise RuntimeError(f"raised at {point}")


def probe(config=None, registry=None) -> RunAgent:
    return RunAgent(
        Probe(), llm_client=scripted_llm(), config=config or RuntimeConfig(), registry=registry
    )


def scripted_llm():
    return ScriptedLlmClient(lambda request: f"echo {request.messages[-1]['content']}")


def command(at: int, key: bytes = KEY, **fields) -> AgentEnvelope:
    return event(at, json.dumps(fields).encode(), key)


def result(at: int, answered: str, status=ToolResult.OK, key: bytes = KEY) -> AgentEnvelope:
    envelope = AgentEnvelope(entity_key=key, event_time_ms=at)
    envelope.tool_result.CopyFrom(ToolResult(intent_id=answered, entity_key=key, status=status))
    return envelope


def test_answers_resume_the_agent_once_all_have_come_in_intent_order(tmp_path):
    first, second = intent_id(KEY, SEQ, 0, 0), intent_id(KEY, SEQ, 0, 1)
    outputs = run_round(
        probe(),
        [
            command(T0, calls=["a.tool", "b.tool"]),
            Advance(T0 + 1),
            result(T0 + 10, second, ToolResult.ERROR),
            Advance(T0 + 11),
            result(T0 + 12, second),
            Advance(T0 + 13),  # a second answer for the same intent
            result(T0 + 20, first),
            Advance(T0 + 21),
        ],
        tmp_path,
    ).before(T0 + 21)
    assert [i.intent_id for i in outputs.values("intents")] == [first, second]
    # A second, different answer for an answered intent is refused, and carried by its letter.
    (refused,) = outputs.values("errors")
    assert refused.reason == "unknown_intent"
    assert refused.input.tool_result.intent_id == second and refused.input.event_time_ms == T0 + 12
    (done,) = outputs.values("completions")
    assert json.loads(done) == [["a.tool", "OK"], ["b.tool", "ERROR"], ["escalations", 0]]


FAR = T0 + 10**8


@pytest.mark.parametrize(
    ("answer", "reason", "deadline"),
    [
        (lambda: result(T0 + 10, "no-such-intent"), "unknown_intent", FAR),
        (lambda: result(T0 + 10, intent_id(KEY, SEQ, 0), key=b"c-2"), "no_suspension", FAR),
        (lambda: result(T0 + 10, intent_id(KEY, SEQ, 0)), "after_deadline", T0 + 5),
        (
            lambda: approval(T0 + 10, ToolIntent(intent_id=intent_id(KEY, SEQ, 0), entity_key=KEY)),
            "answer_mismatch",
            FAR,
        ),
    ],
    ids=[
        "unknown intent",
        "no suspension",
        "after deadline",
        "approval for a tool",
    ],
)
def test_refused_answers_are_dead_letters_and_change_nothing(tmp_path, answer, reason, deadline):
    # The export comes before the watermark reaches any deadline.
    outputs = run_round(
        probe(),
        [
            command(T0, calls=["a.tool"], deadline_ms=deadline),
            Advance(T0 + 1),
            answer(),
            export(T0 + 12, "after"),
            Advance(T0 + 13),
        ],
        tmp_path,
    )
    refused = [(e.reason, e.entity_key) for e in outputs.values("errors")]
    # Once the watermark passed a deadline, a runner may fire its timer before or after a later
    # element: an answer past the deadline is refused as late, or as for no suspension.
    allowed = {reason, "no_suspension"} if reason == "after_deadline" else {reason}
    assert refused[0][0] in allowed and refused[0][1] == answer().entity_key
    # Nothing refused is dropped unseen: the dead letter carries the answer.
    assert outputs.values("errors")[0].input == answer()
    (snapshot,) = outputs.values("snapshots")
    assert list(snapshot.continuation.answers) == []  # the refused answer was never recorded
    completed = [json.loads(done) for done in outputs.before(T0 + 13).values("completions")]
    if deadline < T0 + 13:  # only the deadline resumed it: the refused answer never counted
        assert completed == [[["a.tool", "EXPIRED"], ["escalations", 0]]]
    else:
        assert snapshot.continuation.pending_intent_ids == [intent_id(KEY, SEQ, 0)]
        assert completed == []


def test_an_answer_whose_pending_intent_is_missing_from_state_is_refused(tmp_path):
    snapshot = _suspended_snapshot(FAR)
    del snapshot.pending[:]  # a snapshot whose pending intents were not all exported
    outputs = run_round(
        probe(), [snapshot, Advance(T0 + 1), result(T0 + 2, "i-0"), Advance(T0 + 3)], tmp_path
    ).before(T0 + 3)
    (error,) = outputs.values("errors")
    assert error.reason == "unknown_intent" and "missing" in error.detail


def test_an_envelope_or_snapshot_with_no_entity_key_is_a_dead_letter(tmp_path):
    outputs = run_round(
        probe(),
        [command(T0, key=b"", put={"a": "1"}), StateSnapshot(snapshot_at_ms=T0), Advance(T0 + 1)],
        tmp_path,
    )
    assert sorted(e.reason for e in outputs.values("errors")) == ["no_entity_key"] * 2
    assert outputs.completions == []


def test_a_result_naming_another_entity_is_refused(tmp_path):
    wrong = result(T0 + 10, intent_id(KEY, SEQ, 0))
    wrong.tool_result.entity_key = b"c-2"
    outputs = run_round(
        probe(), [command(T0, calls=["a.tool"]), Advance(T0 + 1), wrong, Advance(T0 + 11)], tmp_path
    ).before(T0 + 11)
    (error,) = outputs.values("errors")
    assert error.reason == "answer_mismatch" and "another entity" in error.detail


def test_escalation_asks_a_human_and_extends_the_deadline_up_to_its_maximum(tmp_path):
    policy = DeadlinePolicy(AtDeadline.ESCALATE, max_escalations=1, extension_ms=100)
    outputs = run_round(
        probe(RuntimeConfig(deadline_policy=policy)),
        [
            command(T0, calls=["a.tool"], deadline_ms=T0 + 50),
            Advance(T0 + 60),
            export(T0 + 61, "escalated"),
            Advance(T0 + 1000),
        ],
        tmp_path,
    ).before(T0 + 1000)
    tool, escalation = outputs.values("intents")
    assert escalation.kind == ToolIntent.APPROVAL and escalation.step_index == 1
    assert json.loads(escalation.args_json)["unanswered"] == [tool.intent_id]
    (snapshot,) = outputs.values("snapshots")
    assert snapshot.continuation.escalations == 1
    assert snapshot.continuation.deadline_ms == T0 + 50 + 100
    assert list(snapshot.continuation.pending_intent_ids) == [tool.intent_id, escalation.intent_id]
    assert escalation.tool_name == "beam_agents.escalation"
    # The second deadline is past the maximum: the agent resumes with its own intent expired
    # (escalations are the runtime's, never the agent's answers).
    (done,) = outputs.values("completions")
    assert json.loads(done) == [["a.tool", "EXPIRED"], ["escalations", 1]]


ESCALATE = RuntimeConfig(
    deadline_policy=DeadlinePolicy(AtDeadline.ESCALATE, max_escalations=3, extension_ms=100)
)


def _escalation(at: int, approved: bool) -> AgentEnvelope:
    asked = ToolIntent(intent_id=intent_id(KEY, SEQ, 1), entity_key=KEY)
    return approval(at, asked, approved)


def test_a_declined_escalation_resumes_the_agent_at_once_without_the_answer(tmp_path):
    outputs = run_round(
        probe(ESCALATE),
        [
            command(T0, calls=["a.tool"], deadline_ms=T0 + 50),
            Advance(T0 + 60),
            _escalation(T0 + 70, approved=False),
            Advance(T0 + 80),
        ],
        tmp_path,
    ).before(T0 + 80)
    (done,) = outputs.values("completions")
    assert json.loads(done) == [["a.tool", "EXPIRED"], ["escalations", 1]]


def test_an_approved_escalation_keeps_waiting_for_the_answer(tmp_path):
    outputs = run_round(
        probe(ESCALATE),
        [
            command(T0, calls=["a.tool"], deadline_ms=T0 + 50),
            Advance(T0 + 60),
            _escalation(T0 + 70, approved=True),
            Advance(T0 + 80),
            result(T0 + 90, intent_id(KEY, SEQ, 0)),
            Advance(T0 + 100),
        ],
        tmp_path,
    ).before(T0 + 100)
    (done,) = outputs.values("completions")
    assert json.loads(done) == [["a.tool", "OK"], ["escalations", 1]]


def test_a_function_agent_resumes_across_an_escalation(tmp_path):
    lookup = intent_id(KEY, SEQ, 0)
    profile = TOOLS["crm.lookup"]({"customer_id": "c-1"}, ToolIntent())
    answer = result(T0 + 90, lookup)
    answer.tool_result.payload = profile
    outputs = run_round(
        run_agent(config=ESCALATE),
        [
            event(T0, ticket("t-2", "c-1", "how do I export my data?")),
            Advance(T0 + 1),
            Advance(T0 + DAY + 10),  # the default deadline passes: escalated
            _escalation(T0 + DAY + 20, approved=True),
            # Its own step: a runner may reorder the elements of one step, and the agent's own
            # answer resumes it whether or not the escalation was answered.
            Advance(T0 + DAY + 25),
            answer,
            Advance(T0 + DAY + 30),
        ],
        tmp_path,
    ).before(T0 + DAY + 30)
    assert outputs.errors == []
    (done,) = outputs.values("completions")
    assert json.loads(done)["outcome"] == "answered"


def test_the_dead_letter_policy_ends_the_suspension_at_the_deadline(tmp_path):
    policy = DeadlinePolicy(AtDeadline.DEAD_LETTER)
    outputs = run_round(
        probe(RuntimeConfig(deadline_policy=policy)),
        [
            command(T0, calls=["a.tool"], deadline_ms=T0 + 50),
            Advance(T0 + 60),
            export(T0 + 61, "ended"),
            result(T0 + 62, intent_id(KEY, SEQ, 0)),
            Advance(T0 + 70),
        ],
        tmp_path,
    ).before(T0 + 70)
    assert [e.reason for e in outputs.values("errors")] == ["deadline_exceeded", "no_suspension"]
    (snapshot,) = outputs.values("snapshots")
    assert not snapshot.HasField("continuation") and list(snapshot.pending) == []
    assert outputs.completions == []


DAY = 24 * 60 * 60 * 1000


def test_an_idle_key_is_wiped_after_its_ttl_and_never_reissues_an_intent_id(tmp_path):
    config = RuntimeConfig(ttl_ms=DAY)
    later = T0 + 3 * DAY
    outputs = run_round(
        probe(config),
        [
            command(T0, calls=["a.tool"], put={"k": "v"}, deadline_ms=T0 + 50),
            Advance(T0 + 60),  # the deadline resumes and completes it
            command(T0 + 100, calls=["b.tool"], deadline_ms=T0 + 150),
            Advance(T0 + 200),
            export(T0 + 300, "before wipe"),
            Advance(later),  # idle past the TTL: wiped
            export(later + 1, "wiped"),
            command(later + 2, calls=["a.tool"], deadline_ms=later + 50),
            Advance(later + 60),
        ],
        tmp_path,
    ).before(later + 60)
    before, wiped = outputs.values("snapshots")
    assert before.memory.entries and before.seq == SEQ + 1
    assert not wiped.HasField("memory") and not wiped.HasField("llm_cache")
    assert wiped.seq == SEQ + 1  # the seq outlives the wipe
    ids = [i.intent_id for i in outputs.values("intents")]
    assert len(ids) == 3 and len(set(ids)) == 3
    assert ids[2] == intent_id(KEY, SEQ + 2, 0)


def test_a_failing_resume_keeps_its_answers_retries_with_backoff_then_dead_letters_them(
    tmp_path,
):
    """The refund case: the tool ran and its result came in, the resume failed. The result is
    never thrown away nor turned into EXPIRED: it is kept, tried again, and at last handed to
    an operator inside the dead letter."""
    config = RuntimeConfig(resume_retries=2, resume_backoff_ms=10, resume_backoff_max_ms=15)
    paid = intent_id(KEY, SEQ, 0)
    outputs = run_round(
        probe(config),
        [
            command(T0, calls=["payments.refund"], raise_at="resume", deadline_ms=T0 + 1000),
            Advance(T0 + 1),
            result(T0 + 2, paid),
            Advance(T0 + 3),
            export(T0 + 4, "kept"),
            Advance(T0 + 5000),
            export(T0 + 5001, "ended"),
            Advance(T0 + 5002),
        ],
        tmp_path,
    ).before(T0 + 5002)
    errors = outputs.values("errors")
    # First try at the answer, retries at +10 and then +15 (doubling, capped), then given up.
    assert [(e.reason, e.event_time_ms) for e in errors] == [
        ("agent_raised", T0 + 2),
        ("agent_raised", T0 + 12),
        ("resume_failed", T0 + 27),
    ]
    for error in errors:
        (kept,) = error.answers
        assert kept.tool_result.intent_id == paid and kept.tool_result.status == ToolResult.OK
    assert "tried again at 1764460800012 (retry 1 of 2)" in errors[0].detail
    kept, ended = outputs.values("snapshots")
    assert [a.tool_result.intent_id for a in kept.continuation.answers] == [paid]
    assert kept.continuation.resume_failures == 1 and kept.continuation.retry_at_ms == T0 + 12
    assert not ended.HasField("continuation") and not ended.pending
    assert outputs.values("completions") == []  # never resumed as EXPIRED


def test_a_resume_that_fails_once_succeeds_on_its_retry_with_the_same_answers(tmp_path):
    """A model briefly down: the resume fails on a retryable LlmCallError, and the retry on the
    timer resumes the agent with the result it was given, never EXPIRED."""
    flaky = _FlakyLlm(1, tmp_path / "calls")
    agent = RunAgent(
        Probe(), llm_client=flaky, config=RuntimeConfig(resume_retries=0, resume_backoff_ms=10)
    )
    paid = intent_id(KEY, SEQ, 0)
    outputs = run_round(
        agent,
        [
            command(T0, calls=["payments.refund"], llm_on_resume="summarise", deadline_ms=T0 + 5),
            Advance(T0 + 1),
            result(T0 + 2, paid),
            Advance(T0 + 100),
        ],
        tmp_path,
    ).before(T0 + 100)
    ((reason, answers),) = [(e.reason, list(e.answers)) for e in outputs.values("errors")]
    assert reason == "llm_failed" and answers[0].tool_result.intent_id == paid
    (done,) = outputs.values("completions")
    assert json.loads(done) == [["payments.refund", "OK"], ["escalations", 0]]


class _FlakyLlm:
    """Fails its first `failures` calls with a retryable LlmCallError, then answers. It counts
    calls in a file, so the count holds across the pickled copies a runner makes."""

    def __init__(self, failures: int, counter) -> None:
        self._failures = failures
        self._counter = str(counter)

    def complete(self, request):
        with open(self._counter, "ab") as counter:
            counter.write(b".")
            calls = counter.tell()
        if calls <= self._failures:
            raise LlmCallError("503 from the provider", model=request.model, retryable=True)
        return LlmResponse("summary", request.model)


def _continuation(**fields):
    defaults = dict(
        state_schema_version=1,
        seq=7,
        step_index=1,
        pending_intent_ids=["i-0"],
        adapter=Probe.adapter,
        snapshot=json.dumps({}).encode(),
        suspended_at_ms=T0,
    )
    return Continuation(**{**defaults, **fields})


def test_export_restore_export_is_lossless_and_export_changes_nothing(tmp_path):
    first = run_round(
        probe(),
        [
            command(
                T0,
                calls=["a.tool", "b.tool"],
                put={"x": "1", "y": "2"},
                llm="hello",
                deadline_ms=FAR,
            ),
            Advance(T0 + 1),
            result(T0 + 5, intent_id(KEY, SEQ, 0, 1)),
            export(T0 + 6, "one"),
            export(T0 + 7, "two"),
            Advance(T0 + 8),
        ],
        tmp_path,
    ).before(T0 + 8)
    one, two = first.values("snapshots")
    assert _state(one) == _state(two)  # exporting changed nothing
    assert one.memory.entries and one.llm_cache.entries and len(one.continuation.answers) == 1
    second = run_round(
        probe(), [one, Advance(T0 + 100), export(T0 + 101, "three")], tmp_path
    ).before(T0 + 102)
    (three,) = second.values("snapshots")
    assert _state(three) == _state(one)
    assert three.request_id == "three" and three.snapshot_at_ms == T0 + 101


def _state(snapshot: StateSnapshot) -> bytes:
    copy = StateSnapshot()
    copy.CopyFrom(snapshot)
    copy.ClearField("request_id")
    copy.ClearField("snapshot_at_ms")
    return copy.SerializeToString(deterministic=True)


def test_a_snapshot_onto_a_key_with_state_is_refused(tmp_path):
    snapshot = StateSnapshot(entity_key=KEY, seq=99, snapshot_at_ms=T0 + 5)
    snapshot.memory.CopyFrom(_memory_blob(1))
    outputs = run_round(
        probe(),
        [
            command(T0, put={"mine": "1"}),
            Advance(T0 + 1),
            snapshot,
            Advance(T0 + 6),
            export(T0 + 7, "after"),
        ],
        tmp_path,
    )
    assert [e.reason for e in outputs.values("errors")] == ["restore_conflict"]
    (after,) = outputs.values("snapshots")
    assert [e.key for e in after.memory.entries] == ["mine"] and after.seq == SEQ


def _memory_blob(version: int):
    blob = MemoryBlob(state_schema_version=version, total_value_bytes=3)
    blob.entries.add(key="restored", value=b"abc", last_access_ms=1)
    return blob


FAILURES = ["start", "after_put", "after_llm", "after_call"]


@pytest.mark.parametrize("point", [*FAILURES, "resume", "not bytes", "nothing", "budget"])
def test_an_agent_that_fails_anywhere_leaves_state_identical(tmp_path, point):
    setup = [
        command(T0, calls=["a.tool"], put={"kept": "yes"}, llm="first", deadline_ms=FAR),
        Advance(T0 + 1),
        export(T0 + 2, "before"),
        Advance(T0 + 3),
    ]
    if point == "resume":
        setup = [
            command(T0, calls=["a.tool"], raise_at="resume", deadline_ms=FAR),
            Advance(T0 + 1),
            export(T0 + 2, "before"),
            Advance(T0 + 3),
        ]
        failing = [result(T0 + 4, intent_id(KEY, SEQ, 0))]
    else:
        setup = [
            command(T0, put={"kept": "yes"}, llm="first"),
            Advance(T0 + 1),
            export(T0 + 2, "before"),
            Advance(T0 + 3),
        ]
        fields = {"raise_at": point} if point in FAILURES else {"return": point}
        put = {"new": "1", "huge": "x" * 2000} if point == "budget" else {"new": "1"}
        calls = [] if point in ("not bytes", "nothing") else ["b.tool"]  # else it suspends
        failing = [command(T0 + 4, calls=calls, put=put, llm="second", **fields)]
    config = RuntimeConfig(memory_budget_bytes=1000)
    outputs = run_round(
        probe(config),
        [*setup, *failing, Advance(T0 + 5), export(T0 + 6, "after"), Advance(T0 + 7)],
        tmp_path,
    ).before(T0 + 7)
    before, after = outputs.values("snapshots")
    if point == "resume":
        # Its durable input, the accepted answer, is kept for the retry; nothing else changed.
        kept = after.continuation
        assert [a.tool_result.intent_id for a in kept.answers] == [intent_id(KEY, SEQ, 0)]
        assert kept.resume_failures == 1 and kept.retry_at_ms > T0 + 4
        after.continuation.CopyFrom(before.continuation)
    assert _state(after) == _state(before)
    (error,) = outputs.values("errors")
    expected = {
        "not bytes": "agent_contract",
        "nothing": "agent_contract",
        "budget": "memory_budget",
    }.get(point, "agent_raised")
    assert error.reason == expected and error.entity_key == KEY
    failed = [t for t in outputs.values("traces") if t.start_ms == T0 + 4]
    assert [t.event_type for t in failed] == [TraceEvent.ERROR]
    assert [i.created_at_ms for i in outputs.values("intents")] == (
        [T0] if point == "resume" else []
    )


# Migration on read, in the element path and both timers ---------------------------------------


def _golden(name: str):
    (fixture,) = [f for f in golden.read_fixtures(data_root() / "golden" / "v1") if f.name == name]
    return message_type(fixture.type_name).FromString(fixture.data)


@pytest.mark.parametrize("memory_fixture", ["memory_blob", "memory_blob_unversioned"])
def test_golden_blobs_migrate_on_first_read_and_reach_state_only_through_a_commit(
    tmp_path, memory_fixture
):
    snapshot = StateSnapshot(entity_key=KEY, seq=7, snapshot_at_ms=T0)
    snapshot.memory.CopyFrom(_golden(memory_fixture))
    snapshot.llm_cache.CopyFrom(_golden("llm_cache_blob"))
    outputs = run_round(
        probe(registry=registry_v2()),
        [
            snapshot,
            Advance(T0 + 1),
            command(T0 + 2, raise_at="start"),
            Advance(T0 + 3),
            export(T0 + 4, "failed"),
            command(T0 + 5, put={"new": "1"}),
            Advance(T0 + 6),
            export(T0 + 7, "committed"),
        ],
        tmp_path,
    ).before(T0 + 8)
    failed, committed = outputs.values("snapshots")
    # A failed activation rewrites nothing: the golden bytes are still there, verbatim.
    assert failed.memory == snapshot.memory and failed.llm_cache == snapshot.llm_cache
    assert failed.state_schema_version == 2  # the exporting binary's version
    # The committed memory is the migrated view plus the activation's work, stamped 2; the
    # activation made no LLM call, so the cache it did not touch is still the golden bytes.
    assert committed.memory.state_schema_version == 2
    assert committed.llm_cache == snapshot.llm_cache
    keys = [e.key for e in committed.memory.entries]
    assert "migrated" in keys and keys[-1] == "new"
    assert [e.key for e in snapshot.memory.entries] == keys[: len(snapshot.memory.entries)]


def _suspended_snapshot(deadline_ms: int, memory="memory_blob", **command_fields):
    snapshot = StateSnapshot(entity_key=KEY, seq=7, snapshot_at_ms=T0)
    snapshot.memory.CopyFrom(_golden(memory))
    pending = ToolIntent(
        intent_id="i-0", entity_key=KEY, seq=7, tool_name="a.tool", kind=ToolIntent.TOOL
    )
    snapshot.pending.append(pending)
    golden_continuation = _golden("continuation")  # v1, from the frozen corpus
    snapshot.continuation.CopyFrom(golden_continuation)
    snapshot.continuation.adapter = Probe.adapter
    snapshot.continuation.snapshot = json.dumps(command_fields).encode()
    snapshot.continuation.seq = 7
    snapshot.continuation.pending_intent_ids[:] = ["i-0"]
    snapshot.continuation.deadline_ms = deadline_ms
    return snapshot


@pytest.mark.parametrize("memory", ["memory_blob", "memory_blob_unversioned"])
@pytest.mark.parametrize("resume_fails", [False, True])
def test_the_deadline_timer_reads_golden_blobs_through_migration(tmp_path, resume_fails, memory):
    fails = {"raise_at": "resume"} if resume_fails else {}
    snapshot = _suspended_snapshot(T0 + 50, memory, **fails)
    outputs = run_round(
        probe(registry=registry_v2()),
        [
            snapshot,
            Advance(T0 + 60),
            export(T0 + 61, "after the deadline"),
        ],
        tmp_path,
    ).before(T0 + 62)
    (after,) = outputs.values("snapshots")
    if resume_fails:
        assert [e.reason for e in outputs.values("errors")] == ["agent_raised"]
        # Memory untouched; the continuation, read through migration, now holds the expiry
        # the resume was given, for its retry.
        assert after.memory == snapshot.memory
        assert after.continuation.state_schema_version == 2
        assert after.continuation.resume_failures == 1
        assert [a.tool_result.status for a in after.continuation.answers] == [ToolResult.EXPIRED]
    else:
        (done,) = outputs.values("completions")
        # 0 in the golden v1 continuation, 10 after the v2 step; expiring is no escalation.
        assert json.loads(done) == [["a.tool", "EXPIRED"], ["escalations", 10]]
        assert after.memory.state_schema_version == 2
        assert "migrated" in [e.key for e in after.memory.entries]
        assert not after.HasField("continuation")


def test_an_answer_reads_a_golden_continuation_through_migration(tmp_path):
    outputs = run_round(
        probe(registry=registry_v2()),
        [
            _suspended_snapshot(FAR),
            Advance(T0 + 1),
            result(T0 + 2, "i-0"),
            Advance(T0 + 3),
        ],
        tmp_path,
    ).before(T0 + 3)
    (done,) = outputs.values("completions")
    assert json.loads(done) == [["a.tool", "OK"], ["escalations", 10]]


@pytest.mark.parametrize("memory", ["memory_blob", "memory_blob_unversioned"])
def test_the_ttl_timer_reads_through_migration_before_it_wipes(tmp_path, memory):
    # A registry without the step cannot read the v1 (or v0) blob: the TTL's read must fail
    # rather than wipe what it cannot read.
    snapshot = StateSnapshot(entity_key=KEY, seq=7, snapshot_at_ms=T0)
    snapshot.memory.CopyFrom(_golden(memory))
    config = RuntimeConfig(ttl_ms=DAY)
    wiped = run_round(
        probe(config, registry=registry_v2()),
        [
            snapshot,
            Advance(T0 + 2 * DAY),
            export(T0 + 2 * DAY + 1, "wiped"),
        ],
        tmp_path,
    ).before(T0 + 2 * DAY + 2)
    (after,) = wiped.values("snapshots")
    assert not after.HasField("memory") and after.seq == 7
    with pytest.raises(Exception, match=r"no migration registered for \(MemoryBlob, 1\)"):
        run_round(
            probe(config, registry=MigrationRegistry(current_version=2)),
            [snapshot, Advance(T0 + 2 * DAY)],
            tmp_path,
        )


def test_a_snapshot_from_a_newer_binary_is_refused_before_anything_is_written(tmp_path):
    """Restored verbatim, its memory would wedge the key at the first read; it is refused at
    restore instead, and the binary that wrote it restores it. (State a newer binary wrote in
    place wedges the key: machine_test proves that on the DoFn, flink_upgrade_test on Flink.)"""
    future = StateSnapshot(entity_key=KEY, seq=7, snapshot_at_ms=T0, request_id="r-9")
    future.memory.CopyFrom(_memory_blob(2))
    inputs = [
        future,
        Advance(T0 + 1),
        command(T0 + 2, put={"new": "1"}),
        Advance(T0 + 3),
        export(T0 + 4, "after"),
    ]
    refused = run_round(probe(), inputs, tmp_path / "refused")
    (error,) = refused.values("errors")
    assert error.reason == "snapshot_from_future" and "memory" in error.detail
    (after,) = refused.values("snapshots")
    assert [e.key for e in after.memory.entries] == ["new"] and after.seq != 7
    rolled_forward = run_round(probe(registry=registry_v2()), inputs, tmp_path / "forward")
    (done,) = rolled_forward.values("completions")
    assert done == b"done"
    (after,) = rolled_forward.values("snapshots")
    assert [e.key for e in after.memory.entries] == ["restored", "new"]


# Coders, traces, batch ----------------------------------------------------------------------

_PROTO_CODERS = {"ProtoCoder", "DeterministicProtoCoder"}


def _coder_names(components, coder_id: str) -> set[str]:
    """The URN, or for Python-only coders the class name, of a coder and its components."""
    coder = components.coders[coder_id]
    name = coder.spec.urn
    if name == "beam:coder:pickled_python:v1":
        name = re.search(rb"(\w+)\$", coder.spec.payload).group(1).decode()
    names = {name}
    for component in coder.component_coder_ids:
        names |= _coder_names(components, component)
    return names


def test_every_output_is_coded_by_protobuf_or_bytes_coders_never_pickle():
    pipeline = beam.Pipeline()
    _ = (
        pipeline
        | beam.Create([event(T0, CHARGED_TWICE).SerializeToString()])
        | "RunAgent" >> (run_agent())
    )
    proto = pipeline.to_runner_api()
    components = proto.components
    (transform,) = [t for t in components.transforms.values() if t.unique_name == "RunAgent"]
    assert set(transform.outputs) == {"completions", "intents", "traces", "errors", "snapshots"}
    allowed = _PROTO_CODERS | {
        "beam:coder:bytes:v1",
        "beam:coder:kv:v1",
        "beam:coder:length_prefix:v1",
    }
    for tag, pcollection_id in transform.outputs.items():
        names = _coder_names(components, components.pcollections[pcollection_id].coder_id)
        assert names <= allowed, (tag, names)
        assert names & (_PROTO_CODERS | {"beam:coder:bytes:v1"}), tag


def test_traces_form_one_tree_per_activation_and_a_resume_continues_its_trace(tmp_path):
    outputs = run_round(
        probe(),
        [
            command(T0, calls=["a.tool"], llm="hi", deadline_ms=FAR),
            Advance(T0 + 1),
            result(T0 + 5, intent_id(KEY, SEQ, 0)),
            Advance(T0 + 6),
        ],
        tmp_path,
    ).before(T0 + 6)
    traces = outputs.values("traces")
    assert [TraceEvent.EventType.Name(t.event_type) for t in traces] == [
        "ACTIVATION_START",
        "LLM_CALL",
        "INTENT_EMITTED",
        "SUSPENDED",
        "ACTIVATION_END",
        "ACTIVATION_START",
        "ACTIVATION_END",
    ]
    assert {len(t.trace_id) for t in traces} == {16} and len({t.trace_id for t in traces}) == 1
    assert {len(t.span_id) for t in traces} == {8}
    first, resumed = traces[0], traces[5]
    assert first.parent_span_id == b"" and resumed.parent_span_id == first.span_id
    for child in traces[1:4]:
        assert child.parent_span_id == first.span_id and child.span_id != first.span_id
    assert traces[4].span_id == first.span_id and traces[6].span_id == resumed.span_id
    llm = traces[1]
    assert llm.attributes["gen_ai.request.model"] == "probe-model"
    assert llm.attributes["gen_ai.operation.name"] == "chat"
    assert traces[2].attributes["beam_agents.intent_id"] == intent_id(KEY, SEQ, 0)


def test_in_batch_undecodable_and_empty_envelopes_are_dead_letters_beside_real_work():
    pipeline = BeamPipeline(runner="DirectRunner")
    outputs = (
        pipeline
        | beam.Create(
            [
                command(T0, put={"a": "1"}).SerializeToString(),
                AgentEnvelope(entity_key=b"c-9", event_time_ms=T0).SerializeToString(),
                b"\xff\xff not an envelope",
            ],
            reshuffle=False,
        )
        | probe()
    )
    assert_that(outputs["completions"], equal_to([(KEY, b"done")]), label="completions")
    assert_that(
        outputs["errors"] | beam.Map(lambda kv: (kv[0], kv[1].reason)),
        equal_to([(b"c-9", "empty_envelope"), (b"", "undecodable_envelope")]),
        label="errors",
    )
    pipeline.run().wait_until_finish()


def test_a_dead_letter_travels_in_an_envelope_as_deterministic_bytes():
    from beam_agents._protos import ActivationErrorRecord
    from beam_agents.runtime.dead_letters import REASONS, error_record, to_envelope

    record = error_record(KEY, "agent_raised", "boom \ud800", T0)
    envelope = to_envelope(record)
    assert (envelope.entity_key, envelope.event_time_ms) == (KEY, T0)
    assert ActivationErrorRecord.FromString(envelope.external_event) == record
    assert envelope.external_event == record.SerializeToString(deterministic=True)
    assert "agent_raised" in REASONS and record.detail == "boom \\ud800"


def test_an_event_at_the_end_of_int64_time_suspends_with_saturated_times():
    pipeline = BeamPipeline(runner="DirectRunner")
    outputs = (
        pipeline
        | beam.Create([command(2**63 - 1, calls=["a.tool"]).SerializeToString()], reshuffle=False)
        | probe()
    )
    assert_that(
        outputs["intents"] | beam.Map(lambda kv: (kv[1].tool_name, kv[1].expires_at_ms)),
        equal_to([("a.tool", 2**63 - 1)]),
        label="intents",
    )
    assert_that(outputs["errors"], equal_to([]), label="no errors")
    pipeline.run().wait_until_finish()


class _InFixedWindows(beam.PTransform):
    """RunAgent behind a one-second fixed windowing: every input in a window of its own."""

    def __init__(self, transform):
        super().__init__()
        self._transform = transform

    def expand(self, inputs):
        windowed = {
            name: pcollection | f"Window{name}" >> beam.WindowInto(window.FixedWindows(1))
            for name, pcollection in inputs.items()
        }
        return windowed | self._transform


def test_an_answer_in_another_window_than_its_suspension_resumes_it(tmp_path):
    outputs = run_round(
        _InFixedWindows(probe()),
        [
            command(T0, calls=["a.tool"], deadline_ms=FAR),
            Advance(T0 + 10),
            result(T0 + 5000, intent_id(KEY, SEQ, 0)),
            Advance(T0 + 6000),
        ],
        tmp_path,
    ).before(T0 + 6000)
    assert outputs.errors == []
    (done,) = outputs.values("completions")
    assert json.loads(done) == [["a.tool", "OK"], ["escalations", 0]]
