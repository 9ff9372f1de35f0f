"""How RunAgent takes answers: all of a suspension's answers resume the agent once, in intent
order; refused answers are dead letters that change nothing; at the deadline the policy
escalates to a human, dead-letters or resumes with the intents expired."""

from __future__ import annotations

import json

import pytest

from beam_agents._protos import (
    AgentEnvelope,
    StateSnapshot,
    ToolIntent,
    ToolResult,
)
from beam_agents.examples.support_triage import TOOLS, ticket
from beam_agents.intents.identity import intent_id
from beam_agents.ops.rounds import Advance, run_round
from beam_agents.runtime import (
    AtDeadline,
    DeadlinePolicy,
    RuntimeConfig,
)
from beam_agents.testing.probe import (
    DAY,
    FAR,
    KEY,
    SEQ,
    T0,
    approval,
    command,
    event,
    export,
    probe,
    result,
    run_agent,
)


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


def test_an_envelope_or_snapshot_with_no_entity_key_is_a_dead_letter(tmp_path):
    outputs = run_round(
        probe(),
        [command(T0, key=b"", put={"a": "1"}), StateSnapshot(snapshot_at_ms=T0), Advance(T0 + 1)],
        tmp_path,
    )
    assert sorted(e.reason for e in outputs.values("errors")) == ["no_entity_key"] * 2
    assert sorted(e.detail.split(" with")[0] for e in outputs.values("errors")) == [
        "a StateSnapshot",
        "an AgentEnvelope",
    ]
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
        probe(RuntimeConfig(deadline_policy=policy, intent_ttl_ms=1)),
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
    deadline_policy=DeadlinePolicy(AtDeadline.ESCALATE, max_escalations=3, extension_ms=100),
    intent_ttl_ms=1,  # the probe's (PROBE_CONFIG): the deadlines its commands name fire
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
        probe(RuntimeConfig(deadline_policy=policy, intent_ttl_ms=1)),
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


def _exported_at_t0_plus_100(tmp_path) -> tuple[StateSnapshot, ToolIntent]:
    """A key suspended on one intent, exported at T0 + 100 (snapshot_at_ms), and the intent."""
    first = run_round(
        probe(),
        [command(T0, calls=["a.tool"], deadline_ms=FAR), Advance(T0 + 1), export(T0 + 100, "r")],
        tmp_path,
    )
    (snapshot,) = first.values("snapshots")
    (intent,) = first.values("intents")
    return snapshot, intent


def test_an_answer_that_overtakes_the_snapshot_restoring_its_key_says_so_and_can_be_sent_again(
    tmp_path,
):
    # Stamped before the snapshot it resumes from, an answer reaches the key first on a runner
    # that takes a key's inputs in event-time order (Prism): here it does on every runner. Its
    # dead letter says what happened and what to do, and doing it resumes the agent.
    snapshot, intent = _exported_at_t0_plus_100(tmp_path)
    early = result(T0 + 50, intent.intent_id)
    outputs = run_round(
        probe(),
        [
            early,
            Advance(T0 + 60),
            snapshot,
            Advance(T0 + 101),
            result(T0 + 150, intent.intent_id),
            Advance(T0 + 200),
        ],
        tmp_path,
    ).before(T0 + 200)
    (refused,) = outputs.values("errors")
    assert refused.reason == "no_suspension" and refused.input == early
    assert "the key has no state" in refused.detail
    assert "Restore the key, then send this answer" in refused.detail
    assert "stamped at or after the snapshot" in refused.detail
    assert [json.loads(c) for c in outputs.values("completions")] == [
        [["a.tool", "OK"], ["escalations", 0]]
    ]


def test_an_answer_stamped_before_its_snapshot_resumes_the_key_or_says_why_it_did_not(tmp_path):
    # Sent after its snapshot but stamped before it: the DirectRunner takes the two in the
    # order sent and resumes the key; Prism takes them in event-time order, so the answer
    # finds no state. Then its dead letter carries it and says what to do, and the restored
    # key still waits for it (nothing was lost, nothing expired).
    snapshot, intent = _exported_at_t0_plus_100(tmp_path)
    early = result(T0 + 50, intent.intent_id)
    outputs = run_round(probe(), [snapshot, early, Advance(T0 + 200)], tmp_path)
    if outputs.values("completions"):
        assert outputs.values("errors") == []
        assert [json.loads(c) for c in outputs.values("completions")] == [
            [["a.tool", "OK"], ["escalations", 0]]
        ]
    else:
        (refused,) = outputs.values("errors")
        assert refused.reason == "no_suspension" and refused.input == early
        assert "Restore the key, then send this answer" in refused.detail
        waiting = outputs.carried[KEY].continuation
        assert list(waiting.pending_intent_ids) == [intent.intent_id] and not waiting.answers
