"""Budgets (machine_budgets and budget.BudgetMeter): usage kept per key, a call past a limit not
made, and under OnBudget.ASK a person raising or declining a key's budget. Each test drives
KeyMachine through `testing.machine_harness`.
"""

from __future__ import annotations

import dataclasses

import pytest

from beam_agents._protos import ActivationRecord, Continuation, ToolIntent, TraceEvent
from beam_agents.errors import LlmCallError
from beam_agents.runtime import LlmResponse, RuntimeConfig, agent
from beam_agents.runtime.machine import ERRORS
from beam_agents.runtime.recording import RECORDS, Recording
from beam_agents.runtime.run_agent import _read
from beam_agents.testing.machine_harness import (
    T0,
    Harness,
    answer,
    approve,
    event,
    pending,
    refund,
    summarise_event,
)

# Issue 19 point 3: budgets --------------------------------------------------------------------


class _Counting:
    """A model that answers every call, counting them, with fixed token usage."""

    def __init__(self, input_tokens=100, output_tokens=50) -> None:
        self.calls = 0
        self.usage = (input_tokens, output_tokens)

    def complete(self, request):
        self.calls += 1
        return LlmResponse("ok", request.model, *self.usage)


class _BusyOnce(_Counting):
    """As _Counting, but busy once (retryable) on the first request for `content`."""

    def __init__(self, content: str) -> None:
        super().__init__()
        self.busy_on = content

    def complete(self, request):
        if request.messages[-1]["content"] == self.busy_on:
            self.busy_on = None
            raise LlmCallError("busy", model=request.model, retryable=True)
        return super().complete(request)


def _budgeted(**budget):
    from beam_agents.runtime.budget import Budget, Price

    prices = {"m": Price(input_per_million=2_000_000, output_per_million=8_000_000)}
    return RuntimeConfig(budget=Budget(prices=prices, **budget))


def test_usage_is_kept_per_key_and_a_call_past_the_key_budget_is_not_made():
    model = _Counting()
    h = Harness(summarise_event, llm=model, config=_budgeted(key_tokens=400))
    h.send(event(T0, b"a"))
    h.send(event(T0 + 1, b"b"))
    cache = h.states[2].value
    assert (cache.input_tokens, cache.output_tokens) == (200, 100)
    # Each call: 100 input tokens at 2 and 50 output tokens at 8 per million, in micros.
    assert cache.cost_micros == 2 * (200 + 400)
    h.send(event(T0 + 2, b"c"))  # 300 used, the estimate fits: 450 used after it
    before = _read(h.states)
    h.send(event(T0 + 3, b"d" * 400))  # past 400 already: not called
    (refused,) = [e for e in h.values(ERRORS)]
    assert refused.reason == "budget_exceeded" and "key tokens" in refused.detail
    assert refused.input.external_event == b"d" * 400
    after = _read(h.states)
    # The refused start ended for good: the key moves past its seq and its dead calls go.
    assert model.calls == 3 and after.seq == before.seq + 1 and not after.cache.entries
    assert after.cache.input_tokens == before.cache.input_tokens == 300
    assert after.memory is before.memory and after.continuation is before.continuation


@pytest.mark.parametrize("limit", ["max_tokens", "max_completion_tokens", "max_output_tokens"])
def test_a_calls_output_limit_counts_in_its_estimate_whatever_the_provider_names_it(limit):
    @agent(name="tests.long_answer/v1")
    def long_answer(ctx, event):
        asked = [{"role": "user", "content": "hi"}]
        return ctx.llm(asked, model="m", **{limit: 5000}).text.encode()

    model = _Counting()
    h = Harness(long_answer, llm=model, config=_budgeted(key_tokens=4000))
    h.send(event(T0, b"x"))
    (refused,) = h.values(ERRORS)
    assert refused.reason == "budget_exceeded" and model.calls == 0


def test_an_activation_budget_and_a_model_without_a_price_under_a_cost_limit():
    h = Harness(summarise_event, llm=_Counting(), config=_budgeted(activation_tokens=5))
    h.send(event(T0, b"a long enough question to pass five tokens"))
    assert [e.reason for e in h.values(ERRORS)] == ["budget_exceeded"]

    @agent(name="tests.unpriced/v1")
    def unpriced(ctx, event):
        return ctx.llm([{"role": "user", "content": "hi"}], model="unpriced").text.encode()

    h = Harness(unpriced, llm=_Counting(), config=_budgeted(key_cost_micros=10**9))
    h.send(event(T0, b"x"))
    (refused,) = h.values(ERRORS)
    assert refused.reason == "budget_exceeded" and "no price for model 'unpriced'" in refused.detail


def test_under_ask_a_person_raises_the_budget_and_the_start_runs_then():
    from beam_agents.runtime.budget import BUDGET_TOOL, OnBudget

    model = _Counting()
    config = _budgeted(key_tokens=10, on_exceed=OnBudget.ASK, raise_tokens=1000)
    h = Harness(summarise_event, llm=model, config=config)
    h.send(event(T0, b"first"))
    (question,) = pending(h)
    assert question.tool_name == BUDGET_TOOL and question.kind == ToolIntent.APPROVAL
    assert h.values(ERRORS) == [] and model.calls == 0
    h.send(event(T0 + 1, b"second"))  # waits behind it
    h.send(approve(T0 + 2, question))
    assert model.calls == 2 and h.values("completions") == [b"ok", b"ok"]
    assert h.states[2].value.token_allowance == 1000 and h.continuation is None


def test_under_ask_a_declined_budget_ends_with_the_event_in_the_dead_letter():
    from beam_agents.runtime.budget import OnBudget

    config = _budgeted(key_tokens=10, on_exceed=OnBudget.ASK, raise_tokens=1000)
    h = Harness(summarise_event, llm=_Counting(), config=config)
    h.send(event(T0, b"first"))
    (question,) = pending(h)
    h.send(approve(T0 + 1, question, approved=False))
    (refused,) = h.values(ERRORS)
    assert refused.reason == "budget_exceeded" and refused.input.external_event == b"first"
    assert h.continuation is None and not pending(h)


@pytest.mark.parametrize("recording", [None, Recording()])
def test_a_declined_raise_records_the_calls_its_attempt_paid_for_and_keeps_none_unrecorded(
    recording,
):
    from beam_agents.runtime.budget import OnBudget
    from beam_agents.runtime.key_driver import KeyDriver, recording_machine
    from beam_agents.testing.review_agents import calls_per_event

    # The first call fits the key's 25 tokens, the second would not: the start asks.
    config = _budgeted(key_tokens=25, on_exceed=OnBudget.ASK, raise_tokens=1000)
    driver = KeyDriver(
        recording_machine(calls_per_event, _Counting(10, 5), config, recording), b"k"
    )
    driver.schedule(event(T0, b"3"))
    (question,) = [value for tag, value in driver.step() if tag == "intents"]
    held = list(driver.state.continuation.held_calls)
    driver.schedule(approve(T0 + 1, question, approved=False))
    records = [value for tag, value in driver.step() if tag == RECORDS]
    if recording is None:
        assert held == [] and records == []
        return
    assert [(c.replayed, c.input_tokens, c.output_tokens) for c in held] == [(False, 10, 5)]
    # Numbered by the attempt the question held up; the declined one's are the record's own.
    assert [c.held_attempt for c in held] == [1]
    own = [ActivationRecord.ModelCall() for _ in held]
    for copy, call in zip(own, held, strict=True):
        copy.CopyFrom(call)
        copy.held_attempt = 0
    (declined,) = records
    assert declined.reason == "budget_exceeded" and list(declined.model_calls) == own
    assert declined.output == b""  # it returned nothing: the agent never finished
    # The start ended for good: no later start replays what it paid for (its usage stays).
    cache = driver.state.cache
    assert list(cache.entries) == [] and (cache.input_tokens, cache.output_tokens) == (10, 5)


def test_under_ask_a_resume_past_its_budget_waits_with_its_answers_and_goes_on_when_raised():
    from beam_agents.runtime.budget import BUDGET_TOOL, OnBudget

    model = _Counting(input_tokens=5, output_tokens=5)
    config = _budgeted(key_tokens=30, on_exceed=OnBudget.ASK, raise_tokens=1000)
    h = Harness(refund, llm=model, config=config)
    h.send(event(T0, b"4200"))
    (paid,) = pending(h)
    h.send(answer(T0 + 1, paid, b"refunded 4200 " * 20))  # a long prompt for the model
    paid_again, question = pending(h)
    assert paid_again == paid and question.tool_name == BUDGET_TOOL and model.calls == 0
    assert [a.tool_result.payload for a in h.continuation.answers] == [b"refunded 4200 " * 20]
    h.send(approve(T0 + 2, question))
    assert model.calls == 1 and h.values(ERRORS) == []
    assert h.values("completions") == [b"ok after 1 visit(s)"]
    assert h.states[2].value.input_tokens == 5 and h.states[2].value.token_allowance == 1000


def test_an_activation_limit_is_a_dead_letter_even_under_ask():
    from beam_agents.runtime.budget import OnBudget

    config = _budgeted(activation_tokens=5, on_exceed=OnBudget.ASK, raise_tokens=1000)
    h = Harness(summarise_event, llm=_Counting(), config=config)
    h.send(event(T0, b"a long enough question to pass five tokens"))
    assert [e.reason for e in h.values(ERRORS)] == ["budget_exceeded"] and not pending(h)


def test_a_keys_usage_travels_in_its_snapshot():
    h = Harness(summarise_event, llm=_Counting(), config=_budgeted(key_tokens=10**6))
    h.send(event(T0, b"a"))
    snapshot = h.export()
    assert (snapshot.llm_cache.input_tokens, snapshot.llm_cache.output_tokens) == (100, 50)
    assert snapshot.llm_cache.cost_micros == 600


def test_a_second_budget_question_for_the_same_start_has_its_own_intent_id():
    # Review: a raise too small for the retried start makes the key ask again. The console keeps
    # one decision per intent_id, so a second question under the first one's id is shown as
    # already decided and can never be answered: the key would wait out its deadline.
    from beam_agents.runtime.budget import BUDGET_TOOL, OnBudget

    model = _Counting()
    config = _budgeted(key_tokens=10, on_exceed=OnBudget.ASK, raise_tokens=1)
    h = Harness(summarise_event, llm=model, config=config)
    h.send(event(T0, b"first"))
    (first,) = pending(h)
    h.send(approve(T0 + 1, first))
    (second,) = pending(h)
    assert second.tool_name == BUDGET_TOOL and model.calls == 0
    assert second.intent_id != first.intent_id
    h.send(approve(T0 + 2, second))
    (third,) = pending(h)
    assert third.intent_id not in (first.intent_id, second.intent_id)


@agent(name="tests.two_calls/v1")
def _two_calls(ctx, event: bytes) -> bytes:
    ctx.llm([{"role": "user", "content": "a"}], model="m")
    return ctx.llm([{"role": "user", "content": "b"}], model="m").text.encode()


def test_under_ask_a_raise_of_the_refused_call_lets_the_start_finish():
    # The start's first call (150 tokens) fits, its second does not: a raise of one call must
    # let the retried start finish. Counting the refused attempt's calls while dropping their
    # answers (as a first fix of the budget hole did) made each approval pay the first call
    # again and ask again, for ever.
    from beam_agents.runtime.budget import BUDGET_TOOL, OnBudget

    model = _Counting()
    config = _budgeted(key_tokens=160, on_exceed=OnBudget.ASK, raise_tokens=150)
    h = Harness(_two_calls, llm=model, config=config)
    h.send(event(T0, b"x"))
    (question,) = pending(h)
    assert question.tool_name == BUDGET_TOOL and model.calls == 1
    h.send(approve(T0 + 1, question))
    assert h.values("completions") == [b"ok"] and not pending(h)
    # The refused attempt's first call is counted, and replayed by the retry, not paid again.
    assert model.calls == 2
    cache = h.states[2].value
    assert cache.input_tokens + cache.output_tokens == 300


@agent(name="tests.pays_then_fails/v1")
def _pays_then_fails(ctx, event: bytes) -> bytes:
    ctx.llm([{"role": "user", "content": "hi"}], model="m")
    raise RuntimeError("a bug after the model call")


def test_a_failed_activations_model_calls_count_against_the_key_budget():
    model = _Counting()
    h = Harness(_pays_then_fails, llm=model, config=_budgeted(key_tokens=400))
    for n in range(6):
        h.send(event(T0 + n, b"x%d" % n))
    # 150 tokens a call: the third fits (300 used), the fourth would pass 400.
    assert model.calls == 3


@agent(name="tests.remembers_or_pays_then_fails/v1")
def _remembers_or_pays_then_fails(ctx, event: bytes) -> bytes:
    if event == b"fail":
        ctx.llm([{"role": "user", "content": "hi"}], model="m")
        raise RuntimeError("a bug after the model call")
    ctx.memory.put("last", event)
    return b"done"


def test_a_failed_start_that_paid_is_activity_the_mark_and_the_ttl_move_together():
    # The TTL counts from the memory's last_activity_ms. A failure that paid records its count,
    # so it is the key's activity: the mark and the timer move together (a timer moved alone
    # would fire at a time the mark calls stale, or wipe the count early: a key that keeps
    # failing would get its budget back every TTL). One that paid nothing moves neither.
    ttl = 10_000
    config = RuntimeConfig(ttl_ms=ttl, budget=_budgeted().budget)
    h = Harness(_remembers_or_pays_then_fails, llm=_Counting(), config=config)
    h.send(event(T0, b"kept"))
    assert h.timers[1].at_ms == T0 + ttl
    h.send(event(T0 + ttl - 1, b"fail"))
    assert [e.reason for e in h.values(ERRORS)] == ["agent_raised"]
    assert h.memory.last_activity_ms == T0 + ttl - 1
    assert h.timers[1].at_ms == T0 + 2 * ttl - 1
    assert [e.key for e in h.export().memory.entries] == ["last"]


def test_a_failed_activation_that_paid_writes_no_blob_the_binary_before_cannot_read():
    # The migrated view reaches state only at a successful commit (the guide, state/migration.py),
    # so a binary whose agent fails on every event can be rolled back: a commit of a failed
    # activation's usage stamped with the current version would wedge every key it touched
    # for the binary before (StateSchemaFromFutureError).
    from beam_agents._protos import LlmCacheBlob

    h = Harness(_pays_then_fails, llm=_Counting(), config=_budgeted())
    h.states[2].value = LlmCacheBlob(state_schema_version=1, input_tokens=10)
    h.send(event(T0, b"x"))
    assert [e.reason for e in h.values(ERRORS)] == ["agent_raised"]
    assert h.states[2].value.state_schema_version == 1


# A failed activation's paid model calls are durable inputs: counted, and replayed by a retry.


def test_a_start_deferred_while_the_model_was_busy_replays_the_call_it_paid_for():
    model = _BusyOnce("b")
    h = Harness(_two_calls, llm=model, config=_budgeted())
    h.send(event(T0, b"x"))
    assert h.continuation.mailbox and model.calls == 1 and h.states[2].value.input_tokens == 100
    h.fire_deadline()
    assert h.values("completions") == [b"ok"] and h.continuation is None
    assert model.calls == 2  # "a" once, "b" once its model was back
    cache = h.states[2].value
    assert cache.input_tokens + cache.output_tokens == 300


def test_a_resume_the_agent_failed_counts_its_calls_and_its_retry_asks_the_model_again():
    # The agent's failure may come from the model's answer (a malformed turn, JSON that does
    # not parse): its retry is handed no recorded answer of the failed attempt, and pays again.
    model, fails = _Counting(), [RuntimeError("a bug after the model call, once")]

    @agent(name="tests.fails_once_after_the_model/v1")
    def fails_once(ctx, event: bytes) -> bytes:
        paid = ctx.call_tool("payments.refund", {"amount": 1})
        summary = ctx.llm([{"role": "user", "content": paid.payload.decode()}], model="m")
        if fails:
            raise fails.pop()
        return summary.text.encode()

    h = Harness(fails_once, llm=model, config=_budgeted())
    h.send(event(T0, b"x"))
    (intent,) = pending(h)
    h.send(answer(T0 + 1, intent))
    assert [e.reason for e in h.values(ERRORS)] == ["agent_raised"] and model.calls == 1
    assert h.continuation.resume_failures == 1 and h.states[2].value.input_tokens == 100
    h.fire_deadline()
    assert h.values("completions") == [b"ok"] and model.calls == 2
    assert h.states[2].value.input_tokens == 200


def test_a_start_that_failed_for_good_replays_its_answer_to_no_later_event():
    # The same request at the same position of the next event's start: a key left at the failed
    # start's seq would hand the next event the answer the failed one paid for.
    @agent(name="tests.same_question/v1")
    def same_question(ctx, event: bytes) -> bytes:
        answered = ctx.llm([{"role": "user", "content": "what now?"}], model="m")
        if event == b"fail":
            raise RuntimeError("a bug after the model call")
        return answered.text.encode()

    model = _Counting()
    h = Harness(same_question, llm=model, config=_budgeted())
    h.send(event(T0, b"fail"))
    h.send(event(T0 + 1, b"ok"))
    assert h.values("completions") == [b"ok"] and model.calls == 2
    assert h.states[2].value.input_tokens == 200


def test_a_new_keys_failed_start_keeps_its_usage_for_a_ttl_from_its_event():
    # With no memory there is no activity to count the TTL from but the failure's: the memory
    # holds that mark alone, a high-water mark as any other, so an event stamped behind and a
    # stale TTL firing cannot wipe the usage early (machine_paid_calls_test).
    ttl = 10_000
    config = RuntimeConfig(ttl_ms=ttl, budget=_budgeted().budget)
    h = Harness(_pays_then_fails, llm=_Counting(), config=config)
    h.send(event(T0 + 5, b"x"))
    assert h.states[2].value.input_tokens == 100
    assert h.memory.last_activity_ms == T0 + 5 and not h.memory.entries
    assert h.timers[1].at_ms == T0 + 5 + ttl


def test_a_budget_its_question_could_not_carry_is_refused_when_the_pipeline_is_built():
    from beam_agents.runtime.budget import Budget, OnBudget

    # A raise travels in the question's canonical JSON (integers up to 2**53 - 1): larger, every
    # question would fail on the worker, after the model was paid.
    with pytest.raises(ValueError, match="raise_tokens"):
        Budget(on_exceed=OnBudget.ASK, raise_tokens=2**53)
    with pytest.raises(ValueError, match="raise_cost_micros"):
        Budget(raise_cost_micros=-1)
    with pytest.raises(ValueError, match="key_tokens"):
        Budget(key_tokens=-5)
    with pytest.raises(ValueError, match="activation_cost_micros"):
        Budget(activation_cost_micros=1.5)
    assert Budget(raise_tokens=2**53 - 1, key_tokens=2**62).raise_tokens == 2**53 - 1


def test_a_reported_token_count_is_taken_as_a_count_from_zero_to_max_safe_integer():
    from beam_agents.intents.identity import MAX_SAFE_INTEGER
    from beam_agents.runtime.budget import reported_tokens

    taken = [reported_tokens(c) for c in (7, -3, 2**70, 12.9, float("inf"), float("nan"))]
    assert taken == [7, 0, MAX_SAFE_INTEGER, 12, MAX_SAFE_INTEGER, 0]
    assert [reported_tokens(c) for c in (None, "100", True)] == [0, 0, 0]


def test_a_limit_of_zero_is_a_valid_budget_that_refuses_every_call():
    from beam_agents.runtime.budget import Budget

    zero = Budget(key_tokens=0, activation_tokens=0, key_cost_micros=0, activation_cost_micros=0)
    assert (zero.key_tokens, zero.activation_cost_micros) == (0, 0)
    model = _Counting()
    h = Harness(summarise_event, llm=model, config=_budgeted(key_tokens=0))
    h.send(event(T0, b"x"))
    assert [e.reason for e in h.values(ERRORS)] == ["budget_exceeded"] and model.calls == 0


def test_a_key_cost_limit_counts_what_the_activation_already_paid():
    # The first call costs 600 micros and fits a limit of 600; the second, in the same
    # activation, would pass it: the key has no stored cost yet, only this activation's.
    model = _Counting()
    h = Harness(_two_calls, llm=model, config=_budgeted(key_cost_micros=600))
    h.send(event(T0, b"x"))
    (refused,) = h.values(ERRORS)
    assert refused.reason == "budget_exceeded" and "key cost" in refused.detail
    assert model.calls == 1


def test_under_ask_an_approval_raises_the_keys_cost_limit_by_its_raise():
    from beam_agents.runtime.budget import OnBudget

    model = _Counting()
    config = _budgeted(key_cost_micros=10, on_exceed=OnBudget.ASK, raise_cost_micros=10_000)
    h = Harness(summarise_event, llm=model, config=config)
    h.send(event(T0, b"first"))
    (question,) = pending(h)
    h.send(approve(T0 + 1, question))
    assert h.values("completions") == [b"ok"] and model.calls == 1 and not pending(h)
    cache = h.states[2].value
    assert (cache.cost_allowance_micros, cache.cost_micros, cache.budget_grants) == (10_000, 600, 1)


def test_a_budget_limits_nothing_and_an_approval_raises_nothing_unless_told():
    from beam_agents.runtime.budget import BUDGET_TOOL, Budget, OnBudget

    unset = Budget()
    limits = (unset.key_tokens, unset.activation_tokens, unset.key_cost_micros)
    assert limits == (None, None, None) and unset.activation_cost_micros is None
    assert (unset.on_exceed, unset.raise_tokens, unset.raise_cost_micros) == (
        OnBudget.DEAD_LETTER,
        0,
        0,
    )
    model = _Counting()
    h = Harness(summarise_event, llm=model, config=_budgeted(key_tokens=10, on_exceed=OnBudget.ASK))
    h.send(event(T0, b"first"))
    (question,) = pending(h)
    h.send(approve(T0 + 1, question))
    (again,) = pending(h)  # approved, raised by nothing: the call still does not fit
    assert again.tool_name == BUDGET_TOOL and again.intent_id != question.intent_id
    assert model.calls == 0 and h.states[2].value.token_allowance == 0


def test_a_budget_question_is_traced_as_an_intent_the_key_emitted():
    # A dashboard follows a key's intents by their spans: the question a budget asks is one,
    # emitted before anyone answers it.
    from beam_agents.runtime.budget import BUDGET_TOOL, OnBudget
    from beam_agents.runtime.machine import TRACES

    model = _Counting()
    config = _budgeted(key_tokens=160, on_exceed=OnBudget.ASK, raise_tokens=150)
    h = Harness(_two_calls, llm=model, config=config)
    h.send(event(T0, b"x"))
    (question,) = pending(h)
    (span,) = h.values(TRACES)
    assert span.event_type == TraceEvent.INTENT_EMITTED
    assert span.attributes["gen_ai.tool.name"] == BUDGET_TOOL
    assert span.attributes["beam_agents.intent_id"] == question.intent_id


class _BusyBilled(_Counting):
    """A model busy on every call (its client's retries spent), each refused answer billed."""

    def complete(self, request):
        self.calls += 1
        raise LlmCallError("busy", model=request.model, retryable=True, input_tokens=10)


def test_a_raise_granted_to_a_start_deferred_on_a_busy_model_gives_it_no_retries_again():
    # Deferred once (its refused answer billed), the start's retry is over the budget and asks
    # a person; granted, it goes on with its one retry left, not with its whole count again.
    from beam_agents.runtime.budget import Budget, OnBudget

    model = _BusyBilled()
    config = RuntimeConfig(
        retryable_resume_retries=2,
        budget=Budget(key_tokens=20, on_exceed=OnBudget.ASK, raise_tokens=1000),
    )
    h = Harness(summarise_event, llm=model, config=config)
    h.send(event(T0, b"x"))
    assert model.calls == 1 and h.continuation.resume_failures == 1
    h.fire_deadline()
    (question,) = pending(h)
    assert model.calls == 1 and h.continuation.resume_failures == 1
    h.send(approve(T0 + 10**6, question))  # granted: tried again, deferred the second time
    assert model.calls == 2 and h.continuation.resume_failures == 2
    h.fire_deadline()  # the last retry: failed for good
    assert model.calls == 3 and h.continuation is None
    assert [letter.reason for letter in h.values(ERRORS)] == ["llm_failed"]


class _BusyThenDownOn(_Counting):
    """As _Counting, but busy on the first request for `content` and down on the second."""

    def __init__(self, content: str) -> None:
        super().__init__()
        self.failures = iter([True, False])
        self.on = content

    def complete(self, request):
        if request.messages[-1]["content"] == self.on:
            retryable = next(self.failures, None)
            if retryable is not None:
                raise LlmCallError("failed", model=request.model, retryable=retryable)
        return super().complete(request)


def test_a_deferred_start_that_then_failed_for_good_drops_the_answers_its_attempts_paid_for():
    # Its first attempt paid for "a" and was deferred on "b" (the key kept "a" for the retry,
    # at its seq); the retry replayed "a" and failed for good on "b". No later start can
    # replay "a": the cache drops it, though the key's seq did not move.
    model = _BusyThenDownOn("b")
    h = Harness(_two_calls, llm=model, config=_budgeted())
    h.send(event(T0, b"x"))
    assert model.calls == 1 and len(h.states[2].value.entries) == 1
    h.fire_deadline()
    assert [letter.reason for letter in h.values(ERRORS)] == ["llm_failed"]
    assert model.calls == 1 and list(h.states[2].value.entries) == []


def test_the_failures_of_attempts_a_budget_held_are_in_their_activations_record():
    # The start asks before its first call; its second attempt catches a busy model, then
    # asks again; its third catches the model busy again and completes. No cache keeps a
    # failed call: the record holds each held attempt's, numbered by attempt.
    from beam_agents.testing.review_agents import held_while_busy_history

    (record,) = held_while_busy_history()
    assert record.outcome == ActivationRecord.OUTCOME_COMPLETED and len(record.answers) == 2
    assert record.held_attempts == 2
    assert [(f.held_attempt, f.after_calls, f.retryable) for f in record.held_failures] == [
        (2, 0, True)
    ]
    assert [(f.held_attempt, f.after_calls) for f in record.model_failures] == [(0, 0)]


def test_a_declined_raise_records_its_attempts_failures_as_its_own_and_the_earlier_as_held():
    from beam_agents.testing.review_agents import held_while_busy_history

    (declined,) = held_while_busy_history(declined=2)
    # Its answers: the raise granted, then the refusal.
    assert declined.reason == "budget_exceeded"
    assert [a.approval.approved for a in declined.answers] == [True, False]
    # The second attempt, the one the declined question held, is the one recorded: its
    # failure is its own; the first (no call made) is the one held before it.
    assert declined.held_attempts == 1 and list(declined.held_failures) == []
    assert [(f.held_attempt, f.after_calls) for f in declined.model_failures] == [(0, 0)]
    assert len(declined.model_calls) == 1


def test_held_attempts_in_a_restored_continuation_saturate_and_a_retry_starts_none():
    # A restored key may hold any count: the next question saturates it, never overflows the
    # uint32. A failed resume's retry is an attempt of its own: it holds no earlier failures.
    from beam_agents.runtime.budget import UINT32_MAX
    from beam_agents.runtime.key_driver import KeyDriver, recording_machine
    from beam_agents.testing.live_history import PlanModel
    from beam_agents.testing.review_agents import RAISED_BY_SIX, asks_again_while_busy

    machine = recording_machine(asks_again_while_busy, PlanModel(["busy", "ok"]), RAISED_BY_SIX)
    driver = KeyDriver(machine, b"k")
    driver.schedule(event(T0, b"x"))
    (question,) = [value for tag, value in driver.step() if tag == "intents"]
    held = Continuation()
    held.CopyFrom(driver.state.continuation)
    held.held_attempts = UINT32_MAX
    driver = KeyDriver(machine, b"k", dataclasses.replace(driver.state, continuation=held))
    driver.schedule(approve(T0 + 1, question))
    driver.step()
    waiting = driver.state.continuation
    assert waiting.held_attempts == UINT32_MAX and waiting.held_failures[0].after_calls == 0


def test_a_start_declined_after_a_restore_moved_the_key_on_never_moves_its_seq_back():
    # A start waits on a budget question; the key is exported, goes on (the start raised and
    # three more paid), is handed off and the export restored: its seq stays the higher one
    # (review rev45). A person declines the restored question: the key's seq must not go back
    # to the held start's, or the next start re-issues an intent id issued before.
    import json

    from beam_agents._protos import AgentEnvelope
    from beam_agents.runtime.budget import Budget, OnBudget
    from beam_agents.runtime.key_driver import KeyDriver, recording_machine
    from beam_agents.runtime.machine import SNAPSHOTS
    from beam_agents.testing.live_history import OK, PlanModel, answer_to
    from beam_agents.testing.simulation_agents import FUNCTION

    # The held start paid for one call (its 20 tokens cover one), kept for its retry.
    config = RuntimeConfig(budget=Budget(key_tokens=20, on_exceed=OnBudget.ASK, raise_tokens=1000))
    machine = recording_machine(FUNCTION, PlanModel([]), config)
    driver = KeyDriver(machine, b"k")
    issued = set()

    def run(envelope):
        driver.schedule(envelope)
        outputs = driver.step()
        intents = [value for tag, value in outputs if tag == "intents"]
        issued.update(i.intent_id for i in intents)
        return outputs, intents

    def event(at, nonce, ops):
        program = json.dumps({"nonce": nonce, "ops": ops}).encode()
        return AgentEnvelope(entity_key=b"k", event_time_ms=at, external_event=program)

    def export(at, release=False):
        envelope = AgentEnvelope(entity_key=b"k", event_time_ms=at)
        envelope.export_request.request_id = f"x{at}"
        envelope.export_request.release = release
        return envelope

    _, (question,) = run(event(T0, 0, [["llm", "p0"], ["llm", "p1"]]))
    outputs, _ = run(export(T0 + 1))
    (snapshot,) = [value for tag, value in outputs if tag == SNAPSHOTS]
    run(answer_to(question, T0 + 2, OK))
    for n in range(1, 4):
        _, (pay,) = run(event(T0 + 10 * n, n, [["call", "pay"]]))
        run(answer_to(pay, T0 + 10 * n + 1, OK))
    went_on = driver.state.seq
    run(export(T0 + 100, release=True))
    restored = machine.on_snapshot(b"k", driver.state, snapshot).state
    driver = KeyDriver(machine, b"k", restored)
    assert driver.state.seq == went_on > driver.state.continuation.seq
    before = set(issued)
    assert len(driver.state.cache.entries) == 1
    run(answer_to(question, T0 + 200, "declined"))
    # Ended for good: the key keeps its seq, and the call the start paid for, which no later
    # start can replay, is dropped.
    assert driver.state.seq == went_on and list(driver.state.cache.entries) == []
    _, (pay,) = run(event(T0 + 300, 9, [["call", "pay"]]))
    assert pay.seq == went_on + 1 and pay.intent_id not in before


def test_a_start_raised_again_and_again_holds_each_paid_answer_once_not_each_replay():
    # The first attempt asks before any call (its estimate passes the 15 tokens); then each
    # raise lets the start pay for one more call, each attempt replaying those before it. The
    # Continuation holds what each attempt had the model answer: one answer an attempt, not
    # the 1 + 2 + 3 + 4 their replays would make.
    from beam_agents.runtime.budget import OnBudget
    from beam_agents.runtime.key_driver import KeyDriver, recording_machine
    from beam_agents.testing.review_agents import calls_per_event

    config = _budgeted(key_tokens=15, on_exceed=OnBudget.ASK, raise_tokens=15)
    driver = KeyDriver(
        recording_machine(calls_per_event, _Counting(10, 5), config, Recording()), b"k"
    )
    driver.schedule(event(T0, b"6"))
    outputs = driver.step()
    for n in range(1, 5):
        (question,) = [value for tag, value in outputs if tag == "intents"]
        driver.schedule(approve(T0 + n, question))
        outputs = driver.step()
        held = driver.state.continuation
        assert held.held_attempts == n + 1
        assert [c.held_attempt for c in held.held_calls] == list(range(2, n + 2))
        assert not any(c.replayed for c in held.held_calls)


def test_a_genuine_answer_replacing_an_expired_while_its_budget_question_waits_asks_nothing_again():
    # At the deadline the EXPIRED payment resumed the agent, whose next call passed the
    # budget: a person is asked. The genuine result then takes the EXPIRED's place: the resume
    # waits for the person's decision (run now, it asked the same question again under the
    # same id, and the second decline was a dead letter; review rev46).
    import json

    from beam_agents._protos import AgentEnvelope
    from beam_agents.runtime.budget import BUDGET_TOOL, Budget, OnBudget
    from beam_agents.runtime.key_driver import KeyDriver, recording_machine
    from beam_agents.testing.live_history import OK, PlanModel, answer_to
    from beam_agents.testing.simulation_agents import FUNCTION

    config = RuntimeConfig(budget=Budget(key_tokens=0, on_exceed=OnBudget.ASK, raise_tokens=1000))
    driver = KeyDriver(recording_machine(FUNCTION, PlanModel([]), config), b"k")
    ops = [["call", "pay"], ["llm", "p0"], ["call", "lookup"]]
    program = json.dumps({"nonce": 0, "ops": ops}).encode()
    driver.schedule(AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=program))
    (pay,) = [value for tag, value in driver.step() if tag == "intents"]
    (question,) = [
        value
        for tag, value in driver.fire_deadline(driver.state.continuation.deadline_ms)
        if tag == "intents"
    ]
    assert question.tool_name == BUDGET_TOOL
    driver.schedule(answer_to(pay, pay.expires_at_ms - 1, OK))
    assert [tag for tag, _ in driver.step() if tag in ("intents", ERRORS)] == []
    ids = list(driver.state.continuation.pending_intent_ids)
    assert ids == [pay.intent_id, question.intent_id]
    driver.schedule(approve(question.expires_at_ms - 1, question))
    outputs = driver.step()
    assert [v for tag, v in outputs if tag == ERRORS] == []
    (lookup,) = [value for tag, value in outputs if tag == "intents"]
    assert lookup.tool_name == "lookup"


def test_a_declined_escalation_while_a_budget_question_waits_asks_nothing_again():
    # No one answered the escalation; at the extended deadline the EXPIRED payment resumed
    # the agent, which asked to raise its budget. The person then declines the escalation:
    # the key keeps waiting on the budget question (the resume ran at once and asked it again
    # under the same id; review rev47), and resumes on the raise.
    import json

    from beam_agents._protos import AgentEnvelope
    from beam_agents.runtime.budget import BUDGET_TOOL, Budget, OnBudget
    from beam_agents.runtime.config import AtDeadline, DeadlinePolicy
    from beam_agents.runtime.context import ESCALATION_TOOL
    from beam_agents.runtime.key_driver import KeyDriver, recording_machine
    from beam_agents.testing.live_history import PlanModel
    from beam_agents.testing.simulation_agents import FUNCTION

    config = RuntimeConfig(
        budget=Budget(key_tokens=0, on_exceed=OnBudget.ASK, raise_tokens=1000),
        deadline_policy=DeadlinePolicy(action=AtDeadline.ESCALATE, max_escalations=1),
    )
    driver = KeyDriver(recording_machine(FUNCTION, PlanModel([]), config), b"k")
    ops = [["call", "pay"], ["llm", "p0"], ["call", "lookup"]]
    program = json.dumps({"nonce": 0, "ops": ops}).encode()
    driver.schedule(AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=program))
    driver.step()

    def fire():
        outputs = driver.fire_deadline(driver.state.continuation.deadline_ms)
        return [value for tag, value in outputs if tag == "intents"]

    (escalation,) = fire()
    (question,) = fire()
    assert (escalation.tool_name, question.tool_name) == (ESCALATION_TOOL, BUDGET_TOOL)
    at = min(driver.state.continuation.deadline_ms, question.expires_at_ms) - 1
    driver.schedule(approve(at, escalation, approved=False))
    assert [tag for tag, _ in driver.step() if tag in ("intents", ERRORS)] == []
    ids = list(driver.state.continuation.pending_intent_ids)
    assert len(ids) == len(set(ids)) and driver.state.continuation.held_attempts == 1
    driver.schedule(approve(at + 1, question))
    outputs = driver.step()
    assert [value.tool_name for tag, value in outputs if tag == "intents"] == ["lookup"]
