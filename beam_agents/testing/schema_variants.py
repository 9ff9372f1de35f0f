"""Bindings of past and future schemas, for proving skew behaviour instead of assuming it.

A `SchemaVariant` starts from a copy of the current beam_agents.proto descriptor, applies edits
(drop a field, drop an enum value, add a field above every existing number) and builds message
classes from the result in a fresh `DescriptorPool`. Those classes really are what an older or a
newer binary would parse and serialize with: bytes they write lack (or carry) exactly the edited
fields, and the current bindings read them back through the real parser. Because each variant
lives in its own pool, its classes never clash with the current ones.

    old = SchemaVariant.current().without_field("ToolIntent", "trace_id")
    old_bytes = old.message_class("ToolIntent")(intent_id="i-1").SerializeToString()
"""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from beam_agents._protos import beam_agents_pb2

__all__ = ["SchemaVariant"]

_FieldType = descriptor_pb2.FieldDescriptorProto.Type


class SchemaVariant:
    """An edited copy of the beam_agents.v1 file descriptor, with classes built on demand."""

    def __init__(self, file_proto: descriptor_pb2.FileDescriptorProto) -> None:
        self._file = file_proto
        self._pool: descriptor_pool.DescriptorPool | None = None

    @classmethod
    def current(cls) -> SchemaVariant:
        """The schema of the committed bindings, unedited."""
        file_proto = descriptor_pb2.FileDescriptorProto()
        beam_agents_pb2.DESCRIPTOR.CopyToProto(file_proto)
        return cls(file_proto)

    @property
    def file_proto(self) -> descriptor_pb2.FileDescriptorProto:
        """A copy of the edited file descriptor."""
        copy = descriptor_pb2.FileDescriptorProto()
        copy.CopyFrom(self._file)
        return copy

    def without_field(self, message: str, *fields: str) -> SchemaVariant:
        """The schema as it was before `fields` of `message` (e.g. "MemoryBlob.MemoryEntry")
        existed."""
        edited = self.file_proto
        descriptor = _find_message(edited, message)
        kept = [f for f in descriptor.field if f.name not in fields]
        missing = set(fields) - {f.name for f in descriptor.field}
        if missing:
            raise KeyError(f"{message} has no field {sorted(missing)}")
        del descriptor.field[:]
        descriptor.field.extend(kept)
        return SchemaVariant(edited)

    def without_enum_value(self, enum: str, *values: str) -> SchemaVariant:
        """The schema as it was before `values` of `enum` (e.g. "TraceEvent.EventType")
        existed."""
        edited = self.file_proto
        message, _, enum_name = enum.rpartition(".")
        scope = _find_message(edited, message) if message else edited
        (descriptor,) = [e for e in scope.enum_type if e.name == enum_name]
        kept = [v for v in descriptor.value if v.name not in values]
        if len(kept) != len(descriptor.value) - len(set(values)):
            raise KeyError(f"{enum} lacks one of {sorted(values)}")
        del descriptor.value[:]
        descriptor.value.extend(kept)
        return SchemaVariant(edited)

    def with_field(
        self,
        message: str,
        name: str,
        number: int,
        field_type: int = _FieldType.TYPE_STRING,
    ) -> SchemaVariant:
        """A future schema where `message` gained one optional scalar field."""
        edited = self.file_proto
        descriptor = _find_message(edited, message)
        descriptor.field.add(
            name=name,
            number=number,
            type=field_type,
            label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
            json_name=name,
        )
        return SchemaVariant(edited)

    def message_class(self, message: str) -> type[Message]:
        """The class of `message` (e.g. "ToolIntent" or "MemoryBlob.MemoryEntry")."""
        if self._pool is None:
            self._pool = descriptor_pool.DescriptorPool()
            self._pool.Add(self._file)
        descriptor = self._pool.FindMessageTypeByName(f"{self._file.package}.{message}")
        return message_factory.GetMessageClass(descriptor)


def _find_message(
    file_proto: descriptor_pb2.FileDescriptorProto, dotted: str
) -> descriptor_pb2.DescriptorProto:
    scope = file_proto.message_type
    found = None
    for part in dotted.split("."):
        matches = [m for m in scope if m.name == part]
        if not matches:
            raise KeyError(f"no message {dotted} in {file_proto.name}")
        found = matches[0]
        scope = found.nested_type
    assert found is not None
    return found
