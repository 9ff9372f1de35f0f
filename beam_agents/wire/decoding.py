"""Decoding serialized beam_agents messages whose type may be unknown.

Protobuf bytes do not name their type, and proto3 parsers accept almost anything: a field with
the wrong wire type, or a number the schema lacks, just becomes an unknown field. So a guess
keeps only the types under which the bytes parse with no unknown field anywhere in the message
tree. Only when no type parses that cleanly does it consider the types whose unknown fields are
all future fields, numbered above every field their message declares (the additive-evolution
rule gives new fields such numbers), preferring the fewest unknown fields: so an intent from a
newer writer still reads as an intent, and `unknown_fields` lists what this binary cannot name.
Among the candidates it prefers the types whose enum fields all hold declared values, then the
reading that explains the bytes with the most populated scalar fields (a MemoryBlob's entries
also parse as a StateSnapshot's entity_key bytes, but as one opaque field; a map entry counts
its key and its value, as the message it is on the wire). When more than one type still fits,
the guess is refused and names the candidates: an operator tool must not print a confident
misreading.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.unknown_fields import UnknownFieldSet

from beam_agents import _protos
from beam_agents.errors import MessageDecodeError

__all__ = [
    "MESSAGE_TYPES",
    "Decoded",
    "UnknownField",
    "decode",
    "describe",
    "message_type",
    "unknown_fields",
]

#: Every top-level message of beam_agents.v1, by short name.
MESSAGE_TYPES: dict[str, type[Message]] = {name: getattr(_protos, name) for name in _protos.__all__}


@dataclasses.dataclass(frozen=True)
class Decoded:
    """The outcome of `decode`."""

    message: Message
    #: True when the type was guessed rather than given.
    guessed: bool


def message_type(name: str) -> type[Message]:
    """The message class for a short ("ToolIntent") or full ("beam_agents.v1.ToolIntent")
    name."""
    short = name.removeprefix("beam_agents.v1.")
    try:
        return MESSAGE_TYPES[short]
    except KeyError:
        raise MessageDecodeError(
            f"unknown message type {name!r}; known: {', '.join(sorted(MESSAGE_TYPES))}",
            type_name=name,
            size=0,
        ) from None


@dataclasses.dataclass(frozen=True)
class UnknownField:
    """A field the message's schema does not declare, as found on the wire."""

    #: Where it sits: "" for the top level, else the path of its message ("pending[1]").
    where: str
    number: int
    wire_type: int


_WIRE_TYPES = {0: "varint", 1: "64-bit", 2: "length-delimited", 3: "group", 5: "32-bit"}


def unknown_fields(message: Message) -> list[UnknownField]:
    """Every unknown field in the message tree, in wire order."""
    return [
        UnknownField(where, field.field_number, field.wire_type)
        for where, m in _walk(message)
        for field in UnknownFieldSet(m)
    ]


def describe(field: UnknownField) -> str:
    where = f"{field.where}: " if field.where else ""
    return f"{where}field {field.number} ({_WIRE_TYPES.get(field.wire_type, field.wire_type)})"


def decode(data: bytes, type_name: str | None = None) -> Decoded:
    """Parses `data` as `type_name`, or as the one type it can only be.

    Raises MessageDecodeError when the bytes do not parse as the given type, parse as no
    type, or fit several types equally well.
    """
    if type_name is not None:
        cls = message_type(type_name)
        try:
            return Decoded(cls.FromString(data), guessed=False)
        except DecodeError as e:
            raise MessageDecodeError(
                f"{len(data)} bytes are not a serialized {cls.DESCRIPTOR.full_name}: {e}",
                type_name=cls.DESCRIPTOR.full_name,
                size=len(data),
            ) from e

    parsed = []
    for cls in MESSAGE_TYPES.values():
        try:
            parsed.append(cls.FromString(data))
        except DecodeError:
            continue
    clean = [m for m in parsed if not any(_has_unknown_fields(m) for _, m in _walk(m))]
    if not clean:
        forward = [m for m in parsed if _only_future_fields(m)]
        fewest = min((len(unknown_fields(m)) for m in forward), default=0)
        clean = [m for m in forward if len(unknown_fields(m)) == fewest]
    plausible = [m for m in clean if not any(_has_undeclared_enum(m) for _, m in _walk(m))] or clean
    most = max((_scalar_count(m) for m in plausible), default=0)
    best = [m for m in plausible if _scalar_count(m) == most]
    if len(best) == 1:
        return Decoded(best[0], guessed=True)
    if not best:
        raise MessageDecodeError(
            f"{len(data)} bytes are not a serialized beam_agents message of any type",
            type_name=None,
            size=len(data),
        )
    names = ", ".join(m.DESCRIPTOR.name for m in best)
    raise MessageDecodeError(
        f"{len(data)} bytes parse equally well as {names}; name the type with --type",
        type_name=None,
        size=len(data),
    )


def _walk(message: Message, where: str = "") -> Iterator[tuple[str, Message]]:
    """(path, message) of `message` and every message inside it, maps' values excluded."""
    yield where, message
    for field, value in message.ListFields():
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if field.message_type.GetOptions().map_entry:
            continue  # map<string, string> values hold no messages
        path = f"{where}.{field.name}" if where else field.name
        if field.is_repeated:
            for i, item in enumerate(value):
                yield from _walk(item, f"{path}[{i}]")
        else:
            yield from _walk(value, path)


def _scalar_count(message: Message) -> int:
    count = 0
    for _, m in _walk(message):
        for field, value in m.ListFields():
            if field.type != FieldDescriptor.TYPE_MESSAGE:
                count += 1
            elif field.message_type.GetOptions().map_entry:
                count += 2 * len(value)  # each entry is a key and a value on the wire
    return count


def _has_unknown_fields(message: Message) -> bool:
    return len(UnknownFieldSet(message)) > 0


def _only_future_fields(message: Message) -> bool:
    for _, m in _walk(message):
        declared = max((f.number for f in m.DESCRIPTOR.fields), default=0)
        if any(field.field_number <= declared for field in UnknownFieldSet(m)):
            return False
    return True


def _has_undeclared_enum(message: Message) -> bool:
    for field, value in message.ListFields():
        if field.type != FieldDescriptor.TYPE_ENUM:
            continue
        values = value if field.is_repeated else [value]
        if any(field.enum_type.values_by_number.get(v) is None for v in values):
            return True
    return False
