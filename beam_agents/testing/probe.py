"""What RunAgent's tests share (beam_agents/runtime/run_agent*_test.py): the probe agent, which
drives the low-level contract from JSON commands in its event (`Probe`, `probe`, `command`), the
example agent with a signing ring (`run_agent`), envelope builders on a fixed clock (T0), and
`converse`: a key's conversation in rounds chained through its snapshots, the way the demo's
local loop runs it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence

from beam_agents._protos import AgentEnvelope, Continuation, MemoryBlob, ToolIntent, ToolResult
from beam_agents.examples.support_triage import scripted_model, ticket, triage
from beam_agents.intents.signing import Keyring
from beam_agents.ops.rounds import run_round
from beam_agents.runtime import RunAgent, RuntimeConfig, ScriptedLlmClient

__all__ = [
    "CHARGED_TWICE",
    "DAY",
    "FAR",
    "KEY",
    "PROBE_CONFIG",
    "RING",
    "SEQ",
    "T0",
    "Probe",
    "approval",
    "command",
    "continuation",
    "converse",
    "event",
    "export",
    "load_ring",
    "memory_blob",
    "message_bytes",
    "probe",
    "result",
    "run_agent",
    "scripted_llm",
]

KEY = b"c-1"
T0 = 1_764_460_800_000
SEQ = T0 * 1000  # a fresh key's first seq: its first event time in microsecond steps
RING = Keyring({"runtime-2026-11": bytes(range(32))}, active="runtime-2026-11")
CHARGED_TWICE = ticket("t-1", "c-1", "I was charged twice, please refund me")
FAR = T0 + 10**8
DAY = 24 * 60 * 60 * 1000


def load_ring() -> Keyring:
    return RING


def run_agent(**overrides) -> RunAgent:
    return RunAgent(triage, llm_client=scripted_model(), keyring_loader=load_ring, **overrides)


def event(at: int, data: bytes, key: bytes = KEY) -> AgentEnvelope:
    return AgentEnvelope(entity_key=key, event_time_ms=at, external_event=data)


def export(at: int, request_id: str, key: bytes = KEY) -> AgentEnvelope:
    envelope = AgentEnvelope(entity_key=key, event_time_ms=at)
    envelope.export_request.request_id = request_id
    return envelope


def approval(at: int, approved_intent: ToolIntent, approved: bool = True) -> AgentEnvelope:
    envelope = AgentEnvelope(entity_key=approved_intent.entity_key, event_time_ms=at)
    envelope.approval.intent_id = approved_intent.intent_id
    envelope.approval.approved = approved
    envelope.approval.approver = "ops@example.com"
    envelope.approval.decided_at_ms = at
    return envelope


def converse(
    transform: Callable[[], RunAgent],
    first: AgentEnvelope,
    answer: Callable[[ToolIntent, int], Sequence[AgentEnvelope]],
    workdir: str | os.PathLike,
    *,
    rounds: int = 6,
    step_ms: int = 1000,
) -> tuple[list[bytes], list[ToolIntent]]:
    """`first`'s key in rounds of `transform()` (a new one each: a transform belongs to one
    pipeline), round n at `first`'s time + n * `step_ms`, each
    chained to the next through the snapshot it exports: every intent a round emits is answered
    by `answer(intent, at)`, whose envelopes (stamped before the next round) go into the next.
    Returns the completions and every intent emitted, when a round completes or the rounds run
    out; a round with a dead letter fails."""
    inputs, intents = [first], []
    for n in range(1, rounds + 1):
        at = first.event_time_ms + n * step_ms
        outputs = run_round(
            transform(), [*inputs, export(at, f"r{n}", first.entity_key)], workdir
        ).before(at + 1)
        assert outputs.errors == [], outputs.errors
        if completions := outputs.values("completions"):
            return completions, intents
        (snapshot,) = outputs.values("snapshots")
        inputs = [snapshot]
        for emitted in outputs.values("intents"):
            intents.append(emitted)
            inputs += answer(emitted, at)
    return [], intents


def message_bytes(values) -> list[bytes]:
    return [v if isinstance(v, bytes) else v.SerializeToString(deterministic=True) for v in values]


class Probe:
    """start: puts memory, asks the model, calls tools / asks approval (then suspends), or
    completes; resume: completes with the answers it got. `raise_at` fails on purpose."""

    adapter = "tests.probe/v1"

    def start(self, ctx, event: bytes):
        command = json.loads(event)
        self._maybe_raise(command, "start")
        for key, value in command.get("put", {}).items():
            ctx.memory.put(key, value.encode())
        self._maybe_raise(command, "after_put")
        if "llm" in command:
            ctx.llm([{"role": "user", "content": command["llm"]}], model="probe-model")
        self._maybe_raise(command, "after_llm")
        if command.get("calls"):
            ctx.call_tools([(name, {"n": i}) for i, name in enumerate(command["calls"])])
        if command.get("approval"):
            ctx.request_approval("ok?")
        self._maybe_raise(command, "after_call")
        if ctx.intents:
            deadline = command.get("deadline_ms")
            return ctx.suspend(snapshot=event, deadline_ms=deadline)
        if command.get("return") == "not bytes":
            return ctx.complete("a str")
        if command.get("return") == "nothing":
            return None
        return ctx.complete(b"done")

    def resume(self, ctx, answers):
        command = json.loads(ctx.resume_of.snapshot)
        self._maybe_raise(command, "resume")
        if "llm_on_resume" in command:
            ctx.llm([{"role": "user", "content": command["llm_on_resume"]}], model="probe-model")
        summary = [
            (
                a.intent.tool_name,
                ToolResult.Status.Name(a.result.status)
                if a.result
                else ("approved" if a.ok else "declined"),
            )
            for a in answers
        ]
        summary.append(("escalations", ctx.resume_of.escalations))
        return ctx.complete(json.dumps(summary).encode())

    @staticmethod
    def _maybe_raise(command, point):
        if command.get("raise_at") == point:
            raise RuntimeError(f"raised at {point}")


#: The probe's intents expire 1 ms after their activation, so the deadlines its commands name
#: (a few ms on) are the ones that fire: a deadline never precedes its intents' expiry.
PROBE_CONFIG = RuntimeConfig(intent_ttl_ms=1)


def probe(config=None, registry=None) -> RunAgent:
    return RunAgent(
        Probe(), llm_client=scripted_llm(), config=config or PROBE_CONFIG, registry=registry
    )


def scripted_llm():
    return ScriptedLlmClient(lambda request: f"echo {request.messages[-1]['content']}")


def command(at: int, key: bytes = KEY, **fields) -> AgentEnvelope:
    return event(at, json.dumps(fields).encode(), key)


def result(at: int, answered: str, status=ToolResult.OK, key: bytes = KEY) -> AgentEnvelope:
    envelope = AgentEnvelope(entity_key=key, event_time_ms=at)
    envelope.tool_result.CopyFrom(ToolResult(intent_id=answered, entity_key=key, status=status))
    return envelope


def continuation(**fields):
    defaults = dict(
        state_schema_version=1,
        seq=7,
        step_index=1,
        pending_intent_ids=["i-0"],
        adapter=Probe.adapter,
        snapshot=json.dumps({}).encode(),
        suspended_at_ms=T0,
    )
    return Continuation(**{**defaults, **fields})


def memory_blob(version: int):
    blob = MemoryBlob(state_schema_version=version, total_value_bytes=3)
    blob.entries.add(key="restored", value=b"abc", last_access_ms=1)
    return blob
