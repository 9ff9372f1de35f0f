"""The ToolIntent signature envelope: HMAC-SHA256 under rotatable keys.

Signing input. A signature covers the deterministic serialization of the intent with its three
signature fields (signature_scheme, signing_key_id, signature) cleared. Unknown fields are part
of that input: an older verifier keeps a newer signer's extra fields as unknown fields and
re-serializes them after the known ones, which equals the signer's sorted-by-number layout
because every new ToolIntent field takes a number above all existing ones (the rule stated in
the .proto file). So signatures verify across schema skew in both directions.

Keys. A `Keyring` maps key ids to secrets (at least 32 bytes each) and names the active key
that signs; verification accepts any key of the ring. It loads from the environment variable
BEAM_AGENTS_SIGNING_KEYS or from a file (BEAM_AGENTS_SIGNING_KEYS_FILE, or a path given), both
holding the same JSON:

    {"active": "2026-11", "keys": {"2026-11": "<base64 secret>", "2026-05": "<base64 secret>"}}

"active" may be omitted for a verify-only ring (the effector). Load keys on the worker (Beam
DoFn.setup), never into a pipeline's serialized graph.

Rotation without downtime:
1. Add the new key to every ring, keeping the old one active; deploy verifiers, then signers.
2. Make the new key active in the signers' ring; deploy. New intents carry the new key id,
   in-flight ones still verify under the old key.
3. After the longest intent lifetime (expires_at_ms) has passed, remove the old key; deploy.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import hashlib
import hmac
import json
import os
from collections.abc import Mapping
from pathlib import Path

from google.protobuf.message import Message

from beam_agents._protos import ToolIntent
from beam_agents.errors import KeyringError

__all__ = [
    "KEYS_ENV",
    "KEYS_FILE_ENV",
    "MIN_SECRET_BYTES",
    "SIGNATURE_FIELDS",
    "Keyring",
    "Verification",
    "is_unsigned",
    "sign",
    "signing_input",
    "verify",
]

SIGNATURE_FIELDS = ("signature_scheme", "signing_key_id", "signature")
KEYS_ENV = "BEAM_AGENTS_SIGNING_KEYS"
KEYS_FILE_ENV = "BEAM_AGENTS_SIGNING_KEYS_FILE"
MIN_SECRET_BYTES = 32


class Verification(enum.Enum):
    """The outcome of `verify`."""

    VALID = "valid"
    #: No scheme and no signature: written before signing existed, or by an unsigned producer.
    UNSIGNED = "unsigned"
    UNKNOWN_KEY = "unknown key"
    BAD_SIGNATURE = "bad signature"
    #: A scheme this binary does not implement (a newer enum value).
    UNKNOWN_SCHEME = "unknown scheme"


_BLOCK = 64  # SHA-256's block size, the width of HMAC's key pads (RFC 2104)


def _pads(secret: bytes) -> tuple:
    """SHA-256 states after absorbing the inner and outer key pads: HMAC's per-key work,
    done once per key instead of once per message."""
    key = hashlib.sha256(secret).digest() if len(secret) > _BLOCK else secret
    key = key.ljust(_BLOCK, b"\0")
    return (
        hashlib.sha256(bytes(b ^ 0x36 for b in key)),
        hashlib.sha256(bytes(b ^ 0x5C for b in key)),
    )


@dataclasses.dataclass(frozen=True, repr=False)
class Keyring:
    """Secrets by key id, and the id of the key that signs."""

    keys: Mapping[str, bytes]
    active: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "_pads", {key_id: _pads(s) for key_id, s in self.keys.items()})
        for key_id, secret in self.keys.items():
            if not key_id:
                raise KeyringError("a key id is empty", source="Keyring")
            if len(secret) < MIN_SECRET_BYTES:
                raise KeyringError(
                    f"key {key_id!r} has {len(secret)} bytes; HMAC-SHA256 keys need at least "
                    f"{MIN_SECRET_BYTES}",
                    source="Keyring",
                )
        if self.active is not None and self.active not in self.keys:
            raise KeyringError(f"active key {self.active!r} is not in the ring", source="Keyring")

    def mac(self, key_id: str, data: bytes) -> bytes:
        """HMAC-SHA256 of `data` under key `key_id` (equal to hmac.digest(secret, data,
        "sha256"), from the per-key pads)."""
        inner_pad, outer_pad = self._pads[key_id]
        inner = inner_pad.copy()
        inner.update(data)
        outer = outer_pad.copy()
        outer.update(inner.digest())
        return outer.digest()

    def __repr__(self) -> str:  # never print secrets
        return f"Keyring(keys={sorted(self.keys)}, active={self.active!r})"

    @classmethod
    def from_json(cls, text: str, *, source: str) -> Keyring:
        """Parses the documented JSON format; `source` names where it came from in errors."""
        try:
            document = json.loads(text)
        except json.JSONDecodeError as e:
            raise KeyringError(f"not JSON: {e.msg} at line {e.lineno}", source=source) from None
        if not isinstance(document, dict) or not isinstance(document.get("keys"), dict):
            raise KeyringError('expected {"active": ..., "keys": {id: base64}}', source=source)
        keys = {}
        for key_id, encoded in document["keys"].items():
            try:
                keys[key_id] = base64.b64decode(encoded, validate=True)
            except (binascii.Error, TypeError):
                raise KeyringError(f"key {key_id!r} is not base64", source=source) from None
        try:
            return cls(keys, document.get("active"))
        except KeyringError as e:
            raise KeyringError(e.reason, source=source) from None

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Keyring:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise KeyringError(f"cannot read: {e.strerror}", source=str(path)) from None
        return cls.from_json(text, source=str(path))

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Keyring:
        """From BEAM_AGENTS_SIGNING_KEYS, else the file BEAM_AGENTS_SIGNING_KEYS_FILE names."""
        environ = os.environ if environ is None else environ
        if KEYS_ENV in environ:
            return cls.from_json(environ[KEYS_ENV], source=f"${KEYS_ENV}")
        if KEYS_FILE_ENV in environ:
            return cls.from_file(environ[KEYS_FILE_ENV])
        raise KeyringError(f"neither {KEYS_ENV} nor {KEYS_FILE_ENV} is set", source="environment")


def signing_input(intent: Message) -> bytes:
    """The bytes a signature covers. Accepts ToolIntent classes of any schema version."""
    if is_unsigned(intent) and not intent.signing_key_id:
        return intent.SerializeToString(deterministic=True)  # nothing to clear: skip the copy
    cleared = type(intent)()
    cleared.CopyFrom(intent)
    for name in SIGNATURE_FIELDS:
        cleared.ClearField(name)
    return cleared.SerializeToString(deterministic=True)


def is_unsigned(intent: Message) -> bool:
    """True when the intent carries no signature at all (scheme unspecified, no bytes)."""
    return (
        intent.signature_scheme == ToolIntent.SIGNATURE_SCHEME_UNSPECIFIED and not intent.signature
    )


def sign(intent: Message, keyring: Keyring) -> Message:
    """A signed copy of `intent` under the ring's active key; `intent` is not changed."""
    if keyring.active is None:
        raise KeyringError("no active key to sign with", source=repr(keyring))
    signed = type(intent)()
    signed.CopyFrom(intent)
    signed.signature_scheme = ToolIntent.HMAC_SHA256
    signed.signing_key_id = keyring.active
    signed.signature = keyring.mac(keyring.active, signing_input(intent))
    return signed


def verify(intent: Message, keyring: Keyring) -> Verification:
    """Checks the intent's signature; constant-time in the signature bytes."""
    if is_unsigned(intent):
        return Verification.UNSIGNED
    if intent.signature_scheme == ToolIntent.SIGNATURE_SCHEME_UNSPECIFIED:
        return Verification.BAD_SIGNATURE  # signature bytes without a scheme
    if intent.signature_scheme != ToolIntent.HMAC_SHA256:
        return Verification.UNKNOWN_SCHEME
    if intent.signing_key_id not in keyring.keys:
        return Verification.UNKNOWN_KEY
    expected = keyring.mac(intent.signing_key_id, signing_input(intent))
    if hmac.compare_digest(expected, intent.signature):
        return Verification.VALID
    return Verification.BAD_SIGNATURE
