"""Replay one activation offline, to prove an agent change is replay-safe before deploying it.

    beam-agents replay SNAPSHOT ENVELOPE --agent MODULE:NAME
        [--recorded-intents FILE] [--recorded-traces FILE]

SNAPSHOT is a key's StateSnapshot exported before the activation (for a resume: while it was
suspended), ENVELOPE the AgentEnvelope that started or resumed it, and the recorded files the
ToolIntents and TraceEvents it emitted in production (length-delimited, as
`beam_agents.integrations.telemetry.write_trace_file` writes them). The replay restores the snapshot
and delivers the envelope in a local Beam pipeline with this binary's agent and RunAgent, and a
model client that refuses every call: every LLM answer must come from the key's replay cache.
Intents are compared without their signature fields (no keys are needed offline).

Verdicts and exit codes: 0 reproduced (the same intents and traces, or, with nothing recorded,
an activation that ran without calling the model); 1 diverged (a unified diff of what
differs, or the agent failing); 3 could not be reproduced (the activation needed the model: a
cache miss, or an entry kept only as a digest; or the state needs a migration this binary lacks,
or comes from a newer binary; or the agent refused the key's stored checkpoint, which names a
type outside its allowlist: `checkpoint_rejected`); 2 usage error.
"""

from __future__ import annotations

import dataclasses
import difflib
import tempfile
from collections.abc import Sequence

from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP
from google.protobuf import text_format
from google.protobuf.message import DecodeError, Message

from beam_agents._protos import AgentEnvelope, StateSnapshot, ToolIntent, TraceEvent
from beam_agents.errors import MessageDecodeError
from beam_agents.intents.signing import SIGNATURE_FIELDS
from beam_agents.ops.loading import load_object
from beam_agents.ops.preflight import report
from beam_agents.ops.rounds import Advance, run_round
from beam_agents.runtime import ERRORS, INTENTS, TRACES, Agent, RefusingLlmClient, RunAgent
from beam_agents.runtime.dead_letters import CHECKPOINT_REJECTED, LLM_FAILED
from beam_agents.state.migration import MigrationRegistry
from beam_agents.wire.fields import split_delimited

__all__ = [
    "DIVERGED",
    "REPRODUCED",
    "UNREPRODUCIBLE",
    "Replay",
    "check_inputs",
    "load_agent",
    "replay",
]

REPRODUCED, DIVERGED, UNREPRODUCIBLE = 0, 1, 3


@dataclasses.dataclass(frozen=True)
class Replay:
    verdict: int
    #: What happened, for people: a summary line, then a diff when it diverged.
    report: str
    intents: list[ToolIntent]
    traces: list[TraceEvent]


def load_agent(spec: str) -> Agent:
    """The Agent named "module:attribute". Raises ValueError naming what is wrong."""
    found = load_object(spec)
    if not isinstance(found, Agent):
        raise ValueError(f"{spec} is not an agent (adapter, start and resume)")
    return found


def check_inputs(snapshot: StateSnapshot, envelope: AgentEnvelope) -> None:
    """Raises ValueError unless the envelope is addressed to the snapshot's key (an activation
    of another key would run on no state and its failure would read as a divergence) and both
    times are ones the replay's pipeline can stamp its inputs with."""
    if not snapshot.entity_key or envelope.entity_key != snapshot.entity_key:
        raise ValueError(
            f"the envelope is for key {envelope.entity_key!r}, the snapshot for "
            f"{snapshot.entity_key!r}: give the snapshot of the key the envelope activates"
        )
    # Inputs are stamped at these times and the watermark goes 1 ms either side of them.
    earliest, latest = MIN_TIMESTAMP.micros // 1000 + 2, MAX_TIMESTAMP.micros // 1000 - 2
    for name, at in (
        ("envelope's event_time_ms", envelope.event_time_ms),
        ("snapshot's snapshot_at_ms", snapshot.snapshot_at_ms),
    ):
        if not earliest <= at <= latest:
            raise ValueError(
                f"the {name} {at} is outside the times Beam stamps ({earliest} to {latest})"
            )


def read_messages(data: bytes, message_type: type[Message]) -> list:
    """The length-delimited messages of `data`. Raises ValueError for a truncated framing and
    MessageDecodeError for a part that is no `message_type`."""
    messages = []
    for index, part in enumerate(split_delimited(data)):
        try:
            messages.append(message_type.FromString(part))
        except DecodeError as e:
            name = message_type.DESCRIPTOR.full_name
            raise MessageDecodeError(
                f"message {index} ({len(part)} bytes) is no {name}: {e}",
                type_name=name,
                size=len(part),
            ) from None
    return messages


def replay(
    snapshot: StateSnapshot,
    envelope: AgentEnvelope,
    agent: Agent,
    *,
    recorded_intents: Sequence[ToolIntent] | None = None,
    recorded_traces: Sequence[TraceEvent] | None = None,
    registry: MigrationRegistry | None = None,
) -> Replay:
    """Re-runs the activation `envelope` starts or resumes from `snapshot`; see the module.
    `registry` replaces this binary's migration registry (tests of another schema version).
    Raises ValueError when the envelope is for another key than the snapshot (`check_inputs`)."""
    check_inputs(snapshot, envelope)
    unreadable = [blob for blob in report(snapshot, registry) if not blob.outcome.readable]
    if unreadable:  # the same verdicts as `beam-agents dry-run`, before any pipeline runs
        where = "; ".join(f"{b.where or b.type_name}: {b.detail}" for b in unreadable)
        return Replay(UNREPRODUCIBLE, f"cannot read the state: {where}", [], [])
    at = envelope.event_time_ms
    inputs = [snapshot, Advance(min(snapshot.snapshot_at_ms, at - 1)), envelope, Advance(at + 1)]
    with tempfile.TemporaryDirectory(prefix="beam-agents-replay-") as workdir:
        agent_run = RunAgent(agent, llm_client=RefusingLlmClient(), registry=registry)
        outputs = run_round(agent_run, inputs, workdir)
    # Only the activation itself counts, not a timer the last advance fired.
    outputs = outputs.before(at + 1)
    intents, traces = outputs.values(INTENTS), outputs.values(TRACES)
    errors = outputs.values(ERRORS)
    if any(e.reason == LLM_FAILED for e in errors):
        digest_only = [e.cache_key for e in snapshot.llm_cache.entries if e.digest_only]
        why = f"; {len(digest_only)} cache entries are kept as digests only" if digest_only else ""
        return Replay(
            UNREPRODUCIBLE,
            "the activation called the model: its answer is not in "
            f"the snapshot's replay cache{why}",
            intents,
            traces,
        )
    rejected = [e for e in errors if e.reason == CHECKPOINT_REJECTED]
    if rejected:
        return Replay(
            UNREPRODUCIBLE, f"cannot read the state: {rejected[0].detail}", intents, traces
        )
    if errors:
        (error, *_) = errors
        return Replay(
            DIVERGED, f"the agent failed: {error.reason}: {error.detail}", intents, traces
        )
    summary = f"{len(intents)} intents, {len(traces)} trace events, no model call"
    if recorded_intents is None and recorded_traces is None:
        return Replay(
            REPRODUCED, f"reproducible: {summary} (nothing recorded to compare)", intents, traces
        )
    diff = []
    if recorded_intents is not None:
        diff += _diff(
            "intents", [_unsigned(i) for i in recorded_intents], [_unsigned(i) for i in intents]
        )
    if recorded_traces is not None:
        diff += _diff("traces", recorded_traces, traces)
    if diff:
        return Replay(DIVERGED, "diverged from the recording:\n" + "".join(diff), intents, traces)
    return Replay(REPRODUCED, f"reproduced the recording: {summary}", intents, traces)


def _unsigned(intent: ToolIntent) -> ToolIntent:
    copy = ToolIntent()
    copy.CopyFrom(intent)
    for name in SIGNATURE_FIELDS:
        copy.ClearField(name)
    return copy


def _diff(label: str, recorded: Sequence[Message], replayed: Sequence[Message]) -> list[str]:
    def text(messages):
        return [
            line
            for i, message in enumerate(messages)
            for line in [
                f"# {label}[{i}]\n",
                *text_format.MessageToString(message).splitlines(keepends=True),
            ]
        ]

    return list(
        difflib.unified_diff(
            text(recorded), text(replayed), fromfile=f"recorded {label}", tofile=f"replayed {label}"
        )
    )
