"""Answers to a suspended key (machine_answers): checked before they are recorded (the intent
pending, the content it was computed for, a signature of the right ring), recorded in the
Continuation's intent order, and a genuine answer on time taking the place of an EXPIRED the
runtime made. Each test drives KeyMachine through `testing.machine_harness`.
"""

from __future__ import annotations

import json

import pytest

from beam_agents._protos import ToolIntent
from beam_agents.runtime import AtDeadline, DeadlinePolicy, RuntimeConfig, agent
from beam_agents.runtime.machine import ERRORS
from beam_agents.testing.machine_harness import (
    EFFECTOR,
    FORGED,
    FORGED_HUMAN,
    T0,
    DownOnce,
    Harness,
    answer,
    approve,
    asks,
    asks_editable,
    event,
    parallel,
    pending,
    refund,
    summarise,
)


def test_a_result_on_time_while_an_expired_resume_awaits_its_retry_reaches_the_agent():
    """The human let the agent go on without the answer, but its resume failed: the refund's
    result arrives before the agent has seen anything and must not be presented as EXPIRED."""
    policy = DeadlinePolicy(AtDeadline.ESCALATE, max_escalations=1, extension_ms=10**6)
    config = RuntimeConfig(
        deadline_policy=policy, suspend_deadline_ms=10, intent_ttl_ms=10, resume_backoff_ms=1000
    )
    h = Harness(refund, llm=DownOnce(1), config=config)
    h.send(event(T0, b"4200"))
    (paid,) = pending(h)
    h.fire_deadline()  # escalates
    escalation = pending(h)[1]
    h.send(approve(T0 + 20, escalation, approved=False))  # go on without it: the resume fails
    assert h.continuation.retry_at_ms
    h.send(answer(T0 + 30, paid, b"refunded 4200"))  # on time, before any resume succeeded
    h.fire_deadline()
    assert h.values("completions") == [b"summary of refunded 4200 after 1 visit(s)"]


# Point 4: answers reach resume in intent order ------------------------------------------------


def test_answers_in_any_order_and_a_shuffled_restore_resume_in_the_continuations_order():
    h = Harness(parallel)
    h.send(event(T0, b"go"))
    first, second, third = pending(h)
    snapshot = h.export(T0 + 1)
    snapshot.pending.reverse()  # an export or restore may list them in any order
    restored = Harness(parallel)
    restored.restore(snapshot)
    for intent, payload in ((third, b"3"), (first, b"1"), (second, b"2")):
        restored.send(answer(T0 + 2, intent, payload))
    assert restored.values(ERRORS) == []
    assert restored.values("completions") == [b"1,2,3"]


# Point 5: a result answers the content it was computed for -----------------------------------


def test_a_result_for_other_content_under_the_same_id_is_refused_and_the_key_keeps_waiting():
    h = Harness(refund, llm=summarise(""), verify_answers=True)
    h.send(event(T0, b"4200"))
    (paid,) = pending(h)
    other = ToolIntent()
    other.CopyFrom(paid)
    other.args_json = '{"amount":5000}'  # the first try's content, from a failed bundle
    h.send(answer(T0 + 1, other, b"refunded 5000"))
    (refused,) = h.values(ERRORS)
    assert refused.reason == "answer_for_other_content"
    assert refused.input.tool_result.payload == b"refunded 5000"
    assert h.continuation is not None and list(h.continuation.answers) == []
    h.send(answer(T0 + 2, paid, b"refunded 4200"))
    assert h.values("completions") == [b"summary of refunded 4200 after 1 visit(s)"]


# Point 9: answers are authenticated -------------------------------------------------------------


@pytest.mark.parametrize(
    "forge",
    [
        lambda intent: answer(T0 + 1, intent, b"paid", ring=None),
        lambda intent: answer(T0 + 1, intent, b"paid", ring=FORGED),
        lambda intent: approve(T0 + 1, intent, ring=None),
    ],
    ids=["unsigned result", "result under a forged key", "unsigned approval"],
)
def test_an_unsigned_or_forged_answer_is_refused_and_the_genuine_one_still_resumes(forge):
    h = Harness(refund, llm=summarise(""), verify_answers=True)
    h.send(event(T0, b"10"))
    (paid,) = pending(h)
    forged = forge(paid)
    h.send(forged)
    (refused,) = h.values(ERRORS)
    want = "bad_answer_signature" if forged.HasField("tool_result") else "answer_mismatch"
    assert refused.reason == want and refused.input == forged
    assert list(h.continuation.answers) == []
    h.send(answer(T0 + 2, paid, b"paid"))
    assert h.values("completions") == [b"summary of paid after 1 visit(s)"]


def test_a_signed_approval_resumes_and_a_forged_one_does_not():
    h = Harness(asks, verify_answers=True)
    h.send(event(T0, b"10"))
    (question,) = pending(h)
    h.send(approve(T0 + 1, question, ring=FORGED_HUMAN))
    assert [e.reason for e in h.values(ERRORS)] == ["bad_answer_signature"]
    h.send(approve(T0 + 2, question))
    assert h.values("completions") == [b"approved"]


def test_an_approval_with_edited_arguments_reaches_the_agent_as_the_arguments_approved():
    """Issue 38 item 16: a person approves the refund at a lower amount; the agent refunds
    what was approved, the other details as asked."""
    h = Harness(asks_editable, verify_answers=True)
    h.send(event(T0, b"42"))
    (question,) = pending(h)
    assert json.loads(question.args_json)["editable"] == ["amount"]
    h.send(approve(T0 + 1, question, edited_args_json='{"amount":30}'))
    assert h.values(ERRORS) == []
    assert h.values("completions") == [b"refunded 30 to c-1"]


def test_an_approval_as_asked_gives_the_agent_the_arguments_it_asked_with():
    h = Harness(asks_editable, verify_answers=True)
    h.send(event(T0, b"42"))
    h.send(approve(T0 + 1, pending(h)[0]))
    assert h.values("completions") == [b"refunded 42 to c-1"]


@pytest.mark.parametrize(
    "edits",
    [
        '{"to":"c-2"}',  # not editable
        '{"amount":"30"}',  # a string for a number
        '{"amount":true}',  # a boolean for a number
        '{"question":"refund 1?"}',  # the question is never editable
        "[30]",  # no object
    ],
)
def test_a_signed_approval_editing_what_its_request_does_not_allow_reaches_no_agent(edits):
    h = Harness(asks_editable, verify_answers=True)
    h.send(event(T0, b"42"))
    (question,) = pending(h)
    h.send(approve(T0 + 1, question, edited_args_json=edits))
    (refused,) = h.values(ERRORS)
    assert refused.reason == "answer_mismatch" and "does not allow" in refused.detail
    assert h.values("completions") == [] and list(h.continuation.answers) == []
    h.send(approve(T0 + 2, question, edited_args_json='{"amount":40}'))
    assert h.values("completions") == [b"refunded 40 to c-1"]


def test_edits_on_an_approval_whose_request_named_none_editable_are_refused():
    h = Harness(asks, verify_answers=True)
    h.send(event(T0, b"10"))
    h.send(approve(T0 + 1, pending(h)[0], edited_args_json='{"amount":5}'))
    assert [e.reason for e in h.values(ERRORS)] == ["answer_mismatch"]


def test_a_declined_approval_carrying_edits_is_refused():
    h = Harness(asks_editable, verify_answers=True)
    h.send(event(T0, b"42"))
    h.send(approve(T0 + 1, pending(h)[0], approved=False, edited_args_json='{"amount":1}'))
    assert [e.reason for e in h.values(ERRORS)] == ["answer_mismatch"]


@agent(name="tests.asks_badly/v1")
def _asks_badly(ctx, event: bytes) -> bytes:
    ctx.request_approval("refund?", editable=["amont"], amount=int(event))
    return b"unreachable"


def test_a_request_naming_an_editable_argument_it_does_not_hold_is_a_contract_error():
    h = Harness(_asks_badly)
    h.send(event(T0, b"42"))
    (refused,) = h.values(ERRORS)
    assert refused.reason == "agent_contract" and "'amont'" in refused.detail
    assert pending(h) == []


def test_an_approval_signed_with_the_effectors_key_is_refused():
    """The effector's result key is in the answer ring to verify its results; an approval it
    signs is not the approvals channel's, and must not open an approval gate."""
    h = Harness(asks, verify_answers=True)
    h.send(event(T0, b"10"))
    (question,) = pending(h)
    h.send(approve(T0 + 1, question, ring=EFFECTOR))
    assert [e.reason for e in h.values(ERRORS)] == ["bad_answer_signature"]
    assert h.values("completions") == [] and h.continuation is not None


class _EditsItsAnswers:
    """On resume, edits each answer's intent and result in place; the first resume then
    raises, the next completes with the payload it was handed."""

    adapter = "tests.edits_answers/v1"

    def __init__(self) -> None:
        self.resumes = 0

    def start(self, ctx, event: bytes):
        ctx.call_tool("a.tool", {"n": 1})
        return ctx.suspend()

    def resume(self, ctx, answers):
        self.resumes += 1
        (given,) = answers
        payload = given.payload
        given.intent.args_json = "{}"
        given.result.payload = b"edited"
        if self.resumes == 1:
            raise RuntimeError("after editing its answer")
        return ctx.complete(payload)


def test_an_agent_that_edits_its_answers_changes_neither_the_state_read_nor_its_retry():
    # The pending intents come from the key's bag state, which a portable runner hands back
    # as the very objects stored: an agent's edit of an answer's intent must not reach them
    # (the harness checks nothing read changed in place). Nor may an edit of the result
    # reach the answers the resume's retry is handed: an accepted answer is kept as it came.
    h = Harness(_EditsItsAnswers())
    h.send(event(T0, b"x"))
    (called,) = pending(h)
    h.send(answer(T0 + 1, called, b"paid 42"))
    assert [e.reason for e in h.values(ERRORS)] == ["agent_raised"]
    assert h.continuation.answers[0].tool_result.payload == b"paid 42"
    h.fire_deadline()
    assert h.values("completions") == [b"paid 42"]


class _EditsItsContinuation:
    """On resume, edits the Continuation it resumes; the first resume then raises, the next
    completes with the snapshot it was handed."""

    adapter = "tests.edits_continuation/v1"

    def __init__(self) -> None:
        self.resumes = 0

    def start(self, ctx, event: bytes):
        ctx.call_tool("a.tool", {"n": 1})
        return ctx.suspend(snapshot=b"where I was")

    def resume(self, ctx, answers):
        self.resumes += 1
        snapshot = ctx.resume_of.snapshot
        ctx.resume_of.snapshot = b"edited"
        del ctx.resume_of.answers[:]
        if self.resumes == 1:
            raise RuntimeError("after editing its continuation")
        return ctx.complete(snapshot + b", %d answer(s)" % len(answers))


def test_an_agent_that_edits_the_continuation_it_resumes_does_not_change_its_retry():
    h = Harness(_EditsItsContinuation())
    h.send(event(T0, b"x"))
    (called,) = pending(h)
    h.send(answer(T0 + 1, called))
    assert [e.reason for e in h.values(ERRORS)] == ["agent_raised"]
    assert h.continuation.snapshot == b"where I was" and len(h.continuation.answers) == 1
    h.fire_deadline()
    assert h.values("completions") == [b"where I was, 1 answer(s)"]


def test_a_copy_of_a_recorded_answer_is_counted_and_a_different_one_is_a_dead_letter():
    # At-least-once delivery sends an answer again: the copy changes nothing and is no error.
    # Another answer for the same intent is refused in a record, the recorded one standing.
    h = Harness(parallel)
    h.send(event(T0, b"go"))
    first, *_ = pending(h)
    h.send(answer(T0 + 1, first, b"1"))
    recorded = h.continuation
    copy = h.send(answer(T0 + 1, first, b"1"))
    assert copy.counters == ["duplicate_answers"] and h.values(ERRORS) == []
    h.send(answer(T0 + 2, first, b"2"))
    (refused,) = h.values(ERRORS)
    assert refused.reason == "unknown_intent" and "another answer recorded" in refused.detail
    assert refused.input.tool_result.payload == b"2"
    assert h.continuation is recorded


def test_an_answer_stamped_past_the_deadline_before_its_timer_fired_is_refused_as_late():
    # The watermark, not the answer, fires the deadline: an answer stamped later can arrive
    # first. It must not resume the agent; the deadline's timer decides, at its time.
    h = Harness(refund, llm=summarise(""))
    h.send(event(T0, b"7"))
    (paid,) = pending(h)
    suspended = h.continuation
    late = suspended.deadline_ms + 1
    h.send(answer(late, paid, b"refunded"))
    (refused,) = h.values(ERRORS)
    assert refused.reason == "after_deadline" and refused.input.tool_result.payload == b"refunded"
    assert h.continuation is suspended and h.values("completions") == []


def test_a_result_taking_an_expireds_place_resumes_no_earlier_than_its_last_retry():
    # The deadline resumed the agent with EXPIRED and it raised; the payment's result, stamped
    # before the intent expired but delivered after, takes the EXPIRED's place and the agent
    # runs on at once: no earlier than the retry it last ran at, or the call it makes next
    # would be born expired (created an hour in, expired a day before it was sent).
    from beam_agents.testing.simulation_agents import FUNCTION

    program = {"nonce": 0, "ops": [["call", "pay"], ["raise_unless_ok"], ["call", "lookup"]]}
    h = Harness(FUNCTION, config=RuntimeConfig())
    h.send(event(T0, json.dumps(program).encode()))
    (paid,) = pending(h)
    h.fire_deadline()  # resumed with EXPIRED at the deadline: it raised
    retried = h.continuation.retry_at_ms
    h.fire_deadline()  # its retry, a minute on: it raised again
    assert h.continuation.resume_failures == 2
    h.send(answer(paid.expires_at_ms - 1, paid, b"paid"))
    (lookup,) = pending(h)
    assert lookup.tool_name == "lookup"
    assert lookup.created_at_ms == retried and lookup.expires_at_ms > retried
