"""The protobuf wire format at the level of fields, for the few places that must work on bytes
as received rather than on parsed messages: signatures over a sender's exact bytes, content
digests without delivery fields, and length-delimited message sequences."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from google.protobuf.message import Message

__all__ = [
    "encode_varint",
    "join_delimited",
    "read_varint",
    "skip_value",
    "split_delimited",
    "strip_fields",
]


def strip_fields(wire: bytes, numbers: frozenset[int]) -> bytes:
    """A serialized message without its top-level fields numbered `numbers` (every
    occurrence), every other byte kept in place. Raises ValueError on malformed protobuf."""
    kept = []
    run_start = position = 0
    end = len(wire)
    while position < end:
        field_start = position
        tag, position = read_varint(wire, position)
        position = skip_value(wire, position, tag)
        if tag >> 3 in numbers:
            kept.append(wire[run_start:field_start])
            run_start = position
    if not kept:
        return wire
    kept.append(wire[run_start:])
    return b"".join(kept)


def read_varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7


def skip_value(data: bytes, position: int, tag: int) -> int:
    wire_type = tag & 7
    if wire_type == 0:
        return read_varint(data, position)[1]
    if wire_type == 1:
        position += 8
    elif wire_type == 2:
        length, position = read_varint(data, position)
        position += length
    elif wire_type == 5:
        position += 4
    elif wire_type == 3:  # a group: skip to its matching end-group tag
        # The open groups' numbers on a list, not the call stack: hostile bytes nest
        # without limit, and every failure here must be a ValueError.
        open_groups = [tag >> 3]
        while open_groups:
            inner, position = read_varint(data, position)
            if inner & 7 == 4:
                if inner >> 3 != open_groups.pop():
                    raise ValueError("mismatched end-group tag")
            elif inner & 7 == 3:
                open_groups.append(inner >> 3)
            else:
                position = skip_value(data, position, inner)
    else:
        raise ValueError(f"wire type {wire_type} cannot start a field")
    if position > len(data):
        raise ValueError("truncated field")
    return position


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def join_delimited(messages: Iterable[Message]) -> bytes:
    """Messages as one byte string, each deterministically serialized behind its length."""
    parts = []
    for message in messages:
        data = message.SerializeToString(deterministic=True)
        parts += (encode_varint(len(data)), data)
    return b"".join(parts)


def split_delimited(data: bytes, *, strict: bool = True) -> Iterator[bytes]:
    """The serialized messages `join_delimited` joined. Raises ValueError on malformed bytes;
    with `strict` False, a tail that is no whole message (a writer that died mid-message) is
    yielded as it is instead, for the reader to refuse as it refuses any bad message."""
    position = 0
    while position < len(data):
        start = position
        try:
            length, position = read_varint(data, position)
            if position + length > len(data):
                raise ValueError("truncated length-delimited message")
        except ValueError:
            if strict:
                raise
            yield data[start:]
            return
        yield data[position : position + length]
        position += length
