"""Dead-letter reasons of RunAgent's ERRORS output, and their wire form on a message bus.

A dead letter is an ActivationErrorRecord (entity_key, reason, detail, event_time_ms). Its
`reason` is one of the constants below, stable across releases so that alerts and replays can
key on it; `detail` is for people. Every dead letter is emitted instead of a change: the key's
state is exactly as it was before the element or timer that produced it, except where a
constant says otherwise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from beam_agents._protos import ActivationErrorRecord, AgentEnvelope

__all__ = [
    "AFTER_DEADLINE",
    "AGENT_CONTRACT",
    "AGENT_RAISED",
    "ANSWER_FOR_OTHER_CONTENT",
    "ANSWER_MISMATCH",
    "BAD_ANSWER_SIGNATURE",
    "BUDGET_EXCEEDED",
    "CHECKPOINT_REJECTED",
    "DEADLINE_EXCEEDED",
    "EMPTY_ENVELOPE",
    "HISTORY_INCOMPLETE",
    "HISTORY_OUT_OF_ORDER",
    "INVALID_SNAPSHOT",
    "INVALID_STATE",
    "LLM_FAILED",
    "MAILBOX_FULL",
    "MEMORY_BUDGET",
    "NO_ENTITY_KEY",
    "NO_SUSPENSION",
    "REASONS",
    "RECORDED_ANSWER_WITHHELD",
    "RECORDING_UNDECODABLE",
    "RECORD_TOO_LARGE",
    "RESTORE_CONFLICT",
    "RESUME_FAILED",
    "SEQ_EXHAUSTED",
    "SNAPSHOT_FROM_FUTURE",
    "TTL_WIPED_SUSPENDED",
    "UNDECODABLE",
    "UNKNOWN_INTENT",
    "error_record",
    "over_limit",
    "to_envelope",
]

UNDECODABLE = "undecodable_envelope"
NO_ENTITY_KEY = "no_entity_key"
EMPTY_ENVELOPE = "empty_envelope"
AGENT_RAISED = "agent_raised"
AGENT_CONTRACT = "agent_contract"
LLM_FAILED = "llm_failed"
MEMORY_BUDGET = "memory_budget"
NO_SUSPENSION = "no_suspension"
UNKNOWN_INTENT = "unknown_intent"
AFTER_DEADLINE = "after_deadline"
ANSWER_MISMATCH = "answer_mismatch"
DEADLINE_EXCEEDED = "deadline_exceeded"
TTL_WIPED_SUSPENDED = "ttl_wiped_suspended"
RESTORE_CONFLICT = "restore_conflict"
RESUME_FAILED = "resume_failed"
MAILBOX_FULL = "mailbox_full"
BAD_ANSWER_SIGNATURE = "bad_answer_signature"
ANSWER_FOR_OTHER_CONTENT = "answer_for_other_content"
SNAPSHOT_FROM_FUTURE = "snapshot_from_future"
INVALID_SNAPSHOT = "invalid_snapshot"
INVALID_STATE = "invalid_state"
CHECKPOINT_REJECTED = "checkpoint_rejected"
BUDGET_EXCEEDED = "budget_exceeded"
SEQ_EXHAUSTED = "seq_exhausted"
RECORD_TOO_LARGE = "record_too_large"
# A backtest's (beam_agents/ops/backtest.py): a recording it cannot run.
RECORDING_UNDECODABLE = "recording_undecodable"
HISTORY_INCOMPLETE = "history_incomplete"
HISTORY_OUT_OF_ORDER = "history_out_of_order"
RECORDED_ANSWER_WITHHELD = "recorded_answer_withheld"

#: Every reason with its meaning (docs/troubleshooting.md's table lists exactly these).
REASONS = {
    UNDECODABLE: "the input bytes are no AgentEnvelope (or no StateSnapshot, on the snapshots "
    "input), or an envelope's idempotency key is neither bytes nor str (the envelope is in the "
    "record)",
    NO_ENTITY_KEY: "an envelope or snapshot with an empty entity_key: no agent to run",
    EMPTY_ENVELOPE: "the envelope carries no payload",
    AGENT_RAISED: "the agent raised; the activation changed nothing but the count of the model "
    "calls it paid for (with the key's activity mark) and, for a start, its seq (a resume keeps "
    "its answers and is tried again)",
    AGENT_CONTRACT: "the agent broke the contract (wrong return type, acted after it finished, "
    "suspended with nothing pending, a replay that diverged)",
    LLM_FAILED: "an LLM call failed or could not be made",
    MEMORY_BUDGET: "the agent stored a memory value larger than the whole memory budget",
    NO_SUSPENSION: "an answer for a key that is not suspended (one with no state at all may "
    "have overtaken the snapshot that restores it: restore first, then send the answer again)",
    UNKNOWN_INTENT: "an answer for an intent that is not pending (or whose pending intent is "
    "missing from the key's state)",
    AFTER_DEADLINE: "an answer whose event time is past the suspension's deadline",
    ANSWER_MISMATCH: "an approval for a tool intent, a result for an approval, a result "
    "naming another entity, or an approval editing arguments its request does not allow",
    DEADLINE_EXCEEDED: "no answer by the deadline under the dead-letter policy; the "
    "suspension was ended",
    TTL_WIPED_SUSPENDED: "a suspended key idle past its TTL; its state was cleared (no longer "
    "written: a suspension's deadline always ends it before its TTL can pass)",
    RESTORE_CONFLICT: "a StateSnapshot for a key that already has state; nothing restored",
    RESUME_FAILED: "a resume failed on every retry; the suspension ended, its answers are in "
    "the record",
    MAILBOX_FULL: "an event for a suspended key whose mailbox is full; the event is in the record",
    BAD_ANSWER_SIGNATURE: "an answer that is unsigned or not signed by a key of the answer "
    "keyring; the key keeps waiting for the genuine one",
    ANSWER_FOR_OTHER_CONTENT: "an answer computed for other content than the pending intent "
    "of that id; the key keeps waiting",
    SNAPSHOT_FROM_FUTURE: "a StateSnapshot holding state of a newer schema than this binary "
    "reads; nothing restored",
    INVALID_SNAPSHOT: "a StateSnapshot whose seq this runtime never issues (negative, or so "
    "large its next seqs overflow int64), whose Continuation or usage it never writes (a "
    "negative seq or usage, a retry of a start with no event), or whose dedupe marks are not "
    "whole marks in time order; nothing restored",
    INVALID_STATE: "the key's stored Continuation is one the runtime cannot act on (a negative "
    "seq, a retry of a start with no event): the suspension was ended before the input, its "
    "answers and each queued event are in records; or its stored usage was out of range "
    "(negative, too many budget grants) and was set to the nearest value in range; or its "
    "stored dedupe marks were not whole marks in time order (restored by an older binary): the "
    "whole ones were kept in time order and the input went on, the detail saying what was "
    "dropped",
    CHECKPOINT_REJECTED: "the key's stored checkpoint (a LangGraph graph's) names a type its "
    "allowlist does not hold, or is in another encoding; nothing was imported or run",
    SEQ_EXHAUSTED: "an event for a key whose seq is the last int64 (one that began near the "
    "end of time and ran on): no activation can start; the event is in the record",
    BUDGET_EXCEEDED: "a model call would have taken the key or the activation past its budget "
    "(or no one raised it when asked); the call was not made, the event or answers are in the "
    "record",
    RECORD_TOO_LARGE: "an output record (a StateSnapshot of a key near its caps, most likely) "
    "over RunAgent's max_output_bytes (the bus loop's max_record_bytes); it was not written, the "
    "key's state is unchanged",
    RECORDING_UNDECODABLE: "a backtest's input is no ActivationRecord (truncated bytes, or "
    "another message type): that record is skipped",
    HISTORY_INCOMPLETE: "a backtest's history of a key lacks the key's first activation (it "
    "starts with a resume, or with a start that is not the key's first seq), or holds answers "
    "to intents no record emitted: the key is not backtested",
    HISTORY_OUT_OF_ORDER: "a backtest's history of a key holds two different records at one "
    "place (seq and step) that are not a failed attempt and its retry (records of two "
    "histories mixed): the key is not backtested",
    RECORDED_ANSWER_WITHHELD: "a backtest's candidate needs a recorded model answer that was "
    "over the recording's max_answer_bytes, kept as a digest only: the key's run stopped there",
}


def error_record(
    entity_key: bytes,
    reason: str,
    detail: str,
    event_time_ms: int,
    *,
    input: AgentEnvelope | None = None,
    answers: Iterable[AgentEnvelope] = (),
):
    """A dead letter; `input` is the refused envelope, `answers` those of an ended suspension."""
    return ActivationErrorRecord(
        entity_key=entity_key,
        reason=reason,
        # Details quote agents' exceptions, which may hold lone surrogates.
        detail=detail.encode("utf-8", "backslashreplace").decode("utf-8"),
        event_time_ms=event_time_ms,
        input=input,
        answers=answers,
    )


def to_envelope(record: ActivationErrorRecord) -> AgentEnvelope:
    """A dead letter as an errors topic carries it: the record, deterministically serialized,
    in an envelope's external_event, keyed and timed as the record."""
    return AgentEnvelope(
        entity_key=record.entity_key,
        event_time_ms=record.event_time_ms,
        external_event=record.SerializeToString(deterministic=True),
    )


def over_limit(
    output: str, entity_key: bytes, value, limit: int, event_time_ms: int
) -> ActivationErrorRecord | None:
    """The `record_too_large` dead letter standing in for the output `value` (bytes, a message,
    or a dead letter, measured inside its envelope as the errors topic carries it) whose key and
    value are over `limit` bytes; None when they fit. Measured without serializing: a message's
    ByteSize is its deterministic serialization's length."""
    body = to_envelope(value) if isinstance(value, ActivationErrorRecord) else value
    size = len(entity_key) + (len(body) if isinstance(body, bytes) else body.ByteSize())
    if size <= limit:
        return None
    data = body if isinstance(body, bytes) else body.SerializeToString(deterministic=True)
    if isinstance(value, ActivationErrorRecord):
        what = f"dead letter ({value.reason})"
    else:
        what = "completion" if isinstance(value, bytes) else type(value).__name__
    detail = (
        f"a {what} record of {size} bytes on the {output} output is over max_output_bytes of "
        f"{limit}; it was not written (SHA-256 {hashlib.sha256(data).hexdigest()}) and the "
        "key's state is unchanged. Make the key smaller (its memory and cache caps, entries "
        "deleted) and ask again, or raise the limit (on the bus loop, max_record_bytes with the "
        "topic's and the broker's max.message.bytes)"
    )
    return error_record(entity_key, RECORD_TOO_LARGE, detail, event_time_ms)
