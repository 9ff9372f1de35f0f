"""The shadow's DoFn driven record by record over generated deliveries of real recorded
histories (any order, copies, failed resumes retried live), against state cells that hand back
the very object they stored, as Beam's portable harness does. Whatever the delivery, each key
gets the backtest's divergence of its whole history, each live activation compared is spanned
once, nothing read from state is changed in place, and nothing is left waiting."""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import json
import random
import sys

import pytest
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.timestamp import Timestamp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_agents._protos import ActivationRecord, AgentEnvelope
from beam_agents.errors import LlmCallError
from beam_agents.examples.support_triage import TOOLS, scripted_model, ticket, triage
from beam_agents.ops.backtest import (
    FEWER,
    NO_LONGER,
    BacktestOptions,
    backtest_key,
    tool_changes,
)
from beam_agents.ops.shadow import DEFAULT_WAIT_MS, TRACES, _Shadow
from beam_agents.runtime import (
    ERRORS,
    INTENTS,
    RECORDS,
    LlmResponse,
    RuntimeConfig,
    ScriptedLlmClient,
    agent,
)
from beam_agents.runtime.budget import BUDGET_TOOL, Budget, OnBudget
from beam_agents.runtime.config import AtDeadline, DeadlinePolicy
from beam_agents.runtime.function_agent import FunctionAgent
from beam_agents.runtime.key_driver import KeyDriver, recording_machine
from beam_agents.runtime.machine_state import due_at, timer_ms
from beam_agents.testing.live_history import OK, PlanModel, answer_to, live_history
from beam_agents.testing.recorded_history import (
    T0,
    FailsOnce,
    gold_only_refunds,
    record_history,
    triage_approver,
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
    asks_twice,
    calls_per_event,
    counter,
    declined_payment,
    expired_then_answered_history,
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
from beam_agents.testing.simulation_agents import FUNCTION, StepAgent


class _Cell:
    """A ReadModifyWrite cell: a read hands back the very object the last write stored."""

    def __init__(self) -> None:
        self.value = None

    def read(self):
        return self.value

    def write(self, value) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class _Bag:
    def __init__(self) -> None:
        self.values: list = []

    def read(self):
        return self.values

    def add(self, value) -> None:
        self.values.append(value)

    def clear(self) -> None:
        self.values = []


class _Timer:
    def __init__(self) -> None:
        self.at: Timestamp | None = None

    def set(self, at) -> None:
        self.at = at

    def clear(self) -> None:
        self.at = None


_CELLS = ("seq", "memory", "cache", "continuation", "last", "report", "waiting_since", "done")
_BAGS = ("pending", "waiting")


def _handed(state: dict) -> list[tuple[object, bytes]]:
    """Every message the cells hold, with its bytes now."""
    held = [state[n].value for n in _CELLS] + [v for n in _BAGS for v in state[n].values]
    return [(m, m.SerializeToString()) for m in held if hasattr(m, "SerializeToString")]


def _deliver(candidate, records, config: RuntimeConfig | None = None) -> dict:
    """Feeds `records` (key, record) one at a time to the DoFn over the state doubles, then
    fires the give-up timer of each key that set one; the outputs by tag."""
    fn = _Shadow(candidate, 60_000, config or RuntimeConfig())
    states: dict[bytes, dict] = {}
    found = {"reports": [], TRACES: [], ERRORS: []}

    def take(outputs):
        for output in outputs:
            if isinstance(output, TaggedOutput):
                found[output.tag].append(output.value)
            else:
                found["reports"].append(output)

    for key, record in records:
        state = states.setdefault(
            key,
            {
                **{n: _Cell() for n in _CELLS},
                **{n: _Bag() for n in _BAGS},
                "give_up": _Timer(),
                "ttl": _Timer(),
            },
        )
        before = _handed(state)
        take(
            fn.process(
                (key, record.SerializeToString()),
                timestamp=Timestamp(micros=record.now_ms * 1000),
                **{n: state[n] for n in (*_CELLS, *_BAGS, "give_up", "ttl")},
            )
        )
        for message, data in before:
            assert message.SerializeToString() == data, "a message read from state was changed"
    for key, state in states.items():
        # The watermark at the end of time: each give-up timer set fires, in turn.
        for _ in range(len(records) + 1):
            if state["give_up"].at is None:
                break
            fired, state["give_up"].at = state["give_up"].at, None
            timers = {n: state[n] for n in (*_CELLS, *_BAGS, "give_up", "ttl")}
            take(fn.at_give_up(key=key, fired=fired, **timers))
    return found


def _histories(count: int, failing: int):
    """Recorded triage histories by key: `count` tickets, the first `failing` of them with a
    model that failed once live (their resume retried on its timer)."""
    tickets = triage_tickets(count)
    records = []
    for index, event in enumerate(tickets):
        model = FailsOnce(scripted_model()) if index < failing else scripted_model()
        records += record_history(
            triage, [event], tools=TOOLS, approver=triage_approver, llm_client=model
        )
    by_key = {}
    for record in records:
        by_key.setdefault(record.entity_key, []).append(record)
    return by_key


_BY_KEY = _histories(12, 4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_delivery_of_the_live_records_is_shadowed_as_the_backtest_runs_the_history(data):
    keys = data.draw(
        st.lists(st.sampled_from(sorted(_BY_KEY)), min_size=1, max_size=4, unique=True)
    )
    delivered = []
    for key in keys:
        records = _BY_KEY[key]
        copies = data.draw(st.lists(st.sampled_from(records), max_size=3))
        delivered += [(key, r) for r in [*records, *copies]]
    delivered = data.draw(st.permutations(delivered))
    found = _deliver(gold_only_refunds, delivered)
    assert found[ERRORS] == []
    reports = {key: report for key, report in found["reports"]}
    for key in keys:
        expected, _ = backtest_key(key, _BY_KEY[key], gold_only_refunds)
        if expected.HasField("divergence"):
            assert reports[key].divergence == expected.divergence
        else:
            assert key not in reports
        spans = [(s.seq, s.step_index) for k, s in found[TRACES] if k == key]
        assert len(spans) == len(set(spans)), "an activation spanned twice"
        # One span per activation compared: up to the divergent one, or all of them.
        compared = expected.divergence.activation + 1 if key in reports else None
        assert len(spans) == (compared or expected.baseline_activations)


def test_a_resume_that_failed_live_and_was_retried_is_no_divergence():
    key = sorted(_BY_KEY)[0]
    records = _BY_KEY[key]
    assert any(r.reason == "llm_failed" for r in records)
    # The retry delivered first, then its failed attempt, then the rest.
    failed = next(r for r in records if r.reason == "llm_failed")
    order = sorted(records, key=lambda r: (r is not failed, r.now_ms), reverse=True)
    found = _deliver(triage, [(key, r) for r in order])
    assert found["reports"] == [] and found[ERRORS] == []
    assert len(found[TRACES]) == len(records) - 1  # the failed attempt is not compared


def test_a_key_recorded_from_its_middle_is_one_dead_letter_not_a_wait_forever():
    events = [
        AgentEnvelope(entity_key=b"k", event_time_ms=T0 + n * 60_000, external_event=b"e%d" % n)
        for n in range(2)
    ]
    history = record_history(
        triage, events, tools=TOOLS, approver=triage_approver, llm_client=scripted_model()
    )
    second = [r for r in history if r.seq != history[0].seq]
    found = _deliver(triage, [(b"k", r) for r in second])
    assert found["reports"] == [] and found[TRACES] == []
    (letter,) = [letter for _, letter in found[ERRORS]]
    assert letter.reason == "history_incomplete" and "the key's first start" in letter.detail


#: A TTL of a minute: `counter`'s key, idle ten minutes between its two events, is wiped.
_TTL_OF_A_MINUTE = RuntimeConfig(ttl_ms=60_000)


def _wiped_between_two_events():
    """(records, the wiped key's TTL time) of `counter`'s key, live, wiped between its events
    (the counter counts from 1 again)."""
    live = KeyDriver(recording_machine(counter, None, _TTL_OF_A_MINUTE), b"k")
    records = []
    for n in range(2):
        live.schedule(AgentEnvelope(entity_key=b"k", event_time_ms=T0 + n * 600_000,
                                    external_event=b"e%d" % n))  # fmt: skip
        records += [value for tag, value in live.step() if tag == RECORDS]
        if n == 0:
            idle_until = live.ttl_at
            live.fire_ttl(idle_until)
    assert [r.output for r in records] == [b"event 1 of this key"] * 2
    return records, idle_until


def test_a_key_idle_past_its_ttl_is_wiped_in_the_shadow_as_live_and_shadowed_on():
    records, idle_until = _wiped_between_two_events()
    fn = _Shadow(counter, 60_000, _TTL_OF_A_MINUTE)
    state = {
        **{n: _Cell() for n in _CELLS},
        **{n: _Bag() for n in _BAGS},
        "give_up": _Timer(),
        "ttl": _Timer(),
    }
    cells = {n: state[n] for n in (*_CELLS, *_BAGS)}

    def deliver(record):
        return list(
            fn.process(
                (b"k", record.SerializeToString()),
                timestamp=Timestamp(micros=record.now_ms * 1000),
                give_up=state["give_up"],
                ttl=state["ttl"],
                **cells,
            )
        )

    assert [o.tag for o in deliver(records[0])] == [TRACES]
    assert state["ttl"].at == Timestamp(micros=idle_until * 1000)
    assert state["memory"].value is not None
    timer = {n: cells[n] for n in ("seq", "memory", "cache", "continuation", "pending", "last")}
    fn.at_ttl(key=b"k", fired=state["ttl"].at, ttl=state["ttl"], **timer)
    assert state["memory"].value is None and not state["last"].value.intents
    assert state["seq"].value == records[0].seq  # the seq outlives the TTL, as live
    # The next start of the key is shadowed on, from a wiped candidate: no divergence.
    assert [o.tag for o in deliver(records[1])] == [TRACES]
    assert state["waiting"].values == [] and state["done"].value is None


# -- a model busy live, a budget raised live, a key that goes on (rev42) -----------------------


def test_a_start_whose_model_was_busy_live_is_no_divergence_in_the_shadow():
    history = record_history(two_calls, ONE_EVENT, tools={}, approver=bool, llm_client=BusyOnce(2))
    found = _deliver(two_calls, [(b"k", r) for r in history])
    assert found["reports"] == [] and found[ERRORS] == []


def test_a_budget_raised_live_is_no_divergence_in_the_shadow_under_the_live_config():
    model = ScriptedLlmClient(lambda request: LlmResponse("ok", "m", 10, 5))
    history = record_history(
        two_calls, ONE_EVENT, tools={}, approver=bool, llm_client=model, config=ASKING
    )
    found = _deliver(two_calls, [(b"k", r) for r in history], ASKING)
    assert found["reports"] == [] and found[ERRORS] == []


def test_the_shadows_report_of_a_key_that_goes_on_says_stopped_as_the_backtests():
    # A silver customer's refund (approval asked live, not by the candidate), then a question.
    events = [
        AgentEnvelope(
            entity_key=b"k",
            event_time_ms=T0 + n * 60_000,
            external_event=ticket(f"t{n}", "c-2", text),
        )
        for n, text in enumerate(["I want a refund for my order", "How do I change my address?"])
    ]
    history = record_history(
        triage, events, tools=TOOLS, approver=triage_approver, llm_client=scripted_model()
    )
    expected, _ = backtest_key(b"k", history, gold_only_refunds)
    ((_, report),) = _deliver(gold_only_refunds, [(b"k", r) for r in history])["reports"]
    assert report.divergence == expected.divergence
    assert report.stopped == expected.stopped
    # Its counts are what it saw up to the divergence, the backtest's the whole recording's:
    # neither says a tool is no longer called when its run stopped short.
    for changes in (tool_changes(report), tool_changes(expected)):
        assert not {NO_LONGER, FEWER} & set(changes.values()), changes


def test_a_shadowed_key_that_went_quiet_leaves_no_state_without_a_timer_to_clear_it():
    key = sorted(_BY_KEY)[-1]  # a ticket whose model never failed: nothing waits
    fn = _Shadow(triage, 60_000, RuntimeConfig(ttl_ms=60_000))
    # Every state cell and timer the DoFn's process takes, whatever they are named.
    parameters = inspect.signature(fn.process).parameters.items()
    state = {
        name: _Bag() if "Bag" in type(parameter.default.state_spec).__name__ else _Cell()
        for name, parameter in parameters
        if type(parameter.default).__name__ == "_StateDoFnParam"
    }
    timers = {
        name: _Timer()
        for name, parameter in parameters
        if type(parameter.default).__name__ == "_TimerDoFnParam"
    }
    for record in _BY_KEY[key]:
        list(
            fn.process(
                (key, record.SerializeToString()),
                timestamp=Timestamp(micros=record.now_ms * 1000),
                **state,
                **timers,
            )
        )
    held = [n for n, cell in state.items() if getattr(cell, "value", None) is not None]
    held += [n for n, bag in state.items() if getattr(bag, "values", None)]
    # The live key is wiped a TTL after its last activity; the shadow's copy must go too.
    assert held == [] or any(timer.at is not None for timer in timers.values()), held


class _BusyFor:
    """The example's model, busy (its client's retries spent) for its first `calls` calls."""

    def __init__(self, calls: int) -> None:
        self._left = calls
        self._inner = scripted_model()

    def complete(self, request):
        if self._left:
            self._left -= 1
            raise LlmCallError("overloaded", model=request.model, retryable=True)
        return self._inner.complete(request)


def test_a_resume_retried_live_for_longer_than_wait_ms_is_still_shadowed():
    history = record_history(
        triage, triage_tickets(1), tools=TOOLS, approver=triage_approver, llm_client=_BusyFor(8)
    )
    key = history[0].entity_key
    retried = [r.now_ms for r in history if r.reason == "llm_failed"]
    # Each attempt came within the live backoff (at most an hour) of the one before it.
    assert len(retried) == 8 and retried[-1] - retried[0] > DEFAULT_WAIT_MS
    fn = _Shadow(triage, DEFAULT_WAIT_MS, RuntimeConfig())
    state = {
        **{n: _Cell() for n in _CELLS},
        **{n: _Bag() for n in _BAGS},
        "give_up": _Timer(),
        "ttl": _Timer(),
    }
    found = []
    for record in history:
        # In order, as the live job emitted them: the watermark reaches each record's time
        # (the live retry timer holds it there) and fires the shadow's timers before it.
        at = Timestamp(micros=record.now_ms * 1000)
        if state["give_up"].at is not None and state["give_up"].at < at:
            fired, state["give_up"].at = state["give_up"].at, None
            cells = {n: state[n] for n in (*_CELLS, *_BAGS, "give_up", "ttl")}
            found += fn.at_give_up(key=key, fired=fired, **cells)
        cells = {n: state[n] for n in (*_CELLS, *_BAGS, "give_up", "ttl")}
        found += fn.process((key, record.SerializeToString()), timestamp=at, **cells)
    letters = [o.value[1].reason for o in found if getattr(o, "tag", None) == ERRORS]
    spans = [o for o in found if getattr(o, "tag", None) == TRACES]
    assert letters == [] and len(spans) == len(history) - len(retried)


@agent(name="review.lookup_then_model/v1")
def lookup_then_model(ctx, event: bytes) -> bytes:
    found = ctx.call_tool("lookup", {"q": "x"}).payload
    return ctx.llm([{"role": "user", "content": "classify"}], model="m").text.encode() + found


@agent(name="review.model_then_lookup/v2")
def model_then_lookup(ctx, event: bytes) -> bytes:
    """The same request and call, the request moved before the call."""
    answer = ctx.llm([{"role": "user", "content": "classify"}], model="m").text.encode()
    return answer + ctx.call_tool("lookup", {"q": "x"}).payload


def test_a_request_moved_to_an_earlier_activation_diverges_in_the_shadow_as_in_the_backtest():
    history = record_history(
        lookup_then_model,
        ONE_EVENT,
        tools={"lookup": lambda args, intent: b"found"},
        approver=bool,
        llm_client=ScriptedLlmClient(lambda request: "ok"),
    )
    expected, _ = backtest_key(b"k", history, model_then_lookup)
    found = _deliver(model_then_lookup, [(b"k", r) for r in history])
    divergences = [report.divergence for _, report in found["reports"]]
    assert divergences == ([expected.divergence] if expected.HasField("divergence") else [])


_THREE_CALLS = [AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"3")]


def test_a_raised_start_whose_model_was_then_busy_live_is_no_divergence_in_the_shadow():
    model = BusyOnce(3)
    history = record_history(
        calls_per_event, _THREE_CALLS, tools={}, approver=bool, llm_client=model, config=ASKING
    )
    assert model.calls == 4 and [r.reason for r in history] == [""]
    found = _deliver(calls_per_event, [(b"k", r) for r in history], ASKING)
    assert found["reports"] == [] and found[ERRORS] == []


def test_a_start_granted_many_budget_raises_live_is_no_divergence_in_the_shadow():
    # A raise of one token per approval: the start's third call asks until ten were granted.
    config = RuntimeConfig(budget=Budget(key_tokens=20, on_exceed=OnBudget.ASK, raise_tokens=1))
    model = ScriptedLlmClient(lambda request: LlmResponse("ok", "m", 10, 5))
    history = record_history(
        calls_per_event, _THREE_CALLS, tools={}, approver=bool, llm_client=model, config=config
    )
    assert [r.reason for r in history] == [""]
    found = _deliver(calls_per_event, [(b"k", r) for r in history], config)
    assert found["reports"] == [] and found[ERRORS] == []


def test_a_start_granted_a_raise_then_declined_live_is_no_divergence_in_the_shadow():
    config, history = raised_then_declined()
    found = _deliver(calls_per_event, [(b"k", r) for r in history], config)
    assert found["reports"] == [] and found[ERRORS] == []


def test_a_budget_question_the_live_key_never_asked_is_the_backtests_divergence_in_the_shadow():
    model = ScriptedLlmClient(lambda request: LlmResponse("ok", "m", 10, 5))
    # Live: no budget; the candidate runs under one that asks a person past 20 tokens.
    history = record_history(
        calls_per_event, _THREE_CALLS, tools={}, approver=bool, llm_client=model
    )
    expected, _ = backtest_key(b"k", history, calls_per_event, BacktestOptions(config=ASKING))
    assert expected.divergence.kind == expected.divergence.KIND_APPROVAL
    ((_, report),) = _deliver(calls_per_event, [(b"k", r) for r in history], ASKING)["reports"]
    assert report.divergence.kind == expected.divergence.kind
    assert report.divergence.detail == expected.divergence.detail


def test_an_event_that_waited_in_a_mailbox_live_runs_when_it_was_drained_in_the_shadow():
    history = queued_history()
    assert history[2].now_ms > history[2].event.event_time_ms  # it ran when drained
    found = _deliver(Stamped(), [(b"k", r) for r in history])
    assert found["reports"] == [] and found[ERRORS] == []


def test_an_approval_no_one_answered_live_is_no_divergence_in_the_shadow():
    history = unanswered_history(asks_a_person, ONE_EVENT, SHORT_DEADLINES)
    found = _deliver(asks_a_person, [(b"k", r) for r in history], SHORT_DEADLINES)
    assert found["reports"] == [] and found[ERRORS] == []


def test_a_resume_that_raised_on_every_retry_live_is_no_divergence_in_the_shadow():
    history = record_history(
        pays, ONE_EVENT, tools={"pay": declined_payment}, approver=bool, llm_client=None
    )
    found = _deliver(pays, [(b"k", r) for r in history])
    assert found["reports"] == [] and found[ERRORS] == []


def test_an_event_sent_again_after_its_start_failed_live_is_shadowed_as_live():
    event = AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"1")
    history = record_history(
        calls_per_event, [event, event], tools={}, approver=bool, llm_client=DownOnFirstCall()
    )
    found = _deliver(calls_per_event, [(b"k", r) for r in history])
    assert found["reports"] == [] and found[ERRORS] == []
    assert len(found[TRACES]) == 2


def test_a_resume_declined_a_raise_live_is_shadowed_not_waited_on_for_a_retry():
    # The resume's model call would pass the key's 5 tokens: a person is asked, and declines.
    config = RuntimeConfig(budget=Budget(key_tokens=5, on_exceed=OnBudget.ASK, raise_tokens=10))
    history = record_history(
        lookup_then_model,
        ONE_EVENT,
        tools={"lookup": lambda args, intent: b"found"},
        approver=lambda intent: False,
        llm_client=ScriptedLlmClient(lambda request: LlmResponse("ok", "m", 20, 10)),
        config=config,
    )
    assert [r.reason for r in history] == ["", "budget_exceeded"]
    found = _deliver(lookup_then_model, [(b"k", r) for r in history], config)
    assert found["reports"] == [] and found[ERRORS] == []
    assert len(found[TRACES]) == 2


def test_a_resume_that_raised_on_every_retry_live_is_no_divergence_in_any_order_of_its_records():
    history = record_history(
        pays, ONE_EVENT, tools={"pay": declined_payment}, approver=bool, llm_client=None
    )
    # The start, then the resume that ended it all, then (late) the attempts before it.
    order = [history[0], history[-1], *history[1:-1]]
    found = _deliver(pays, [(b"k", r) for r in order])
    assert found["reports"] == [] and found[ERRORS] == []


_DEADLINE_ENDINGS = {
    "escalated, no one answered": (ESCALATING, None, 3_000_000),
    "escalated, declined": (ESCALATING, False, 3_000_000),
    "escalated, kept waiting": (ESCALATING, True, 3_000_000),
    "dead-lettered": (DEAD_LETTERING, None, 3_000_000),
    "dead-lettered, an event queued": (DEAD_LETTERING, None, 600_000),
}


@pytest.mark.parametrize("ending", sorted(_DEADLINE_ENDINGS))
def test_a_suspension_its_deadline_policy_ended_live_is_no_divergence_in_the_shadow(ending):
    config, escalation, later_ms = _DEADLINE_ENDINGS[ending]
    later = AgentEnvelope(entity_key=b"k", event_time_ms=T0 + later_ms, external_event=b"later")
    history = unanswered_history(
        asks_a_person, ONE_EVENT, config, escalation=escalation, events_at=[later]
    )
    found = _deliver(asks_a_person, [(b"k", r) for r in history], config)
    assert [(letter.reason, letter.detail) for _, letter in found[ERRORS]] == []
    assert found["reports"] == []
    assert len(found[TRACES]) == len(history)


class _DownFor:
    """A model down (its client's retries spent) for its first `calls` requests."""

    def __init__(self, calls: int) -> None:
        self._left = calls

    def complete(self, request):
        if self._left:
            self._left -= 1
            raise LlmCallError("down", model=request.model, retryable=False)
        return LlmResponse("ok", "m", 10, 5)


def _down_through_a_resume() -> list[ActivationRecord]:
    """The model was down through the resume's retries (resume_failed), then back for the
    key's next event."""
    events = [
        AgentEnvelope(entity_key=b"k", event_time_ms=T0 + n * 3_600_000, external_event=b"e")
        for n in range(2)
    ]
    history = record_history(
        lookup_then_model,
        events,
        tools={"lookup": lambda args, intent: b"found"},
        approver=bool,
        llm_client=_DownFor(4),
    )
    assert [r.reason for r in history if r.reason][-1] == "resume_failed"
    return history


def test_a_resume_the_model_failed_for_good_live_is_no_divergence_in_the_shadow():
    # The records hold the failed requests: the candidate's fail as the live ones did.
    history = _down_through_a_resume()
    expected, letters = backtest_key(b"k", history, lookup_then_model)
    assert letters == [] and not expected.stopped and not expected.HasField("divergence")
    found = _deliver(lookup_then_model, [(b"k", r) for r in history])
    assert found[ERRORS] == [] and found["reports"] == []


def test_a_resume_the_model_failed_for_good_live_stops_the_shadow_as_the_backtest_not_a_wait():
    # Records that do not hold the request the model failed on (written before they held
    # failed calls): the backtest stops the key's run there (stopped, no divergence), and so
    # must the shadow, not wait for a resume of its candidate's that will never come and
    # dead-letter the key history_incomplete.
    history = _down_through_a_resume()
    for record in history:
        del record.model_failures[:]
    expected, letters = backtest_key(b"k", history, lookup_then_model)
    assert letters == [] and expected.stopped and not expected.HasField("divergence")
    found = _deliver(lookup_then_model, [(b"k", r) for r in history])
    assert found[ERRORS] == []
    ((_, report),) = found["reports"]
    assert report.stopped and not report.HasField("divergence")


def test_a_key_idle_past_its_ttl_live_is_wiped_in_the_shadow_when_its_records_come_reversed():
    # The later start's record comes first and waits; the earlier one releases it in the same
    # bundle, before any watermark could fire the candidate's TTL between them. The live key
    # was wiped between them (the counter counts from 1 again), so the candidate must be too.
    records, _ = _wiped_between_two_events()
    found = _deliver(counter, [(b"k", r) for r in reversed(records)], _TTL_OF_A_MINUTE)
    assert found["reports"] == [] and found[ERRORS] == []


def test_a_request_made_twice_in_a_start_held_for_a_raise_is_no_divergence_in_the_shadow():
    history = asked_twice_history()
    found = _deliver(asks_twice, [(b"k", r) for r in history], RAISED_BY_SIX)
    assert found["reports"] == [] and found[ERRORS] == []


def test_a_record_keyed_under_another_key_is_a_dead_letter_not_a_divergence():
    # The shadow's input re-keyed (by customer, by a constant): one key's shadow would run the
    # records of many live keys as one history and report a divergence no candidate made.
    key = sorted(_BY_KEY)[-1]
    records = _BY_KEY[key]
    found = _deliver(triage, [(b"all tickets", r) for r in records])
    assert found["reports"] == [] and found[TRACES] == []
    letters = [letter for _, letter in found[ERRORS]]
    assert [letter.reason for letter in letters] == ["recording_undecodable"] * len(records)
    assert "keyed" in letters[0].detail


def test_parallel_calls_answered_out_of_their_order_live_are_no_divergence_in_the_shadow():
    history = pair_history()
    found = _deliver(StampedPair(), [(b"k", r) for r in history])
    assert found["reports"] == [] and found[ERRORS] == []


def test_a_request_moved_to_an_earlier_activation_past_a_budget_asks_a_person_now():
    # Live, the resume's model call passed the key's 5 tokens and a person raised them. The
    # candidate makes the call in its start: a question the live start was not asked (the
    # same id: a budget question is numbered by its key, seq and raises so far), which the
    # raise granted to the later activation must not answer.
    config = RuntimeConfig(budget=Budget(key_tokens=5, on_exceed=OnBudget.ASK, raise_tokens=100))
    history = record_history(
        lookup_then_model,
        ONE_EVENT,
        tools={"lookup": lambda args, intent: b"found"},
        approver=bool,
        llm_client=ScriptedLlmClient(lambda request: "ok"),
        config=config,
    )
    assert [r.outcome for r in history][-1] == history[-1].OUTCOME_COMPLETED
    expected, _ = backtest_key(b"k", history, model_then_lookup, BacktestOptions(config=config))
    assert expected.divergence.kind == expected.divergence.KIND_APPROVAL
    found = _deliver(model_then_lookup, [(b"k", r) for r in history], config)
    assert [report.divergence for _, report in found["reports"]] == [expected.divergence]


@agent(name="review.exits/v2")
def exits(ctx, event: bytes) -> bytes:
    sys.exit("usage: helper [-h]")


def test_a_candidate_that_calls_sys_exit_is_the_backtests_divergence_in_the_shadow():
    key = sorted(_BY_KEY)[-1]
    expected, _ = backtest_key(key, _BY_KEY[key], exits)
    found = _deliver(exits, [(key, r) for r in _BY_KEY[key]])
    assert [report.divergence for _, report in found["reports"]] == [expected.divergence]


def test_an_answer_stamped_before_the_escalation_it_came_after_is_no_divergence_in_the_shadow():
    # A backlog: the watermark passed the deadline, which escalated (the suspension's step
    # moved on), and then the answer came, stamped five seconds after the event. The resume's
    # record is at the escalated step but stamped before the deadline it came after.
    driver = KeyDriver(recording_machine(asks_a_person, None, ESCALATING), b"k")
    driver.schedule(ONE_EVENT[0])
    history = [value for tag, value in driver.step() if tag == RECORDS]
    (asked,) = history[0].intents
    driver.fire_deadline(driver.state.continuation.deadline_ms)
    answer = AgentEnvelope(entity_key=b"k", event_time_ms=T0 + 5_000)
    answer.approval.intent_id = asked.intent_id
    answer.approval.approved = True
    driver.schedule(answer)
    history += [value for tag, value in driver.step() if tag == RECORDS]
    assert [(r.first_step, r.output) for r in history] == [(0, b""), (2, b"approved")]
    expected, _ = backtest_key(b"k", history, asks_a_person, BacktestOptions(config=ESCALATING))
    assert not expected.HasField("divergence")
    found = _deliver(asks_a_person, [(b"k", r) for r in history], ESCALATING)
    assert found["reports"] == [] and found[ERRORS] == []


_FAILED_ENDINGS = {"resume_failed": RETRIED_ONCE, "budget_exceeded": RAISED_BY_SIX}


@pytest.mark.parametrize("ending", sorted(_FAILED_ENDINGS))
def test_a_resume_that_failed_for_good_after_an_attempt_is_no_divergence_in_any_order(ending):
    # The resume made a model call and raised; its retry asked the model afresh (a failure of
    # the agent's keeps no answer) and ended the suspension: its retries spent, or its budget
    # question declined. Its record delivered before the attempt's, the shadow compared it
    # at once and missed the attempt's answer: a divergence of the unchanged agent. It now
    # waits for the attempts before it.
    config = _FAILED_ENDINGS[ending]
    history = raised_on_a_failed_payment(config)
    assert [r.reason for r in history] == ["", "agent_raised", ending]
    for order in itertools.permutations(history):
        found = _deliver(FUNCTION, [(b"k", r) for r in order], config)
        assert found["reports"] == [] and found[ERRORS] == [], [r.reason for r in order]
        assert len(found[TRACES]) == 2  # the start and the ending; the attempt is not compared


@pytest.mark.parametrize("ending", sorted(_FAILED_ENDINGS))
def test_a_changed_agent_on_a_resume_that_failed_for_good_diverges_as_in_the_backtest(ending):
    # The ending comes first and the candidate departs on it (a divergence, or, against a
    # resume_failed, which a model failure ends too, a stop: its request is one the recording
    # lacks): the report waits for the attempt, then says what the backtest, holding every
    # record, says.
    config = _FAILED_ENDINGS[ending]
    history = raised_on_a_failed_payment(config)
    candidate = _changed(FUNCTION, "new prompt")
    expected, _ = backtest_key(b"k", history, candidate, BacktestOptions(config=config))
    assert expected.HasField("divergence") != (ending == "resume_failed")
    order = [history[0], history[2], history[1]]
    found = _deliver(candidate, [(b"k", r) for r in order], config)
    assert [r.divergence for _, r in found["reports"]] == [expected.divergence]
    assert found[ERRORS] == []


def test_a_start_drained_when_a_failure_ended_a_long_suspension_is_no_ttl_wipe_in_the_shadow():
    # Live: the key suspends on a payment no one answers, an event queues meanwhile; a day on
    # the deadline's EXPIRED makes the resume raise until its retries are spent, and the queued
    # start runs at once, in the same bundle: no idle time, no TTL. The shadow fired the
    # candidate's TTL (two hours, counted from the suspension) before that start, wiping the
    # count the live key kept: "completed -> completed" in every order of the records.
    config = RuntimeConfig(ttl_ms=2 * 3_600_000)
    programs = [[["count"]], [["call", "pay"], ["raise_unless_ok"]], [["count"]]]
    events = [
        (T0, AgentEnvelope(entity_key=b"k", event_time_ms=T0,
                           external_event=json.dumps({"nonce": n, "ops": ops}).encode()))
        for n, ops in enumerate(programs)
    ]  # fmt: skip
    history = live_history(FUNCTION, b"k", events, config, PlanModel([]), lambda i: (None, OK))
    assert [r.reason for r in history] == ["", "", *["agent_raised"] * 3, "resume_failed", ""]
    assert history[-1].now_ms == history[-2].now_ms > history[-1].event.event_time_ms
    report, _ = backtest_key(b"k", history, FUNCTION, BacktestOptions(config=config))
    assert not report.HasField("divergence")
    for seed in range(4):
        found = _deliver(FUNCTION, _delivered(history, seed), config)
        assert found["reports"] == [] and found[ERRORS] == []


def test_a_start_queued_behind_a_start_deferred_past_the_ttl_is_no_ttl_wipe():
    # Found by the generated test: the model stays busy, so the second event's start is
    # deferred, retried for five hours and fails for good; the third event, queued behind
    # it, runs at once. The backtest fired the candidate's TTL (two hours from the first
    # event) before that start, as if the live key had sat idle: "completed -> completed".
    config = RuntimeConfig(ttl_ms=2 * 3_600_000)
    programs = [[["count"]], [["llm", "p0"]], [["count"]]]
    events = [
        (T0, AgentEnvelope(entity_key=b"k", event_time_ms=T0,
                           external_event=json.dumps({"nonce": n, "ops": ops}).encode()))
        for n, ops in enumerate(programs)
    ]  # fmt: skip
    history = live_history(
        FUNCTION, b"k", events, config, PlanModel(["busy"]), lambda i: (1_000, OK)
    )
    assert [r.reason for r in history] == ["", "llm_failed", ""]
    assert history[-1].now_ms - T0 > config.ttl_ms
    report, _ = backtest_key(b"k", history, FUNCTION, BacktestOptions(config=config))
    assert not report.HasField("divergence"), report.divergence.detail
    for seed in range(4):
        found = _deliver(FUNCTION, _delivered(history, seed), config)
        assert found["reports"] == [] and found[ERRORS] == []


@pytest.mark.parametrize("agent", [FUNCTION, StepAgent()], ids=["function", "step"])
def test_a_resume_run_again_on_the_genuine_answer_that_replaced_its_expired_is_no_divergence(
    agent,
):
    # Live: the deadline resumed the agent with EXPIRED, it raised; the genuine answer, on
    # time, came before the retry and the resume ran on it at once. The candidate's retry
    # ran first, on EXPIRED again: "completed -> failed agent_raised".
    history = expired_then_answered_history(agent)
    assert [(r.reason, r.attempt) for r in history] == [("", 0), ("agent_raised", 0), ("", 1)]
    report, letters = backtest_key(b"k", history, agent)
    assert letters == [] and not report.HasField("divergence"), report.divergence.detail
    for seed in range(4):
        found = _deliver(agent, _delivered(history, seed), RuntimeConfig())
        assert found["reports"] == [] and found[ERRORS] == []


def test_a_start_queued_hours_before_a_long_suspension_failed_is_no_ttl_wipe_in_the_shadow():
    # Found by the generated test: as above, but the queued event is stamped five hours in,
    # past the two-hour TTL counted from the memory's mark (the resume's retries a day on do
    # not move it). The shadow fired the candidate's TTL at the event's time, before the
    # retries the live key ran after it: "completed -> completed" in every order.
    config = RuntimeConfig(ttl_ms=2 * 3_600_000)
    programs = [(T0, [["count"]]), (T0, [["call", "pay"], ["call", "pay"], ["raise_unless_ok"]])]
    programs.append((T0 + 5 * 3_600_000, [["count"]]))
    events = [
        (at, AgentEnvelope(entity_key=b"k", event_time_ms=at,
                           external_event=json.dumps({"nonce": n, "ops": ops}).encode()))
        for n, (at, ops) in enumerate(programs)
    ]  # fmt: skip
    planned = iter([(1_000, OK), (None, OK)] * 100)
    history = live_history(
        FUNCTION, b"k", events, config, PlanModel([]), lambda intent: next(planned)
    )
    assert history[-2].reason == "resume_failed" and history[-1].HasField("event")
    _replays(FUNCTION, history, config)


# -- attempts a budget question held up (review rev45) -------------------------------------------


class _Scripted:
    """A model that gives each call of a prompt what `plan` says in turn ("busy", "down",
    "busy-billed": busy with 30 tokens billed; "ok" once run out)."""

    def __init__(self, plan) -> None:
        self.plan = {prompt: list(outcomes) for prompt, outcomes in plan.items()}
        self.calls = 0

    def complete(self, request):
        prompt = request.messages[-1]["content"]
        what = self.plan[prompt].pop(0) if self.plan.get(prompt) else OK
        self.calls += 1
        if what != OK:
            billed = 30 if what == "busy-billed" else 0
            retryable = what.startswith("busy")
            raise LlmCallError(what, model=request.model, retryable=retryable, input_tokens=billed)
        return LlmResponse(f"{prompt}#{self.calls}", request.model, 3, 2)


def _ask(ctx, prompt: str) -> str:
    return ctx.llm([{"role": "user", "content": prompt}], model="m").text


@agent(name="review.catches_z/v1")
def _catches_z(ctx, event: bytes) -> bytes:
    x, y = _ask(ctx, "x"), _ask(ctx, "y")
    try:
        z = _ask(ctx, "z")
    except LlmCallError:
        z = "failed"
    return f"{x} {y} {z}".encode()


@agent(name="review.held_then_failed/v1")
def _held_then_failed(ctx, event: bytes) -> bytes:
    ctx.call_tool("lookup", {})
    try:
        x = _ask(ctx, "x")
    except LlmCallError as e:
        if not e.retryable:
            raise
        x = "busy"
    return f"{x} {_ask(ctx, 'a')} {_ask(ctx, 'b')}".encode()


class _Live:
    """A key's live run, driven input by input: its records and intents."""

    def __init__(self, agent_, model, config) -> None:
        self.driver = KeyDriver(recording_machine(agent_, model, config), b"k")
        self.records, self.intents = [], []

    def take(self, outputs) -> None:
        for tag, value in outputs:
            if tag == RECORDS:
                self.records.append(value)
            elif tag == INTENTS:
                self.intents.append(value)

    def send(self, envelope) -> None:
        self.driver.schedule(envelope)
        self.take(self.driver.step())

    def fire(self) -> None:
        self.take(self.driver.fire_deadline(timer_ms(due_at(self.driver.state.continuation))))


def _replays(agent_, records, config) -> None:
    report, letters = backtest_key(b"k", records, agent_, BacktestOptions(config=config))
    assert letters == [] and not report.HasField("divergence"), report.divergence.detail
    for seed in range(4):
        found = _deliver(agent_, _delivered(records, seed), config)
        assert found["reports"] == [] and found[ERRORS] == []


def test_a_resume_run_again_on_a_genuine_answer_while_held_keeps_no_held_attempt_of_before():
    # The deadline's EXPIRED resumed the agent, which passed its budget and asked; the genuine
    # answer came late and took EXPIRED's place: the resume ran again (and asked again). The
    # attempt held on EXPIRED is not one of its: the record counted it, and the candidate (on
    # the genuine answer only) was offered the wrong attempt's calls.
    config = RuntimeConfig(budget=Budget(key_tokens=0, on_exceed=OnBudget.ASK, raise_tokens=25))
    live = _Live(FUNCTION, PlanModel(["busy"]), config)
    program = json.dumps({"nonce": 0, "ops": [["approve", "q0"], ["try_llm", "p0"]]}).encode()
    live.send(AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=program))
    (approval,) = live.intents
    live.fire()
    live.send(answer_to(approval, T0 + 1_000, OK))
    question = next(i for i in live.intents if i.tool_name == BUDGET_TOOL)
    live.send(answer_to(question, live.driver.state.continuation.suspended_at_ms + 2_000, OK))
    assert [r.held_attempts for r in live.records] == [0, 1]
    _replays(FUNCTION, live.records, config)


def test_a_candidate_that_asks_a_person_fewer_times_than_live_gets_the_later_attempts_calls():
    # The live start was deferred on a busy model that billed 30 tokens, so its retry asked
    # for a raise; the candidate, run once, never paid those, asks nothing, and its one
    # attempt is the live key's last: it is answered and failed as that one was.
    config = RuntimeConfig(budget=Budget(key_tokens=40, on_exceed=OnBudget.ASK, raise_tokens=100))
    live = _Live(_catches_z, _Scripted({"y": ["busy-billed"], "z": ["busy"]}), config)
    live.send(AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"e"))
    live.fire()
    (question,) = [i for i in live.intents if i.tool_name == BUDGET_TOOL]
    live.send(answer_to(question, question.created_at_ms + 1_000, OK))
    (record,) = live.records
    assert record.held_attempts == 1 and [f.error for f in record.model_failures] == ["busy"]
    _replays(_catches_z, live.records, config)


def test_an_answer_a_held_attempt_paid_for_is_in_the_record_of_the_attempt_that_failed_after():
    # A resume held for a raise after catching a busy model and getting answer a; the raise's
    # retry failed on the model before reaching a (llm_failed), the next completed, replaying
    # a. The failed attempt's record holds what its held attempt asked (held_calls), so the
    # candidate's same attempt is answered a.
    config = RuntimeConfig(budget=Budget(key_tokens=20, on_exceed=OnBudget.ASK, raise_tokens=20))
    live = _Live(_held_then_failed, _Scripted({"x": ["busy", "down"]}), config)
    live.send(AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"e"))
    live.send(answer_to(live.intents[-1], T0 + 1_000, OK))
    question = live.intents[-1]
    assert question.tool_name == BUDGET_TOOL
    live.send(answer_to(question, T0 + 2_000, OK))
    live.fire()
    failed = live.records[1]
    assert (failed.reason, failed.held_attempts) == ("llm_failed", 1)
    assert [c.held_attempt for c in failed.held_calls] == [1]
    _replays(_held_then_failed, live.records, config)


def test_an_answer_taken_after_the_deadline_while_a_budget_question_waited_is_no_divergence():
    # Live: the deadline escalated, a person let the key wait, the extended deadline resumed
    # the agent with EXPIRED, and it asked to raise its budget, so the key waited on; the
    # genuine approval then came and took the EXPIRED's place. No record holds the EXPIRED
    # attempt: the candidate, given the approval after its deadline, refused it (the
    # candidate ran 1 activation of 2). Its timer now fires first, as the live key's did.
    config = dataclasses.replace(
        _SHORT,
        deadline_policy=DeadlinePolicy(action=AtDeadline.ESCALATE, extension_ms=1_200_000),
        budget=Budget(key_tokens=0, on_exceed=OnBudget.ASK, raise_tokens=1_000),
    )
    live = _Live(FUNCTION, PlanModel([]), config)
    program = json.dumps({"nonce": 0, "ops": [["approve", "q0"], ["llm", "p0"]]}).encode()
    live.send(AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=program))
    (approval,) = live.intents
    live.fire()
    (_, escalation) = live.intents
    live.send(answer_to(escalation, escalation.created_at_ms + 1_000, OK))
    deadline = live.driver.state.continuation.deadline_ms
    live.fire()
    live.send(answer_to(approval, deadline + 600_000, OK))
    question = live.intents[-1]
    assert question.tool_name == BUDGET_TOOL
    live.send(answer_to(question, deadline + 700_000, OK))
    assert [r.outcome for r in live.records] == [
        ActivationRecord.OUTCOME_SUSPENDED,
        ActivationRecord.OUTCOME_COMPLETED,
    ]
    _replays(FUNCTION, live.records, config)


# -- generated live histories (rev42) -----------------------------------------------------------
# Programs of model calls, tool calls (one or several at once), approvals, memory writes and
# failures, run by a function agent and a step agent through the runtime's machine as a
# streaming job runs them (events late or twice, answers after any delay or never, a model busy
# or down, deadlines that expire, escalate or dead-letter, budgets put before a person, TTLs),
# then backtested and shadowed in any order. The unchanged agent never diverges and is never a
# dead letter, in either; a changed one diverges in the shadow exactly where it does in the
# backtest.

_SHORT = RuntimeConfig(intent_ttl_ms=600_000, suspend_deadline_ms=1_200_000)
_ASKING = Budget(key_tokens=12, on_exceed=OnBudget.ASK, raise_tokens=6)
CONFIGS = {
    "default": RuntimeConfig(),
    "short deadlines": dataclasses.replace(_SHORT, resume_retries=1, retryable_resume_retries=2),
    "budget asked": RuntimeConfig(budget=_ASKING),
    "ttl": RuntimeConfig(ttl_ms=2 * 3_600_000),
    "escalate": dataclasses.replace(
        _SHORT,
        deadline_policy=DeadlinePolicy(action=AtDeadline.ESCALATE, extension_ms=1_200_000),
    ),
    "dead-letter": dataclasses.replace(
        _SHORT, deadline_policy=DeadlinePolicy(action=AtDeadline.DEAD_LETTER)
    ),
}  # fmt: skip
_TOOLS = ("pay", "lookup")


def _ops(asks: tuple[str, ...]):
    return st.one_of(
        st.tuples(st.just("put"), st.sampled_from("ab"), st.sampled_from(["1", "2"])).map(list),
        st.just(["count"]),
        st.tuples(st.sampled_from(asks), st.sampled_from(["p0", "p1"])).map(list),
        st.tuples(st.just("call"), st.sampled_from(_TOOLS)).map(list),
        st.tuples(st.just("calls"), st.lists(st.sampled_from(_TOOLS), min_size=2, max_size=3)).map(
            list
        ),
        st.tuples(st.just("approve"), st.sampled_from(["q0", "q1"])).map(list),
        st.just(["raise_unless_ok"]),
    )


_OPS = _ops(("llm", "try_llm"))


@st.composite
def _live(draw):
    """(agent, records, config) of one key's generated live history."""
    agent = draw(st.sampled_from([FUNCTION, StepAgent()]))
    config = CONFIGS[draw(st.sampled_from(sorted(CONFIGS)))]
    events, at = [], T0
    for nonce in range(draw(st.integers(1, 4))):
        at += draw(st.sampled_from([0, 1_000, 60_000, 3_600_000, 5 * 3_600_000]))
        program = {"nonce": nonce, "ops": draw(st.lists(_OPS, max_size=4))}
        event = AgentEnvelope(
            entity_key=b"k", event_time_ms=at, external_event=json.dumps(program).encode()
        )
        late = draw(st.sampled_from([0, 0, 500, 120_000]))
        events.append((at + late, event))
        if draw(st.integers(0, 3)) == 0:  # sent twice
            events.append((at + late + draw(st.sampled_from([1, 10_000])), event))
    plan = draw(st.lists(st.sampled_from([OK, OK, OK, "busy", "down"]), max_size=6))
    delays = st.sampled_from([1_000, 60_000, 3_000_000, None])
    answers = draw(st.lists(st.tuples(delays, st.sampled_from([OK, OK, "error"])), min_size=1))
    planned = iter(answers * 100)
    records = live_history(
        agent, b"k", events, config, PlanModel(plan), lambda intent: next(planned)
    )
    return agent, records, config


def _delivered(records, seed: int):
    delivered = [(b"k", record) for record in records]
    random.Random(seed).shuffle(delivered)
    return delivered


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(live=_live(), seed=st.integers(0, 2**16))
def test_the_unchanged_agent_diverges_nowhere_in_the_backtest_or_the_shadow(live, seed):
    agent, records, config = live
    report, letters = backtest_key(b"k", records, agent, BacktestOptions(config=config))
    assert [(letter.reason, letter.detail) for letter in letters] == []
    assert not report.HasField("divergence"), report.divergence.detail
    found = _deliver(agent, _delivered(records, seed), config)
    assert [(letter.reason, letter.detail) for _, letter in found[ERRORS]] == []
    # A key whose run the backtest stopped (a resume the model failed both live and here)
    # has the shadow's report too, as stopped: never a divergence.
    for _, shadowed in found["reports"]:
        assert report.stopped and not shadowed.HasField("divergence")


def _changed(agent, change: str):
    """`agent` with its programs changed: no single payment, new prompts, no approvals, or
    every tool call a lookup."""

    def program(event: bytes) -> bytes:
        read = json.loads(event)
        ops = []
        for op in read["ops"]:
            if change == "no payment" and op == ["call", "pay"]:
                continue
            if change == "no approval" and op[0] == "approve":
                continue
            if change == "new prompt" and op[0] == "llm":
                op = ["llm", op[1] + " (reworded)"]
            if change == "lookups" and op[0] == "call":
                op = ["call", "lookup"]
            ops.append(op)
        return json.dumps({**read, "ops": ops}).encode()

    if agent is FUNCTION:
        return FunctionAgent(lambda ctx, event: agent.function(ctx, program(event)), agent.adapter)

    class Changed(StepAgent):
        def start(self, ctx, event: bytes):
            return super().start(ctx, program(event))

    return Changed()


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    live=_live(),
    change=st.sampled_from(["no payment", "no approval", "new prompt", "lookups"]),
    seed=st.integers(0, 2**16),
)
def test_a_changed_agent_diverges_in_the_shadow_where_it_does_in_the_backtest(live, change, seed):
    agent, records, config = live
    candidate = _changed(agent, change)
    expected, _ = backtest_key(b"k", records, candidate, BacktestOptions(config=config))
    found = _deliver(candidate, _delivered(records, seed), config)
    divergences = [r.divergence for _, r in found["reports"] if r.HasField("divergence")]
    if expected.HasField("divergence"):
        assert divergences == [expected.divergence]
    else:
        assert divergences == []


@pytest.mark.parametrize("seed", range(6))
def test_attempts_retried_without_backoff_are_shadowed_in_the_order_they_ran(seed):
    # Every attempt of the resume ran at the same time (resume_backoff_ms=0): only their
    # recorded attempt tells their order, and none is a copy of another.
    config = RuntimeConfig(resume_backoff_ms=0)
    history = raised_between_busy_models(config=config)
    assert len({r.now_ms for r in history[1:]}) == 1
    found = _deliver(FUNCTION, _delivered(history, seed), config)
    assert [(letter.reason, letter.detail) for _, letter in found[ERRORS]] == []
    assert found["reports"] == []


@pytest.mark.parametrize("seed", range(4))
def test_a_start_a_budget_question_ended_is_shadowed_as_it_is_backtested(seed):
    history = queued_behind_a_question_history()
    found = _deliver(FUNCTION, _delivered(history, seed), RAISED_BY_SIX)
    assert [(letter.reason, letter.detail) for _, letter in found[ERRORS]] == []
    assert found["reports"] == []


@agent(name="review.pays_after_three_answers/v1")
def pays_after_three_answers(ctx, event: bytes) -> bytes:
    """Asks the model three times, the last two taking its failure (busy or down) for an
    answer, then pays with what it said. Re-run from the top on its resume."""
    messages = [{"role": "user", "content": "a"}]
    said = [ctx.llm(messages, model="m").text]
    for _ in range(2):
        try:
            said.append(ctx.llm(messages, model="m").text)
        except LlmCallError as e:
            said.append("busy" if e.retryable else "down")
    ctx.call_tool("pay", {"said": said})
    return " ".join(said).encode()


def test_the_shadow_compares_a_resume_as_the_backtest_whichever_attempt_comes_first():
    # Answered, busy, down, in turn. The start: answered, busy, down, pays. Its resume (from
    # the top; the first answer replayed) gets other failures, pays otherwise, and fails
    # (agent_contract) twice; its third attempt is answered as the start was and completes.
    # The shadow, handed the completed attempt before the second failed one, waits for it
    # (the completed one says it was attempt 2), as the backtest holds them all.
    history = live_history(
        pays_after_three_answers,
        b"k",
        [(T0, AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"e"))],
        RuntimeConfig(),
        PlanModel([OK, "busy", "down"]),
        lambda intent: (1_000, OK),
    )
    assert [(r.reason, r.attempt) for r in history] == [
        ("", 0),
        ("agent_contract", 0),
        ("agent_contract", 1),
        ("", 2),
    ]
    report, letters = backtest_key(b"k", history, pays_after_three_answers)
    assert letters == [] and not report.HasField("divergence")
    start, first, second, last = history
    found = _deliver(pays_after_three_answers, [(b"k", r) for r in (first, start, last, second)])
    assert found[ERRORS] == []
    assert [r.divergence.detail for _, r in found["reports"] if r.HasField("divergence")] == []


def test_a_start_that_failed_on_the_model_under_the_largest_retry_limit_is_shadowed():
    history = raised_then_down_history()
    found = _deliver(FUNCTION, [(b"k", r) for r in history], RETRIED_FOR_EVER)
    assert found[ERRORS] == [] and found["reports"] == []


@pytest.mark.parametrize("seed", range(4))
def test_a_resume_whose_first_attempts_an_older_binary_recorded_is_shadowed_as_backtested(seed):
    history, config = upgraded_mid_resume_history()
    found = _deliver(FUNCTION, _delivered(history, seed), config)
    assert [(letter.reason, letter.detail) for _, letter in found[ERRORS]] == []
    assert [r.divergence.detail for _, r in found["reports"] if r.HasField("divergence")] == []
