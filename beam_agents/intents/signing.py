"""The signature envelope of ToolIntents, ToolResults and Approvals: HMAC-SHA256 under
rotatable keys.

Three messages are signed, each by the party that produces it: a ToolIntent by the runtime that
emits it, a ToolResult by the effector, an AgentEnvelope.Approval by the approvals channel.
Each carries the same three fields (signature_scheme, signing_key_id, signature) as its
highest-numbered ones, so everything below holds for all three; the field numbers are read from
each message's descriptor.

Signing input. A signature covers the deterministic serialization of the intent with its three
signature fields (signature_scheme, signing_key_id, signature) cleared. Unknown fields are part
of that input: an older verifier keeps a newer signer's extra fields as unknown fields and
re-serializes them after the known ones, which equals the signer's sorted-by-number layout
because every new ToolIntent field takes a number above all existing ones (the rule stated in
the .proto file). So signatures verify across schema skew in both directions.

Verifying from the bytes as received. A field that a newer binary removed (its number
reserved) is unknown to that binary, and an unknown field is re-serialized after every known
one, so re-serializing cannot rebuild the signer's bytes when the removed number sits below a
known one. Wherever the serialized intent is at hand, `verify(intent, ring, wire=data)` takes
the signing input from `data` itself, dropping the three signature fields from the wire bytes
(`strip_signature`); it matches the signer exactly because the signer serialized
deterministically, in field-number order. Re-serialization is the fallback for an intent that
exists only as a message.

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
import functools
import hashlib
import hmac
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

from google.protobuf.message import Message

from beam_agents._protos import ToolIntent
from beam_agents.errors import KeyringError
from beam_agents.wire.fields import encode_varint, strip_fields

__all__ = [
    "KEYS_ENV",
    "KEYS_FILE_ENV",
    "MIN_SECRET_BYTES",
    "SIGNATURE_BYTES",
    "SIGNATURE_FIELDS",
    "Keyring",
    "Verification",
    "is_unsigned",
    "sign",
    "signing_input",
    "strip_signature",
    "verify",
]

SIGNATURE_FIELDS = ("signature_scheme", "signing_key_id", "signature")
KEYS_ENV = "BEAM_AGENTS_SIGNING_KEYS"
KEYS_FILE_ENV = "BEAM_AGENTS_SIGNING_KEYS_FILE"
MIN_SECRET_BYTES = 32
#: Length of an HMAC-SHA256 signature; any other length is refused before a MAC is computed.
SIGNATURE_BYTES = 32


@functools.cache
def _layout(descriptor) -> tuple[frozenset[int], tuple[bytes, bytes, bytes]]:
    """The signature fields' numbers of a signed message type, and their tags as encoded."""
    numbers = [descriptor.fields_by_name[name].number for name in SIGNATURE_FIELDS]
    tags = tuple(
        encode_varint(number << 3 | wire_type)
        for number, wire_type in zip(numbers, (0, 2, 2), strict=True)
    )
    return frozenset(numbers), tags


class Verification(enum.Enum):
    """The outcome of `verify`."""

    VALID = "valid"
    #: No scheme and no signature: written before signing existed, or by an unsigned producer.
    UNSIGNED = "unsigned"
    UNKNOWN_KEY = "unknown key"
    BAD_SIGNATURE = "bad signature"
    #: A scheme this binary does not implement (a newer enum value).
    UNKNOWN_SCHEME = "unknown scheme"


_SURROGATE = re.compile("[\ud800-\udfff]")
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
    """Secrets by key id, and the id of the key that signs. Every malformed ring (no keys, a key
    id that is no string, a secret that is not bytes or too short, an unknown active key) is a
    KeyringError naming `source`."""

    keys: Mapping[str, bytes]
    active: str | None = None
    source: str = dataclasses.field(default="Keyring", compare=False)

    def __post_init__(self) -> None:
        source = self.source
        if not isinstance(self.keys, Mapping):
            raise KeyringError(
                f"keys must map key ids to secrets, not {type(self.keys).__name__}", source=source
            )
        if not self.keys:
            raise KeyringError("the ring holds no keys", source=source)
        for key_id, secret in self.keys.items():
            if not isinstance(key_id, str) or not key_id:
                raise KeyringError(f"key id {key_id!r} is not a non-empty string", source=source)
            if not key_id.isascii() and _SURROGATE.search(key_id):
                # An intent's signing_key_id is a proto string: such an id could sign nothing.
                raise KeyringError(
                    f"key id {key_id!r} holds a lone surrogate, not Unicode text", source=source
                )
            if not isinstance(secret, bytes):
                raise KeyringError(
                    f"key {key_id!r} is a {type(secret).__name__}, not bytes", source=source
                )
            if len(secret) < MIN_SECRET_BYTES:
                raise KeyringError(
                    f"key {key_id!r} has {len(secret)} bytes; HMAC-SHA256 keys need at least "
                    f"{MIN_SECRET_BYTES}",
                    source=source,
                )
        if self.active is not None:
            if not isinstance(self.active, str):
                raise KeyringError(
                    f"active must be a key id (a string), not {type(self.active).__name__}",
                    source=source,
                )
            if self.active not in self.keys:
                raise KeyringError(f"active key {self.active!r} is not in the ring", source=source)
        object.__setattr__(self, "keys", dict(self.keys))
        object.__setattr__(self, "_pads", {key_id: _pads(s) for key_id, s in self.keys.items()})
        object.__setattr__(self, "_envelopes", {})

    def mac(self, key_id: str, data: bytes) -> bytes:
        """HMAC-SHA256 of `data` under key `key_id` (equal to hmac.digest(secret, data,
        "sha256"), from the per-key pads)."""
        inner_pad, outer_pad = self._pads[key_id]
        inner = inner_pad.copy()
        inner.update(data)
        outer = outer_pad.copy()
        outer.update(inner.digest())
        return outer.digest()

    def envelope(self, key_id: str, signature: bytes, descriptor=ToolIntent.DESCRIPTOR) -> bytes:
        """The deterministic encoding of the three signature fields of an HMAC_SHA256
        signature (SIGNATURE_BYTES long) under key `key_id`, for a message of `descriptor`."""
        prefix = self._envelopes.get((descriptor, key_id))
        if prefix is None:
            if key_id not in self.keys:
                raise KeyError(key_id)
            prefix = self._envelopes[descriptor, key_id] = _envelope_prefix(descriptor, key_id)
        return prefix + signature

    def __repr__(self) -> str:  # never print secrets
        return f"Keyring(keys={sorted(self.keys)}, active={self.active!r})"

    @classmethod
    def from_json(cls, text: str, *, source: str) -> Keyring:
        """Parses the documented JSON format; `source` names where it came from in errors."""
        try:
            document = json.loads(text, object_pairs_hook=_unique_names)
        except json.JSONDecodeError as e:
            raise KeyringError(f"not JSON: {e.msg} at line {e.lineno}", source=source) from None
        except RecursionError:
            raise KeyringError("not a key ring: nested too deep", source=source) from None
        except _DuplicateName as e:
            # JSON readers disagree on which of the two wins: a ring must not depend on it.
            raise KeyringError(f"{e.args[0]!r} appears twice", source=source) from None
        if not isinstance(document, dict) or not isinstance(document.get("keys"), dict):
            raise KeyringError('expected {"active": ..., "keys": {id: base64}}', source=source)
        keys = {}
        for key_id, encoded in document["keys"].items():
            if not isinstance(encoded, str):
                raise KeyringError(
                    f"key {key_id!r} is a JSON {type(encoded).__name__}, not a base64 string",
                    source=source,
                )
            try:
                keys[key_id] = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError):
                raise KeyringError(f"key {key_id!r} is not base64", source=source) from None
        return cls(keys, document.get("active"), source=source)

    @classmethod
    def from_file(cls, path: str | bytes | os.PathLike) -> Keyring:
        path = os.fsdecode(path)
        source = path.encode("utf-8", "backslashreplace").decode("utf-8")
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise KeyringError(f"cannot read: {e.strerror}", source=source) from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise KeyringError(f"not UTF-8 at byte {e.start}", source=source) from None
        return cls.from_json(text, source=source)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Keyring:
        """From BEAM_AGENTS_SIGNING_KEYS, else the file BEAM_AGENTS_SIGNING_KEYS_FILE names."""
        environ = os.environ if environ is None else environ
        if KEYS_ENV in environ:
            return cls.from_json(environ[KEYS_ENV], source=f"${KEYS_ENV}")
        if KEYS_FILE_ENV in environ:
            return cls.from_file(environ[KEYS_FILE_ENV])
        raise KeyringError(f"neither {KEYS_ENV} nor {KEYS_FILE_ENV} is set", source="environment")


class _DuplicateName(Exception):
    pass


def _unique_names(pairs: list[tuple[str, object]]) -> dict:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateName(next(name for name, _ in pairs if name in seen or seen.add(name)))
    return document


def signing_input(intent: Message, *, wire: bytes | None = None) -> bytes:
    """The bytes a signature covers. Accepts the signed message classes of any schema version.

    `wire`, when given, is the serialization `intent` was parsed from; the input is then those
    bytes without the signature fields, which also holds for fields this binary does not know.
    """
    if wire is not None:
        return strip_signature(wire, intent.DESCRIPTOR)
    if is_unsigned(intent) and not intent.signing_key_id:
        return intent.SerializeToString(deterministic=True)  # nothing to clear: skip the copy
    cleared = type(intent)()
    cleared.CopyFrom(intent)
    for name in SIGNATURE_FIELDS:
        cleared.ClearField(name)
    return cleared.SerializeToString(deterministic=True)


def strip_signature(wire: bytes, descriptor=ToolIntent.DESCRIPTOR) -> bytes:
    """A serialized signed message (a ToolIntent unless `descriptor` says otherwise) without
    its signature fields (every occurrence), every other byte kept in place. Raises ValueError
    on bytes that are not well-formed protobuf."""
    return strip_fields(wire, _layout(descriptor)[0])


def is_unsigned(intent: Message) -> bool:
    """True when the intent carries no signature at all (scheme unspecified, no bytes)."""
    return (
        intent.signature_scheme == ToolIntent.SIGNATURE_SCHEME_UNSPECIFIED and not intent.signature
    )


def sign(intent: Message, keyring: Keyring) -> Message:
    """A signed copy of `intent` under the ring's active key; `intent` is not changed."""
    key_id = keyring.active
    if key_id is None:
        raise KeyringError("no active key to sign with", source=keyring.source)
    unsigned = signing_input(intent)
    # Parsing the input with the envelope appended builds the copy in one pass: field order
    # does not matter to the parser, and unknown fields stay unknown.
    return type(intent).FromString(
        unsigned + keyring.envelope(key_id, keyring.mac(key_id, unsigned), intent.DESCRIPTOR)
    )


def verify(intent: Message, keyring: Keyring, *, wire: bytes | None = None) -> Verification:
    """Checks the intent's signature; constant-time in the signature bytes.

    Pass `wire`, the bytes `intent` was parsed from, wherever the caller has them: then fields
    this binary does not know, wherever their numbers sit, are covered exactly as signed.
    """
    scheme = intent.signature_scheme
    signature = intent.signature
    if scheme == ToolIntent.SIGNATURE_SCHEME_UNSPECIFIED:
        # No scheme and no bytes: unsigned. Bytes without a scheme: a broken envelope.
        return Verification.BAD_SIGNATURE if signature else Verification.UNSIGNED
    if scheme != ToolIntent.HMAC_SHA256:
        return Verification.UNKNOWN_SCHEME
    key_id = intent.signing_key_id
    if key_id not in keyring.keys:
        return Verification.UNKNOWN_KEY
    if len(signature) != SIGNATURE_BYTES:
        return Verification.BAD_SIGNATURE
    try:
        envelope = keyring.envelope(key_id, signature, intent.DESCRIPTOR)
        if wire is None:
            signed_bytes = _signing_input_of_signed(intent, envelope)
        elif wire.endswith(envelope):  # the signer's deterministic layout: envelope last
            signed_bytes = wire[: len(wire) - len(envelope)]
        else:
            signed_bytes = strip_signature(wire, intent.DESCRIPTOR)
    except ValueError:
        return Verification.BAD_SIGNATURE
    expected = keyring.mac(key_id, signed_bytes)
    if hmac.compare_digest(expected, signature):
        return Verification.VALID
    return Verification.BAD_SIGNATURE


def _signing_input_of_signed(intent: Message, envelope: bytes) -> bytes:
    # The signature fields are the highest-numbered known fields, so a deterministic
    # serialization ends with them unless unknown (higher) fields follow: then cut them off the
    # end, else clear them on a copy.
    data = intent.SerializeToString(deterministic=True)
    if data.endswith(envelope):
        return data[: len(data) - len(envelope)]
    return signing_input(intent)


def _envelope_prefix(descriptor, key_id: str) -> bytes:
    """The signature fields' encoding up to the signature bytes, for one key."""
    scheme_tag, key_id_tag, signature_tag = _layout(descriptor)[1]
    key = key_id.encode("utf-8")
    return b"".join(
        (
            scheme_tag,
            encode_varint(ToolIntent.HMAC_SHA256),
            key_id_tag,
            encode_varint(len(key)),
            key,
            signature_tag,
            encode_varint(SIGNATURE_BYTES),
        )
    )
