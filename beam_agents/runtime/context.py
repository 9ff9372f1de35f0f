"""The agent contract: what an agent implements, and the ActivationContext it acts through.

An agent is any object with `start(ctx, event)` for a new event and `resume(ctx, answers)` for
the answers to its pending intents, each returning a `Completion` (bytes for the main output)
or a `Suspension` (built by `ctx.suspend`). `adapter` names the agent in its Continuation.

The context is the agent's only door to the world, and everything it hands out is a pure
function of the key, the activation's seq and step, and the call's content, so a retried
bundle emits byte-identical intents and traces:

* "now" is the envelope's event_time_ms (`ctx.now_ms`), never the wall clock;
* `ctx.llm(...)` goes through the key's ReplayCache: a call the activation made before (same
  seq, same position, same request) returns the recorded response without calling the model;
* `ctx.call_tool`, `ctx.call_tools` and `ctx.request_approval` emit ToolIntents with
  deterministic ids, RFC 8785 arguments, created/expires times from event time, the
  activation's trace id, signed when the runtime has a keyring;
* `ctx.memory` is the key's Memory;
* `ctx.suspend(...)` builds the Continuation (`build_continuation`) naming every intent this
  activation emitted as pending.

Nothing an agent does through the context reaches state or outputs unless the activation
returns normally: the runtime commits the context's memory, cache, intents and traces only
then. The one exception is what the model was paid for: a failed activation's model calls are
counted in the key's usage, and kept in its cache for the activation's retry when the model or
the budget stopped it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from beam_agents._protos import AgentEnvelope, Continuation, ToolIntent, ToolResult, TraceEvent
from beam_agents.errors import (
    AgentContractError,
    ApprovalEditError,
    LlmCallError,
    error_text,
    said_retryable,
    with_article,
)
from beam_agents.intents.approval_edits import approval_args, approved_args
from beam_agents.intents.identity import canonical_args_json, intent_id
from beam_agents.intents.signing import Keyring, sign
from beam_agents.runtime.budget import BUDGET_TOOL, BudgetMeter, reported_tokens
from beam_agents.runtime.recording import ModelCallLog
from beam_agents.runtime.tool_calling import ToolCall, ToolDefinition
from beam_agents.runtime.trace_ids import span_id, trace_id
from beam_agents.state.memory import Memory, ReplayCache
from beam_agents.state.migration import new_state_blob

__all__ = [
    "APPROVAL_TOOL",
    "ESCALATION_TOOL",
    "RUNTIME_TOOLS",
    "ActivationContext",
    "Agent",
    "Answer",
    "Completion",
    "LlmClient",
    "LlmRequest",
    "LlmResponse",
    "RefusingLlmClient",
    "ScriptedLlmClient",
    "Suspension",
    "llm_cache_key",
    "model_slot",
    "span_id",
    "trace_id",
]

#: The tool_name of an agent's APPROVAL intents; a human, not a tool, answers them.
APPROVAL_TOOL = "human.approval"
#: The tool_name of the runtime's own APPROVAL intents, asking a human whether a suspension
#: past its deadline should keep waiting; their answers go to the runtime, not the agent.
ESCALATION_TOOL = "beam_agents.escalation"
#: The runtime's own questions to people: their answers go to the runtime, never the agent, so
#: an agent may not call a tool of these names.
RUNTIME_TOOLS = frozenset({ESCALATION_TOOL, BUDGET_TOOL})


@dataclasses.dataclass(frozen=True)
class Completion:
    """The activation is done; `output` goes to the completions output."""

    output: bytes


@dataclasses.dataclass(frozen=True)
class Suspension:
    """The activation waits for answers to `continuation.pending_intent_ids`."""

    continuation: Continuation


@dataclasses.dataclass(frozen=True)
class Answer:
    """The answer to one pending intent: a ToolResult for a TOOL intent (EXPIRED when the
    deadline passed first), an Approval for an APPROVAL intent (None when it expired).

    A call can be `ok` (it took effect) and still have no payload: `payload_unknown`. Check it
    before reading `payload` as the tool's answer."""

    intent: ToolIntent
    result: ToolResult | None = None
    approval: AgentEnvelope.Approval | None = None

    @property
    def ok(self) -> bool:
        if self.intent.kind == ToolIntent.APPROVAL:
            return self.approval is not None and self.approval.approved
        return self.result is not None and self.result.status == ToolResult.OK

    @property
    def approved_args(self) -> dict[str, object] | None:
        """An approved APPROVAL intent's details as the person approved them: the details the
        agent asked with, each argument they changed at its new value (the request named it
        `editable`); None unless `ok`. RunAgent refused any edit the request did not allow."""
        if not self.ok or self.approval is None:
            return None
        return approved_args(self.intent, self.approval)

    @property
    def payload_unknown(self) -> bool:
        """The call took effect (`ok`) but what the tool answered is not known: the effector
        kept no payload (over its max_result_bytes), or its effector stopped mid-call and a
        person settled it, saying only that it acted. `payload` is then empty, and
        `result.error_message` says which."""
        result = self.result
        if result is None or result.status != ToolResult.OK:
            return False
        return (not result.payload and bool(result.error_message)) or _confirmation_only(
            result.payload
        )

    @property
    def payload(self) -> bytes:
        """The tool's answer; empty when there is none or it is unknown (`payload_unknown`)."""
        if self.result is None or self.payload_unknown:
            return b""
        return self.result.payload

    @classmethod
    def from_envelope(cls, intent: ToolIntent, envelope: AgentEnvelope) -> Answer:
        which = envelope.WhichOneof("payload")
        return cls(
            intent,
            result=envelope.tool_result if which == "tool_result" else None,
            approval=envelope.approval if which == "approval" else None,
        )

    def envelope(self) -> AgentEnvelope:
        """The answer as the envelope that carried it (entity_key and time left out)."""
        envelope = AgentEnvelope()
        if self.approval is not None:
            envelope.approval.CopyFrom(self.approval)
        elif self.result is not None:
            envelope.tool_result.CopyFrom(self.result)
        return envelope


def approval_request(
    question: str, details: Mapping[str, object], editable: Sequence[str], *, agent: str
) -> dict:
    """The arguments of an APPROVAL intent (`approval_args`), an agent's mistake in naming
    editable details being a contract error."""
    try:
        return approval_args(question, details, editable)
    except ApprovalEditError as e:
        raise AgentContractError(f"request_approval: {e}", agent=agent) from None


def _confirmation_only(payload: bytes) -> bool:
    """Whether `payload` is a person's confirmation that a lost call took effect, as effectors
    before `Answer.payload_unknown` recorded it in place of the tool's payload (a result of one
    may still be sent again from its store)."""
    if not payload.startswith(b'{"confirmed_by":'):
        return False
    try:
        answer = json.loads(payload)
    except ValueError:
        return False
    return answer.keys() == {"confirmed_by", "took_effect"} and answer["took_effect"] is True


@runtime_checkable
class Agent(Protocol):
    #: Names the adapter in Continuation.adapter.
    adapter: str

    def start(self, ctx: ActivationContext, event: bytes) -> Completion | Suspension: ...

    def resume(
        self, ctx: ActivationContext, answers: Sequence[Answer]
    ) -> Completion | Suspension: ...


@dataclasses.dataclass(frozen=True)
class LlmRequest:
    """A chat request: JSON-able messages and parameters, and the tools the model may call
    (`beam_agents.runtime.tool_calling`), canonicalized for the cache key."""

    model: str
    messages: tuple[Mapping[str, object], ...]
    params: Mapping[str, object] = dataclasses.field(default_factory=dict)
    tools: tuple[ToolDefinition, ...] = ()

    def canonical(self) -> str:
        request = {
            "messages": [dict(m) for m in self.messages],
            "model": self.model,
            "params": dict(self.params),
        }
        # Only when there are tools: a request without them keeps the cache key it had before
        # tool calling existed, so recorded answers still replay.
        if self.tools:
            request["tools"] = [t.to_json() for t in self.tools]
        return canonical_args_json(request)


@dataclasses.dataclass(frozen=True)
class LlmResponse:
    """A model's answer: its text and the tools it asked to call (`tool_calls`, in order)."""

    text: str
    model: str = ""
    input_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = ""
    tool_calls: tuple[ToolCall, ...] = ()

    def to_bytes(self) -> bytes:
        """RFC 8785 JSON: how a response is kept in the replay cache (never pickle). An answer
        without tool calls has the bytes it had before they existed."""
        # Field by field: dataclasses.asdict deep-copies every value, on every model call.
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        if self.tool_calls:
            fields["tool_calls"] = [dataclasses.asdict(call) for call in self.tool_calls]
        else:
            del fields["tool_calls"]
        return canonical_args_json(fields).encode("utf-8")

    @classmethod
    def from_bytes(cls, data: bytes) -> LlmResponse:
        fields = json.loads(data)
        calls = tuple(ToolCall(**call) for call in fields.pop("tool_calls", ()))
        return cls(**fields, tool_calls=calls)


class LlmClient(Protocol):
    def complete(self, request: LlmRequest) -> LlmResponse: ...


class ScriptedLlmClient:
    """Answers requests from a script, for tests and the demo: either a list of responses in
    call order, or a function of the request. Picklable when its script is."""

    def __init__(
        self, script: Sequence[LlmResponse | str] | Callable[[LlmRequest], LlmResponse | str]
    ) -> None:
        self._script = script
        self._position = 0

    def complete(self, request: LlmRequest) -> LlmResponse:
        if callable(self._script):
            answer = self._script(request)
        else:
            if self._position >= len(self._script):
                raise LlmCallError(
                    "the script has no more responses", model=request.model, retryable=False
                )
            answer = self._script[self._position]
            self._position += 1
        return answer if isinstance(answer, LlmResponse) else LlmResponse(answer, request.model)


class RefusingLlmClient:
    """Refuses every call: for replays that must be answered from the cache alone."""

    def complete(self, request: LlmRequest) -> LlmResponse:
        raise LlmCallError(
            "this replay may not call the model", model=request.model, retryable=False
        )


_SLOTS: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_SLOTS_LOCK = threading.Lock()


@contextlib.contextmanager
def model_slot(model: str, concurrency: int | None):
    """Holds one of `concurrency` slots for calls to `model` in this process (none: no cap);
    a call past the cap waits for a slot, so a burst of keys cannot storm the provider."""
    if concurrency is None:
        yield
        return
    with _SLOTS_LOCK:
        slots = _SLOTS.setdefault((model, concurrency), threading.BoundedSemaphore(concurrency))
    with slots:
        yield


def llm_cache_key(entity_key: bytes, seq: int, position: int | str, canonical: str) -> str:
    """A model call's key in the replay cache: the key, its activation's seq, its position in
    the activation (or `key:<replay_key>`) and the request's canonical JSON."""
    return hashlib.sha256(
        f"llm|{entity_key.hex()}|{seq}|{position}|{canonical}".encode()
    ).hexdigest()


_NO_CLIENT = (
    "no LLM client is configured: give RunAgent (or run_locally) llm_client=, a provider's "
    "client or a ScriptedLlmClient"
)

#: The request params that bound an answer's tokens, by provider: OpenAI's (and Anthropic's),
#: OpenAI's reasoning models', Gemini's. A budget's estimate of a call counts the one given.
_OUTPUT_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def _saturating_add(ms: int, delta_ms: int) -> int:
    # Event times are any int64; a time past the end of int64 is the end of int64.
    return min(ms + delta_ms, 2**63 - 1)


def _said(error: LlmCallError, name: str, default: str) -> str:
    """The text `error` holds as `name` (its reason, its model): a client's may hold any
    object there, or fail to hand it over, and recording it must not fail the activation."""
    try:
        value = getattr(error, name)
    except Exception:
        return default
    return value if isinstance(value, str) else error_text(value)


def _as_reported(response: object, model: str) -> LlmResponse:
    """`response` with its token counts as usage takes them (`reported_tokens`): what the agent,
    the replay cache and the budget all see. A client's answer of another type is its
    failure."""
    if not isinstance(response, LlmResponse):
        raise LlmCallError(
            f"the client answered {with_article(type(response).__name__)}, not an LlmResponse",
            model=model,
            retryable=False,
        )
    usage = reported_tokens(response.input_tokens), reported_tokens(response.output_tokens)
    if usage == (response.input_tokens, response.output_tokens):
        return response
    return dataclasses.replace(response, input_tokens=usage[0], output_tokens=usage[1])


class ActivationContext:
    """One activation's door to the world; see the module docstring."""

    def __init__(
        self,
        *,
        entity_key: bytes,
        seq: int,
        now_ms: int,
        memory: Memory,
        cache: ReplayCache,
        llm_client: LlmClient | None,
        adapter: str,
        first_step: int = 0,
        resume_of: Continuation | None = None,
        keyring: Keyring | None = None,
        intent_ttl_ms: int = 60 * 60 * 1000,
        suspend_deadline_ms: int = 24 * 60 * 60 * 1000,
        llm_concurrency: int | None = None,
        meter: BudgetMeter | None = None,
    ) -> None:
        self.entity_key = entity_key
        self.seq = seq
        self.now_ms = now_ms
        self.memory = memory
        self.cache = cache
        self.adapter = adapter
        #: The Continuation this activation resumes (None for a new event).
        self.resume_of = resume_of
        self._llm_client = llm_client
        self._keyring = keyring
        self._intent_ttl_ms = intent_ttl_ms
        self._suspend_deadline_ms = suspend_deadline_ms
        self._llm_concurrency = llm_concurrency
        #: The key's budget, when one is configured: checked before and counted after every
        #: call a model answers.
        self.meter = meter
        self._next_step = first_step
        self._llm_calls = 0
        #: Calls the model answered (not the cache): paid, whatever becomes of the activation.
        self.model_calls = 0
        #: Every model call with the answer it used, when the runtime records activations
        #: (`beam_agents.runtime.recording`); None: not recorded.
        self.model_log: list[ModelCallLog] | None = None
        self._closed = False
        #: ToolIntents emitted, in order.
        self.intents: list[ToolIntent] = []
        #: TraceEvents of this activation, in order.
        self.traces: list[TraceEvent] = []
        self.trace_id = trace_id(entity_key, seq)
        # A resume is a child span of the activation that suspended: one tree per trace.
        self.span_id = span_id(entity_key, seq, "activation", first_step)
        self._parent = span_id(entity_key, seq, "activation", 0) if first_step else b""

    # -- tools ----------------------------------------------------------------------------

    def call_tool(self, name: str, args: Mapping[str, object]) -> ToolIntent:
        """Emits one TOOL intent as its own step; returns it."""
        (emitted,) = self.call_tools([(name, args)])
        return emitted

    def call_tools(self, calls: Sequence[tuple[str, Mapping[str, object]]]) -> list[ToolIntent]:
        """Emits several TOOL intents as one step (parallel calls, call_index 0, 1, ...)."""
        return self._emit(calls, ToolIntent.TOOL)

    def request_approval(
        self, question: str, *, editable: Sequence[str] = (), **details: object
    ) -> ToolIntent:
        """Emits an APPROVAL intent asking a human `question`; details travel as arguments.
        `editable` names details a person may change before approving (scalars: the answer's
        `Answer.approved_args` holds what they approved; intents/approval_edits.py)."""
        args = approval_request(question, details, editable, agent=self.adapter)
        (emitted,) = self._emit([(APPROVAL_TOOL, args)], ToolIntent.APPROVAL)
        return emitted

    def escalate(
        self, question: str, *, tool: str = ESCALATION_TOOL, **details: object
    ) -> list[ToolIntent]:
        """The runtime's own question to a person (an APPROVAL intent of `tool`: a suspension
        past its deadline, a budget to raise); not for agents."""
        return self._emit([(tool, {"question": question, **details})], ToolIntent.APPROVAL)

    def _emit(self, calls, kind) -> list[ToolIntent]:
        self._check_open()
        if not calls:
            raise AgentContractError("a step needs at least one call", agent=self.adapter)
        step = self._next_step
        self._next_step += 1
        emitted = []
        for call_index, (name, args) in enumerate(calls):
            tool_intent = ToolIntent(
                intent_id=intent_id(self.entity_key, self.seq, step, call_index),
                entity_key=self.entity_key,
                seq=self.seq,
                step_index=step,
                tool_name=name,
                args_json=canonical_args_json(args),
                created_at_ms=self.now_ms,
                expires_at_ms=_saturating_add(self.now_ms, self._intent_ttl_ms),
                kind=kind,
                trace_id=self.trace_id,
            )
            if self._keyring is not None:
                tool_intent = sign(tool_intent, self._keyring)
            emitted.append(tool_intent)
            self._trace(
                TraceEvent.INTENT_EMITTED,
                span_id(self.entity_key, self.seq, "intent", tool_intent.intent_id),
                step,
                {
                    "beam_agents.intent_id": tool_intent.intent_id,
                    "gen_ai.tool.name": name,
                    "beam_agents.intent.kind": ToolIntent.Kind.Name(kind),
                },
            )
        self.intents.extend(emitted)
        return emitted

    # -- the model ------------------------------------------------------------------------

    def llm(
        self,
        messages: Sequence[Mapping[str, object]],
        *,
        model: str,
        replay_key: str | None = None,
        tools: Sequence[ToolDefinition] = (),
        **params: object,
    ) -> LlmResponse:
        """One chat completion, answered from the replay cache when this activation made the
        same call before. The cache key is the key, seq, the call's position in the activation
        and the request; an adapter whose resumes re-run only part of the agent (a LangGraph
        node) names the position itself with `replay_key`. With `tools`, the model may answer
        with `tool_calls` instead of (or beside) text."""
        self._check_open()
        request = LlmRequest(model, tuple(messages), params, tuple(tools))
        canonical = request.canonical()
        position = self._llm_calls if replay_key is None else f"key:{replay_key}"
        self._llm_calls += 1
        key = llm_cache_key(self.entity_key, self.seq, position, canonical)
        recorded = self.cache.get(key)
        cost = 0
        if recorded is not None:
            response, replayed, answer = LlmResponse.from_bytes(recorded), True, recorded
        else:
            if self._llm_client is None:
                raise LlmCallError(_NO_CLIENT, model=model, retryable=False)
            if self.meter is not None:
                limit = next((params[n] for n in _OUTPUT_LIMITS if n in params), None)
                self.meter.check(model, canonical, limit)
            try:
                with model_slot(model, self._llm_concurrency):
                    response = self._llm_client.complete(request)
            except LlmCallError as e:
                # An answer the client refused was billed all the same: it counts, and the
                # failure commits its count (a key answered only so must not call for free).
                # A client's own kind of the error may not have run LlmCallError's __init__.
                billed = (
                    reported_tokens(getattr(e, "input_tokens", 0)),
                    reported_tokens(getattr(e, "output_tokens", 0)),
                )
                if any(billed):
                    self.model_calls += 1
                    if self.meter is not None:
                        self.meter.record(model, *billed)
                if self.model_log is not None:
                    self.model_log.append(
                        ModelCallLog(
                            cache_key=key,
                            canonical=canonical,
                            response=b"",
                            replayed=False,
                            model=_said(e, "model", model),
                            input_tokens=billed[0],
                            output_tokens=billed[1],
                            failed=True,
                            retryable=said_retryable(e),
                            reason=_said(e, "reason", ""),
                            text=error_text(e),
                        )
                    )
                raise
            response = _as_reported(response, model)
            replayed = False
            self.model_calls += 1
            answer = response.to_bytes()
            self.cache.put(key, answer)
            if self.meter is not None:
                cost = self.meter.record(model, response.input_tokens, response.output_tokens)
        if self.model_log is not None:
            self.model_log.append(
                ModelCallLog(
                    cache_key=key,
                    canonical=canonical,
                    response=answer,
                    replayed=replayed,
                    model=model,
                    input_tokens=response.input_tokens,
                    output_tokens=response.output_tokens,
                )
            )
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "gen_ai.response.model": response.model or model,
            "gen_ai.usage.input_tokens": str(response.input_tokens),
            "gen_ai.usage.output_tokens": str(response.output_tokens),
            "beam_agents.replayed": "true" if replayed else "false",
        }
        if cost:
            attributes["beam_agents.cost_micros"] = str(cost)
        if response.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = response.finish_reason
        self._trace(
            TraceEvent.LLM_CALL,
            span_id(self.entity_key, self.seq, "llm", self.span_id.hex(), key),
            self._next_step,
            attributes,
        )
        return response

    # -- suspension -----------------------------------------------------------------------

    def build_continuation(
        self, *, snapshot: bytes = b"", deadline_ms: int | None = None
    ) -> Continuation:
        """The Continuation of a suspension on every intent this activation emitted."""
        if not self.intents:
            raise AgentContractError("suspended with no intent pending", agent=self.adapter)
        if not isinstance(snapshot, bytes):
            raise AgentContractError(
                f"snapshot is {type(snapshot).__name__}, not bytes", agent=self.adapter
            )
        deadline = (
            _saturating_add(self.now_ms, self._suspend_deadline_ms)
            if deadline_ms is None
            else deadline_ms
        )
        return new_state_blob(
            Continuation,
            seq=self.seq,
            step_index=self._next_step,
            pending_intent_ids=[i.intent_id for i in self.intents],
            adapter=self.adapter,
            snapshot=snapshot,
            suspended_at_ms=self.now_ms,
            deadline_ms=deadline,
        )

    def suspend(self, *, snapshot: bytes = b"", deadline_ms: int | None = None) -> Suspension:
        """Waits for answers to every intent this activation emitted (then `resume` runs)."""
        suspension = Suspension(self.build_continuation(snapshot=snapshot, deadline_ms=deadline_ms))
        self._closed = True
        return suspension

    def complete(self, output: bytes) -> Completion:
        self._closed = True
        return Completion(output)

    # -- traces ---------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise AgentContractError("acted after it completed or suspended", agent=self.adapter)

    def _trace(
        self,
        event_type,
        span: bytes,
        step: int,
        attributes: Mapping[str, str],
        parent: bytes | None = None,
    ) -> None:
        event = TraceEvent(
            trace_id=self.trace_id,
            span_id=span,
            parent_span_id=self.span_id if parent is None else parent,
            entity_key=self.entity_key,
            seq=self.seq,
            step_index=step,
            event_type=event_type,
            start_ms=self.now_ms,
            end_ms=self.now_ms,
        )
        # Item by item: a map field's update() is the generic MutableMapping one (an ABC
        # isinstance check, then the same loop in Python), on every activation's path.
        fields = event.attributes
        for name, value in attributes.items():
            fields[name] = value
        self.traces.append(event)

    def trace_activation(self, event_type, attributes: Mapping[str, str]) -> None:
        """ACTIVATION_START and ACTIVATION_END carry the activation's own span."""
        self._trace(event_type, self.span_id, self._next_step, attributes, parent=self._parent)

    def trace_child(self, event_type, name: str, attributes: Mapping[str, str]) -> None:
        """SUSPENDED and ERROR events: children of the activation's span."""
        self._trace(
            event_type,
            span_id(self.entity_key, self.seq, name, self._next_step),
            self._next_step,
            attributes,
        )

    @property
    def next_step(self) -> int:
        return self._next_step
