"""The wire-schemas spec's scenarios of tool intents and results that the schema itself answers
for: their identity and field numbers, expiry, kinds, signatures and statuses, and their skew
between schema versions, named and built as beam_agents_proto_test.py's (which has the other
messages') are.
"""

from __future__ import annotations

import hashlib

from google.protobuf.unknown_fields import UnknownFieldSet

from beam_agents._protos import (
    ToolIntent,
    ToolResult,
)
from beam_agents.testing.samples import (
    TRACE_ID,
    roundtrip,
)
from beam_agents.testing.samples import intent as full_intent
from beam_agents.testing.schema_variants import SchemaVariant


def test_tool_intent_all_identity_fields_round_trip():
    """Scenario: All identity fields round-trip."""
    intent = full_intent(
        kind=ToolIntent.APPROVAL,
        signature_scheme=ToolIntent.HMAC_SHA256,
        signing_key_id="k1",
        signature=bytes(32),
    )
    parsed = roundtrip(intent)
    assert parsed == intent
    for field in intent.DESCRIPTOR.fields:
        assert getattr(parsed, field.name) == getattr(intent, field.name), field.name
    assert parsed.args_json == intent.args_json
    assert parsed.kind == ToolIntent.APPROVAL
    assert parsed.trace_id == TRACE_ID and len(parsed.trace_id) == 16


def test_tool_intent_field_numbers_match_the_spec():
    numbers = {f.name: f.number for f in ToolIntent.DESCRIPTOR.fields}
    assert numbers["trace_id"] == 11
    others = [n for name, n in numbers.items() if not name.startswith("signature")]
    others.remove(numbers["signing_key_id"])
    signature_numbers = sorted(
        numbers[n] for n in ("signature_scheme", "signing_key_id", "signature")
    )
    assert signature_numbers == [max(others) + 1, max(others) + 2, max(others) + 3]
    assert ToolIntent.Kind.Name(0) == "TOOL_KIND_UNSPECIFIED"
    assert ToolIntent.SignatureScheme.Name(1) == "HMAC_SHA256"


def test_expiry_is_representable_for_fail_closed_enforcement():
    """Scenario: Expiry is representable for fail-closed enforcement."""
    parsed = roundtrip(full_intent(expires_at_ms=1_700_000_123_456))
    assert parsed.expires_at_ms == 1_700_000_123_456


def test_an_intent_written_without_trace_id_still_decodes():
    """Scenario: An intent written without trace_id still decodes (bytes from bindings that
    predate the field; the golden fixture is replayed in schema_compat_test.py)."""
    old_cls = (
        SchemaVariant.current().without_field("ToolIntent", "trace_id").message_class("ToolIntent")
    )
    expected = full_intent(trace_id=b"")
    old_bytes = old_cls.FromString(expected.SerializeToString()).SerializeToString()
    parsed = ToolIntent.FromString(old_bytes)
    assert parsed.trace_id == b""
    assert parsed == expected


def test_approval_intents_are_distinguishable_on_the_wire():
    """Scenario: Approval intents are distinguishable on the wire."""
    approval = roundtrip(full_intent(kind=ToolIntent.APPROVAL))
    tool = roundtrip(full_intent(kind=ToolIntent.TOOL))
    assert approval.kind == ToolIntent.APPROVAL
    assert tool.kind == ToolIntent.TOOL
    assert approval.tool_name == tool.tool_name


def test_an_intent_written_before_kind_existed_reads_as_a_tool_call():
    """Scenario: An intent written before kind existed reads as a tool call."""
    from beam_agents.intents.identity import effective_kind

    old_cls = (
        SchemaVariant.current().without_field("ToolIntent", "kind").message_class("ToolIntent")
    )
    old_bytes = old_cls(intent_id="i-1", tool_name="approve.refund").SerializeToString()
    parsed = ToolIntent.FromString(old_bytes)
    assert parsed.kind == ToolIntent.TOOL_KIND_UNSPECIFIED
    assert effective_kind(parsed) == ToolIntent.TOOL
    assert effective_kind(full_intent(kind=ToolIntent.APPROVAL)) == ToolIntent.APPROVAL


def test_signature_fields_round_trip():
    """Scenario: Signature fields round-trip."""
    signature = hashlib.sha256(b"anything").digest()
    parsed = roundtrip(
        full_intent(
            signature_scheme=ToolIntent.HMAC_SHA256, signing_key_id="2026-11", signature=signature
        )
    )
    assert parsed.signature_scheme == ToolIntent.HMAC_SHA256
    assert parsed.signing_key_id == "2026-11"
    assert parsed.signature == signature and len(parsed.signature) == 32


def test_a_pre_signature_intent_decodes_as_unsigned():
    """Scenario: A pre-signature intent decodes as unsigned."""
    from beam_agents.intents.signing import is_unsigned

    old_cls = (
        SchemaVariant.current()
        .without_field("ToolIntent", "signature_scheme", "signing_key_id", "signature")
        .message_class("ToolIntent")
    )
    old_bytes = old_cls.FromString(full_intent().SerializeToString()).SerializeToString()
    parsed = ToolIntent.FromString(old_bytes)
    assert parsed.signature_scheme == ToolIntent.SIGNATURE_SCHEME_UNSPECIFIED
    assert parsed.signature == b""
    assert is_unsigned(parsed)
    assert parsed == full_intent()


def test_a_future_field_intent_still_yields_a_stable_signing_input():
    """Scenario: A future-field intent still yields a stable signing input."""
    from beam_agents.intents.signing import signing_input

    future_cls = (
        SchemaVariant.current()
        .with_field("ToolIntent", "routing_hint", 15)
        .message_class("ToolIntent")
    )
    signed_by_newer = future_cls.FromString(full_intent().SerializeToString())
    signed_by_newer.routing_hint = "eu-west"
    signed_by_newer.signature_scheme = ToolIntent.HMAC_SHA256
    signed_by_newer.signing_key_id = "k1"
    signed_by_newer.signature = bytes(32)
    # The newer signer's input: its own message, signature fields cleared, deterministic.
    signer_input = signing_input(signed_by_newer)

    current = ToolIntent.FromString(signed_by_newer.SerializeToString())
    assert len(UnknownFieldSet(current)) == 1
    assert signing_input(current) == signer_input


def test_every_tool_result_status_is_representable():
    """Scenario: Every status value is representable."""
    statuses = ToolResult.Status.values()
    assert sorted(ToolResult.Status.keys()) == sorted(
        ["STATUS_UNSPECIFIED", "OK", "ERROR", "EXPIRED", "REJECTED"]
    )
    for status in statuses:
        parsed = roundtrip(ToolResult(intent_id="i", status=status, payload=b"p"))
        assert parsed.status == status
    assert roundtrip(ToolResult(intent_id="i")).status == ToolResult.STATUS_UNSPECIFIED


def test_tool_result_fields_round_trip():
    result = ToolResult(
        intent_id="i-9",
        entity_key=b"k",
        seq=4,
        status=ToolResult.ERROR,
        payload=b"\x00\xff",
        error_message="timeout",
        completed_at_ms=5,
    )
    assert roundtrip(result) == result
