"""Live histories for the backtest's generated tests: a key's events, answers and timers through
the runtime's per-key machine with recording on, as a streaming job would run them.

`live_history` runs one key: each input at its arrival (an event's may come after its own time,
or twice), each intent answered after a delay (or never), OK or with an error, by `answer_plan`;
before each input the key's deadline and TTL timers fire as a watermark at the input's arrival
fires them, and after the last one every timer left fires. `PlanModel` answers, is busy or is
down as its plan says, call after call. What comes out is what RunAgent's RECORDS output holds
(beam_agents/testing/recorded_history.py answers every intent at once and fires no deadline).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable, Sequence

from beam_agents._protos import ActivationRecord, AgentEnvelope, ToolIntent, ToolResult
from beam_agents.errors import LlmCallError
from beam_agents.intents.identity import content_digest
from beam_agents.runtime import INTENTS, RECORDS, LlmResponse, RuntimeConfig
from beam_agents.runtime.context import Agent
from beam_agents.runtime.key_driver import KeyDriver, recording_machine
from beam_agents.runtime.machine_state import due_at, timer_ms

__all__ = ["OK", "PlanModel", "answer_to", "live_history"]

#: More timer firings than this before one input means a timer that never stops firing.
_MAX_FIRINGS = 1_000

#: An answer plan's outcomes: a tool's OK result (an approval granted), else its ERROR (denied).
OK = "ok"


class PlanModel:
    """A model that, call after call, answers ("ok"), is busy past its client's retries
    ("busy") or down ("down") as `plan` says (cycling; always "ok" when empty). Each answer
    names its request and the call's number: two answers to one request differ."""

    def __init__(self, plan: Sequence[str]) -> None:
        self._plan = list(plan)
        self.calls = 0

    def complete(self, request):
        what = self._plan[self.calls % len(self._plan)] if self._plan else OK
        self.calls += 1
        if what != OK:
            raise LlmCallError(what, model=request.model, retryable=what == "busy")
        return LlmResponse(f"{request.messages[-1]['content']}#{self.calls}", request.model, 3, 2)


def answer_to(intent: ToolIntent, at: int, outcome: str) -> AgentEnvelope:
    """The answer of `outcome` ("ok", else an error; for an approval, approved or not) to
    `intent`, stamped `at`, bound to its content."""
    digest = content_digest(intent.SerializeToString(deterministic=True))
    envelope = AgentEnvelope(entity_key=intent.entity_key, event_time_ms=at)
    if intent.kind == ToolIntent.APPROVAL:
        envelope.approval.intent_id = intent.intent_id
        envelope.approval.approved = outcome == OK
        envelope.approval.decided_at_ms = at
        envelope.approval.intent_digest = digest
        return envelope
    envelope.tool_result.CopyFrom(
        ToolResult(
            intent_id=intent.intent_id,
            entity_key=intent.entity_key,
            seq=intent.seq,
            completed_at_ms=at,
            intent_digest=digest,
            status=ToolResult.OK if outcome == OK else ToolResult.ERROR,
            payload=intent.tool_name.encode(),
        )
    )
    return envelope


def live_history(
    agent: Agent,
    key: bytes,
    events: Iterable[tuple[int, AgentEnvelope]],
    config: RuntimeConfig,
    model,
    answer_plan: Callable[[ToolIntent], tuple[int | None, str]],
) -> list[ActivationRecord]:
    """The records of `agent` on `events`, (arrival ms, envelope) of one key; `answer_plan`
    says of each intent after how many ms it is answered (None: never) and how."""
    machine = recording_machine(agent, model, config)
    driver = KeyDriver(machine, key)
    order = itertools.count()
    inputs = [(arrival, next(order), event) for arrival, event in events]
    heapq.heapify(inputs)
    timers: dict[str, int | None] = {"deadline": None, "ttl": None}
    records = []

    def take(outputs) -> None:
        for tag, value in outputs:
            if tag == RECORDS:
                records.append(value)
            elif tag == INTENTS:
                delay, outcome = answer_plan(value)
                if delay is not None:
                    at = value.created_at_ms + delay
                    heapq.heappush(inputs, (at, next(order), answer_to(value, at, outcome)))
        waiting = driver.state.continuation
        timers["deadline"] = timer_ms(due_at(waiting)) if waiting is not None else None
        if driver.ttl_set:
            timers["ttl"] = driver.ttl_at

    # Inputs by arrival, each after the timers due before it, then the timers left, in turn:
    # a timer's firing may ask something (a retry's budget question) whose answer comes later.
    watermark, firings = 0, 0
    while True:
        due = [(at, name) for name, at in timers.items() if at is not None]
        if inputs:
            watermark = max(watermark, inputs[0][0])
        if due and (not inputs or min(due)[0] < watermark):
            if firings == _MAX_FIRINGS:
                raise AssertionError(f"the key's timers fired {_MAX_FIRINGS} times in a row")
            firings += 1
            at, name = min(due)
            timers[name] = None
            take(driver.fire_deadline(at) if name == "deadline" else driver.fire_ttl(at))
        elif inputs:
            arrival, _, envelope = heapq.heappop(inputs)
            firings = 0
            effects = machine.on_envelope(key, driver.state, envelope, arrival_ms=arrival)
            take(driver._apply(effects))
        else:
            break
    return records
