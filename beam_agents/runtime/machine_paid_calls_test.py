"""A failed activation's paid model calls under attack: a start that ends for good
(its last attempt paid or not, a budget question declined or unanswered) leaves no answer for a
later event's start at its seq; a retry past the cache's limits counts every payment; a ReAct
resume that failed on a bad model turn asks the model again on its retry; the TTL is not moved
back. Each test drives KeyMachine through `testing.machine_harness`.
"""

from __future__ import annotations

import dataclasses

import pytest

from beam_agents._protos import MemoryBlob
from beam_agents.errors import LlmCallError
from beam_agents.runtime import LlmResponse, RuntimeConfig, agent
from beam_agents.runtime.budget import Budget, OnBudget, Price
from beam_agents.runtime.machine import ERRORS
from beam_agents.testing.machine_harness import T0, Harness, answer, approve, event, pending


class _Numbered:
    """A model whose every answer is new ("answer 1", "answer 2", ...), so a replayed answer
    tells itself apart from a paid one; busy (retryable) on requests for `busy`, `times`
    times (None: always)."""

    def __init__(self, busy: str | None = None, times: int | None = None) -> None:
        self.calls = 0
        self.busy = busy
        self.times = times

    def complete(self, request):
        if request.messages[-1]["content"] == self.busy and self.times != 0:
            self.times = None if self.times is None else self.times - 1
            raise LlmCallError("busy", model=request.model, retryable=True)
        self.calls += 1
        return LlmResponse(f"answer {self.calls}", request.model, 100, 50)


@agent(name="tests.status/v1")
def _status(ctx, event: bytes) -> bytes:
    # The same first question whatever the event: "what is the status now?". A `deep` event
    # asks a second question after it.
    now = ctx.llm([{"role": "user", "content": "status?"}], model="m").text
    if event == b"deep":
        ctx.llm([{"role": "user", "content": "details?"}], model="m")
    return now.encode()


def _config(**budget) -> RuntimeConfig:
    prices = {"m": Price(input_per_million=2_000_000, output_per_million=8_000_000)}
    return RuntimeConfig(budget=Budget(prices=prices, **budget))


def test_a_deferred_start_that_ends_on_a_replayed_attempt_moves_the_key_past_its_seq():
    # The first attempt pays for "status?" and is deferred ("details?" busy); its last retry
    # replays "status?", pays nothing, and fails for good. The cache still holds the first
    # attempt's answer at that seq, so the key must move past it whatever the last attempt
    # paid, or the next event is answered with it.
    model = _Numbered(busy="details?")
    config = dataclasses.replace(_config(), retryable_resume_retries=1)
    h = Harness(_status, llm=model, config=config)
    h.send(event(T0 - 1, b"quick"))  # a key with a seq: the next start runs at its successor
    h.send(event(T0, b"deep"))
    assert h.continuation.mailbox and model.calls == 2
    h.fire_deadline()
    assert [e.reason for e in h.values(ERRORS)] == ["llm_failed"] and h.continuation is None
    model.busy = None
    h.send(event(T0 + 10**6, b"quick"))
    # The new event must ask the model; "answer 2" was paid for by the event that failed.
    assert h.values("completions") == [b"answer 1", b"answer 3"]
    assert model.calls == 3


@pytest.mark.parametrize("decision", ["declined", "unanswered"])
def test_a_budget_question_on_a_start_that_is_declined_moves_the_key_past_its_seq(decision):
    # A start pays for "status?", is refused "details?" under ASK, and no one raises its
    # budget: the start has failed for good, as a `budget_exceeded` dead letter, and the next
    # event must not replay the answer it paid for.
    model = _Numbered()
    config = _config(key_tokens=310, on_exceed=OnBudget.ASK, raise_tokens=1000)
    h = Harness(_status, llm=model, config=config)
    h.send(event(T0 - 1, b"quick"))
    h.send(event(T0, b"deep"))
    (question,) = pending(h)
    assert model.calls == 2
    if decision == "declined":
        h.send(approve(T0 + 1, question, approved=False))
    else:
        h.fire_deadline()
    assert [e.reason for e in h.values(ERRORS)] == ["budget_exceeded"] and not pending(h)
    later = h.timers[1].at_ms or T0 + 10**9
    h.send(event(later - 1, b"quick"))
    # The refused start's call counts (300 of 310 tokens used): the next start asks too.
    (again,) = pending(h)
    h.send(approve(later, again))
    assert h.values("completions") == [b"answer 1", b"answer 3"]
    assert model.calls == 3


@agent(name="tests.three_then_busy/v1")
def _three_then_busy(ctx, event: bytes) -> bytes:
    for question in ("a", "b", "c", "last"):
        answered = ctx.llm([{"role": "user", "content": question}], model="m")
    return answered.text.encode()


def test_a_retry_whose_calls_overflow_the_cache_pays_again_and_counts_every_payment():
    # Three calls paid, the fourth busy; the cache keeps two. The retry runs the calls in the
    # order they were made, so LRU evicts each kept answer just before it is needed and every
    # call is paid again: replay holds within the cache's limits only (the guide, Budgets). What
    # must hold past them is the count: each payment once in the key's usage.
    model = _Numbered(busy="last")
    config = dataclasses.replace(_config(), cache_max_entries=2)
    h = Harness(_three_then_busy, llm=model, config=config)
    h.send(event(T0, b"x"))
    assert model.calls == 3 and h.continuation.mailbox
    model.busy = None
    h.fire_deadline()
    assert h.values("completions") == [b"answer 7"] and model.calls == 7
    cache = h.states[2].value
    assert (cache.input_tokens, cache.output_tokens) == (700, 350)


def test_a_react_resume_that_failed_on_a_bad_model_turn_asks_the_model_again_on_its_retry():
    # A ReAct resume whose model turn named a tool it was not given until the turn limit is a
    # TurnLimitError (agent_raised), which resume_retries exists to retry. A retry handed the
    # same bad turn would fail the same way each time, and the suspension would end as
    # resume_failed after a refund was paid; a react agent cannot ask again on its own, as its
    # calls are its loop's. So the retry asks the model, which answers differently.
    from beam_agents.runtime.react import react_agent
    from beam_agents.runtime.tool_calling import ToolCall, ToolDefinition

    class Model:
        calls = 0

        def complete(self, request):
            self.calls += 1
            if self.calls == 1:
                call = ToolCall("c1", "refund", {"amount": 1})
                return LlmResponse("", request.model, 10, 10, tool_calls=(call,))
            if self.calls == 2:  # a bad turn: a tool that does not exist
                call = ToolCall("c2", "refund_v2", {})
                return LlmResponse("", request.model, 10, 10, tool_calls=(call,))
            return LlmResponse("refunded", request.model, 10, 10)

    model = Model()
    agent_ = react_agent(
        model="m",
        tools=[ToolDefinition("refund", "Refunds.", {"type": "object"})],
        max_turns=2,
    )
    h = Harness(agent_, llm=model, config=_config())
    h.send(event(T0, b"refund my order"))
    (intent,) = pending(h)
    h.send(answer(T0 + 1, intent))
    assert [e.reason for e in h.values(ERRORS)] == ["agent_raised"]
    h.fire_deadline()
    assert h.values("completions") == [b"refunded"]


@agent(name="tests.suspends_then_fails/v1")
def _suspends_then_fails(ctx, event: bytes) -> bytes:
    if event == b"fail":
        ctx.llm([{"role": "user", "content": "hi"}], model="m")
        raise RuntimeError("a bug after the model call")
    ctx.memory.put("order", event)
    ctx.call_tool("payments.refund", {"amount": 1})
    raise RuntimeError("a bug in the resume")


def test_a_failed_start_that_paid_does_not_move_the_keys_ttl_back():
    # A resume that fails for good is activity: the TTL timer is set a TTL from it, though the
    # memory's last_activity_ms does not move. A failed start that paid must leave that timer:
    # set anew from the memory's mark, it would move back, and the key (its memory and its
    # usage) would be wiped half a TTL after its latest activity.
    ttl = 10_000_000
    config = dataclasses.replace(_config(), ttl_ms=ttl, resume_retries=0)
    h = Harness(_suspends_then_fails, llm=_Numbered(), config=config)
    h.send(event(T0, b"refund"))
    (intent,) = pending(h)
    h.send(answer(T0 + ttl // 2, intent))
    assert [e.reason for e in h.values(ERRORS)] == ["resume_failed"]
    assert h.timers[1].at_ms == T0 + ttl // 2 + ttl
    h.send(event(T0 + ttl // 2 + 1, b"fail"))
    assert h.values(ERRORS)[-1].reason == "agent_raised" and h.states[2].value.input_tokens
    assert h.timers[1].at_ms >= T0 + ttl // 2 + ttl


def test_a_start_that_ends_for_good_keeps_the_count_of_its_calls_not_their_answers():
    # Its seq is never run again, so an answer kept at it would be dead weight in every later
    # commit of the cache, until a start that calls the model drops it.
    class Down(_Numbered):
        def complete(self, request):
            if request.messages[-1]["content"] == "details?":
                raise LlmCallError("down", model=request.model, retryable=False)
            return super().complete(request)

    h = Harness(_status, llm=Down(), config=_config())
    h.send(event(T0, b"deep"))
    assert [e.reason for e in h.values(ERRORS)] == ["llm_failed"]
    cache = h.states[2].value
    assert not cache.entries and cache.input_tokens == 100


@agent(name="tests.pays_then_fails/v1")
def _pays_then_fails(ctx, event: bytes) -> bytes:
    ctx.llm([{"role": "user", "content": "hi"}], model="m")
    raise RuntimeError("a bug after the model call")


def test_a_memoryless_keys_usage_is_kept_for_a_ttl_from_its_latest_failure():
    # A key whose only state is what failed starts paid (a poison key) keeps it for a TTL from
    # the latest of them, a high-water mark like any key's activity: an event stamped behind
    # does not move the timer back, and a stale firing of an earlier setting wipes nothing.
    # Else its budget would reset early, and it would pay on for ever, a TTL at a time.
    ttl = 10_000_000
    config = dataclasses.replace(_config(key_tokens=400), ttl_ms=ttl)
    h = Harness(_pays_then_fails, llm=_Numbered(), config=config)
    h.send(event(T0 + 10**6, b"a"))
    assert h.timers[1].at_ms == T0 + 10**6 + ttl
    h.send(event(T0, b"b"))  # stamped behind; its start fails after paying too
    assert h.states[2].value.input_tokens == 200
    assert h.timers[1].at_ms == T0 + 10**6 + ttl
    h.fire_ttl(T0 + ttl)  # the setting an event at T0 would have made, fired anyway
    assert h.states[2].value.input_tokens == 200
    assert [e.reason for e in h.values(ERRORS)] == ["agent_raised"] * 2


@agent(name="tests.status_then_details/v1")
def _status_then_details(ctx, event: bytes) -> bytes:
    now = ctx.llm([{"role": "user", "content": "status?"}], model="m").text
    ctx.llm([{"role": "user", "content": "details?"}], model="m")
    return now.encode()


@pytest.mark.parametrize("ending", ["deferred_then_busy", "budget_declined"])
def test_a_start_that_ends_for_good_leaves_no_answer_an_earlier_attempt_kept(ending):
    # The first attempt pays "status?" and keeps it for its retry (deferred: "details?" busy;
    # or held by a budget question); then the start ends for good. Its seq never runs again,
    # so the answer would only be copied and encoded by every commit of the cache.
    if ending == "deferred_then_busy":
        model = _Numbered(busy="details?")
        config = dataclasses.replace(_config(), retryable_resume_retries=1)
    else:
        model = _Numbered()
        config = _config(key_tokens=160, on_exceed=OnBudget.ASK, raise_tokens=10)
    h = Harness(_status_then_details, llm=model, config=config)
    h.send(event(T0, b"x"))
    assert model.calls == 1 and h.continuation is not None
    if ending == "deferred_then_busy":
        h.fire_deadline()
        assert [e.reason for e in h.values(ERRORS)] == ["llm_failed"]
    else:
        (question,) = pending(h)
        h.send(approve(T0 + 1, question, approved=False))
        assert [e.reason for e in h.values(ERRORS)] == ["budget_exceeded"]
    assert h.continuation is None and model.calls == 1
    cache = h.states[2].value
    assert cache.input_tokens == 100 and not cache.entries


@agent(name="tests.says_or_fails/v1")
def _says_or_fails(ctx, event: bytes) -> bytes:
    said = ctx.llm([{"role": "user", "content": event.decode()}], model="m").text
    if event == b"fail":
        raise RuntimeError("a bug after the model call")
    return said.encode()


def test_a_failed_start_after_a_commit_that_migrated_the_cache_is_counted():
    # The key holds a version-1 cache. Its deferred start succeeds on its retry and its commit
    # migrates the cache; then a queued event pays and fails in the same input. The key holds
    # no older blob any more, so that payment counts.
    from beam_agents._protos import LlmCacheBlob

    model = _Numbered(busy="first", times=1)
    h = Harness(_says_or_fails, llm=model, config=_config())
    h.states[2].value = LlmCacheBlob(state_schema_version=1, input_tokens=10)
    h.send(event(T0, b"first"))
    h.send(event(T0 + 1, b"fail"))
    assert len(h.continuation.mailbox) == 2 and model.calls == 0
    h.fire_deadline()
    assert h.values("completions") == [b"answer 1"] and model.calls == 2
    assert [e.reason for e in h.values(ERRORS)] == ["agent_raised"]
    cache = h.states[2].value
    assert cache.state_schema_version == 2 and cache.input_tokens == 10 + 200


def test_a_poison_keys_usage_is_kept_while_it_keeps_failing():
    # A key failing every TTL/2 is never idle: its count must not be wiped a TTL after its
    # first failure, or it would get its budget back every TTL and pay on for ever.
    ttl = 10_000
    config = dataclasses.replace(_config(key_tokens=400), ttl_ms=ttl)
    h = Harness(_pays_then_fails, llm=_Numbered(), config=config)
    h.send(event(T0, b"a"))
    h.send(event(T0 + ttl // 2, b"b"))
    h.fire_ttl(T0 + ttl)  # what the first failure set, fired anyway
    assert h.states[2].value.input_tokens == 200
    assert h.timers[1].at_ms == T0 + ttl // 2 + ttl


@pytest.mark.parametrize("held", ["deferred", "budget_asked"])
def test_a_held_start_on_an_older_versions_key_keeps_what_it_paid_for(held):
    # The key holds a version-1 memory only. A start pays "status?", then "details?" is busy
    # (deferred) or past the key's budget (ASK). The deferral or the question writes the key
    # at version 2 in the same input, so what the failure paid is kept too: a version-1
    # binary reads the key no more either way.
    if held == "deferred":
        model = _Numbered(busy="details?", times=1)
        config = dataclasses.replace(_config(), retryable_resume_retries=1)
    else:
        model = _Numbered()
        config = _config(key_tokens=160, on_exceed=OnBudget.ASK, raise_tokens=1000)
    h = Harness(_status_then_details, llm=model, config=config)
    h.states[1].value = MemoryBlob(state_schema_version=1, last_activity_ms=T0 - 1)
    h.send(event(T0, b"x"))
    assert model.calls == 1 and h.continuation.mailbox
    assert h.continuation.state_schema_version == h.memory.state_schema_version == 2
    if held == "deferred":
        h.fire_deadline()
    else:
        (question,) = pending(h)
        h.send(approve(T0 + 1, question))
    assert h.values("completions") and model.calls == 2
    assert h.states[2].value.input_tokens == 200


def test_a_resume_that_fails_for_good_counts_its_calls_before_the_mailbox_runs():
    # Its retries spent, the suspension ends and the events queued behind it start, paying
    # too: each payment counts once, the resume's included.
    @agent(name="tests.pays_on_resume_then_fails/v1")
    def pays_on_resume_then_fails(ctx, event: bytes) -> bytes:
        if event == b"queued":
            return ctx.llm([{"role": "user", "content": "queued"}], model="m").text.encode()
        ctx.call_tool("payments.refund", {"amount": 1})
        ctx.llm([{"role": "user", "content": "summary?"}], model="m")
        raise RuntimeError("a bug after the model call")

    model = _Numbered()
    config = dataclasses.replace(_config(), resume_retries=0)
    h = Harness(pays_on_resume_then_fails, llm=model, config=config)
    h.send(event(T0, b"refund"))
    (intent,) = pending(h)
    h.send(event(T0 + 1, b"queued"))
    h.send(answer(T0 + 2, intent))
    assert [e.reason for e in h.values(ERRORS)] == ["resume_failed"]
    assert h.values("completions") == [b"answer 2"] and model.calls == 2
    assert h.states[2].value.input_tokens == 200


@agent(name="tests.two_calls_after_a_tool/v1")
def _two_calls_after_a_tool(ctx, event: bytes) -> bytes:
    ctx.call_tool("payments.refund", {"amount": 1})
    ctx.llm([{"role": "user", "content": "first"}], model="m")
    return ctx.llm([{"role": "user", "content": "second"}], model="m").text.encode()


def test_a_resume_whose_model_went_busy_replays_the_calls_it_paid_for_on_its_retry():
    model = _Numbered(busy="second", times=1)
    h = Harness(_two_calls_after_a_tool, llm=model, config=_config())
    h.send(event(T0, b"x"))
    (intent,) = pending(h)
    h.send(answer(T0 + 1, intent))
    assert [e.reason for e in h.values(ERRORS)] == ["llm_failed"] and model.calls == 1
    h.fire_deadline()
    assert h.values("completions") == [b"answer 2"] and model.calls == 2  # "first" replayed
    assert h.states[2].value.input_tokens == 200


def test_a_resume_held_by_its_budget_replays_what_it_paid_for_once_raised():
    model = _Numbered()
    config = _config(key_tokens=160, on_exceed=OnBudget.ASK, raise_tokens=1000)
    h = Harness(_two_calls_after_a_tool, llm=model, config=config)
    h.send(event(T0, b"x"))
    (intent,) = pending(h)
    h.send(answer(T0 + 1, intent))
    _, question = pending(h)
    assert model.calls == 1 and h.states[2].value.input_tokens == 100
    h.send(approve(T0 + 2, question))
    assert h.values("completions") == [b"answer 2"] and model.calls == 2
    assert h.states[2].value.input_tokens == 200


class _RefusesAfterATool:
    """A model that answers "first" (10 + 10 tokens) and refuses "after the tool", billing
    10,000 input tokens for the refused answer (a safety block, say)."""

    def complete(self, request):
        if request.messages[-1]["content"] == "after the tool":
            raise LlmCallError("refused", model=request.model, retryable=False, input_tokens=10_000)
        return LlmResponse("ok", request.model, 10, 10)


@agent(name="tests.refused_on_resume/v1")
def _refused_on_resume(ctx, event: bytes) -> bytes:
    if event == b"first":
        return ctx.llm([{"role": "user", "content": "first"}], model="m").text.encode()
    ctx.call_tool("a.tool", {})
    return ctx.llm([{"role": "user", "content": "after the tool"}], model="m").text.encode()


def test_a_refused_answer_that_fails_a_resume_is_counted_on_a_blob_of_its_own():
    # The resume touches no call the key's cache holds, so the cache it read is unchanged
    # and its `to_blob` is the stored blob itself. The refused answer's usage must land on a
    # new blob, which the DoFn then writes: counted in place on the blob read, it changed
    # state on a portable runner only (the harness's cells hand back the stored object and
    # check it is never changed), and was lost on the DirectRunner.
    h = Harness(_refused_on_resume, llm=_RefusesAfterATool())
    h.send(event(T0, b"first"))
    read = h.states[2].value
    writes = h.states[2].writes
    h.send(event(T0 + 1, b"x"))
    (called,) = pending(h)
    h.send(answer(T0 + 2, called))
    assert [e.reason for e in h.values(ERRORS)] == ["llm_failed"]
    cache = h.states[2].value
    assert cache is not read and h.states[2].writes > writes
    assert (cache.input_tokens, cache.output_tokens) == (10_010, 10)
    assert (read.input_tokens, read.output_tokens) == (10, 10)
