"""A function agent's resumes make each model call of its seq once: every path a resume takes
finds in the replay cache every call the activation made before, though its resumes write back
only the calls they make again (a model that answers differently each time, and counts)."""

from __future__ import annotations

from beam_agents.runtime import (
    AtDeadline,
    DeadlinePolicy,
    LlmResponse,
    RuntimeConfig,
    agent,
)
from beam_agents.runtime.budget import BUDGET_TOOL, Budget, OnBudget, Price
from beam_agents.runtime.machine import ERRORS
from beam_agents.runtime.react import react_agent
from beam_agents.runtime.tool_calling import ToolCall, ToolDefinition
from beam_agents.testing.machine_harness import T0, Harness, answer, approve, event, pending


class _Fresh:
    """Answers each call with a new text (a re-call would diverge), counting calls; down for
    the calls whose numbers are in `down`."""

    def __init__(self, down=()):
        self.calls = 0
        self.down = set(down)

    def complete(self, request):
        from beam_agents.errors import LlmCallError

        self.calls += 1
        if self.calls in self.down:
            raise LlmCallError("busy", model=request.model, retryable=True)
        return LlmResponse(f"{request.messages[-1]['content']}#{self.calls}", request.model, 1, 1)


@agent(name="tests.replay_long/v1")
def _long(ctx, event: bytes) -> bytes:
    a = ctx.llm([{"role": "user", "content": "a"}], model="m").text
    answers = ctx.call_tools([("t.x", {"a": a}), ("t.y", {"a": a}), ("t.z", {"a": a})])
    b = ctx.llm([{"role": "user", "content": "b" + a}], model="m").text
    ctx.request_approval("ok?", b=b)
    c = ctx.llm([{"role": "user", "content": "c" + b}], model="m").text
    ctx.call_tool("t.w", {"c": c})
    d = ctx.llm([{"role": "user", "content": "d" + c}], model="m").text
    return (d + "|" + ",".join(x.payload.decode() for x in answers)).encode()


def _drive(h, model, *, expire_first=False, restore_at=None):
    h.send(event(T0, b"go"))
    x, y, z = pending(h)
    # Parallel answers out of order, one at a time.
    for n, intent in enumerate((z, x, y)):
        if expire_first and intent is y:
            h.fire_deadline()  # escalates or expires y
            continue
        h.send(answer(T0 + 1 + n, intent, intent.tool_name.encode()))
    if restore_at == "approval":
        snapshot = h.export()
        h = Harness(_long, llm=model, config=h.machine._config)
        h.restore(snapshot)
    own = [
        i for i in pending(h) if i.tool_name not in (BUDGET_TOOL,) and "escalat" not in i.tool_name
    ]
    (asked,) = own[-1:]
    h.send(approve(T0 + 10, asked))
    (w,) = [i for i in pending(h) if i.tool_name == "t.w"]
    h.send(answer(T0 + 11, w, b"w"))
    return h


def test_a_long_function_agent_calls_each_model_call_once():
    model = _Fresh()
    h = _drive(Harness(_long, llm=model), model)
    assert h.values(ERRORS) == []
    assert model.calls == 4
    assert len(h.values("completions")) == 1


def test_with_a_restore_while_suspended_and_retries_after_a_busy_model():
    model = _Fresh(down=(3,))  # c's first call fails: the resume retries on its timer
    h = Harness(_long, llm=model, config=RuntimeConfig(resume_backoff_ms=1))
    h.send(event(T0, b"go"))
    for n, intent in enumerate(reversed(pending(h))):
        h.send(answer(T0 + 1 + n, intent, b"r"))
    snapshot = h.export()
    h = Harness(_long, llm=model, config=RuntimeConfig(resume_backoff_ms=1))
    h.restore(snapshot)
    (asked,) = pending(h)
    h.send(approve(T0 + 10, asked))
    assert [e.reason for e in h.values(ERRORS)] == ["llm_failed"]
    h.fire_deadline()
    (w,) = pending(h)
    h.send(answer(T0 + 20, w, b"w"))
    assert len(h.values("completions")) == 1 and model.calls == 5  # 4 + the failed one


def test_with_escalation_and_expiry():
    model = _Fresh()
    policy = DeadlinePolicy(AtDeadline.ESCALATE, max_escalations=1, extension_ms=50)
    h = Harness(_long, llm=model, config=RuntimeConfig(deadline_policy=policy))
    h.send(event(T0, b"go"))
    x, y, z = pending(h)
    h.send(answer(T0 + 1, z, b"z"))
    h.fire_deadline()  # escalates
    esc = [i for i in pending(h) if i not in (x, y, z)]
    h.send(approve(T0 + 2, esc[0], approved=False))  # expire the rest, resume
    (asked,) = [i for i in pending(h) if i.kind == asked_kind()]
    h.send(approve(T0 + 10, asked))
    assert len([i for i in pending(h) if i.tool_name == "t.w"]) == 1
    h.fire_deadline()  # escalates on w
    h.fire_deadline()  # now expires w
    assert h.values(ERRORS) == [], h.values(ERRORS)
    assert len(h.values("completions")) == 1 and model.calls == 4


def asked_kind():
    from beam_agents._protos import ToolIntent

    return ToolIntent.APPROVAL


def _until_done(h, at=T0):
    asked_budget = 0
    for _ in range(50):
        if not pending(h):
            break
        for intent in list(reversed(pending(h))):
            done = {
                a.tool_result.intent_id or a.approval.intent_id
                for a in (h.continuation.answers if h.continuation else ())
            }
            if intent not in pending(h) or intent.intent_id in done:
                continue
            at += 1
            if intent.tool_name == BUDGET_TOOL:
                asked_budget += 1
                h.send(approve(at, intent))
            elif intent.kind == asked_kind():
                h.send(approve(at, intent))
            else:
                h.send(answer(at, intent, b"r"))
    return asked_budget


def test_with_budget_questions_on_resumes():
    seen = set()
    for tokens in range(2, 60, 3):
        model = _Fresh()
        prices = {"m": Price(input_per_million=1, output_per_million=1)}
        config = RuntimeConfig(
            budget=Budget(
                prices=prices, key_tokens=tokens, on_exceed=OnBudget.ASK, raise_tokens=tokens
            )
        )
        h = Harness(_long, llm=model, config=config)
        h.send(event(T0, b"go"))
        asked = _until_done(h)
        seen.add(asked)
        assert h.values(ERRORS) == [], (tokens, h.values(ERRORS))
        assert len(h.values("completions")) == 1 and model.calls == 4, (tokens, asked, model.calls)
    assert len(seen) > 2, seen  # budget questions were asked, on resumes too


class _ReactModel:
    def __init__(self):
        self.calls = 0

    def complete(self, request):
        self.calls += 1
        turns = sum(1 for m in request.messages if m.get("role") == "tool")
        if turns < 4:
            calls = (
                ToolCall(f"c{self.calls}a", "kb", {"q": self.calls}),
                ToolCall(f"c{self.calls}b", "kb", {"q": -self.calls}),
            )
            return LlmResponse(f"turn {self.calls}", request.model, 1, 1, tool_calls=calls)
        return LlmResponse(f"done {self.calls}", request.model, 1, 1)


def test_react_agent_calls_each_turn_once():
    model = _ReactModel()
    kb = ToolDefinition("kb", "kb", {"type": "object"})
    h = Harness(react_agent(model="m", tools=[kb]), llm=model)
    h.send(event(T0, b"hi"))
    at = T0
    while pending(h):
        for intent in reversed(pending(h)):
            at += 1
            h.send(answer(at, intent, b"r"))
    assert h.values(ERRORS) == [], h.values(ERRORS)
    assert h.values("completions") and model.calls == 3


def test_cache_max_entries_small_still_resumes_without_recalls_when_the_seq_fits():
    model = _Fresh()
    h = _drive(Harness(_long, llm=model, config=RuntimeConfig(cache_max_entries=4)), model)
    assert h.values(ERRORS) == [] and model.calls == 4


def test_a_subclass_with_a_resume_of_its_own_does_not_claim_to_replay_every_call():
    from beam_agents.runtime.function_agent import FunctionAgent

    class OwnResume(FunctionAgent):
        def resume(self, ctx, answers):
            return super().resume(ctx, answers)

    def ask(ctx, event: bytes) -> bytes:
        return ctx.llm([{"role": "user", "content": "q"}], model="m").text.encode()

    assert FunctionAgent(ask, "tests.ask/v1").replays_every_call
    assert not OwnResume(ask, "tests.own_resume/v1").replays_every_call


@agent(name="tests.parallel_second/v1")
def _parallel_second(ctx, event: bytes) -> bytes:
    first = ctx.call_tool("t.a", {})
    both = ctx.call_tools([("t.b", {}), ("t.c", {})])
    last = ctx.call_tool("t.d", {})
    return b",".join(a.payload for a in (first, *both, last))


def test_a_parallel_step_after_another_step_replays_with_its_own_answers():
    # The snapshot keeps answers flat; a replay groups them back into steps by step_index. A
    # step of two calls behind a step of one must get both its answers, not lend one to the
    # step before (the replay would diverge at that step).
    h = Harness(_parallel_second)
    h.send(event(T0, b"go"))
    for step in range(3):
        for n, intent in enumerate(pending(h)):
            h.send(answer(T0 + 10 * step + n + 1, intent, intent.tool_name.encode()))
    assert h.values(ERRORS) == [] and not pending(h)
    assert h.values("completions") == [b"t.a,t.b,t.c,t.d"]
