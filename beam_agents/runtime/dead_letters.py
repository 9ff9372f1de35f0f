"""Dead-letter reasons of RunAgent's ERRORS output, and their wire form on a message bus.

A dead letter is an ActivationErrorRecord (entity_key, reason, detail, event_time_ms). Its
`reason` is one of the constants below, stable across releases so that alerts and replays can
key on it; `detail` is for people. Every dead letter is emitted instead of a change: the key's
state is exactly as it was before the element or timer that produced it, except where a
constant says otherwise.
"""

from __future__ import annotations

from beam_agents._protos import ActivationErrorRecord, AgentEnvelope

__all__ = [
    "AFTER_DEADLINE",
    "AGENT_CONTRACT",
    "AGENT_RAISED",
    "ANSWER_MISMATCH",
    "CHECKPOINT_REJECTED",
    "DEADLINE_EXCEEDED",
    "EMPTY_ENVELOPE",
    "KEY_SUSPENDED",
    "LLM_FAILED",
    "MEMORY_BUDGET",
    "NO_ENTITY_KEY",
    "NO_SUSPENSION",
    "REASONS",
    "RESTORE_CONFLICT",
    "STALE_TIMER",
    "TTL_WIPED_SUSPENDED",
    "UNDECODABLE",
    "UNKNOWN_INTENT",
    "error_record",
    "to_envelope",
]

UNDECODABLE = "undecodable_envelope"
NO_ENTITY_KEY = "no_entity_key"
EMPTY_ENVELOPE = "empty_envelope"
AGENT_RAISED = "agent_raised"
AGENT_CONTRACT = "agent_contract"
LLM_FAILED = "llm_failed"
MEMORY_BUDGET = "memory_budget"
KEY_SUSPENDED = "key_suspended"
NO_SUSPENSION = "no_suspension"
UNKNOWN_INTENT = "unknown_intent"
AFTER_DEADLINE = "after_deadline"
ANSWER_MISMATCH = "answer_mismatch"
DEADLINE_EXCEEDED = "deadline_exceeded"
STALE_TIMER = "stale_timer"
TTL_WIPED_SUSPENDED = "ttl_wiped_suspended"
RESTORE_CONFLICT = "restore_conflict"
CHECKPOINT_REJECTED = "checkpoint_rejected"

#: Every reason with its meaning (the README's table is this one).
REASONS = {
    UNDECODABLE: "the input bytes are no AgentEnvelope (or no StateSnapshot, on the snapshots "
    "input)",
    NO_ENTITY_KEY: "an envelope or snapshot with an empty entity_key: no agent to run",
    EMPTY_ENVELOPE: "the envelope carries no payload",
    AGENT_RAISED: "the agent raised; the activation changed nothing",
    AGENT_CONTRACT: "the agent broke the contract (wrong return type, acted after it finished, "
    "suspended with nothing pending, a replay that diverged)",
    LLM_FAILED: "an LLM call failed or could not be made",
    MEMORY_BUDGET: "the agent stored a memory value larger than the whole memory budget",
    KEY_SUSPENDED: "an event for a key that is waiting for answers; it was not processed",
    NO_SUSPENSION: "an answer for a key that is not suspended",
    UNKNOWN_INTENT: "an answer for an intent that is not pending (or whose pending intent is "
    "missing from the key's state)",
    AFTER_DEADLINE: "an answer whose event time is past the suspension's deadline",
    ANSWER_MISMATCH: "an approval for a tool intent, a result for an approval, or a result "
    "naming another entity",
    DEADLINE_EXCEEDED: "no answer by the deadline under the dead-letter policy; the "
    "suspension was ended",
    STALE_TIMER: "a deadline timer found a suspension due at another time (one that finds the "
    "suspension resolved already is only counted)",
    TTL_WIPED_SUSPENDED: "a suspended key idle past its TTL; its state was cleared",
    RESTORE_CONFLICT: "a StateSnapshot for a key that already has state; nothing restored",
    CHECKPOINT_REJECTED: "the key's stored checkpoint (a LangGraph graph's) names a type its "
    "allowlist does not hold, or is in another encoding; nothing was imported or run",
}


def error_record(entity_key: bytes, reason: str, detail: str, event_time_ms: int):
    return ActivationErrorRecord(
        entity_key=entity_key,
        reason=reason,
        # Details quote agents' exceptions, which may hold lone surrogates.
        detail=detail.encode("utf-8", "backslashreplace").decode("utf-8"),
        event_time_ms=event_time_ms,
    )


def to_envelope(record: ActivationErrorRecord) -> AgentEnvelope:
    """A dead letter as an errors topic carries it: the record, deterministically serialized,
    in an envelope's external_event, keyed and timed as the record."""
    return AgentEnvelope(
        entity_key=record.entity_key,
        event_time_ms=record.event_time_ms,
        external_event=record.SerializeToString(deterministic=True),
    )
