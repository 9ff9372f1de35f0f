"""The ToolIntent signature envelope.

A signature covers the deterministic serialization of the intent with its three signature
fields (signature_scheme, signing_key_id, signature) cleared. Unknown fields are part of that
input: an older verifier keeps a newer signer's extra fields as unknown fields and re-serializes
them after the known ones, which equals the signer's sorted-by-number layout because every new
ToolIntent field takes a number above all existing ones (the rule stated in the .proto file).
"""

from __future__ import annotations

from google.protobuf.message import Message

from beam_agents._protos import ToolIntent

__all__ = ["SIGNATURE_FIELDS", "is_unsigned", "signing_input"]

SIGNATURE_FIELDS = ("signature_scheme", "signing_key_id", "signature")


def signing_input(intent: Message) -> bytes:
    """The bytes a signature covers. Accepts ToolIntent classes of any schema version."""
    cleared = type(intent)()
    cleared.CopyFrom(intent)
    for name in SIGNATURE_FIELDS:
        cleared.ClearField(name)
    return cleared.SerializeToString(deterministic=True)


def is_unsigned(intent: ToolIntent) -> bool:
    """True when the intent carries no signature at all (scheme unspecified, no bytes)."""
    return (
        intent.signature_scheme == ToolIntent.SIGNATURE_SCHEME_UNSPECIFIED and not intent.signature
    )
