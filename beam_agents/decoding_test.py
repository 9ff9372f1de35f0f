"""Type guessing and typed errors of beam_agents.decoding."""

from __future__ import annotations

import pytest

from beam_agents._protos import (
    ActivationErrorRecord,
    Continuation,
    LlmCacheBlob,
    MemoryBlob,
    StateSnapshot,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.decoding import MESSAGE_TYPES, decode, message_type
from beam_agents.errors import BeamAgentsError, MessageDecodeError

WELL_FORMED = [
    MemoryBlob(
        state_schema_version=1,
        entries=[MemoryBlob.MemoryEntry(key="a", value=b"x", last_access_ms=3)],
        total_value_bytes=1,
    ),
    ToolIntent(intent_id="i", entity_key=b"k", tool_name="t", args_json="{}", kind=1),
    TraceEvent(trace_id=bytes(16), span_id=bytes(8), event_type=2, attributes={"a": "b"}),
    Continuation(state_schema_version=1, seq=3, pending_intent_ids=["a"], snapshot=b"s"),
    LlmCacheBlob(
        state_schema_version=1,
        entries=[LlmCacheBlob.LlmCacheEntry(cache_key="k", response=b"r", response_digest=b"d")],
    ),
    ActivationErrorRecord(entity_key=b"k", reason="r", detail="d", event_time_ms=3),
    StateSnapshot(state_schema_version=1, entity_key=b"k", seq=3, request_id="r"),
]


@pytest.mark.parametrize("message", WELL_FORMED, ids=lambda m: m.DESCRIPTOR.name)
def test_guess_finds_the_type_that_explains_the_bytes(message):
    decoded = decode(message.SerializeToString())
    assert decoded.guessed
    assert type(decoded.message) is type(message)
    assert decoded.message == message


def test_a_given_type_is_used_even_where_another_would_be_guessed():
    data = WELL_FORMED[0].SerializeToString()
    decoded = decode(data, "beam_agents.v1.StateSnapshot")
    assert not decoded.guessed
    assert isinstance(decoded.message, StateSnapshot)


def test_bytes_that_fit_two_types_equally_are_refused_naming_both():
    # Same shape under both schemas: string 1, bytes 2, varint 3.
    data = ToolResult(intent_id="i", entity_key=b"k", seq=2).SerializeToString()
    with pytest.raises(MessageDecodeError) as raised:
        decode(data)
    assert "ToolIntent" in str(raised.value) and "ToolResult" in str(raised.value)
    assert "--type" in str(raised.value)
    assert raised.value.type_name is None and raised.value.size == len(data)


def test_bytes_of_no_message_get_a_typed_error():
    with pytest.raises(MessageDecodeError, match="not a serialized beam_agents message"):
        decode(b"\xff\xff\xff\xff")


def test_bytes_that_do_not_parse_as_the_given_type_name_it():
    with pytest.raises(MessageDecodeError) as raised:
        decode(b"\x0a\x05ab", "ToolIntent")
    assert raised.value.type_name == "beam_agents.v1.ToolIntent"
    assert isinstance(raised.value, BeamAgentsError)


def test_unknown_type_names_list_the_known_ones():
    with pytest.raises(MessageDecodeError, match="MemoryBlob"):
        message_type("NoSuchMessage")
    assert set(MESSAGE_TYPES) >= {"MemoryBlob", "StateSnapshot", "ToolIntent"}
