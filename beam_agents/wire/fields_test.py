"""Field-level wire helpers on real serialized messages."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from beam_agents._protos import AgentEnvelope, ToolIntent
from beam_agents.testing.samples import intent
from beam_agents.wire.fields import (
    encode_varint,
    join_delimited,
    read_varint,
    split_delimited,
    strip_fields,
)


@given(st.integers(0, 2**64 - 1))
def test_varints_round_trip(value):
    encoded = encode_varint(value)
    assert read_varint(encoded, 0) == (value, len(encoded))


def test_stripping_fields_keeps_every_other_byte_in_place():
    data = intent().SerializeToString(deterministic=True)
    stripped = strip_fields(data, frozenset({5, 6}))
    expected = intent()
    expected.ClearField("tool_name")
    expected.ClearField("args_json")
    assert stripped == expected.SerializeToString(deterministic=True)
    assert strip_fields(data, frozenset({99})) is data


def test_every_occurrence_of_a_stripped_field_goes_even_in_groups():
    group_20 = b"\xa3\x01" + b"\x08\x01" + b"\xa4\x01"  # start group 20, a varint, end group 20
    data = b"\x2a\x01a" + group_20 + b"\x2a\x01b"  # tool_name twice around the group
    assert strip_fields(data, frozenset({5})) == group_20
    assert strip_fields(data, frozenset({20})) == b"\x2a\x01a\x2a\x01b"


@pytest.mark.parametrize(
    "malformed",
    [b"\x0a\x05ab", b"\x80", b"\x0f", b"\xa3\x01\x08\x01", b"\xa3\x01\xac\x01", b"\x09\x00"],
    ids=["short length", "truncated tag", "wire type 7", "open group", "wrong end", "short 64"],
)
def test_malformed_bytes_are_a_value_error(malformed):
    with pytest.raises(ValueError):
        strip_fields(malformed, frozenset({1}))


@pytest.mark.parametrize("closed", [True, False], ids=["closed", "open"])
def test_groups_nested_deeper_than_the_stack_are_skipped_or_a_value_error(closed):
    depth = 100_000
    groups = b"\xa3\x01" * depth + (b"\xa4\x01" * depth if closed else b"")
    data = b"\x2a\x01a" + groups
    if closed:
        assert strip_fields(data, frozenset({5})) == groups
    else:
        with pytest.raises(ValueError):
            strip_fields(data, frozenset({5}))


def test_delimited_messages_round_trip_and_refuse_truncation():
    messages = [intent(), ToolIntent(), intent(intent_id="x" * 300)]
    data = join_delimited(messages)
    assert [ToolIntent.FromString(m) for m in split_delimited(data)] == messages
    assert list(split_delimited(b"")) == []
    with pytest.raises(ValueError):
        list(split_delimited(data[:-1]))
    envelope = AgentEnvelope(entity_key=b"k", external_event=b"\x00")
    assert AgentEnvelope.FromString(next(split_delimited(join_delimited([envelope])))) == envelope


@pytest.mark.parametrize("cut", [1, 5, 301])
def test_a_truncated_tail_is_yielded_whole_when_not_strict(cut):
    messages = [intent(), intent(intent_id="x" * 300)]
    data = join_delimited(messages)
    first = len(join_delimited(messages[:1]))
    *whole, tail = split_delimited(data[:-cut], strict=False)
    assert [ToolIntent.FromString(m) for m in whole] == messages[:1]
    assert tail == data[first:-cut]
    # An overlong varint: the rest is the tail.
    assert list(split_delimited(b"\xff" * 11, strict=False)) == [b"\xff" * 11]
    assert list(split_delimited(data, strict=False)) == [m.SerializeToString() for m in messages]
