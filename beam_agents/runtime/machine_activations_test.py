"""The agent's activations (machine_activations): an accepted answer survives a failing resume,
a function agent's memory writes count once however often it suspends, an agent out of
contract is a dead letter, and memory totals are written as the activation left them. Each
test drives KeyMachine through `testing.machine_harness`.
"""

from __future__ import annotations

import pytest

from beam_agents.runtime import LlmResponse, RuntimeConfig, Suspension, agent
from beam_agents.runtime.context import RUNTIME_TOOLS
from beam_agents.runtime.machine import ERRORS
from beam_agents.testing.machine_harness import (
    SEQ,
    T0,
    DownOnce,
    Harness,
    answer,
    approve,
    event,
    pending,
    refund,
    summarise,
)

# Point 1: an accepted answer is durable input -------------------------------------------------


def test_a_result_survives_a_failing_resume_and_is_never_presented_as_expired():
    h = Harness(refund, llm=DownOnce(2), config=RuntimeConfig(resume_backoff_ms=1000))
    h.send(event(T0, b"4200"))
    (paid,) = pending(h)
    h.send(answer(T0 + 5, paid, b"refunded 4200"))
    (failed,) = h.values(ERRORS)
    assert (
        failed.reason == "llm_failed" and failed.answers[0].tool_result.payload == b"refunded 4200"
    )
    assert h.continuation.resume_failures == 1 and h.timers[0].at_ms == T0 + 5 + 1000
    h.fire_deadline()  # down again: a second retry, twice the backoff
    assert h.continuation.resume_failures == 2 and h.timers[0].at_ms == T0 + 1005 + 2000
    h.fire_deadline()
    assert h.values("completions") == [b"summary of refunded 4200 after 1 visit(s)"]
    assert h.continuation is None and h.timers[0].at_ms is None


# Point 3: a function agent's memory writes count once -----------------------------------------


def test_a_function_agent_counts_one_visit_per_event_however_often_it_suspends():
    h = Harness(refund, llm=summarise(""))
    for n, at in enumerate((T0, T0 + 100), start=1):
        h.send(event(at, b"7"))
        (paid,) = pending(h)
        assert h.memory.entries[0].value == str(n - 1).encode() if n > 1 else True
        h.send(answer(at + 1, paid))
    assert h.values("completions") == [
        b"summary of ok after 1 visit(s)",
        b"summary of ok after 2 visit(s)",
    ]
    assert [(e.key, e.value) for e in h.memory.entries] == [("visits", b"2")]


# The replay cache ------------------------------------------------------------------------------


class _Counted:
    """A model that answers every call with 5 input and 3 output tokens, and counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request):
        self.calls += 1
        return LlmResponse(f"on {request.messages[-1]['content']}", request.model, 5, 3)


@agent(name="tests.asks_then_pays/v1")
def _asks_then_pays(ctx, event: bytes) -> bytes:
    advice = ctx.llm([{"role": "user", "content": event.decode()}], model="m")
    return ctx.call_tool("payments.refund", {"advice": advice.text}).payload


def test_a_start_writes_back_its_own_model_calls_not_the_ones_before_and_a_resume_replays():
    """A call's cache key holds its activation's seq, so a call recorded under an earlier seq
    can never answer again: a start's commit writes its own calls and the key's usage only.
    The resume of the same activation still answers the start's call from the cache."""
    model = _Counted()
    h = Harness(_asks_then_pays, llm=model)
    for n, at in enumerate((T0, T0 + 100, T0 + 200), start=1):
        h.send(event(at, b"q%d" % n))
        cache = h.states[2].value
        assert len(cache.entries) == 1 and cache.total_response_bytes == len(
            cache.entries[0].response
        )
        assert (cache.input_tokens, cache.output_tokens) == (5 * n, 3 * n)
        (paid,) = pending(h)
        h.send(answer(at + 1, paid, b"paid %d" % n))
        assert model.calls == n
    assert h.values("completions") == [b"paid 1", b"paid 2", b"paid 3"]
    # The completion drops the calls it made (see the end of this file).
    assert list(h.states[2].value.entries) == []


class _AsksEachEvent:
    """An agent of its own start and resume (not one that runs again from the top)."""

    adapter = "tests.asks_each_event/v1"

    def start(self, ctx, event):
        return ctx.complete(
            ctx.llm([{"role": "user", "content": event.decode()}], model="m").text.encode()
        )

    def resume(self, ctx, answers):
        raise AssertionError("never suspends")


def test_any_agents_completed_start_keeps_no_model_calls_but_counts_them():
    model = _Counted()
    h = Harness(_AsksEachEvent(), llm=model)
    for n in range(3):
        h.send(event(T0 + n, b"q%d" % n))
        assert list(h.states[2].value.entries) == []
    assert h.values("completions") == [b"on q0", b"on q1", b"on q2"] and model.calls == 3
    assert h.states[2].value.input_tokens == 15


def test_a_start_that_calls_no_model_leaves_the_recorded_calls_unwritten():
    h = Harness(refund, llm=summarise(""))  # a tool first; the model only in the resume
    h.send(event(T0, b"7"))
    (paid,) = pending(h)
    h.send(answer(T0 + 1, paid))
    recorded = h.states[2].value
    assert recorded.input_tokens == 0 and list(recorded.entries) == []  # dropped at completion
    h.send(event(T0 + 100, b"8"))
    assert pending(h) and h.states[2].value is recorded


def test_an_agent_that_calls_the_model_only_after_a_tool_keeps_no_dead_calls():
    # Its starts call no model and write no cache; its resumes run the function again from
    # the top and write back only the calls they made again or made first.
    h = Harness(refund, llm=summarise(""))
    for n in range(1, 6):
        h.send(event(T0 + 10 * n, str(n).encode()))
        (paid,) = pending(h)
        h.send(answer(T0 + 10 * n + 1, paid, b"refunded %d" % n))
    assert h.values("completions")[-1].startswith(b"summary of refunded 5")
    assert list(h.states[2].value.entries) == []


class _PlansThenPays:
    """An agent of its own (not a function run again): its resume makes a model call of its
    own and none of its start's, so the start's recorded call must stay for later resumes."""

    adapter = "tests.plans_then_pays/v1"

    def start(self, ctx, event):
        ctx.llm([{"role": "user", "content": "plan"}], model="m")
        ctx.call_tool("a.tool", {"step": 1})
        return ctx.suspend(snapshot=b"1")

    def resume(self, ctx, answers):
        ctx.llm([{"role": "user", "content": f"step {ctx.resume_of.snapshot.decode()}"}], model="m")
        if ctx.resume_of.snapshot == b"1":
            ctx.call_tool("a.tool", {"step": 2})
            return ctx.suspend(snapshot=b"2")
        return ctx.complete(b"done")


def test_an_agent_that_does_not_run_again_from_the_top_keeps_the_calls_its_resume_left():
    h = Harness(_PlansThenPays(), llm=summarise(""))
    h.send(event(T0, b"x"))
    (asked,) = pending(h)
    h.send(answer(T0 + 1, asked))
    assert len(h.states[2].value.entries) == 2  # the start's plan and the first resume's step
    (asked,) = pending(h)
    h.send(answer(T0 + 2, asked))
    assert h.values("completions") == [b"done"]
    assert list(h.states[2].value.entries) == []  # the completion drops the seq's calls


@agent(name="tests.pays_then_asks_twice/v1")
def _pays_then_asks_twice(ctx, event: bytes) -> bytes:
    for step in (1, 2):
        paid = ctx.call_tool("payments.refund", {"step": step})
        ctx.llm([{"role": "user", "content": paid.payload.decode()}], model="m")
    return b"done"


def test_a_function_agents_resume_drops_the_calls_an_earlier_seq_left():
    # Calls of an earlier seq (as a binary before seq-scoped writes left them) can answer
    # nothing again. A function agent runs again from the top at each resume, so its resume
    # writes back only the calls it made or made again: the dead ones go.
    earlier = Harness(_PlansThenPays(), llm=summarise(""))
    earlier.send(event(T0, b"x"))
    (asked,) = pending(earlier)
    earlier.send(answer(T0 + 1, asked))
    left = earlier.states[2].value
    assert len(left.entries) == 2
    h = Harness(_pays_then_asks_twice, llm=summarise(""))
    h.states[0].value = SEQ
    h.states[2].value = left
    h.send(event(T0 + 10, b"y"))  # a tool first: the start writes no cache
    assert h.states[2].value is left
    (paid,) = pending(h)
    h.send(answer(T0 + 11, paid, b"refunded"))
    (own,) = h.states[2].value.entries
    assert own.response == LlmResponse("summary of refunded", "m").to_bytes()


# Contract and memory totals ---------------------------------------------------------------------


class _BadSuspension:
    adapter = "tests.bad/v1"

    def start(self, ctx, event):
        ctx.call_tool("a.tool", {})
        return Suspension(continuation=b"not a continuation")

    def resume(self, ctx, answers):
        raise AssertionError("never resumed")


@pytest.mark.parametrize("name", sorted(RUNTIME_TOOLS))
def test_an_agent_calling_a_tool_named_as_the_runtimes_own_questions_is_a_contract_letter(name):
    """Its answer would have gone to the runtime's budget or deadline path, not the agent, and
    the key ended in a dead letter of that path's, at the resume (review rev48)."""

    @agent(name="tests.poses/v1")
    def poses(ctx, event: bytes) -> bytes:
        return ctx.call_tool(name, {"question": "raise?"}).payload

    class Escalates:
        """A class agent gets the context itself, and its `escalate` (review rev49)."""

        adapter = "tests.escalates/v1"

        def start(self, ctx, event):
            return ctx.suspend() if ctx.escalate("may I?", tool=name) else None

        def resume(self, ctx, answers):
            raise AssertionError("never resumed")

    for posing in (poses, Escalates()):
        h = Harness(posing)
        effects = h.send(event(T0, b"x"))
        (refused,) = h.values(ERRORS)
        assert refused.reason == "agent_contract" and repr(name) in refused.detail
        assert h.values("intents") == [] and effects.state.seq == SEQ


def test_a_suspension_without_a_continuation_is_a_contract_dead_letter_not_a_crash():
    h = Harness(_BadSuspension())
    effects = h.send(event(T0, b"x"))
    assert [e.reason for e in h.values(ERRORS)] == ["agent_contract"]
    # Only the seq is written: the key moves past the start that failed for good.
    assert effects.state.empty and effects.state.seq == SEQ and h.values("intents") == []


def test_a_memory_total_that_drops_to_zero_is_written_as_zero():
    @agent(name="tests.forget/v1")
    def forget(ctx, event):
        if event == b"put":
            ctx.memory.put("k", b"value")
        else:
            ctx.memory.delete("k")
        return b"ok"

    h = Harness(forget)
    h.send(event(T0, b"put"))
    assert h.memory.total_value_bytes == 5
    h.send(event(T0 + 1, b"delete"))
    assert h.memory.total_value_bytes == 0 and list(h.memory.entries) == []


# A completed key keeps no model answers ---------------------------------------------------------


@agent(name="tests.three_steps/v1")
def _three_steps(ctx, event: bytes) -> bytes:
    """A model answer kept in memory, one tool call, one approval: the peers benchmark's agent."""
    draft = ctx.llm([{"role": "user", "content": event.decode()}], model="m").text
    ctx.memory.put("draft", draft.encode())
    booked = ctx.call_tool("ledger.book", {"draft": len(draft)})
    decided = ctx.request_approval("send?", booked=booked.payload.decode())
    return b"sent" if decided.ok else b"held"


def _completed(model) -> tuple[Harness, list, object]:
    """A key of `_three_steps` run to completion, and the state it read at the completing
    answer (what a retry of that bundle reads again)."""
    h = Harness(_three_steps, llm=model)
    h.send(event(T0, b"q"))
    (booked,) = pending(h)
    h.send(answer(T0 + 1, booked, b"booked"))
    (asked,) = pending(h)
    before = [cell.value for cell in h.states]
    h.send(approve(T0 + 2, asked))
    assert h.values("completions") == [b"sent"]
    return h, before, asked


def test_a_completed_key_keeps_its_usage_but_not_its_model_answers():
    """The calls of a completed activation's seq can answer nothing (a later start runs under
    a later seq), so its commit drops them: the model's answer is left in memory only. What
    the key paid for stays counted."""
    h, _, _ = _completed(_Counted())
    cache = h.states[2].value
    assert list(cache.entries) == [] and cache.total_response_bytes == 0
    assert (cache.input_tokens, cache.output_tokens) == (5, 3)
    assert h.memory.entries[0].key == "draft"


def test_a_copy_of_an_input_after_completion_runs_nothing():
    """The dedupe marks live in memory, not in the cache: a late copy of the event, of the
    tool's result or of the approval calls no model and emits no intent."""
    model = _Counted()
    h, _, asked = _completed(model)
    ledger_and_approval = list(h.values("intents"))
    h.send(event(T0, b"q"))
    h.send(approve(T0 + 3, asked))
    assert model.calls == 1 and h.values("intents") == ledger_and_approval
    assert h.values("completions") == [b"sent"]


def test_a_retry_of_the_completing_bundle_replays_the_model_from_the_state_it_read():
    """A bundle that fails commits nothing: its retry reads the suspended key again, whose
    cache still answers the model's call, and completes the same way."""
    model = _Counted()
    h, before, asked = _completed(model)
    for cell, value in zip(h.states, before, strict=True):
        cell.value = value
    h.send(approve(T0 + 2, asked))
    assert model.calls == 1 and h.values("completions") == [b"sent", b"sent"]
    assert list(h.states[2].value.entries) == []


@agent(name="tests.raises/v1")
def _raises(ctx, event: bytes) -> bytes:
    raise KeyError("no such customer")


def test_a_failed_activation_is_traced_as_an_error_of_its_type_and_reason():
    # error.type is the OpenTelemetry conventions' name: integrations/telemetry.py describes the
    # span's error status with it.
    from beam_agents._protos import TraceEvent

    h = Harness(_raises)
    h.send(event(T0, b"x"))
    (failed,) = [t for t in h.values("traces") if t.event_type == TraceEvent.ERROR]
    assert dict(failed.attributes) == {
        "error.type": "KeyError",
        "beam_agents.reason": "agent_raised",
    }
