"""What the tests of RunAgent's state machine (beam_agents/runtime/machine*_test.py) share:
`Harness`, one key's state cells and timers under the state model of Beam's portable SDK
harness, envelope builders with the effector's and the approvals channel's keys, and the agents
the tests run.

Prism, Flink and Dataflow Runner v2 hand back from a state read the very object an earlier write
stored; the DirectRunner decodes a fresh copy on every read and so cannot see a change made in
place. The Harness drives `KeyMachine` through the DoFn's own `_read` and `_write` over state
cells that hand back the stored object, and checks after every step that nothing the machine
read was changed in place.
"""

from __future__ import annotations

from beam_agents._protos import (
    AgentEnvelope,
    Continuation,
    MemoryBlob,
    StateSnapshot,
    ToolIntent,
    ToolResult,
)
from beam_agents.errors import LlmCallError
from beam_agents.intents.identity import content_digest
from beam_agents.intents.signing import Keyring, sign
from beam_agents.runtime import LlmResponse, RuntimeConfig, ScriptedLlmClient, agent
from beam_agents.runtime.machine import KeyMachine, KeyState
from beam_agents.runtime.run_agent import _read, _write
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION

__all__ = [
    "EFFECTOR",
    "FORGED",
    "FORGED_HUMAN",
    "HUMANS",
    "KEY",
    "SEQ",
    "T0",
    "Bag",
    "Cell",
    "DownOnce",
    "Harness",
    "Timer",
    "answer",
    "approve",
    "asks",
    "asks_editable",
    "echo",
    "event",
    "frozen",
    "parallel",
    "pending",
    "refund",
    "summarise",
    "summarise_event",
]

KEY = b"k-1"
T0 = 1_764_460_800_000
SEQ = T0 * 1000
EFFECTOR = Keyring({"effector-1": bytes(range(32))}, active="effector-1")
HUMANS = Keyring({"approvals-1": bytes(range(1, 33))}, active="approvals-1")
#: Keys with the right ids and the wrong secrets.
FORGED = Keyring({"effector-1": b"x" * 32, "approvals-1": b"y" * 32}, active="effector-1")
FORGED_HUMAN = Keyring(FORGED.keys, active="approvals-1")


class Cell:
    """A ReadModifyWrite state double that hands back the very object it stored, and counts
    the reads and writes that a portable runner serves as state requests."""

    def __init__(self) -> None:
        self.value = None
        self.reads = self.writes = 0

    def read(self):
        self.reads += 1
        return self.value

    def write(self, value) -> None:
        self.writes += 1
        self.value = value

    def clear(self) -> None:
        self.writes += 1
        self.value = None


class Bag(Cell):
    def __init__(self) -> None:
        super().__init__()
        self.value = []

    def add(self, value) -> None:
        self.writes += 1
        self.value.append(value)

    def clear(self) -> None:
        self.writes += 1
        self.value = []


class Timer:
    def __init__(self) -> None:
        self.at_ms = None

    def set(self, timestamp) -> None:
        self.at_ms = timestamp.micros // 1000

    def clear(self) -> None:
        self.at_ms = None


def frozen(stored: KeyState) -> list[bytes | None]:
    blobs = [stored.memory, stored.cache, stored.continuation, *stored.pending]
    return [None if b is None else b.SerializeToString(deterministic=True) for b in blobs]


class Harness:
    """One key's state cells and timers, and the machine; every step checks that nothing it
    read was changed in place."""

    def __init__(self, agent_, *, llm=None, config=None, verify_answers=False, keyring=None):
        self.states = (Cell(), Cell(), Cell(), Cell(), Bag())
        self.timers = (Timer(), Timer())
        self.machine = KeyMachine(
            agent_,
            llm_client=llm,
            keyring=keyring,
            result_keyring=EFFECTOR if verify_answers else None,
            approval_keyring=HUMANS if verify_answers else None,
            config=config or RuntimeConfig(),
            registry=None,
            current_version=CURRENT_STATE_SCHEMA_VERSION,
        )
        self.outputs: list[tuple[str, object]] = []

    def _step(self, call):
        stored = _read(self.states)
        before = frozen(stored)
        effects = call(stored)
        assert frozen(stored) == before, "the machine changed a state read in place"
        if effects.state is not None:
            _write(effects, stored, self.states, self.timers)
        self.outputs += [(tag, value) for tag, (_, value) in effects.outputs]
        return effects

    def send(self, envelope: AgentEnvelope, *, arrival_ms: int = 0, idempotency_key=b""):
        return self._step(
            lambda stored: self.machine.on_envelope(
                KEY, stored, envelope, arrival_ms=arrival_ms, idempotency_key=idempotency_key
            )
        )

    def restore(self, snapshot: StateSnapshot):
        return self._step(lambda stored: self.machine.on_snapshot(KEY, stored, snapshot))

    def fire_deadline(self, at_ms: int | None = None):
        at = self.timers[0].at_ms if at_ms is None else at_ms
        return self._step(lambda stored: self.machine.on_deadline_timer(KEY, stored, at))

    def fire_ttl(self, at_ms: int | None = None):
        at = self.timers[1].at_ms if at_ms is None else at_ms
        return self._step(lambda stored: self.machine.on_ttl_timer(KEY, stored, at))

    def export(self, at: int = T0 + 10**6) -> StateSnapshot:
        envelope = AgentEnvelope(entity_key=KEY, event_time_ms=at)
        envelope.export_request.request_id = "export"
        (snapshot,) = [v for t, v in self.send(envelope).outputs if t == "snapshots"]
        return snapshot[1]

    def values(self, tag: str) -> list:
        return [v for t, v in self.outputs if t == tag]

    @property
    def continuation(self) -> Continuation | None:
        return self.states[3].value

    @property
    def memory(self) -> MemoryBlob | None:
        return self.states[1].value


def event(at: int, data: bytes) -> AgentEnvelope:
    return AgentEnvelope(entity_key=KEY, event_time_ms=at, external_event=data)


def answer(at: int, intent: ToolIntent, payload=b"ok", *, status=ToolResult.OK, ring=EFFECTOR):
    """The effector's signed result for `intent`, bound to its content."""
    result = ToolResult(
        intent_id=intent.intent_id,
        entity_key=KEY,
        status=status,
        payload=payload,
        completed_at_ms=at,
        intent_digest=content_digest(intent.SerializeToString(deterministic=True)),
    )
    if ring is not None:
        result = sign(result, ring)
    return AgentEnvelope(entity_key=KEY, event_time_ms=at, tool_result=result)


def approve(
    at: int, intent: ToolIntent, approved=True, *, ring=HUMANS, edited_args_json: str = ""
) -> AgentEnvelope:
    decision = AgentEnvelope.Approval(
        intent_id=intent.intent_id,
        approved=approved,
        approver="ops@example.com",
        decided_at_ms=at,
        intent_digest=content_digest(intent.SerializeToString(deterministic=True)),
        edited_args_json=edited_args_json,
    )
    if ring is not None:
        decision = sign(decision, ring)
    return AgentEnvelope(entity_key=KEY, event_time_ms=at, approval=decision)


@agent(name="tests.refund/v1")
def refund(ctx, event: bytes) -> bytes:
    visits = int(ctx.memory.get("visits", b"0")) + 1
    ctx.memory.put("visits", str(visits).encode())
    paid = ctx.call_tool("payments.refund", {"amount": int(event)})
    summary = ctx.llm([{"role": "user", "content": paid.payload.decode()}], model="m")
    return f"{summary.text} after {visits} visit(s)".encode()


@agent(name="tests.parallel/v1")
def parallel(ctx, event: bytes) -> bytes:
    answers = ctx.call_tools([("a.tool", {"n": 1}), ("b.tool", {"n": 2}), ("c.tool", {"n": 3})])
    return b",".join(a.payload for a in answers)


@agent(name="tests.echo/v1")
def echo(ctx, event: bytes) -> bytes:
    ctx.memory.put("last", event)
    return b"echo " + event


@agent(name="tests.asks/v1")
def asks(ctx, event: bytes) -> bytes:
    decided = ctx.request_approval("refund?", amount=int(event))
    return b"approved" if decided.ok else b"declined"


@agent(name="tests.asks_editable/v1")
def asks_editable(ctx, event: bytes) -> bytes:
    """Asks to refund `event` EUR, the amount editable; refunds what the person approved."""
    decided = ctx.request_approval("refund?", editable=["amount"], amount=int(event), to="c-1")
    if not decided.ok:
        return b"declined"
    return f"refunded {decided.approved_args['amount']} to {decided.approved_args['to']}".encode()


def summarise(payload: str):
    return ScriptedLlmClient(lambda request: f"summary of {request.messages[-1]['content']}")


def pending(h: Harness) -> list[ToolIntent]:
    return list(h.states[4].value)


class DownOnce:
    """A model that is down for its first `failures` calls (retryable), then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def complete(self, request):
        if self.failures:
            self.failures -= 1
            raise LlmCallError("model overloaded", model=request.model, retryable=True)
        return LlmResponse(f"summary of {request.messages[-1]['content']}", request.model)


@agent(name="tests.summarise/v1")
def summarise_event(ctx, event: bytes) -> bytes:
    return ctx.llm([{"role": "user", "content": event.decode()}], model="m").text.encode()
