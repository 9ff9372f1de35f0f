"""Agents and models the hostile reviews of the backtest and the shadow drive histories with
(beam_agents/ops/backtest_hostile_test.py, shadow_order_test.py): small agents whose answers
show what a key's state held, and models that fail as a live job's do (busy once, on a given
request), with the budget config that asks a person to raise a key's tokens.
"""

from __future__ import annotations

import dataclasses
import json

from beam_agents._protos import AgentEnvelope, ToolResult
from beam_agents.errors import LlmCallError
from beam_agents.runtime import (
    INTENTS,
    RECORDS,
    LlmResponse,
    RuntimeConfig,
    ScriptedLlmClient,
    agent,
)
from beam_agents.runtime.budget import Budget, OnBudget
from beam_agents.runtime.config import AtDeadline, DeadlinePolicy
from beam_agents.runtime.context import ESCALATION_TOOL
from beam_agents.runtime.key_driver import KeyDriver, recording_machine
from beam_agents.runtime.machine_state import due_at
from beam_agents.testing.live_history import OK, PlanModel, answer_to, live_history
from beam_agents.testing.recorded_history import T0, record_history
from beam_agents.testing.simulation_agents import FUNCTION

__all__ = [
    "ASKING",
    "DEAD_LETTERING",
    "ESCALATING",
    "ONE_EVENT",
    "RAISED_BY_SIX",
    "RETRIED_FOR_EVER",
    "RETRIED_ONCE",
    "SHORT_DEADLINES",
    "BusyOnce",
    "DownOnFirstCall",
    "Numbered",
    "Stamped",
    "StampedPair",
    "asked_twice_history",
    "asks_a_person",
    "asks_again_while_busy",
    "asks_twice",
    "calls_per_event",
    "counter",
    "declined_payment",
    "expired_then_answered_history",
    "held_while_busy_history",
    "pair_history",
    "pays",
    "queued_behind_a_question_history",
    "queued_history",
    "raised_between_busy_models",
    "raised_on_a_failed_payment",
    "raised_then_declined",
    "raised_then_down_history",
    "two_calls",
    "unanswered_history",
    "upgraded_mid_resume_history",
]

#: One event of key b"k".
ONE_EVENT = [AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"e")]
#: A live job that puts a key's exceeded budget (20 tokens) before a person.
ASKING = RuntimeConfig(budget=Budget(key_tokens=20, on_exceed=OnBudget.ASK, raise_tokens=1_000))


@agent(name="review.counter/v1")
def counter(ctx, event: bytes) -> bytes:
    """The n-th event of its key since the key's state began."""
    n = int(ctx.memory.get("n", b"0")) + 1
    ctx.memory.put("n", str(n).encode())
    return f"event {n} of this key".encode()


@agent(name="review.two_calls/v1")
def two_calls(ctx, event: bytes) -> bytes:
    """Two model requests in one start, the second made from the first's answer."""
    first = ctx.llm(
        [{"role": "user", "content": "first " + event.decode()}], model="m", temperature=0
    ).text
    return ctx.llm(
        [{"role": "user", "content": "second " + first}], model="m", temperature=0
    ).text.encode()


@agent(name="review.calls_per_event/v1")
def calls_per_event(ctx, event: bytes) -> bytes:
    """As many model requests as the event says."""
    text = ""
    for n in range(int(event)):
        text = ctx.llm([{"role": "user", "content": f"q{n} {text}"}], model="m", temperature=0).text
    return text.encode()


class Stamped:
    """A step agent that opens a ticket stamped with its activation's time (`ctx.now_ms`, as
    agents stamp what they create), then completes when the ticket is answered."""

    adapter = "review.stamped/v1"

    def start(self, ctx, event: bytes):
        ctx.call_tool("ticket.open", {"event": event.decode(), "at": ctx.now_ms})
        return ctx.suspend()

    def resume(self, ctx, answers):
        return ctx.complete(b"opened at %d" % ctx.now_ms)


class StampedPair:
    """A step agent that makes two calls at once and says when its resume ran."""

    adapter = "review.stamped_pair/v1"

    def start(self, ctx, event: bytes):
        ctx.call_tools([("first", {}), ("second", {})])
        return ctx.suspend()

    def resume(self, ctx, answers):
        return ctx.complete(b"resumed at %d" % ctx.now_ms)


def pair_history():
    """`StampedPair`'s records on one event whose first call is answered a minute after the
    event and its second a second after it: it resumes at the later answer."""
    driver = KeyDriver(recording_machine(StampedPair(), None, RuntimeConfig()), b"k")
    driver.schedule(ONE_EVENT[0])
    history = []
    while driver:
        for tag, value in driver.step():
            if tag == RECORDS:
                history.append(value)
            elif tag == INTENTS:
                at = T0 + (60_000 if value.tool_name == "first" else 1_000)
                answer = AgentEnvelope(entity_key=b"k", event_time_ms=at)
                answer.tool_result.intent_id = value.intent_id
                answer.tool_result.status = ToolResult.OK
                driver.schedule(answer)
    return history


def queued_history():
    """A key's two events half a second apart, the second reaching the key while it waits on
    the first one's ticket (answered a second after it was asked): it waits in the mailbox and
    runs when the first completes, at that time."""
    events = [
        AgentEnvelope(entity_key=b"k", event_time_ms=T0 + n * 500, external_event=b"e%d" % n)
        for n in range(2)
    ]
    return record_history(
        Stamped(),
        events,
        tools={"ticket.open": lambda args, intent: b"{}"},
        approver=bool,
        llm_client=None,
    )


@agent(name="review.asks_a_person/v1")
def asks_a_person(ctx, event: bytes) -> bytes:
    """Asks a person whether to act on the event; says what it was told."""
    answer = ctx.request_approval("act on " + event.decode() + "?")
    return b"approved" if answer.ok else b"not approved: %d" % answer.result.status


#: A live job whose suspensions end twenty minutes on (its intents expire in ten).
SHORT_DEADLINES = RuntimeConfig(intent_ttl_ms=600_000, suspend_deadline_ms=1_200_000)
#: The same, asking a person at the deadline whether to wait twenty minutes more.
ESCALATING = dataclasses.replace(
    SHORT_DEADLINES,
    deadline_policy=DeadlinePolicy(action=AtDeadline.ESCALATE, extension_ms=1_200_000),
)
#: The same, ending a suspension at its deadline with a dead letter (no resume).
DEAD_LETTERING = dataclasses.replace(
    SHORT_DEADLINES, deadline_policy=DeadlinePolicy(action=AtDeadline.DEAD_LETTER)
)


def unanswered_history(agent, events, config, *, escalation=None, events_at=()):
    """The records of `agent` on `events` (one key's) under `config` where no intent of the
    agent's is ever answered: each suspension ends at its deadline, as the key's deadline timer
    fires, by the config's DeadlinePolicy. A person answers an escalation at once (keep
    waiting: `escalation` True, or not) when `escalation` is not None. `events_at` are more
    events, sent when the watermark reaches their time (the timers before them fire first)."""
    key = events[0].entity_key
    driver = KeyDriver(recording_machine(agent, None, config), key)
    for event in events:
        driver.schedule(event)
    later = sorted(events_at, key=lambda e: e.event_time_ms)
    history = []
    while driver or driver.state.continuation is not None or later:
        waiting = driver.state.continuation
        if driver:
            outputs = driver.step()
        elif waiting is not None and (not later or due_at(waiting) < later[0].event_time_ms):
            outputs = driver.fire_deadline(due_at(waiting))
        else:
            driver.schedule(later.pop(0))
            continue
        for tag, value in outputs:
            if tag == RECORDS:
                history.append(value)
            elif tag == INTENTS and value.tool_name == ESCALATION_TOOL and escalation is not None:
                answer = AgentEnvelope(entity_key=key, event_time_ms=value.created_at_ms + 1_000)
                answer.approval.intent_id = value.intent_id
                answer.approval.approved = escalation
                answer.approval.decided_at_ms = value.created_at_ms + 1_000
                driver.schedule(answer)
    return history


@agent(name="review.pays/v1")
def pays(ctx, event: bytes) -> bytes:
    """Pays, and raises when the payment failed: on every retry of its resume alike."""
    if not ctx.call_tool("pay", {"for": event.decode()}).ok:
        raise RuntimeError("the payment failed")
    return b"paid"


def declined_payment(args, intent) -> bytes:
    """A payment tool that fails (its ERROR result)."""
    raise RuntimeError("card declined")


class DownOnFirstCall:
    """A model down for the first request it is sent (its client's retries spent), then
    answering: a live outage that ended one start for good."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request):
        self.calls += 1
        if self.calls == 1:
            raise LlmCallError("down", model=request.model, retryable=False)
        return LlmResponse("ok", "m", 10, 5)


@agent(name="review.asks_twice/v1")
def asks_twice(ctx, event: bytes) -> bytes:
    """The same request twice (a retry of its own, a second opinion), then acts on the second
    answer."""
    first = ctx.llm([{"role": "user", "content": "p0"}], model="m", temperature=0).text
    second = ctx.llm([{"role": "user", "content": "p0"}], model="m", temperature=0).text
    ctx.call_tool("pay", {"first": first, "second": second})
    return b"paid"


class Numbered:
    """A model whose n-th answer says n: two answers to one request differ."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request):
        self.calls += 1
        return LlmResponse(f"answer {self.calls}", "m", 3, 2)


class BusyOnce:
    """A model busy once (retryable: its client's own retries spent), on the `nth` request it
    is sent, as a provider's overload leaves a live job's call; every answer is 15 tokens."""

    def __init__(self, nth: int) -> None:
        self._nth = nth
        #: The requests sent so far.
        self.calls = 0

    def complete(self, request):
        self.calls += 1
        if self.calls == self._nth:
            raise LlmCallError("busy", model=request.model, retryable=True)
        text = request.messages[-1]["content"]
        return LlmResponse(text="ok: " + text, model="m", input_tokens=10, output_tokens=5)


def asked_twice_history():
    """`asks_twice`'s records on one event under `RAISED_BY_SIX`: held for a raise at its
    second call, the start ran again, its first answer replayed (paid by the held attempt) and
    its second asked afresh, both answers to the same request."""
    history = record_history(
        asks_twice,
        ONE_EVENT,
        tools={"pay": lambda args, intent: b"{}"},
        approver=bool,
        llm_client=Numbered(),
        config=RAISED_BY_SIX,
    )
    assert [c.replayed for c in history[0].model_calls] == [True, False]
    return history


def raised_then_declined():
    """(config, history) of a key whose first start (`calls_per_event` on b"3") asks a raise
    before its first call, is granted ten tokens, makes one call, asks again and is declined;
    its second start (b"1") asks once and is granted."""
    config = RuntimeConfig(budget=Budget(key_tokens=20, on_exceed=OnBudget.ASK, raise_tokens=10))
    asked = []

    def approver(intent) -> bool:
        asked.append(intent.intent_id)
        return len(asked) != 2

    events = [
        AgentEnvelope(entity_key=b"k", event_time_ms=T0 + n * 60_000, external_event=calls)
        for n, calls in enumerate([b"3", b"1"])
    ]
    model = ScriptedLlmClient(lambda request: LlmResponse("ok", "m", 10, 5))
    history = record_history(
        calls_per_event, events, tools={}, approver=approver, llm_client=model, config=config
    )
    return config, history


#: Resumes retried once (twice on a busy model), under short deadlines.
RETRIED_ONCE = dataclasses.replace(SHORT_DEADLINES, resume_retries=1, retryable_resume_retries=2)
#: A key's 12 tokens: a call's estimate passes them, and a person is asked for 6 more.
RAISED_BY_SIX = RuntimeConfig(budget=Budget(key_tokens=12, on_exceed=OnBudget.ASK, raise_tokens=6))


@agent(name="review.asks_again_while_busy/v1")
def asks_again_while_busy(ctx, event: bytes) -> bytes:
    """Asks again while the model is busy (up to twice), then asks it once more."""
    messages = [{"role": "user", "content": "a"}]
    failed = 0
    while True:
        try:
            first = ctx.llm(messages, model="m").text
            break
        except LlmCallError:
            failed += 1
            if failed == 2:
                raise
    second = ctx.llm(messages, model="m").text
    return f"{failed} {first} {second}".encode()


def held_while_busy_history(*, declined: int = 0) -> list:
    """The records of `asks_again_while_busy` on one event under RAISED_BY_SIX, its model busy
    on every second call: its start asks a person before its first call, and again after an
    attempt that caught the model's failure; each raise granted, but the `declined`-th (from
    1; 0: none)."""
    asked = iter(range(1, 100))

    def answered(intent):
        return (1_000, "error" if next(asked) == declined else OK)

    return live_history(
        asks_again_while_busy,
        b"k",
        [(T0, ONE_EVENT[0])],
        RAISED_BY_SIX,
        PlanModel(["busy", OK]),
        answered,
    )


def raised_on_a_failed_payment(config: RuntimeConfig):
    """The history of `FUNCTION` on one event that pays, asks the model and raises when the
    payment failed, under `config`: the payment fails (its ERROR a second after), so each
    resume asks the model afresh (a failure of the agent's keeps no answer for its retry,
    `Activations._keep_paid`) and raises. Its budget questions, if `config` asks them: the
    first granted a second after, the rest never answered."""
    ops = [["call", "pay"], ["llm", "p0"], ["raise_unless_ok"]]
    event = AgentEnvelope(
        entity_key=b"k",
        event_time_ms=T0,
        external_event=json.dumps({"nonce": 0, "ops": ops}).encode(),
    )
    answers = iter([(1_000, "error"), (1_000, OK)] + [(None, OK)] * 10)
    return live_history(
        FUNCTION, b"k", [(T0, event)], config, PlanModel([]), lambda intent: next(answers)
    )


def raised_between_busy_models(plan=(OK, "busy"), config: RuntimeConfig | None = None):
    """The pay-then-model-then-raise history with the model as `plan` has it, by default busy
    on every second request: the resume's attempts alternate, raised (after its model call)
    and llm_failed (busy), until its retries are spent."""
    ops = [["call", "pay"], ["llm", "p0"], ["raise_unless_ok"]]
    event = AgentEnvelope(
        entity_key=b"k",
        event_time_ms=T0,
        external_event=json.dumps({"nonce": 0, "ops": ops}).encode(),
    )
    answers = iter([(1_000, "error")] + [(None, OK)] * 10)
    return live_history(
        FUNCTION,
        b"k",
        [(T0, event)],
        config or RuntimeConfig(),
        PlanModel(plan),
        lambda i: next(answers),
    )


def queued_behind_a_question_history():
    """Two events at once, each asking the model over the key's budget (RAISED_BY_SIX): the
    first's question is never answered, so the second waits in the mailbox until its
    deadline; drained then, the second is granted a raise a second later, asks again, and
    that question is never answered either."""
    events = [
        AgentEnvelope(
            entity_key=b"k",
            event_time_ms=T0,
            external_event=json.dumps({"nonce": n, "ops": [["llm", "p0"]] * (n + 1)}).encode(),
        )
        for n in range(2)
    ]
    plan = iter([(None, OK), (1_000, OK), (None, OK)])
    return live_history(
        FUNCTION,
        b"k",
        [(T0, event) for event in events],
        RAISED_BY_SIX,
        PlanModel([]),
        lambda intent: next(plan),
    )


#: A job that retries a busy model "for ever" (the largest limit a Continuation counts to),
#: its key budget asked.
RETRIED_FOR_EVER = RuntimeConfig(
    budget=Budget(key_tokens=12, on_exceed=OnBudget.ASK, raise_tokens=6),
    retryable_resume_retries=2**32 - 1,
)


def raised_then_down_history():
    """One start: its budget raised (approved), then the model down on its last call."""
    program = {"nonce": 0, "ops": [["llm", "p0"], ["llm", "p1"], ["llm", "p2"], ["llm", "p3"]]}
    event = AgentEnvelope(
        entity_key=b"k", event_time_ms=T0, external_event=json.dumps(program).encode()
    )
    history = live_history(
        FUNCTION, b"k", [(T0, event)], RETRIED_FOR_EVER, PlanModel([OK, OK, OK, "down"]),
        lambda intent: (1_000, OK),
    )  # fmt: skip
    assert [r.reason for r in history] == ["llm_failed"]
    return history


def upgraded_mid_resume_history() -> tuple[list, RuntimeConfig]:
    """(records, config): the model busy throughout, the resume's attempt 0 fails and its
    retry (the last) too, resume_failed; the binary was upgraded between them: attempt 0's
    record, written before records held failed calls, does not say which request failed."""
    config = RuntimeConfig(resume_retries=1, retryable_resume_retries=1)
    ops = [["call", "pay"], ["llm", "p0"]]
    event = AgentEnvelope(
        entity_key=b"k",
        event_time_ms=T0,
        external_event=json.dumps({"nonce": 0, "ops": ops}).encode(),
    )
    history = live_history(
        FUNCTION, b"k", [(T0, event)], config, PlanModel(["busy"]), lambda i: (1_000, OK)
    )
    assert [(r.reason, r.attempt) for r in history] == [
        ("", 0),
        ("llm_failed", 0),
        ("resume_failed", 1),
    ]
    del history[1].model_failures[:]  # by the older binary
    return history, config


def expired_then_answered_history(agent) -> list:
    """`agent`'s records (a simulation agent) of a payment whose answer came late: at the
    deadline the runtime resumed it with EXPIRED and the agent raised; before the retry, the
    genuine result (stamped before the intent's expiry, so on time) came and took the
    EXPIRED's place, and the resume ran again on it at once and completed."""
    program = {"nonce": 0, "ops": [["call", "pay"], ["raise_unless_ok"]]}
    driver = KeyDriver(recording_machine(agent, PlanModel([]), RuntimeConfig()), b"k")
    event = json.dumps(program).encode()
    driver.schedule(AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=event))
    outputs = driver.step()
    (pay,) = [value for tag, value in outputs if tag == INTENTS]
    outputs += driver.fire_deadline(driver.state.continuation.deadline_ms)
    driver.schedule(answer_to(pay, pay.expires_at_ms - 1, OK))
    outputs += driver.step()
    return [value for tag, value in outputs if tag == RECORDS]
