"""Fully populated example messages of every beam_agents.v1 type, for tests and fuzz seeds.

These are test inputs, free to change; the golden corpus has its own frozen builders under
golden/v<N>/.
"""

from __future__ import annotations

from google.protobuf.message import Message

from beam_agents._protos import (
    ActivationErrorRecord,
    AgentEnvelope,
    Continuation,
    LlmCacheBlob,
    MemoryBlob,
    StateSnapshot,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION

__all__ = [
    "ALL_MESSAGES",
    "PARENT_SPAN_ID",
    "SPAN_ID",
    "TRACE_ID",
    "intent",
    "roundtrip",
    "sample",
    "snapshot",
]

TRACE_ID = bytes(range(16))
SPAN_ID = bytes(range(100, 108))
PARENT_SPAN_ID = bytes(range(200, 208))

ALL_MESSAGES: tuple[type[Message], ...] = (
    MemoryBlob,
    ToolIntent,
    ToolResult,
    TraceEvent,
    AgentEnvelope,
    Continuation,
    LlmCacheBlob,
    ActivationErrorRecord,
    StateSnapshot,
)


def intent(**overrides) -> ToolIntent:
    """An unsigned TOOL intent with every identity field set; `overrides` replace fields."""
    fields = dict(
        intent_id="9b1deb4d-3b7d-5bad-9bdd-2b0d7b3dcb6d",
        entity_key=b"customer-42",
        seq=7,
        step_index=3,
        tool_name="crm.lookup",
        args_json='{"fields":["name","tier"],"id":42,"note":"caf\\u00e9"}',
        created_at_ms=1_700_000_000_000,
        expires_at_ms=1_700_000_060_000,
        attempt=2,
        kind=ToolIntent.TOOL,
        trace_id=TRACE_ID,
    )
    fields.update(overrides)
    return ToolIntent(**fields)


def snapshot() -> StateSnapshot:
    """A suspended key's snapshot, as this binary exports it: memory, cache (one digest-only
    entry), continuation, two pending intents."""
    memory = MemoryBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION, total_value_bytes=2)
    memory.entries.add(key="z", value=b"1", last_access_ms=2)
    memory.entries.add(key="a", value=b"2", last_access_ms=1)
    cache = LlmCacheBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION, total_response_bytes=3)
    cache.entries.add(cache_key="c2", response=b"abc", response_digest=bytes(32))
    cache.entries.add(cache_key="c1", digest_only=True, response_digest=bytes(range(32)))
    return StateSnapshot(
        state_schema_version=CURRENT_STATE_SCHEMA_VERSION,
        entity_key=b"customer-42",
        seq=12,
        snapshot_at_ms=1_700_000_000_000,
        memory=memory,
        llm_cache=cache,
        continuation=Continuation(
            state_schema_version=CURRENT_STATE_SCHEMA_VERSION,
            seq=12,
            pending_intent_ids=["i-1", "i-2"],
            snapshot=b"s",
        ),
        pending=[intent(intent_id="i-1"), intent(intent_id="i-2", step_index=4)],
        request_id="export-1",
    )


def roundtrip(message: Message) -> Message:
    """`message` through its bytes: what a reader of the wire gets."""
    return type(message).FromString(message.SerializeToString())


def sample(cls: type[Message]) -> Message:
    """A populated message of type `cls`."""
    builders = {
        MemoryBlob: lambda: snapshot().memory,
        ToolIntent: intent,
        ToolResult: lambda: ToolResult(
            intent_id="i", entity_key=b"k", seq=1, status=ToolResult.OK, payload=b"p"
        ),
        TraceEvent: lambda: TraceEvent(
            trace_id=TRACE_ID,
            span_id=SPAN_ID,
            parent_span_id=PARENT_SPAN_ID,
            event_type=TraceEvent.LLM_CALL,
            attributes={"gen_ai.request.model": "gemini-2.5-pro"},
        ),
        AgentEnvelope: lambda: AgentEnvelope(
            entity_key=b"k", event_time_ms=5, tool_result=ToolResult(intent_id="i", status=1)
        ),
        Continuation: lambda: snapshot().continuation,
        LlmCacheBlob: lambda: snapshot().llm_cache,
        ActivationErrorRecord: lambda: ActivationErrorRecord(
            entity_key=b"k", reason="r", detail="d", event_time_ms=1
        ),
        StateSnapshot: snapshot,
    }
    return builders[cls]()
