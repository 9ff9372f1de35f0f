"""Type guessing and typed errors of beam_agents.wire.decoding."""

from __future__ import annotations

import itertools

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
from beam_agents.errors import BeamAgentsError, MessageDecodeError
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION
from beam_agents.wire.decoding import (
    MESSAGE_TYPES,
    UnknownField,
    decode,
    describe,
    message_type,
    unknown_fields,
)
from tools import golden
from tools.workspace import data_root

REPO = data_root()

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
    ActivationErrorRecord(entity_key=b"k", reason="r", detail="d", event_time_ms=1_764_460_800_000),
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


def _golden_fixtures():
    return golden.read_fixtures(REPO / "golden" / f"v{CURRENT_STATE_SCHEMA_VERSION}")


def _without_fields(message):
    """The message, then every copy of it with one or more top-level fields removed."""
    names = [field.name for field, _ in message.ListFields()]
    for count in range(len(names)):
        for removed in itertools.combinations(names, count):
            variant = type(message)()
            variant.CopyFrom(message)
            for name in removed:
                variant.ClearField(name)
            yield variant


def test_a_guess_is_the_right_type_or_a_refusal_naming_it_never_a_misreading():
    checked = 0
    for fixture in _golden_fixtures():
        cls = message_type(fixture.type_name)
        for variant in _without_fields(cls.FromString(fixture.data)):
            data = variant.SerializeToString()
            if not data:
                continue
            checked += 1
            try:
                decoded = decode(data)
            except MessageDecodeError as e:
                assert cls.DESCRIPTOR.name in str(e), (fixture.name, variant, str(e))
                continue
            assert type(decoded.message) is cls, (fixture.name, variant)
    assert checked > 20_000  # every combination of every fixture's fields


def test_a_blob_with_future_fields_decodes_under_its_type_and_lists_them():
    (fixture,) = [f for f in _golden_fixtures() if f.name == "tool_intent_future_field"]
    decoded = decode(fixture.data)
    assert isinstance(decoded.message, ToolIntent) and decoded.guessed
    assert unknown_fields(decoded.message) == [UnknownField("", 20, 2)]
    assert describe(UnknownField("", 20, 2)) == "field 20 (length-delimited)"


def test_a_future_field_inside_a_nested_message_is_listed_where_it_sits():
    from beam_agents.testing.samples import snapshot

    exported = snapshot()
    exported.pending[1].MergeFromString(b"\xa2\x01\x01x")  # field 20, unknown here
    decoded = decode(exported.SerializeToString())
    assert isinstance(decoded.message, StateSnapshot)
    assert unknown_fields(decoded.message) == [UnknownField("pending[1]", 20, 2)]
