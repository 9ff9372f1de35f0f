"""The plain-Python adapter: an agent written as one ordinary function.

    @beam_agents.runtime.agent
    def triage(ctx, event: bytes) -> bytes:
        customer = ctx.call_tool("crm.lookup", {"id": ...})   # an Answer
        ...
        return b"done"

Tool calls look synchronous. The first time the function reaches a call, the call becomes a
ToolIntent and the activation suspends; when the answers arrive, the function runs again from
the top with the same event: calls already answered return their Answer at once (the step must
ask for the same tool with the same arguments as before, or the replay diverged and the
activation fails), LLM calls replay from the cache, and the first unanswered call suspends
again. So the function must be deterministic given its event, its answers, its memory and its
LLM responses: no wall clock, no randomness, no I/O of its own.

Memory. The function runs on a copy of the key's memory, which replaces the key's memory only
when the function returns: at a suspension the writes made so far are dropped, because the
replay makes them again. So every run sees the memory as it was when the activation began plus
its own writes, and `visits = get + 1; put; call_tool(...)` counts one visit per event however
many times the function suspends.

The snapshot the adapter keeps in the Continuation is the event and every answer so far, as
length-delimited protobuf messages (an external_event envelope, then a ToolIntent and its
answer envelope per answered call): never pickle.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

from beam_agents._protos import AgentEnvelope, ToolIntent
from beam_agents.errors import AgentContractError
from beam_agents.intents.identity import canonical_args_json
from beam_agents.runtime.context import (
    APPROVAL_TOOL,
    ActivationContext,
    Answer,
    Completion,
    LlmResponse,
    Suspension,
    approval_request,
)
from beam_agents.wire.fields import join_delimited, split_delimited

__all__ = ["FunctionAgent", "agent"]


class _Suspend(Exception):
    """Unwinds the function to the adapter once a call needs answers."""


class _ReplayingContext:
    """What the function sees as `ctx`: the activation context, with calls answered before
    returning their answers instead of emitting again."""

    def __init__(self, ctx: ActivationContext, answered: Sequence[list[Answer]], name: str):
        self._ctx = ctx
        self._answered = answered
        self._name = name
        self._step = 0
        #: The function's working copy of the key's memory (see the module docstring).
        self.memory = ctx.memory.copy()

    @property
    def now_ms(self) -> int:
        return self._ctx.now_ms

    @property
    def entity_key(self) -> bytes:
        return self._ctx.entity_key

    def llm(self, messages, *, model: str, **params) -> LlmResponse:
        return self._ctx.llm(messages, model=model, **params)

    def call_tool(self, name: str, args: Mapping[str, object]) -> Answer:
        (answer,) = self.call_tools([(name, args)])
        return answer

    def request_approval(
        self, question: str, *, editable: Sequence[str] = (), **details: object
    ) -> Answer:
        args = approval_request(question, details, editable, agent=self._name)
        (answer,) = self._step_answers([(APPROVAL_TOOL, args)], ToolIntent.APPROVAL)
        return answer

    def call_tools(self, calls: Sequence[tuple[str, Mapping[str, object]]]) -> list[Answer]:
        return self._step_answers(calls, ToolIntent.TOOL)

    def _step_answers(self, calls, kind) -> list[Answer]:
        step = self._step
        self._step += 1
        if step < len(self._answered):
            answers = self._answered[step]
            asked = [(i.tool_name, i.args_json, i.kind) for i in (a.intent for a in answers)]
            now = [(name, canonical_args_json(args), kind) for name, args in calls]
            if asked != now:
                raise AgentContractError(
                    f"replay diverged at step {step}: it asked {asked}, now {now}",
                    agent=self._name,
                )
            return list(answers)
        if kind == ToolIntent.APPROVAL:
            ((_, args),) = calls
            question = args.pop("question")
            self._ctx.request_approval(question, **args)
        else:
            self._ctx.call_tools(calls)
        raise _Suspend


@dataclasses.dataclass(frozen=True)
class FunctionAgent:
    """An Agent running `function(ctx, event) -> bytes` by deterministic re-execution."""

    function: Callable[..., bytes]
    adapter: str

    @property
    def replays_every_call(self) -> bool:
        """Each resume runs the function again from the top, making again (from the replay
        cache) every model call of its seq it can need: what it does not touch, it never
        needs. Not said of a subclass with a resume of its own, which may not."""
        return type(self).resume is FunctionAgent.resume

    def start(self, ctx: ActivationContext, event: bytes) -> Completion | Suspension:
        return self._run(ctx, event, [])

    def resume(self, ctx: ActivationContext, answers: Sequence[Answer]) -> Completion | Suspension:
        event, answered = _unpack(ctx.resume_of.snapshot)
        return self._run(ctx, event, [*answered, list(answers)])

    def _run(self, ctx, event: bytes, answered: list[list[Answer]]) -> Completion | Suspension:
        replaying = _ReplayingContext(ctx, answered, self.adapter)
        try:
            output = self.function(replaying, event)
        except _Suspend:
            return ctx.suspend(snapshot=_pack(event, answered))
        if not isinstance(output, bytes):
            raise AgentContractError(
                f"returned {type(output).__name__}, not bytes", agent=self.adapter
            )
        ctx.memory = replaying.memory
        return ctx.complete(output)


def _pack(event: bytes, answered: list[list[Answer]]) -> bytes:
    messages = [AgentEnvelope(external_event=event)]
    for step in answered:
        for answer in step:
            messages += (answer.intent, answer.envelope())
    return join_delimited(messages)


def _unpack(snapshot: bytes) -> tuple[bytes, list[list[Answer]]]:
    parts = list(split_delimited(snapshot))
    event = AgentEnvelope.FromString(parts[0]).external_event
    answered: list[list[Answer]] = []
    for intent_bytes, envelope_bytes in zip(parts[1::2], parts[2::2], strict=True):
        answer = Answer.from_envelope(
            ToolIntent.FromString(intent_bytes), AgentEnvelope.FromString(envelope_bytes)
        )
        # A step's calls share its step_index; steps come in order.
        if answered and answered[-1][0].intent.step_index == answer.intent.step_index:
            answered[-1].append(answer)
        else:
            answered.append([answer])
    return event, answered


def agent(function: Callable[..., bytes] | None = None, *, name: str | None = None):
    """Makes `function(ctx, event) -> bytes` an Agent; `name` defaults to its qualified name."""
    if function is None:
        return functools.partial(agent, name=name)
    adapter = name or f"python:{function.__module__}.{function.__qualname__}"
    return FunctionAgent(function, adapter)
