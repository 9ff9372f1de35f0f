"""Every scenario of the wire-schemas spec that the schema itself answers for, but those of tool
intents and results (beam_agents_proto_intents_test.py).

Each test names its scenario in its docstring ("Scenario: ..."). Old and future readers are
real bindings built from an edited descriptor in a separate pool (beam_agents.testing), so the
skew cases run the real parser on real bytes. Golden-corpus scenarios are proven in
beam_agents/state/schema_compat_test.py, signing ones in beam_agents/intents/signing_test.py.
"""

from __future__ import annotations

import hashlib

import pytest
from google.protobuf.descriptor_pb2 import FieldDescriptorProto
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

import beam_agents._protos as protos
from beam_agents._protos import (
    ActivationErrorRecord,
    AgentEnvelope,
    Continuation,
    LlmCacheBlob,
    MemoryBlob,
    StateSnapshot,
    ToolResult,
    TraceEvent,
)
from beam_agents.testing.samples import (
    ALL_MESSAGES,
    PARENT_SPAN_ID,
    SPAN_ID,
    TRACE_ID,
    roundtrip,
    sample,
    snapshot,
)
from beam_agents.testing.schema_variants import SchemaVariant


def test_all_eight_message_classes_import_from_beam_agents_protos():
    """Scenario: Bindings are importable from the installed package (here: the source tree;
    tools/wheel_test.py proves it from an installed wheel)."""
    names = [
        "MemoryBlob",
        "ToolIntent",
        "ToolResult",
        "TraceEvent",
        "AgentEnvelope",
        "Continuation",
        "LlmCacheBlob",
        "ActivationErrorRecord",
    ]
    for name in names:
        cls = getattr(protos, name)
        assert cls.DESCRIPTOR.full_name == f"beam_agents.v1.{name}"
    assert protos.StateSnapshot.DESCRIPTOR.full_name == "beam_agents.v1.StateSnapshot"
    assert MemoryBlob.DESCRIPTOR.file.name == "beam_agents.proto"
    assert SchemaVariant.current().file_proto.syntax == "proto3"
    assert MemoryBlob.DESCRIPTOR.file.package == "beam_agents.v1"


def test_every_enum_zero_value_is_unspecified():
    file_proto = SchemaVariant.current().file_proto

    def enums(messages):
        for message in messages:
            yield from message.enum_type
            yield from enums(message.nested_type)

    all_enums = list(file_proto.enum_type) + list(enums(file_proto.message_type))
    # Named, so a new enum is looked at here before it is accepted.
    assert sorted(e.name for e in all_enums) == [
        "EventType",
        "Kind",
        "Kind",
        "Outcome",
        "Outcome",
        "SignatureScheme",
        "Status",
    ]
    for enum in all_enums:
        zero = [v for v in enum.value if v.number == 0]
        assert len(zero) == 1 and zero[0].name.endswith("_UNSPECIFIED"), enum.name


def test_memory_entries_round_trip_in_insertion_order():
    """Scenario: Entries round-trip in insertion order."""
    blob = MemoryBlob(state_schema_version=1, total_value_bytes=6)
    for i, key in enumerate(["a", "b", "c"]):
        blob.entries.add(key=key, value=key.encode() * 2, last_access_ms=1000 - i)
    parsed = roundtrip(blob)
    assert [e.key for e in parsed.entries] == ["a", "b", "c"]
    for original, back in zip(blob.entries, parsed.entries, strict=True):
        assert (back.key, back.value, back.last_access_ms) == (
            original.key,
            original.value,
            original.last_access_ms,
        )
    assert parsed.total_value_bytes == 6


def test_memory_blob_version_zero_is_distinguishable_as_pre_versioned():
    """Scenario: Schema version defaults are explicit (the parse half; the runtime writers'
    stamping is proven in beam_agents/state/migration_test.py)."""
    unversioned = MemoryBlob.FromString(MemoryBlob(total_value_bytes=3).SerializeToString())
    stamped = roundtrip(MemoryBlob(state_schema_version=1))
    assert unversioned.state_schema_version == 0
    assert stamped.state_schema_version == 1


def test_gen_ai_attributes_survive_round_trip():
    """Scenario: GenAI attributes survive round-trip."""
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gemini-2.5-pro",
        "gen_ai.usage.input_tokens": "1234",
        "gen_ai.usage.output_tokens": "56",
    }
    event = TraceEvent(event_type=TraceEvent.LLM_CALL, attributes=attributes, start_ms=1, end_ms=2)
    parsed = roundtrip(event)
    assert dict(parsed.attributes) == attributes
    assert (parsed.start_ms, parsed.end_ms) == (1, 2)


def test_correlation_identifiers_round_trip_at_their_wire_widths():
    """Scenario: Correlation identifiers round-trip at their wire widths."""
    event = TraceEvent(trace_id=TRACE_ID, span_id=SPAN_ID, parent_span_id=PARENT_SPAN_ID)
    parsed = roundtrip(event)
    assert parsed.trace_id == TRACE_ID and len(parsed.trace_id) == 16
    assert parsed.span_id == SPAN_ID and len(parsed.span_id) == 8
    assert parsed.parent_span_id == PARENT_SPAN_ID and len(parsed.parent_span_id) == 8


def test_the_suspension_event_type_round_trips():
    """Scenario: The suspension event type round-trips, and bindings that predate SUSPENDED
    expose it as an unrecognized enum number without a parse error."""
    assert TraceEvent.SUSPENDED == 7
    data = TraceEvent(event_type=TraceEvent.SUSPENDED, seq=3).SerializeToString()
    assert TraceEvent.FromString(data).event_type == TraceEvent.SUSPENDED

    old_cls = (
        SchemaVariant.current()
        .without_enum_value("TraceEvent.EventType", "SUSPENDED")
        .message_class("TraceEvent")
    )
    old = old_cls.FromString(data)
    assert old.event_type == 7
    assert 7 not in old_cls.EventType.values()
    with pytest.raises(ValueError):
        old_cls.EventType.Name(old.event_type)
    assert old.seq == 3
    # Proto3 enums are open: the old reader keeps the number when it rewrites the event.
    assert TraceEvent.FromString(old.SerializeToString()).event_type == TraceEvent.SUSPENDED


def test_suspension_state_round_trips():
    """Scenario: Suspension state round-trips."""
    snapshot = bytes(range(256)) * 3
    continuation = Continuation(
        state_schema_version=1,
        seq=11,
        step_index=2,
        pending_intent_ids=["i-1", "i-2", "i-3"],
        adapter="langgraph",
        snapshot=snapshot,
        suspended_at_ms=100,
        deadline_ms=200,
        escalations=1,
    )
    parsed = roundtrip(continuation)
    assert parsed == continuation
    assert list(parsed.pending_intent_ids) == ["i-1", "i-2", "i-3"]
    assert parsed.snapshot == snapshot


def test_escalation_count_round_trips_and_defaults_to_zero():
    """Scenario: Escalation count round-trips and defaults to zero."""
    old_cls = (
        SchemaVariant.current()
        .without_field("Continuation", "escalations")
        .message_class("Continuation")
    )
    old_bytes = old_cls(state_schema_version=1, seq=3, deadline_ms=9).SerializeToString()
    assert Continuation.FromString(old_bytes).escalations == 0
    assert roundtrip(Continuation(escalations=4_000_000_000)).escalations == 4_000_000_000


def test_cache_entries_round_trip_in_insertion_order():
    """Scenario: Cache entries round-trip in insertion order."""
    blob = LlmCacheBlob(state_schema_version=1)
    for i, key in enumerate(["a", "b", "c"]):
        response = f"response {key}".encode()
        blob.entries.add(
            cache_key=key,
            response=response,
            response_digest=hashlib.sha256(response).digest(),
            created_at_ms=10 + i,
            last_access_ms=20 + i,
            digest_only=False,
        )
    blob.total_response_bytes = sum(len(e.response) for e in blob.entries)
    parsed = roundtrip(blob)
    assert [e.cache_key for e in parsed.entries] == ["a", "b", "c"]
    for original, back in zip(blob.entries, parsed.entries, strict=True):
        assert back == original
        for field in original.DESCRIPTOR.fields:
            assert getattr(back, field.name) == getattr(original, field.name)
    assert parsed.total_response_bytes == blob.total_response_bytes


def test_digest_only_entries_are_representable():
    """Scenario: Digest-only entries are representable."""
    digest = hashlib.sha256(b"evicted response").digest()
    blob = LlmCacheBlob(state_schema_version=1)
    blob.entries.add(cache_key="k", response=b"", response_digest=digest, digest_only=True)
    (entry,) = roundtrip(blob).entries
    assert entry.digest_only is True
    assert entry.response == b""
    assert entry.response_digest == digest and len(entry.response_digest) == 32


def _future_variant(cls: type[Message]) -> type[Message]:
    name = cls.DESCRIPTOR.name
    top = max(f.number for f in cls.DESCRIPTOR.fields)
    return (
        SchemaVariant.current()
        .with_field(name, "from_the_future", top + 100, FieldDescriptorProto.TYPE_BYTES)
        .message_class(name)
    )


@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=lambda c: c.DESCRIPTOR.name)
def test_unknown_fields_are_tolerated_on_decode(cls):
    """Scenario: Unknown fields are tolerated on decode."""
    future_cls = _future_variant(cls)
    expected = sample(cls)
    future = future_cls.FromString(expected.SerializeToString())
    future.from_the_future = b"\x01newer"
    parsed = cls.FromString(future.SerializeToString())
    assert parsed.ListFields() == expected.ListFields()
    unknown = UnknownFieldSet(parsed)
    assert len(unknown) == 1
    assert unknown[0].field_number == future_cls.DESCRIPTOR.fields_by_name["from_the_future"].number


@pytest.mark.parametrize("cls", ALL_MESSAGES, ids=lambda c: c.DESCRIPTOR.name)
def test_unknown_fields_survive_re_encode(cls):
    """Scenario: Unknown fields survive re-encode."""
    future_cls = _future_variant(cls)
    future = future_cls.FromString(sample(cls).SerializeToString())
    future.from_the_future = b"\x01newer"
    reencoded = cls.FromString(future.SerializeToString()).SerializeToString(deterministic=True)
    assert future_cls.FromString(reencoded) == future


def test_unknown_fields_survive_when_an_old_reader_rewrites_state():
    # The --update window: an older binary reads newer state, changes a known field, writes it.
    future_cls = _future_variant(MemoryBlob)
    newer = future_cls(state_schema_version=1, from_the_future=b"keep me")
    older_view = MemoryBlob.FromString(newer.SerializeToString())
    older_view.entries.add(key="k", value=b"v")
    older_view.total_value_bytes = 1
    rewritten = future_cls.FromString(older_view.SerializeToString(deterministic=True))
    assert rewritten.from_the_future == b"keep me"
    assert [e.key for e in rewritten.entries] == ["k"]


def test_activation_error_record_all_fields_round_trip():
    """Scenario: All fields round-trip (ActivationErrorRecord)."""
    record = ActivationErrorRecord(
        entity_key=b"\x00key", reason="llm_timeout", detail="after 30s", event_time_ms=123
    )
    parsed = roundtrip(record)
    assert (parsed.entity_key, parsed.reason, parsed.detail, parsed.event_time_ms) == (
        b"\x00key",
        "llm_timeout",
        "after 30s",
        123,
    )


def test_deterministic_serialization_is_byte_stable():
    """Scenario: Deterministic serialization is byte-stable."""
    record = ActivationErrorRecord(
        entity_key=b"k", reason="bad_input", detail="x" * 300, event_time_ms=1
    )
    first = record.SerializeToString(deterministic=True)
    second = ActivationErrorRecord.FromString(first).SerializeToString(deterministic=True)
    assert first == record.SerializeToString(deterministic=True) == second


def test_an_error_record_travels_in_external_event_as_deterministic_bytes():
    record = ActivationErrorRecord(entity_key=b"k", reason="r", detail="d", event_time_ms=9)
    envelope = AgentEnvelope(
        entity_key=b"k",
        event_time_ms=9,
        external_event=record.SerializeToString(deterministic=True),
    )
    carried = roundtrip(envelope).external_event
    assert ActivationErrorRecord.FromString(carried) == record


def test_exactly_one_payload_variant_is_set():
    """Scenario: Exactly one payload variant is set."""
    envelope = AgentEnvelope(entity_key=b"k")
    envelope.tool_result.CopyFrom(ToolResult(intent_id="i", status=ToolResult.OK))
    assert envelope.WhichOneof("payload") == "tool_result"
    envelope.approval.CopyFrom(AgentEnvelope.Approval(intent_id="i", approved=True))
    assert envelope.WhichOneof("payload") == "approval"
    assert not envelope.HasField("tool_result")
    assert envelope.tool_result == ToolResult()


def test_all_four_payload_variants_round_trip():
    """Scenario: All four variants round-trip."""
    oneof = AgentEnvelope.DESCRIPTOR.oneofs_by_name["payload"]
    assert sorted(f.name for f in oneof.fields) == sorted(
        ["external_event", "tool_result", "approval", "export_request"]
    )
    variants = {
        "external_event": AgentEnvelope(external_event=b"\x00opaque\xff"),
        "tool_result": AgentEnvelope(
            tool_result=ToolResult(intent_id="i", status=ToolResult.REJECTED)
        ),
        "approval": AgentEnvelope(
            approval=AgentEnvelope.Approval(
                intent_id="i", approved=True, approver="ops@example.com", decided_at_ms=5
            )
        ),
        "export_request": AgentEnvelope(
            export_request=AgentEnvelope.StateExportRequest(request_id="r-1")
        ),
    }
    for case, envelope in variants.items():
        envelope.entity_key = b"key"
        envelope.event_time_ms = 77
        parsed = roundtrip(envelope)
        assert parsed.WhichOneof("payload") == case
        assert getattr(parsed, case) == getattr(envelope, case)
        assert parsed == envelope


def test_an_envelope_written_before_export_request_still_decodes():
    """Scenario: An envelope written before export_request still decodes, and a reader that
    predates the variant sees it as an unknown field."""
    old_cls = (
        SchemaVariant.current()
        .without_field("AgentEnvelope", "export_request")
        .message_class("AgentEnvelope")
    )
    expected = AgentEnvelope(
        entity_key=b"k",
        event_time_ms=3,
        approval=AgentEnvelope.Approval(intent_id="i", approved=False, approver="a"),
    )
    old_bytes = old_cls.FromString(expected.SerializeToString()).SerializeToString()
    assert AgentEnvelope.FromString(old_bytes) == expected

    export = AgentEnvelope(
        entity_key=b"k", export_request=AgentEnvelope.StateExportRequest(request_id="r")
    )
    old_view = old_cls.FromString(export.SerializeToString())
    assert old_view.WhichOneof("payload") is None
    assert len(UnknownFieldSet(old_view)) == 1


def test_a_populated_snapshot_round_trips():
    """Scenario: A populated snapshot round-trips."""
    exported = snapshot()
    parsed = StateSnapshot.FromString(exported.SerializeToString(deterministic=True))
    assert parsed == exported
    assert [e.key for e in parsed.memory.entries] == ["z", "a"]
    assert [e.cache_key for e in parsed.llm_cache.entries] == ["c2", "c1"]
    assert [i.intent_id for i in parsed.pending] == ["i-1", "i-2"]
    assert parsed.HasField("continuation")


def test_embedded_blobs_keep_their_own_schema_versions():
    """Scenario: Embedded blobs keep their own schema versions."""
    exported = snapshot()
    exported.state_schema_version = 3
    exported.memory.state_schema_version = 7
    exported.llm_cache.state_schema_version = 0
    parsed = StateSnapshot.FromString(exported.SerializeToString(deterministic=True))
    assert parsed.state_schema_version == 3
    assert parsed.memory.state_schema_version == 7
    assert parsed.llm_cache.state_schema_version == 0


def test_a_snapshot_of_a_running_key_has_no_continuation():
    exported = snapshot()
    exported.ClearField("continuation")
    assert not roundtrip(exported).HasField("continuation")


@pytest.mark.parametrize(
    "cls",
    [*ALL_MESSAGES, MemoryBlob.MemoryEntry, LlmCacheBlob.LlmCacheEntry, AgentEnvelope.Approval],
)
def test_message_classes_pickle_by_a_reference_that_workers_can_import(cls):
    # Beam pickles ProtoCoder's message class into the pipeline graph.
    import pickle
    import subprocess
    import sys

    assert pickle.loads(pickle.dumps(cls)) is cls
    code = (
        "import pickle, sys; cls = pickle.loads(sys.stdin.buffer.read()); "
        "print(cls.DESCRIPTOR.full_name)"
    )
    fresh = subprocess.run(
        [sys.executable, "-c", code], input=pickle.dumps(cls), capture_output=True, check=True
    )
    assert fresh.stdout.decode().strip() == cls.DESCRIPTOR.full_name
