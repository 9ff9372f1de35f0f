"""Hostile histories for the backtest: recordings a production job really writes (a record
delivered twice by an at-least-once sink, a model that failed once and was retried, a
recording turned on after a key began), bad records, and the token report under a budget.
Each test states what issue 42 promises."""

from __future__ import annotations

import json
import sys

import pytest

from beam_agents._protos import ActivationRecord, AgentEnvelope
from beam_agents.errors import LlmCallError
from beam_agents.examples.support_triage import TOOLS, scripted_model, ticket, triage
from beam_agents.ops.backtest import BacktestOptions, backtest_key, run_backtest
from beam_agents.ops.cli import main
from beam_agents.runtime import (
    RECORDS,
    LlmResponse,
    Recording,
    RuntimeConfig,
    ScriptedLlmClient,
    agent,
)
from beam_agents.runtime.budget import Budget, OnBudget
from beam_agents.runtime.key_driver import KeyDriver, recording_machine
from beam_agents.runtime.machine import KeyState
from beam_agents.testing.live_history import OK, PlanModel, live_history
from beam_agents.testing.recorded_history import (
    T0,
    FailsOnce,
    record_history,
    triage_approver,
    triage_history,
    triage_tickets,
)
from beam_agents.testing.review_agents import (
    ASKING,
    DEAD_LETTERING,
    ESCALATING,
    ONE_EVENT,
    RAISED_BY_SIX,
    RETRIED_FOR_EVER,
    RETRIED_ONCE,
    SHORT_DEADLINES,
    BusyOnce,
    DownOnFirstCall,
    Stamped,
    StampedPair,
    asked_twice_history,
    asks_a_person,
    asks_again_while_busy,
    asks_twice,
    calls_per_event,
    counter,
    declined_payment,
    held_while_busy_history,
    pair_history,
    pays,
    queued_behind_a_question_history,
    queued_history,
    raised_between_busy_models,
    raised_on_a_failed_payment,
    raised_then_declined,
    raised_then_down_history,
    two_calls,
    unanswered_history,
    upgraded_mid_resume_history,
)
from beam_agents.testing.simulation_agents import FUNCTION
from beam_agents.wire.fields import join_delimited


@agent(name="review.asks_anew/v2")
def asks_anew(ctx, event: bytes) -> bytes:
    """Two requests the recording never made: both go to the continue_with model."""
    first = ctx.llm([{"role": "user", "content": "first " + event.decode()}], model="m").text
    second = ctx.llm([{"role": "user", "content": "second " + event.decode()}], model="m").text
    return (first + second).encode()


def _triage_history(count: int):
    return triage_history(count)


def test_a_record_delivered_twice_is_no_divergence_of_the_unchanged_agent():
    # RunAgent's RECORDS written to Kafka (ordinary Beam, at least once) or files written by a
    # retried export can hold a record twice: same key, seq, step and time, same bytes.
    history = [r for r in _triage_history(1) if r.entity_key == b"ticket-0"]
    assert len(history) == 4
    report, letters = backtest_key(b"ticket-0", [*history, history[1]], triage)
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_a_model_that_failed_once_live_is_no_divergence_of_the_unchanged_agent():
    # The live model timed out on one resume; the runtime retried it on its timer and the key
    # went on to the refund. An unchanged candidate, answered from the recording, does not fail.
    event = AgentEnvelope(
        entity_key=b"flaky",
        event_time_ms=T0,
        external_event=ticket("t-1", "c-1", "I want a refund for my order"),
    )
    history = record_history(
        triage,
        [event],
        tools=TOOLS,
        approver=triage_approver,
        llm_client=FailsOnce(scripted_model()),
    )
    assert [r.reason for r in history if r.reason] == ["llm_failed"]
    assert b'"refunded"' in history[-1].output
    report, letters = backtest_key(b"flaky", history, triage)
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail
    assert not report.stopped


def test_a_recording_that_began_after_the_keys_first_event_is_a_dead_letter():
    # Recording turned on by an --update of a running job, or last week's records of a key
    # that began the week before: the key's state before the first record is not in it. The
    # first record is a start, but its seq is not a first seq (the key's state held one).
    events = [
        AgentEnvelope(entity_key=b"k", event_time_ms=T0 + n * 60_000, external_event=b"e%d" % n)
        for n in range(4)
    ]
    history = record_history(
        counter, events, tools=TOOLS, approver=triage_approver, llm_client=scripted_model()
    )
    assert backtest_key(b"k", history, counter)[0].HasField("divergence") is False
    report, letters = backtest_key(b"k", history[2:], counter)
    # The unchanged agent "diverges" (event 1 of this key, recorded: event 3): a wrong report.
    assert report is None or not report.HasField("divergence"), report.divergence.detail
    assert [letter.reason for letter in letters] == ["history_incomplete"]


def test_what_the_continue_with_model_billed_counts_in_the_candidates_tokens():
    events = [
        AgentEnvelope(entity_key=b"k", event_time_ms=T0 + n * 60_000, external_event=b"e%d" % n)
        for n in range(2)
    ]
    history = record_history(
        counter, events, tools=TOOLS, approver=triage_approver, llm_client=scripted_model()
    )
    costly = ScriptedLlmClient(
        lambda request: LlmResponse("x", "m", input_tokens=1_000_000, output_tokens=1)
    )
    options = BacktestOptions(stop_at_divergence=False, continue_with=costly, max_tokens=10)
    report, _ = backtest_key(b"k", history, asks_anew, options)
    # The model was called once (1,000,001 tokens, billed) before the budget refused the next
    # request and the activation failed: the report's token difference must show that spend.
    assert report.candidate_input_tokens + report.candidate_output_tokens >= 1_000_001


@agent(name="review.echo/v1")
def echo(ctx, event: bytes) -> bytes:
    return b"ok " + event


def test_an_event_that_arrived_late_live_is_backtested_not_dead_lettered():
    # On a stream an event can reach its key after one stamped later (another partition, a
    # retrying sender): RunAgent runs it on arrival, under the next seq, at its own time. That
    # is the live history, not bad input (the backtest once called it history_out_of_order
    # and dropped the key, even for a stateless agent backtested against itself).
    machine = recording_machine(echo, scripted_model(), RuntimeConfig(), Recording())
    state, history = KeyState(), []
    for at, body in ((T0 + 2_000, b"second"), (T0, b"first, 2 s late")):
        event = AgentEnvelope(entity_key=b"k", event_time_ms=at, external_event=body)
        effects = machine.on_envelope(b"k", state, event, arrival_ms=T0 + 2_000)
        if effects.state is not None:
            state = effects.state
        history += [value for tag, (_, value) in effects.outputs if tag == RECORDS]
    assert [r.output for r in history] == [b"ok second", b"ok first, 2 s late"]
    report, letters = backtest_key(b"k", history, echo)
    assert [(letter.reason, letter.detail) for letter in letters] == []
    assert report is not None and not report.HasField("divergence")


def test_a_record_of_an_outcome_this_binary_does_not_name_is_no_failed_pipeline():
    # A recording by a newer binary (an Outcome value added, as protobuf's additive rules
    # allow), or a flipped byte: the record parses, its outcome is a number without a name.
    # _outcomes' Outcome.Name raises ValueError out of the Run DoFn: every key's run is lost.
    history = _triage_history(4)
    changed = ActivationRecord.FromString(history[-1].SerializeToString())
    changed.outcome = 7
    inputs = [*history[:-1], changed]
    reports, letters = run_backtest(inputs, triage)
    assert len(reports) + len(letters) >= 4


def test_an_answer_without_a_payload_in_a_foreign_recording_is_no_failed_pipeline():
    # A record parse_record accepts (key, adapter, outcome present) whose answer envelope
    # carries no payload, for an intent recorded without an id: _addressed does
    # getattr(envelope, None) and the TypeError fails the pipeline.
    history = _triage_history(2)
    key = b"ticket-1"
    bad = [
        ActivationRecord.FromString(r.SerializeToString()) for r in history if r.entity_key == key
    ]
    bad[0].intents[0].intent_id = ""
    del bad[1].answers[:]
    bad[1].answers.add()
    reports, letters = run_backtest([*[r for r in history if r.entity_key != key], *bad], triage)
    assert [r.entity_key for r in reports] == [b"ticket-0"]
    # The record is refused at the edge, and its key's history, short of it, is not run.
    undecodable, incomplete = sorted(letters, key=lambda letter: letter.reason, reverse=True)
    assert undecodable.reason == "recording_undecodable" and "no tool result" in undecodable.detail
    assert (incomplete.entity_key, incomplete.reason) == (key, "history_incomplete")


# -- a model busy live, a budget raised live (rev42) -------------------------------------------


def test_a_start_whose_model_was_busy_live_is_no_divergence_of_the_unchanged_agent():
    history = record_history(two_calls, ONE_EVENT, tools={}, approver=bool, llm_client=BusyOnce(2))
    # Live, the start was deferred once and run again on its timer: one record, the first
    # answer replayed from what the deferred attempt paid for.
    assert [[c.replayed for c in r.model_calls] for r in history] == [[True, False]]
    report, letters = backtest_key(b"k", history, two_calls)
    assert letters == [] and not report.HasField("divergence")
    # Both calls were billed live once each.
    assert (report.baseline_input_tokens, report.baseline_output_tokens) == (20, 10)


def test_a_budget_raised_live_is_no_divergence_under_the_live_jobs_config():
    model = ScriptedLlmClient(lambda request: LlmResponse("ok", "m", 10, 5))
    history = record_history(
        two_calls, ONE_EVENT, tools={}, approver=bool, llm_client=model, config=ASKING
    )
    assert [r.outcome for r in history] == [ActivationRecord.OUTCOME_COMPLETED]
    report, letters = backtest_key(b"k", history, two_calls, BacktestOptions(config=ASKING))
    assert letters == [] and not report.HasField("divergence")


@agent(name="review.lookup_then_two_calls/v1")
def lookup_then_two_calls(ctx, event: bytes) -> bytes:
    """A tool call, then two model requests in the resume (where a budget can run out)."""
    found = ctx.call_tool("lookup", {"q": event.decode()}).payload.decode()
    first = ctx.llm([{"role": "user", "content": "first " + found}], model="m", temperature=0).text
    return ctx.llm(
        [{"role": "user", "content": "second " + first}], model="m", temperature=0
    ).text.encode()


def test_a_budget_raised_on_a_resume_live_is_backtested_not_dead_lettered():
    model = ScriptedLlmClient(lambda request: LlmResponse("ok", "m", 10, 5))
    history = record_history(
        lookup_then_two_calls,
        ONE_EVENT,
        tools={"lookup": lambda args, intent: b"found"},
        approver=bool,
        llm_client=model,
        config=ASKING,
    )
    assert [r.outcome for r in history] == [
        ActivationRecord.OUTCOME_SUSPENDED,
        ActivationRecord.OUTCOME_COMPLETED,
    ]
    report, letters = backtest_key(b"k", history, lookup_then_two_calls)
    assert [letter.reason for letter in letters] == []
    assert not report.HasField("divergence")


class _Down:
    """A model that is down for good (its client's retries spent): every call fails."""

    def complete(self, request):
        raise LlmCallError("down", model=request.model, retryable=False)


def test_a_resume_that_failed_for_good_live_is_no_divergence_of_the_unchanged_agent():
    history = record_history(
        triage, triage_tickets(1), tools=TOOLS, approver=triage_approver, llm_client=_Down()
    )
    assert history[-1].reason == "resume_failed"
    report, letters = backtest_key(history[0].entity_key, history, triage)
    assert letters == [] and not report.HasField("divergence")


def test_a_key_whose_first_events_budget_was_declined_live_is_backtested():
    model = ScriptedLlmClient(lambda request: LlmResponse("ok", "m", 10, 5))
    events = [
        AgentEnvelope(entity_key=b"k", event_time_ms=T0 + n * 60_000, external_event=calls)
        for n, calls in enumerate([b"3", b"0"])
    ]
    history = record_history(
        calls_per_event,
        events,
        tools={},
        approver=lambda intent: False,  # the budget question: declined
        llm_client=model,
        config=ASKING,
    )
    # Recorded from the key's first event on: the declined start ended on its budget.
    assert [(r.event.external_event, r.reason) for r in history] == [
        (b"3", "budget_exceeded"),
        (b"0", ""),
    ]
    report, letters = backtest_key(b"k", history, calls_per_event, BacktestOptions(config=ASKING))
    assert [letter.reason for letter in letters] == []
    assert not report.HasField("divergence")


def test_a_recording_that_ends_before_a_failed_resumes_retry_is_no_divergence():
    history = record_history(
        triage,
        triage_tickets(1),
        tools=TOOLS,
        approver=triage_approver,
        llm_client=FailsOnce(scripted_model()),
    )
    # Last week's export: it ends after the failed attempt, before the retry an hour's
    # backoff at most later.
    cut = history[: [r.reason for r in history].index("llm_failed") + 1]
    report, _ = backtest_key(history[0].entity_key, cut, triage)
    assert report is None or not report.HasField("divergence"), report.divergence


def test_a_key_idle_past_its_ttl_live_is_backtested_from_a_wiped_key():
    # The live key sat idle past its TTL between its two events: the runtime wiped its memory
    # (the seq kept), so the counter counts from 1 again. Run under the live config, the
    # unchanged agent does too.
    config = RuntimeConfig(ttl_ms=60_000)
    live = KeyDriver(recording_machine(counter, None, config), b"k")
    history = []
    for n in range(2):
        event = AgentEnvelope(entity_key=b"k", event_time_ms=T0 + n * 600_000, external_event=b"e")
        live.schedule(event)
        history += [value for tag, value in live.step() if tag == RECORDS]
        if n == 0:
            live.fire_ttl(live.ttl_at)
    assert [r.output for r in history] == [b"event 1 of this key"] * 2
    report, letters = backtest_key(b"k", history, counter, BacktestOptions(config=config))
    assert letters == [] and not report.HasField("divergence"), report.divergence.detail


def test_a_budget_question_the_live_key_never_asked_is_reported():
    model = ScriptedLlmClient(lambda request: LlmResponse("ok", "m", 10, 5))
    # Live: no budget; the key's one start made three model calls (45 tokens).
    history = record_history(
        calls_per_event,
        [AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"3")],
        tools={},
        approver=bool,
        llm_client=model,
    )
    # The candidate runs under a 20-token key budget that asks a person past it: no person
    # was asked live, so what a person would have said is unknown, and the report must say
    # the candidate stopped to ask rather than show the same run as the live one.
    report, letters = backtest_key(b"k", history, calls_per_event, BacktestOptions(config=ASKING))
    assert letters == []
    assert report.HasField("divergence")


def test_a_key_granted_more_than_1024_budget_raises_live_is_backtested():
    # A small raise per approval: each model call past the limit asks again, so a key that
    # lives long under OnBudget.ASK is granted raises by the thousand.
    config = RuntimeConfig(budget=Budget(key_tokens=20, on_exceed=OnBudget.ASK, raise_tokens=1))
    model = ScriptedLlmClient(lambda request: LlmResponse("ok", "m", 10, 5))
    events = [
        AgentEnvelope(entity_key=b"k", event_time_ms=T0 + n * 1000, external_event=b"e")
        for n in range(40)
    ]
    history = record_history(
        lookup_then_two_calls,
        events,
        tools={"lookup": lambda args, intent: b"found"},
        approver=bool,
        llm_client=model,
        config=config,
    )
    assert all(r.reason == "" for r in history)  # every raise approved, every event answered
    report, letters = backtest_key(
        b"k", history, lookup_then_two_calls, BacktestOptions(config=config)
    )
    assert [letter.reason for letter in letters] == []
    assert not report.HasField("divergence")


@agent(name="review.lookup_then_two_calls/v1")
def lookup_then_reworded(ctx, event: bytes) -> bytes:
    """lookup_then_two_calls with a new prompt: one model request, worded otherwise."""
    found = ctx.call_tool("lookup", {"q": event.decode()}).payload.decode()
    return ctx.llm(
        [{"role": "user", "content": "a new prompt: " + found}], model="m", temperature=0
    ).text.encode()


def test_a_new_prompt_against_a_live_model_that_was_down_is_not_reported_unchanged():
    history = record_history(
        lookup_then_two_calls,
        ONE_EVENT,
        tools={"lookup": lambda args, intent: b"found"},
        approver=bool,
        llm_client=_Down(),
    )
    assert history[-1].reason == "resume_failed"
    report, letters = backtest_key(b"k", history, lookup_then_reworded)
    assert letters == []
    # The live request is unknown (the model never answered it), so the candidate's is
    # either a divergence or not compared; it is not the same run.
    assert report.HasField("divergence") or report.stopped


def test_a_start_granted_many_budget_raises_live_is_backtested():
    # Each approval raises the key's limit by one token: the start's third call is past it
    # until ten raises were granted, each asked anew by the same start.
    config = RuntimeConfig(budget=Budget(key_tokens=20, on_exceed=OnBudget.ASK, raise_tokens=1))
    model = ScriptedLlmClient(lambda request: LlmResponse("ok", "m", 10, 5))
    history = record_history(
        calls_per_event,
        [AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"3")],
        tools={},
        approver=bool,
        llm_client=model,
        config=config,
    )
    assert [r.outcome for r in history] == [ActivationRecord.OUTCOME_COMPLETED]
    report, letters = backtest_key(b"k", history, calls_per_event, BacktestOptions(config=config))
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_a_raised_start_whose_model_was_then_busy_live_is_no_divergence():
    # The third call passes the 20-token budget; approved, the start runs again (its first
    # two calls replayed) and the model is busy on that call: the start is deferred.
    model = BusyOnce(3)
    history = record_history(
        calls_per_event,
        [AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"3")],
        tools={},
        approver=bool,
        llm_client=model,
        config=ASKING,
    )
    assert model.calls == 4
    assert [r.outcome for r in history] == [ActivationRecord.OUTCOME_COMPLETED]
    report, letters = backtest_key(b"k", history, calls_per_event, BacktestOptions(config=ASKING))
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_a_start_the_model_failed_live_does_not_end_the_unchanged_agents_backtest():
    events = [
        AgentEnvelope(entity_key=b"k", event_time_ms=T0 + n * 60_000, external_event=b"1")
        for n in range(3)
    ]
    history = record_history(
        calls_per_event, events, tools={}, approver=bool, llm_client=DownOnFirstCall()
    )
    assert [r.reason for r in history] == ["llm_failed", "", ""]
    report, letters = backtest_key(b"k", history, calls_per_event)
    assert letters == [] and not report.HasField("divergence")
    # The two starts after the outage ran live as they would here: they are compared.
    assert not report.stopped
    assert report.candidate_activations == 3


def test_a_start_granted_a_raise_then_declined_live_is_no_divergence_of_the_unchanged_agent():
    config, history = raised_then_declined()
    # The declined start's record holds the one call its last attempt paid for.
    assert [(r.reason, len(r.model_calls)) for r in history] == [("budget_exceeded", 1), ("", 1)]
    report, letters = backtest_key(b"k", history, calls_per_event, BacktestOptions(config=config))
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_a_resume_declined_a_raise_after_a_model_call_live_is_no_divergence():
    # The resume's first call fits the key's 25 tokens, its second asks and is declined: the
    # record holds the call the declined attempt paid for.
    config = RuntimeConfig(budget=Budget(key_tokens=25, on_exceed=OnBudget.ASK, raise_tokens=10))
    model = ScriptedLlmClient(lambda request: LlmResponse("ok", "m", 10, 5))
    history = record_history(
        lookup_then_two_calls,
        ONE_EVENT,
        tools={"lookup": lambda args, intent: b"found"},
        approver=lambda intent: False,
        llm_client=model,
        config=config,
    )
    assert [(r.reason, len(r.model_calls)) for r in history] == [("", 0), ("budget_exceeded", 1)]
    report, letters = backtest_key(
        b"k", history, lookup_then_two_calls, BacktestOptions(config=config)
    )
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_an_event_that_waited_in_a_mailbox_live_runs_when_it_was_drained_not_at_its_own_time():
    history = queued_history()
    # Live, the second event ran when the first's ticket was answered, a second after the
    # first event: its ticket is stamped then, not at its own time.
    second = history[2]
    assert second.now_ms == T0 + 1_000 and second.event.event_time_ms == T0 + 500
    report, letters = backtest_key(b"k", history, Stamped())
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_a_budget_declined_at_its_deadline_with_an_event_queued_live_is_no_divergence():
    # No one answers the budget question: it is declined at its deadline, a day later; the
    # second event, queued meanwhile, runs then, asks again and is declined a day after that.
    # Run at its own time, the candidate's question would be answered after its deadline.
    events = [
        AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"%d" % n) for n in (3, 2)
    ]
    model = ScriptedLlmClient(lambda request: LlmResponse("ok", "m", 10, 5))
    machine = recording_machine(calls_per_event, model, ASKING)
    driver = KeyDriver(machine, b"k")
    for event in events:
        driver.schedule(event)
    history = []
    while driver or driver.state.continuation is not None:
        if driver:
            outputs = driver.step()
        else:
            outputs = driver.fire_deadline(driver.state.continuation.deadline_ms)
        history += [value for tag, value in outputs if tag == RECORDS]
    assert [r.reason for r in history] == ["budget_exceeded"] * 2
    report, letters = backtest_key(b"k", history, calls_per_event, BacktestOptions(config=ASKING))
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_an_approval_no_one_answered_live_is_no_divergence_of_the_unchanged_agent():
    # At the suspension's deadline the runtime resumed the agent with an EXPIRED result for
    # the approval: the record's answer is the runtime's, a tool_result to an APPROVAL intent.
    history = unanswered_history(asks_a_person, ONE_EVENT, SHORT_DEADLINES)
    assert [r.output for r in history] == [b"", b"not approved: 3"]  # EXPIRED
    report, letters = backtest_key(
        b"k", history, asks_a_person, BacktestOptions(config=SHORT_DEADLINES)
    )
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_a_resume_that_raised_on_every_retry_live_is_no_divergence_of_the_unchanged_agent():
    # The payment failed, and the agent raises on it: live, its resume failed, was tried
    # again on its timer three times (resume_retries) and then ended (resume_failed).
    history = record_history(
        pays, ONE_EVENT, tools={"pay": declined_payment}, approver=bool, llm_client=None
    )
    assert [r.reason for r in history] == ["", *["agent_raised"] * 3, "resume_failed"]
    report, letters = backtest_key(b"k", history, pays)
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail
    assert report.candidate_activations == report.baseline_activations == 2


def test_an_event_sent_again_after_its_start_failed_live_is_run_again_as_live():
    # The model was down for the event's start, which ended for good (llm_failed, its event
    # not marked as seen); the producer (or an operator replaying the dead letters) sent the
    # very same event again, and the key ran it again, under the next seq.
    event = AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"1")
    history = record_history(
        calls_per_event, [event, event], tools={}, approver=bool, llm_client=DownOnFirstCall()
    )
    assert [r.reason for r in history] == ["llm_failed", ""]
    report, letters = backtest_key(b"k", history, calls_per_event)
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail
    assert report.candidate_activations == 2


def _declined_on_a_resume():
    """(config, history): the resume's first call fits the key's 25 tokens, its second asks a
    raise and is declined, the last record of the recording."""
    config = RuntimeConfig(budget=Budget(key_tokens=25, on_exceed=OnBudget.ASK, raise_tokens=10))
    model = ScriptedLlmClient(lambda request: LlmResponse("ok", "m", 10, 5))
    history = record_history(
        lookup_then_two_calls,
        ONE_EVENT,
        tools={"lookup": lambda args, intent: b"found"},
        approver=lambda intent: False,
        llm_client=model,
        config=config,
    )
    assert [r.reason for r in history] == ["", "budget_exceeded"]
    return config, history


def test_a_resume_declined_a_raise_live_is_compared_not_taken_for_an_attempt_awaiting_a_retry():
    # A declined raise ends the suspension for good; the runtime runs no retry of it. Taken
    # for a failed attempt awaiting its retry, the last record was never compared: the
    # unchanged agent ran one activation of two, and a new prompt in the resume went unseen.
    config, history = _declined_on_a_resume()
    report, letters = backtest_key(
        b"k", history, lookup_then_two_calls, BacktestOptions(config=config)
    )
    assert letters == [] and not report.HasField("divergence")
    assert report.candidate_activations == report.baseline_activations == 2
    report, letters = backtest_key(
        b"k", history, lookup_then_reworded, BacktestOptions(config=config)
    )
    assert letters == []
    assert report.divergence.kind == report.divergence.KIND_MODEL_REQUEST


_DEADLINE_ENDINGS = {
    "escalated, no one answered": (ESCALATING, None, 3_000_000),
    "escalated, declined": (ESCALATING, False, 3_000_000),
    "escalated, kept waiting": (ESCALATING, True, 3_000_000),
    "dead-lettered": (DEAD_LETTERING, None, 3_000_000),
    "dead-lettered, an event queued": (DEAD_LETTERING, None, 600_000),
}


@pytest.mark.parametrize("ending", sorted(_DEADLINE_ENDINGS))
def test_a_suspension_its_deadline_policy_ended_live_is_no_divergence_of_the_unchanged_agent(
    ending,
):
    # ESCALATE asks a person at the deadline (an intent of the runtime's, in no record) and
    # moves the suspension's step; DEAD_LETTER ends it with no resume at all. Either way the
    # live key went on, and so must the candidate, its deadline timer fired as the live one.
    config, escalation, later_ms = _DEADLINE_ENDINGS[ending]
    later = AgentEnvelope(entity_key=b"k", event_time_ms=T0 + later_ms, external_event=b"later")
    history = unanswered_history(
        asks_a_person, ONE_EVENT, config, escalation=escalation, events_at=[later]
    )
    report, letters = backtest_key(b"k", history, asks_a_person, BacktestOptions(config=config))
    assert [(letter.reason, letter.detail) for letter in letters] == []
    assert not report.HasField("divergence"), report.divergence.detail
    assert report.candidate_activations == report.baseline_activations


def test_a_request_made_twice_in_a_start_held_for_a_raise_gets_each_answer_in_its_place():
    history = asked_twice_history()
    options = BacktestOptions(config=RAISED_BY_SIX)
    report, letters = backtest_key(b"k", history, asks_twice, options)
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_parallel_calls_answered_out_of_their_order_live_resume_at_the_last_answers_time():
    # The second call was answered first: the live resume ran at the first's answer, a
    # minute on. Fed in the calls' order, the candidate resumed at the second's, a second on.
    history = pair_history()
    report, letters = backtest_key(b"k", history, StampedPair())
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


# -- the command line misused (rev42) ------------------------------------------------------------

#: Not a model client: what `--continue-with` might name by mistake.
NOT_A_CLIENT = "gpt-5"


@pytest.mark.parametrize(
    "misuse, said",
    [
        (["--agent", "review_boom:agent"], "cannot import review_boom"),
        (["--report", "{missing}/reports.binpb"], "--report"),
        (["--html", "{missing}/report.html"], "--html"),
        ([f"--continue-with={__name__}:NOT_A_CLIENT", "--max-tokens=10"], "not a model client"),
        (["--max-tokens=10"], "--max-tokens needs --continue-with"),
        ([f"--continue-with={__name__}:ScriptedLlmClient"], "not a model client"),
        (["--price-per-million", "-1", "5"], "--price-per-million"),
    ],
    ids=["agent raises on import", "report folder missing", "html folder missing",
         "continue-with no client", "max-tokens alone", "continue-with a class", "negative price"],
)  # fmt: skip
def test_a_misused_command_line_is_a_usage_error_before_the_pipeline_runs(
    misuse, said, tmp_path, capsys, monkeypatch
):
    # Each used to end in a traceback (exit 1, which says "some key diverged"), after the
    # whole pipeline had run for the output ones, or to be ignored, or to crash the pipeline
    # at the first divergence (a --continue-with that cannot complete).
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "review_boom.py").write_text("raise RuntimeError('a bad deploy')\n")
    records = tmp_path / "records.binpb"
    records.write_bytes(join_delimited(_triage_history(1)))
    missing = tmp_path / "no such folder"
    args = [arg.format(missing=missing) for arg in misuse]
    if "--agent" not in args:
        args += ["--agent", "beam_agents.examples.support_triage:triage"]
    assert main(["backtest", str(records), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("beam-agents backtest:") and said in err, err
    assert "Traceback" not in err


@agent(name="review.exits/v2")
def exits(ctx, event: bytes) -> bytes:
    """A candidate that calls a helper which ends the process (argparse, click, a CLI's main)."""
    sys.exit("usage: helper [-h]")


def test_a_candidate_that_calls_sys_exit_is_a_divergence_not_a_dead_worker():
    # SystemExit is no Exception: it went through the runtime's catch, out of the Run DoFn,
    # and took the worker down with every key of the bundle (retried on a runner, for ever).
    history = _triage_history(2)
    reports, letters = run_backtest(history, exits)
    assert letters == [] and len(reports) == 2
    for report in reports:
        assert report.divergence.candidate_outcome == ActivationRecord.OUTCOME_FAILED
        assert "agent_raised" in report.divergence.detail


def test_a_resume_record_lost_as_too_large_is_a_dead_letter_not_a_divergence():
    # A resume whose record was over RunAgent's max_output_bytes (a tool's answer of a few
    # megabytes, which the recording keeps whole) is a record_too_large dead letter instead:
    # the recording lacks it. The key's next start ran before the suspension's intents could
    # expire, so a resume ran first: the history is incomplete, not the candidate changed.
    events = [
        AgentEnvelope(entity_key=b"k", event_time_ms=T0 + n * 10_000, external_event=b"e%d" % n)
        for n in range(2)
    ]
    history = record_history(
        Stamped(),
        events,
        tools={"ticket.open": lambda args, intent: b"{}"},
        approver=bool,
        llm_client=None,
    )
    assert [(r.seq - history[0].seq, r.first_step) for r in history] == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
    ]
    lost = [history[0], *history[2:]]
    report, letters = backtest_key(b"k", lost, Stamped())
    assert report is None or not report.HasField("divergence"), report.divergence.detail
    assert [letter.reason for letter in letters] == ["history_incomplete"]
    assert "resume" in letters[0].detail


def test_a_start_granted_a_raise_then_left_unanswered_after_a_busy_model_is_no_divergence():
    # The start asks a raise at once (its first call would pass 12 tokens), is granted a
    # second later, and runs again on the grant: the model is busy, so it waits a minute's
    # backoff, then asks for its second call and no one answers: declined at the question's
    # deadline, a day and a minute on. That record's time is the decline's, not the start's;
    # and the candidate, answered at once, asks its second question a minute before the live
    # key did, so its deadline comes first.
    config = RuntimeConfig(budget=Budget(key_tokens=12, on_exceed=OnBudget.ASK, raise_tokens=6))
    program = json.dumps({"nonce": 0, "ops": [["llm", "p0"], ["llm", "p0"]]}).encode()
    event = AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=program)
    answers = iter([(1_000, OK)] + [(None, OK)] * 10)
    history = live_history(
        FUNCTION, b"k", [(T0, event)], config, PlanModel(["busy", OK]), lambda i: next(answers)
    )
    assert [(r.reason, r.now_ms - T0) for r in history] == [("budget_exceeded", 86_461_000)]
    report, letters = backtest_key(b"k", history, FUNCTION, BacktestOptions(config=config))
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_a_resume_that_raised_after_a_model_call_asks_the_model_afresh_on_its_retry_as_live():
    # The payment failed, so the resume raised after its model call: a failure of the agent's
    # keeps no answer for the retry, which asked the model again and got another answer (both
    # records hold the call, under one cache key). Offered once, as if the retry had replayed
    # it, the second request went unanswered: the unchanged agent diverged.
    history = raised_on_a_failed_payment(RETRIED_ONCE)
    assert [r.reason for r in history] == ["", "agent_raised", "resume_failed"]
    first, retry = (r.model_calls[0] for r in history[1:])
    assert first.cache_key == retry.cache_key and first.response != retry.response
    assert not retry.replayed
    report, letters = backtest_key(b"k", history, FUNCTION, BacktestOptions(config=RETRIED_ONCE))
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail
    # Both attempts paid for the call, live and in the candidate.
    assert report.candidate_input_tokens == report.baseline_input_tokens == 6


def test_a_resume_that_raised_after_a_raise_then_was_declined_one_is_no_divergence():
    # Granted a raise, the resume made its call and raised; its retry asked again, and no one
    # answered: budget_exceeded at the question's deadline.
    history = raised_on_a_failed_payment(RAISED_BY_SIX)
    assert [r.reason for r in history] == ["", "agent_raised", "budget_exceeded"]
    report, letters = backtest_key(b"k", history, FUNCTION, BacktestOptions(config=RAISED_BY_SIX))
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_a_resume_that_raised_between_busy_model_attempts_is_no_divergence():
    history = raised_between_busy_models()
    assert [r.reason for r in history] == [
        "", "agent_raised", "llm_failed", "agent_raised", "llm_failed", "resume_failed"
    ]  # fmt: skip
    report, letters = backtest_key(b"k", history, FUNCTION)
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail
    # Its attempts kept in step with the live key's: busy past resume_retries (3) is run
    # again, so it asked the model as often, billed alike.
    assert (
        (report.candidate_input_tokens, report.candidate_output_tokens)
        == (
            report.baseline_input_tokens,
            report.baseline_output_tokens,
        )
        == (9, 6)
    )


def test_a_resume_whose_last_attempt_the_model_failed_for_good_after_busy_ones_is_no_divergence():
    # Found by the generated test of the unchanged agent in shadow_order_test: the last
    # attempt asks the request the live model failed on for good, which no answer holds; the
    # record's failure fails it here too, for good, so the suspension ends as it did live.
    history = raised_between_busy_models([OK, "busy", OK, "down"])
    assert [r.reason for r in history] == [
        "", "agent_raised", "llm_failed", "agent_raised", "resume_failed"
    ]  # fmt: skip
    assert not history[-1].model_calls
    assert [f.retryable for f in history[-1].model_failures] == [False]
    report, letters = backtest_key(b"k", history, FUNCTION)
    assert letters == []
    assert not report.stopped and not report.HasField("divergence"), report.divergence.detail
    # The start, then the resume (its attempts are one activation compared).
    assert report.candidate_activations == report.baseline_activations == 2
    assert report.candidate_input_tokens == report.baseline_input_tokens == 6


def test_a_model_failure_a_record_does_not_hold_stops_the_run_where_both_failed():
    # A record written before records held failed calls: the request the live model failed on
    # is unknown, so the candidate's unanswered one may be it. Not comparable past it.
    history = raised_between_busy_models([OK, "busy", OK, "down"])
    for record in history:
        del record.model_failures[:]
    report, letters = backtest_key(b"k", history, FUNCTION)
    assert letters == []
    assert report.stopped and not report.HasField("divergence"), report.divergence.detail


class _FailsFirst:
    """A model whose first `calls` requests fail, busy (`retryable`) or down, each billed 4
    tokens (an answer its client refused); then it answers."""

    def __init__(self, calls: int, *, retryable: bool) -> None:
        self._left, self._retryable = calls, retryable

    def complete(self, request):
        if self._left:
            self._left -= 1
            raise LlmCallError(
                "busy" if self._retryable else "down",
                model=request.model,
                retryable=self._retryable,
                input_tokens=3,
                output_tokens=1,
            )
        return LlmResponse("ok", "m", 10, 5)


@agent(name="review.reads_retryable/v1")
def reads_retryable(ctx, event: bytes) -> bytes:
    """Catches the model's failure and answers after what kind it was."""
    try:
        return ctx.llm([{"role": "user", "content": event.decode()}], model="m").text.encode()
    except LlmCallError as e:
        return b"busy" if e.retryable else b"down"


@pytest.mark.parametrize("retryable", [True, False], ids=["busy", "down"])
def test_a_model_failure_the_agent_caught_live_is_no_divergence_of_the_unchanged_agent(
    retryable,
):
    event = AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"classify")
    history = record_history(
        reads_retryable,
        [event],
        tools={},
        approver=bool,
        llm_client=_FailsFirst(1, retryable=retryable),
    )
    ((record,),) = [history]
    assert record.output == (b"busy" if retryable else b"down")
    assert [(f.after_calls, f.retryable) for f in record.model_failures] == [(0, retryable)]
    asked = []
    options = BacktestOptions(
        stop_at_divergence=False,
        continue_with=ScriptedLlmClient(lambda r: asked.append(r) or LlmResponse("x", "m", 1, 1)),
        max_tokens=100,
    )
    for given in (BacktestOptions(), options):
        report, letters = backtest_key(b"k", history, reads_retryable, given)
        assert letters == []
        assert not report.HasField("divergence"), report.divergence.detail
        # The refused answer was billed live and here alike.
        assert (report.baseline_input_tokens, report.candidate_input_tokens) == (3, 3)
    # The request the live model failed fails here too: continue_with is not asked it.
    assert asked == []


@agent(name="review.lookup_then_reads_retryable/v1")
def lookup_then_reads_retryable(ctx, event: bytes) -> bytes:
    """On its resume, leaves a busy model to the runtime's retries and falls back on a down
    one."""
    found = ctx.call_tool("lookup", {"q": "x"}).payload
    try:
        return ctx.llm([{"role": "user", "content": "classify"}], model="m").text.encode() + found
    except LlmCallError as e:
        if e.retryable:
            raise
        return b"down " + found


def test_a_busy_model_live_is_not_made_a_down_one_for_an_agent_that_reads_retryable():
    # Busy through every retry (retryable_resume_retries): the resume's suspension ended. Its
    # first attempts were within resume_retries too, where a down model would have been
    # retried as well; only the record says which it was.
    event = AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"e")
    history = record_history(
        lookup_then_reads_retryable,
        [event],
        tools={"lookup": lambda args, intent: b"found"},
        approver=bool,
        llm_client=_FailsFirst(100, retryable=True),
    )
    assert history[-1].reason == "resume_failed"
    assert all(f.retryable for r in history for f in r.model_failures)
    report, letters = backtest_key(b"k", history, lookup_then_reads_retryable)
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail
    assert not report.stopped
    assert report.candidate_input_tokens == report.baseline_input_tokens == 3 * 11


def test_attempts_retried_without_backoff_are_each_run_whatever_order_they_come_in():
    # resume_backoff_ms=0: every attempt of the resume ran at the same time. Their records
    # differ by their attempt, so none is taken for a copy of another, and they are put in
    # the order they ran whichever order they are read in.
    config = RuntimeConfig(resume_backoff_ms=0)
    history = raised_between_busy_models(config=config)
    resumes = history[1:]
    assert len({r.now_ms for r in resumes}) == 1
    assert [r.attempt for r in resumes] == [0, 1, 2, 3, 4]
    assert len({r.SerializeToString(deterministic=True) for r in history}) == len(history)
    options = BacktestOptions(config=config)
    found = [
        backtest_key(b"k", ordered, FUNCTION, options)
        for ordered in (history, history[::-1], [history[0], *resumes[::-1]])
    ]
    for report, letters in found:
        assert letters == []
        assert not report.HasField("divergence"), report.divergence.detail
    assert found[0] == found[1] == found[2]


class _Busy:
    """A model busy on every call (its client's retries spent)."""

    def complete(self, request):
        raise LlmCallError("busy", model=request.model, retryable=True)


@agent(name="review.retries_a_busy_model_once/v1")
def retries_a_busy_model_once(ctx, event: bytes) -> bytes:
    """Asks again once when the model is busy; a model down for good is answered "down"."""
    for attempt in range(2):
        try:
            return ctx.llm([{"role": "user", "content": "classify"}], model="m").text.encode()
        except LlmCallError as e:
            if not e.retryable:
                return b"down"
            if attempt == 1:
                raise
    raise AssertionError("unreachable")


def test_a_start_that_failed_busy_twice_in_its_last_attempt_is_no_divergence():
    event = AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"e")
    history = record_history(
        retries_a_busy_model_once, [event], tools={}, approver=bool, llm_client=_Busy()
    )
    (record,) = history
    assert record.reason == "llm_failed"
    assert [f.retryable for f in record.model_failures] == [True, True]
    report, letters = backtest_key(b"k", history, retries_a_busy_model_once)
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


class RateLimited(LlmCallError):
    """A provider client's own kind of LlmCallError."""


class _DownOnce:
    """A model whose client raises its own LlmCallError subclass on the first call."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request):
        self.calls += 1
        if self.calls == 1:
            raise RateLimited("rate limited", model=request.model, retryable=False)
        return LlmResponse("ok", request.model, 3, 2)


@agent(name="review.asks_once/v1")
def asks_once(ctx, event: bytes) -> bytes:
    return ctx.llm([{"role": "user", "content": event.decode()}], model="m").text.encode()


def test_a_model_client_raising_a_subclass_of_llm_call_error_is_no_divergence():
    event = AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"e")
    history = record_history(asks_once, [event], tools={}, approver=bool, llm_client=_DownOnce())
    (record,) = history
    assert [f.error for f in record.model_failures] == ["rate limited"]
    report, letters = backtest_key(b"k", history, asks_once)
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


class Worded(LlmCallError):
    """A provider client's own kind of LlmCallError, worded its own way."""

    def __str__(self) -> str:
        return f"provider says: {self.reason}, try later"


class _FailsFirstWith:
    """A model whose client raises `error(request)` on its first call, then answers."""

    def __init__(self, error) -> None:
        self._error, self.calls = error, 0

    def complete(self, request):
        self.calls += 1
        if self.calls == 1:
            raise self._error(request)
        return LlmResponse("ok", request.model, 3, 2)


@agent(name="review.tells_the_error/v1")
def tells_the_error(ctx, event: bytes) -> bytes:
    """Answers with the model's error when it fails (as many agents log or return it)."""
    try:
        return ctx.llm([{"role": "user", "content": "a"}], model="m").text.encode()
    except LlmCallError as e:
        return f"failed: {e}".encode()


@pytest.mark.parametrize(
    "error",
    [
        lambda r: LlmCallError("", model=r.model, retryable=False),
        lambda r: LlmCallError("x" * 2_000, model=r.model, retryable=False),
        lambda r: LlmCallError("down", model="m-2024-05-01", retryable=False),
        lambda r: LlmCallError("down", model=None, retryable=False),
        lambda r: Worded("down", model=r.model, retryable=False),
    ],
    ids=[
        "empty reason",
        "reason over 1 KiB",
        "client names the model it resolved",
        "client names no model",
        "client words its own error",
    ],
)
def test_an_agent_that_reads_the_model_error_gets_the_live_one(error):
    event = AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"e")
    history = record_history(
        tells_the_error, [event], tools={}, approver=bool, llm_client=_FailsFirstWith(error)
    )
    (record,) = history
    assert record.output.startswith(b"failed: ")
    report, letters = backtest_key(b"k", history, tells_the_error)
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


class _NoTruth:
    def __bool__(self):
        raise ValueError("the truth value is ambiguous")


class _NoText:
    def __format__(self, spec: str) -> str:
        return "no text"

    def __str__(self) -> str:
        raise ValueError("no text")


def _hostile_retryable(request):
    error = LlmCallError("busy", model=request.model, retryable=True)
    error.retryable = _NoTruth()
    return error


def _hostile_reason(request):
    return LlmCallError(_NoText(), model=request.model, retryable=False)


@agent(name="review.falls_back/v1")
def falls_back(ctx, event: bytes) -> bytes:
    """Falls back on a fixed answer whatever the model's failure."""
    try:
        return ctx.llm([{"role": "user", "content": "a"}], model="m").text.encode()
    except LlmCallError:
        return b"fallback"


@pytest.mark.parametrize(
    "error", [_hostile_retryable, _hostile_reason], ids=["retryable", "reason"]
)
def test_a_failure_the_agent_caught_with_hostile_attributes_still_makes_a_record(error):
    # Without recording the key completes; with it, building the record must not raise (it
    # would fail the bundle, over and over).
    event = AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"e")
    history = record_history(
        falls_back, [event], tools={}, approver=bool, llm_client=_FailsFirstWith(error)
    )
    assert [r.output for r in history] == [b"fallback"]


@agent(name="review.gives_up_on_a_busy_model/v1")
def gives_up_on_a_busy_model(ctx, event: bytes) -> bytes:
    """Gives up at once (its own LlmCallError, for good) when the model is busy; answers
    "down" when it is down."""
    try:
        return ctx.llm([{"role": "user", "content": "a"}], model="m").text.encode()
    except LlmCallError as e:
        if e.retryable:
            raise LlmCallError("gave up: busy", model="m", retryable=False) from e
        return b"down"


def test_a_start_that_gave_up_on_a_busy_model_itself_is_no_divergence():
    # The start failed llm_failed on the agent's own error: the model's busy failure it
    # caught is the record's last, yet did not end the start.
    event = AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"e")
    history = record_history(
        gives_up_on_a_busy_model, [event], tools={}, approver=bool, llm_client=_Busy()
    )
    (record,) = history
    assert record.reason == "llm_failed"
    assert [f.retryable for f in record.model_failures] == [True]
    report, letters = backtest_key(b"k", history, gives_up_on_a_busy_model)
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_a_start_a_budget_question_ended_runs_when_its_last_question_was_asked():
    # Found by the generated test of the unchanged agent: run at its event's own time, the
    # second start's question expired a day before the raise the live key was granted.
    history = queued_behind_a_question_history()
    assert [r.reason for r in history] == ["budget_exceeded", "budget_exceeded"]
    first, second = history
    assert second.asked_at_ms == first.now_ms + 1_000 > second.event.event_time_ms
    report, letters = backtest_key(b"k", history, FUNCTION, BacktestOptions(config=RAISED_BY_SIX))
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


@agent(name="review.pays_after_what_the_model_said/v1")
def pays_after_what_the_model_said(ctx, event: bytes) -> bytes:
    """Asks the model twice, taking its failure (busy or down) for an answer, then pays with
    what it said. Re-run from the top on its resume."""
    said = []
    for _ in range(2):
        try:
            said.append(ctx.llm([{"role": "user", "content": "a"}], model="m").text)
        except LlmCallError as e:
            said.append("busy" if e.retryable else "down")
    ctx.call_tool("pay", {"said": said})
    return " ".join(said).encode()


def test_a_resume_that_caught_failures_after_a_failed_attempt_is_no_divergence():
    # Busy, down, busy, answered, in turn. The start: busy, down, pays. Its resume asks again
    # (a function agent runs from the top): busy, answered, so it pays otherwise and fails
    # (agent_contract); its retry: busy, down, as the start was, and completes. Each of the
    # candidate's attempts is offered its own live attempt's answers and failures.
    plan = ["busy", "down", "busy", OK]
    history = live_history(
        pays_after_what_the_model_said,
        b"k",
        [(T0, AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"e"))],
        RuntimeConfig(),
        PlanModel(plan),
        lambda intent: (1_000, OK),
    )
    assert [(r.reason, r.attempt, len(r.model_calls), len(r.model_failures)) for r in history] == [
        ("", 0, 0, 2),
        ("agent_contract", 0, 1, 1),
        ("", 1, 0, 2),
    ]
    report, letters = backtest_key(b"k", history, pays_after_what_the_model_said)
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_failures_caught_in_attempts_held_for_a_budget_question_are_no_divergence():
    # The records hold the held attempts' failures, numbered by attempt
    # (machine_budgets_test): the candidate's second attempt fails where the live one's did.
    history = held_while_busy_history()
    report, letters = backtest_key(
        b"k", history, asks_again_while_busy, BacktestOptions(config=RAISED_BY_SIX)
    )
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_a_raise_declined_after_an_attempt_that_caught_a_failure_is_no_divergence():
    history = held_while_busy_history(declined=2)
    assert [r.reason for r in history] == ["budget_exceeded"]
    report, letters = backtest_key(
        b"k", history, asks_again_while_busy, BacktestOptions(config=RAISED_BY_SIX)
    )
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_a_start_that_failed_on_the_model_under_the_largest_retry_limit_backtests():
    # The candidate's start counts config.retryable_resume_retries deferrals spent
    # (backtest.deferrals); its budget question stores them in Continuation.resume_failures,
    # a uint32: a larger limit is refused by RuntimeConfig (config_test), this one fits.
    history = raised_then_down_history()
    report, letters = backtest_key(
        b"k", history, FUNCTION, BacktestOptions(config=RETRIED_FOR_EVER)
    )
    assert letters == [] and not report.HasField("divergence")


def test_a_resume_whose_first_attempts_an_older_binary_recorded_is_no_divergence():
    history, config = upgraded_mid_resume_history()
    report, letters = backtest_key(b"k", history, FUNCTION, BacktestOptions(config=config))
    assert letters == []
    assert not report.HasField("divergence"), report.divergence.detail


def test_a_record_claiming_every_held_attempt_there_is_backtests_at_once():
    # A record's count of held attempts is not a number of steps to take: one at the largest
    # uint32 (the runtime saturates there) kept the backtest iterating for ever (review
    # rev46). Its calls are offered by the attempts they name.
    from beam_agents.runtime.budget import UINT32_MAX

    history = held_while_busy_history()
    (record,) = history
    record.held_attempts = UINT32_MAX
    report, letters = backtest_key(
        b"k", history, asks_again_while_busy, BacktestOptions(config=RAISED_BY_SIX)
    )
    assert letters == [] and report is not None
