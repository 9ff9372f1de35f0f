"""HMAC-SHA256 signing of ToolIntents, ToolResults and Approvals: outcomes, key rings,
rotation, schema skew, and the typed scheme that binds the message type (with the legacy
scheme's window)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib.util
import json
import os
from pathlib import Path

import pytest
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_agents._protos import AgentEnvelope, ToolIntent, ToolResult
from beam_agents.errors import KeyringError
from beam_agents.intents.signing import (
    KEYS_ENV,
    KEYS_FILE_ENV,
    LEGACY_UNTIL_MS,
    Keyring,
    Verification,
    is_unsigned,
    sign,
    signing_input,
    strip_signature,
    verify,
)
from beam_agents.testing.samples import intent
from beam_agents.testing.schema_variants import SchemaVariant

SECRET_1 = bytes(range(32))
SECRET_2 = bytes(range(100, 140))
RING = Keyring({"k1": SECRET_1, "k2": SECRET_2}, active="k1")
REPO = Path(__file__).resolve().parents[2]


def test_signing_sets_the_envelope_on_a_copy_and_verifies():
    original = intent()
    before = original.SerializeToString()
    signed = sign(original, RING)
    assert original.SerializeToString() == before
    assert signed.signature_scheme == ToolIntent.HMAC_SHA256_TYPED
    assert signed.signing_key_id == "k1"
    assert len(signed.signature) == 32
    assert signing_input(signed) == signing_input(original)
    assert verify(signed, RING) is Verification.VALID
    assert verify(ToolIntent.FromString(signed.SerializeToString()), RING) is Verification.VALID


def test_an_unsigned_intent_reads_as_unsigned():
    """Scenario: A pre-signature intent decodes as unsigned (the verifier's half)."""
    assert is_unsigned(intent())
    assert verify(intent(), RING) is Verification.UNSIGNED


def test_each_failure_has_its_own_outcome():
    signed = sign(intent(), RING)

    tampered = ToolIntent()
    tampered.CopyFrom(signed)
    tampered.args_json = '{"id":43}'
    assert verify(tampered, RING) is Verification.BAD_SIGNATURE

    assert verify(signed, Keyring({"k2": SECRET_2})) is Verification.UNKNOWN_KEY

    future_scheme = ToolIntent()
    future_scheme.CopyFrom(signed)
    future_scheme.signature_scheme = 3  # a scheme this binary does not implement
    assert verify(future_scheme, RING) is Verification.UNKNOWN_SCHEME

    no_scheme = ToolIntent()
    no_scheme.CopyFrom(signed)
    no_scheme.ClearField("signature_scheme")
    assert verify(no_scheme, RING) is Verification.BAD_SIGNATURE

    empty = ToolIntent()
    empty.CopyFrom(signed)
    empty.ClearField("signature")
    assert verify(empty, RING) is Verification.BAD_SIGNATURE

    other_key = sign(intent(), Keyring(RING.keys, active="k2"))
    relabelled = ToolIntent()
    relabelled.CopyFrom(other_key)
    relabelled.signing_key_id = "k1"
    assert verify(relabelled, RING) is Verification.BAD_SIGNATURE


def test_the_golden_signed_intent_verifies_under_the_published_test_key():
    """The golden intent is signed with the legacy scheme: valid inside its window only."""
    spec = importlib.util.spec_from_file_location("v1_builders", REPO / "golden/v1/builders.py")
    builders = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builders)
    key_id = builders.GOLDEN_SIGNING_KEY_ID
    ring = Keyring(
        {key_id: builders.GOLDEN_SIGNING_SECRET},
        active=key_id,
        sign_scheme=ToolIntent.HMAC_SHA256,
        legacy_until_ms=2**62,
    )
    data = (REPO / "golden/v1/tool_intent_signed.binpb").read_bytes()
    assert verify(ToolIntent.FromString(data), ring) is Verification.VALID
    assert sign(builders.tool_intent_traced(), ring) == ToolIntent.FromString(data)
    closed = Keyring({key_id: builders.GOLDEN_SIGNING_SECRET}, legacy_until_ms=0)
    assert verify(ToolIntent.FromString(data), closed) is Verification.LEGACY_EXPIRED


def test_rotation_keeps_every_in_flight_intent_verifiable():
    old_only = Keyring({"2026-05": SECRET_1}, active="2026-05")
    signed_before = sign(intent(), old_only)
    # Step 1: every ring learns the new key; the old one still signs.
    both_old_active = Keyring({"2026-05": SECRET_1, "2026-11": SECRET_2}, active="2026-05")
    assert verify(signed_before, both_old_active) is Verification.VALID
    # Step 2: the new key signs; intents signed before still verify.
    both_new_active = Keyring(both_old_active.keys, active="2026-11")
    signed_after = sign(intent(), both_new_active)
    assert signed_after.signing_key_id == "2026-11"
    for signed in (signed_before, signed_after):
        assert verify(signed, both_old_active) is Verification.VALID
    # Step 3: once old intents have expired, the old key goes.
    new_only = Keyring({"2026-11": SECRET_2}, active="2026-11")
    assert verify(signed_after, new_only) is Verification.VALID
    assert verify(signed_before, new_only) is Verification.UNKNOWN_KEY


def _document(**keys) -> str:
    return json.dumps(
        {"active": "k1", "keys": {k: base64.b64encode(v).decode() for k, v in keys.items()}}
    )


def test_a_keyring_loads_from_the_environment_or_a_file(tmp_path):
    text = _document(k1=SECRET_1, k2=SECRET_2)
    from_env = Keyring.from_environment({KEYS_ENV: text})
    path = tmp_path / "keys.json"
    path.write_text(text)
    from_file = Keyring.from_environment({KEYS_FILE_ENV: str(path)})
    for ring in (from_env, from_file, Keyring.from_file(path)):
        assert ring.active == "k1" and dict(ring.keys) == {"k1": SECRET_1, "k2": SECRET_2}
    assert "k1" in repr(from_env) and SECRET_1.hex() not in repr(from_env)
    verify_only = Keyring.from_json(
        json.dumps({"keys": {"k1": base64.b64encode(SECRET_1).decode()}}), source="t"
    )
    assert verify_only.active is None
    with pytest.raises(KeyringError, match="no active key"):
        sign(intent(), verify_only)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "not JSON"),
        ('{"active": "k1"}', 'expected {"active"'),
        (json.dumps({"keys": {"k1": "%%%"}}), "not base64"),
        (json.dumps({"keys": {"k1": base64.b64encode(b"short").decode()}}), "at least 32"),
        (_document(k2=SECRET_2), "active key 'k1' is not in the ring"),
    ],
)
def test_bad_key_material_is_a_typed_error_naming_its_source(text, reason):
    with pytest.raises(KeyringError) as raised:
        Keyring.from_json(text, source="$BEAM_AGENTS_SIGNING_KEYS")
    assert reason in str(raised.value)
    assert raised.value.source == "$BEAM_AGENTS_SIGNING_KEYS"


def test_missing_key_configuration_is_a_typed_error(tmp_path):
    with pytest.raises(KeyringError, match="neither"):
        Keyring.from_environment({})
    with pytest.raises(KeyringError, match="cannot read"):
        Keyring.from_file(tmp_path / "absent.json")


FUTURE = (
    SchemaVariant.current().with_field("ToolIntent", "routing_hint", 15).message_class("ToolIntent")
)


def test_an_intent_signed_by_newer_bindings_verifies_with_the_current_ones():
    newer = FUTURE.FromString(intent().SerializeToString())
    newer.routing_hint = "eu-west"
    signed = sign(newer, RING)
    current = ToolIntent.FromString(signed.SerializeToString())
    assert verify(current, RING) is Verification.VALID
    # The unknown field is covered: dropping it breaks the signature.
    current.DiscardUnknownFields()
    assert verify(current, RING) is Verification.BAD_SIGNATURE


def test_an_intent_signed_by_the_current_bindings_verifies_with_newer_ones():
    signed = sign(intent(), RING)
    newer = FUTURE.FromString(signed.SerializeToString())
    assert verify(newer, RING) is Verification.VALID
    newer.routing_hint = "added in flight"
    assert verify(newer, RING) is Verification.BAD_SIGNATURE


SIGNED = sign(intent(), RING)
SIGNED_BYTES = SIGNED.SerializeToString(deterministic=True)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, len(SIGNED_BYTES) - 1), st.integers(1, 255)),
        min_size=1,
        max_size=3,
    )
)
def test_every_byte_change_that_still_parses_to_another_intent_fails(flips):
    data = bytearray(SIGNED_BYTES)
    for position, mask in flips:
        data[position] ^= mask
    try:
        mutated = ToolIntent.FromString(bytes(data))
    except DecodeError:
        return
    if mutated == SIGNED:
        # Same message from other bytes (e.g. a flip that cancels out): nothing changed.
        assert verify(mutated, RING) is Verification.VALID
    else:
        assert verify(mutated, RING) is not Verification.VALID


def _changed(value):
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, bytes):
        return value + b"\x00"
    return value + "x"


@pytest.mark.parametrize("field", [f.name for f in ToolIntent.DESCRIPTOR.fields])
def test_changing_any_field_fails_verification(field):
    changed = ToolIntent()
    changed.CopyFrom(SIGNED)
    setattr(changed, field, _changed(getattr(SIGNED, field)))
    assert verify(changed, RING) is not Verification.VALID


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=32, max_size=200), st.binary(max_size=300))
def test_the_keyring_mac_is_standard_hmac_sha256(secret, data):
    ring = Keyring({"k": secret})
    assert ring.mac("k", data) == hmac.new(secret, data, hashlib.sha256).digest()


# A field removed by a newer binary (its number reserved) -----------------------------------

WITHOUT_KIND = SchemaVariant.current().without_field("ToolIntent", "kind")
REMOVED = WITHOUT_KIND.message_class("ToolIntent")


def test_an_intent_signed_before_a_field_was_removed_verifies_from_its_bytes():
    # The signer still has kind (10); the verifier removed it, so 10 is unknown there and
    # re-serializing moves it after trace_id (11).
    data = sign(intent(), RING).SerializeToString(deterministic=True)
    newer = REMOVED.FromString(data)
    assert len(UnknownFieldSet(newer)) == 1  # kind survives only as an unknown field
    assert verify(newer, RING, wire=data) is Verification.VALID
    # Without the bytes, re-serialization cannot rebuild the signer's layout.
    assert verify(newer, RING) is Verification.BAD_SIGNATURE


def test_an_intent_signed_after_a_field_was_removed_verifies_at_an_older_binary():
    newer = REMOVED.FromString(intent(kind=ToolIntent.TOOL_KIND_UNSPECIFIED).SerializeToString())
    data = sign(newer, RING).SerializeToString(deterministic=True)
    older = ToolIntent.FromString(data)
    assert older.kind == ToolIntent.TOOL_KIND_UNSPECIFIED
    assert verify(older, RING, wire=data) is Verification.VALID
    assert verify(older, RING) is Verification.VALID


def test_verifying_from_bytes_still_covers_every_byte():
    data = bytearray(sign(intent(), RING).SerializeToString(deterministic=True))
    data[data.index(b"crm.lookup")] ^= 0x01
    changed = ToolIntent.FromString(bytes(data))
    assert verify(changed, RING, wire=bytes(data)) is Verification.BAD_SIGNATURE
    appended = sign(intent(), RING).SerializeToString() + b"\x2a\x03abc"  # tool_name again
    assert (
        verify(ToolIntent.FromString(appended), RING, wire=appended) is Verification.BAD_SIGNATURE
    )


def test_stripping_the_signature_from_the_wire_gives_the_signing_input():
    signed = sign(intent(), RING)
    data = signed.SerializeToString(deterministic=True)
    assert strip_signature(data) == signing_input(intent())
    assert strip_signature(signing_input(intent())) == signing_input(intent())


@pytest.mark.parametrize("wire", [b"\x0a\xff", b"\x80", b"\x0b", b"\x0f"])
def test_malformed_wire_bytes_fail_verification_without_raising(wire):
    assert verify(sign(intent(), RING), RING, wire=wire) is Verification.BAD_SIGNATURE


@pytest.mark.parametrize("length", [0, 1, 31, 33, 64])
def test_signatures_of_the_wrong_length_are_refused(length):
    signed = sign(intent(), RING)
    forged = ToolIntent()
    forged.CopyFrom(signed)
    forged.signature = (signed.signature * 2)[:length] if length else b"\x00"
    assert verify(forged, RING) is Verification.BAD_SIGNATURE


# Malformed key material ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            json.dumps({"active": [], "keys": {"k1": base64.b64encode(SECRET_1).decode()}}),
            "active must be a key id",
        ),
        (json.dumps({"keys": {}}), "holds no keys"),
        (json.dumps({"keys": {"k1": 5}}), "not a base64 string"),
        (json.dumps({"keys": {"": base64.b64encode(SECRET_1).decode()}}), "not a non-empty"),
        ("[" * 100_000, "not"),
        ("[]", 'expected {"active"'),
        (
            '{"active": "k1", "keys": {"k1": "SECRET_1", "k1": "SECRET_2"}}'.replace(
                "SECRET_1", base64.b64encode(SECRET_1).decode()
            ).replace("SECRET_2", base64.b64encode(SECRET_2).decode()),
            "'k1' appears twice",
        ),
        (  # the name that appears twice, not the first name of the object
            json.dumps({"active": "k1", "keys": {"k1": base64.b64encode(SECRET_1).decode()}})[:-2]
            + ', "k2": "", "k2": ""}}',
            "'k2' appears twice",
        ),
        (
            '{"active": "k\\ud800", "keys": {"k\\ud800": "'
            + base64.b64encode(SECRET_1).decode()
            + '"}}',
            "lone surrogate",
        ),
    ],
)
def test_every_malformed_ring_is_a_keyring_error_naming_its_source(text, reason):
    with pytest.raises(KeyringError) as raised:
        Keyring.from_json(text, source="keys.json")
    assert reason in raised.value.reason and raised.value.source == "keys.json"


@pytest.mark.parametrize(
    ("keys", "active", "reason"),
    [
        ({}, None, "holds no keys"),
        ({"k1": "not bytes, a str of 40 characters......"}, None, "is a str, not bytes"),
        ({"k1": bytearray(SECRET_1)}, None, "is a bytearray, not bytes"),
        ({1: SECRET_1}, None, "key id 1"),
        ([("k1", SECRET_1)], None, "must map key ids"),
        ({"k1": SECRET_1}, ["k1"], "active must be a key id"),
    ],
)
def test_a_keyring_built_in_code_refuses_malformed_keys(keys, active, reason):
    with pytest.raises(KeyringError, match=reason):
        Keyring(keys, active)


def test_a_key_file_that_is_not_utf8_is_a_keyring_error(tmp_path):
    path = tmp_path / "keys.json"
    path.write_bytes(b'{"keys": {"k\xff": "AAAA"}}')
    with pytest.raises(KeyringError, match="not UTF-8 at byte 12") as raised:
        Keyring.from_file(path)
    assert raised.value.source == str(path)


def test_a_key_file_with_a_non_utf8_name_is_named_printably(tmp_path):
    path = os.path.join(os.fsencode(tmp_path), b"keys-\xff.json")
    with pytest.raises(KeyringError, match="cannot read") as raised:
        Keyring.from_file(path)
    assert raised.value.source.endswith("keys-\\udcff.json")
    assert raised.value.source.encode("utf-8")


# The typed scheme and the legacy scheme's window ------------------------------------------

BEFORE_WINDOW_END = LEGACY_UNTIL_MS - 1
LEGACY_RING = Keyring(
    {"k1": SECRET_1}, active="k1", sign_scheme=ToolIntent.HMAC_SHA256, legacy_until_ms=2**62
)


def _inquiry():
    # Shaped as the effector's inquiries are (no attempt), of an intent without a trace_id.
    return intent(step_index=1, attempt=0, kind=ToolIntent.APPROVAL, trace_id=b"")


def _as(message_class, signed, ring=RING):
    """`signed`'s fields and signature presented as a message of `message_class`."""
    unsigned = strip_signature(signed.SerializeToString(deterministic=True), signed.DESCRIPTOR)
    envelope = ring.envelope(
        signed.signing_key_id, signed.signature, message_class.DESCRIPTOR, signed.signature_scheme
    )
    return message_class.FromString(unsigned + envelope)


def test_a_signature_made_for_one_message_type_does_not_verify_for_another():
    inquiry = sign(_inquiry(), RING)
    result = _as(ToolResult, inquiry)
    assert result.status == ToolResult.OK  # the inquiry's step_index 1, read as a ToolResult
    assert verify(inquiry, RING) is Verification.VALID
    assert verify(result, RING) is Verification.BAD_SIGNATURE
    assert verify(result, RING, wire=result.SerializeToString()) is Verification.BAD_SIGNATURE


@pytest.mark.parametrize(
    ("signed_as", "presented_as"),
    [
        (ToolResult, ToolIntent),
        (ToolResult, AgentEnvelope.Approval),
        (AgentEnvelope.Approval, ToolResult),
        (AgentEnvelope.Approval, ToolIntent),
        (ToolIntent, AgentEnvelope.Approval),
    ],
)
def test_no_signed_type_verifies_as_another(signed_as, presented_as):
    signed = sign(signed_as.FromString(signing_input(_inquiry())), RING)
    assert verify(signed, RING) is Verification.VALID
    assert verify(_as(presented_as, signed), RING) is Verification.BAD_SIGNATURE


def test_the_typed_input_is_the_domain_prefix_the_type_name_and_the_signing_input():
    # Stated byte for byte, as the Go and Java readers (polyglot/) compute it.
    result = ToolResult.FromString(signing_input(_inquiry()))
    signed = sign(result, RING)
    expected = hmac.new(
        SECRET_1,
        b"\0beam_agents signature HMAC_SHA256_TYPED\0beam_agents.v1.ToolResult\0"
        + signing_input(result),
        hashlib.sha256,
    ).digest()
    assert signed.signature == expected
    legacy = sign(result, LEGACY_RING)
    assert legacy.signature_scheme == ToolIntent.HMAC_SHA256
    assert legacy.signature == hmac.new(SECRET_1, signing_input(result), hashlib.sha256).digest()


def test_a_signature_relabelled_with_the_other_scheme_does_not_verify():
    typed, legacy = sign(intent(), RING), sign(intent(), LEGACY_RING)
    typed.signature_scheme, legacy.signature_scheme = (
        ToolIntent.HMAC_SHA256,
        ToolIntent.HMAC_SHA256_TYPED,
    )
    for relabelled in (typed, legacy):
        assert verify(relabelled, RING, now_ms=0) is Verification.BAD_SIGNATURE


def test_a_legacy_signature_verifies_inside_its_window_and_never_after():
    signed = sign(intent(), LEGACY_RING)
    ring = Keyring({"k1": SECRET_1}, legacy_until_ms=1_000)
    assert verify(signed, ring, now_ms=999) is Verification.VALID
    assert verify(signed, ring, now_ms=1_000) is Verification.LEGACY_EXPIRED
    assert verify(signed, Keyring({"k1": SECRET_1})) is Verification.VALID  # the default window
    assert verify(signed, Keyring({"k1": SECRET_1}), now_ms=LEGACY_UNTIL_MS) is (
        Verification.LEGACY_EXPIRED
    )
    # A typed signature knows no window.
    assert verify(sign(intent(), RING), ring, now_ms=2**62) is Verification.VALID


def test_inside_the_window_a_legacy_signature_still_crosses_types_and_after_it_is_refused():
    """What the window costs: a legacy-signed inquiry re-enveloped as a ToolResult verifies
    until the window ends, which is why signers move to the typed scheme first."""
    result = _as(ToolResult, sign(_inquiry(), LEGACY_RING), LEGACY_RING)
    ring = Keyring({"k1": SECRET_1}, legacy_until_ms=1_000)
    assert verify(result, ring, now_ms=999) is Verification.VALID
    assert verify(result, ring, now_ms=1_000) is Verification.LEGACY_EXPIRED


def test_a_ring_reads_its_scheme_and_window_from_json():
    secret = base64.b64encode(SECRET_1).decode()
    default = Keyring.from_json(json.dumps({"active": "k1", "keys": {"k1": secret}}), source="s")
    assert (default.sign_scheme, default.legacy_until_ms) == (
        ToolIntent.HMAC_SHA256_TYPED,
        LEGACY_UNTIL_MS,
    )
    text = json.dumps(
        {
            "active": "k1",
            "keys": {"k1": secret},
            "sign_scheme": "HMAC_SHA256",
            "legacy_until": "2999-01-01T01:00:00+01:00",
        }
    )
    ring = Keyring.from_json(text, source="s")
    assert ring.sign_scheme == ToolIntent.HMAC_SHA256
    assert ring.legacy_until_ms == 32_472_144_000_000
    assert sign(intent(), ring).signature_scheme == ToolIntent.HMAC_SHA256


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        ({"sign_scheme": "HMAC_SHA512"}, "sign_scheme 'HMAC_SHA512' is none of"),
        ({"sign_scheme": 1}, "sign_scheme 1 is none of"),
        ({"legacy_until": 1803859200000}, "is a JSON int, not an RFC 3339 instant"),
        ({"legacy_until": "March 2027"}, "is not an RFC 3339 instant"),
        ({"legacy_until": "2027-03-01T00:00:00"}, "states no UTC offset"),
        (
            {"sign_scheme": "HMAC_SHA256", "legacy_until": "2026-01-01T00:00:00Z"},
            "signs the legacy scheme HMAC_SHA256 after its window ended",
        ),
    ],
)
def test_a_malformed_scheme_or_window_is_a_keyring_error(extra, reason):
    text = json.dumps(
        {"active": "k1", "keys": {"k1": base64.b64encode(SECRET_1).decode()}, **extra}
    )
    with pytest.raises(KeyringError, match=reason):
        Keyring.from_json(text, source="keys.json")


def test_a_verify_only_ring_may_hold_a_closed_legacy_window():
    # Not a signer: nothing it signs would be refused.
    ring = Keyring({"k1": SECRET_1}, sign_scheme=ToolIntent.HMAC_SHA256, legacy_until_ms=0)
    assert verify(sign(intent(), LEGACY_RING), ring) is Verification.LEGACY_EXPIRED
