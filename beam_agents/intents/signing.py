r"""The signature envelope of ToolIntents, ToolResults and Approvals: HMAC-SHA256 under
rotatable keys.

Three messages are signed, each by the party that produces it: a ToolIntent by the runtime that
emits it, a ToolResult by the effector, an AgentEnvelope.Approval by the approvals channel.
Each carries the same three fields (signature_scheme, signing_key_id, signature), its
highest-numbered ones when they were added (fields added since take higher numbers still, as
AgentEnvelope.Approval's edited_args_json), so everything below holds for all three; the field
numbers are read from each message's descriptor.

Signing input. A signature covers the deterministic serialization of the intent with its three
signature fields (signature_scheme, signing_key_id, signature) cleared, preceded under the
current scheme by a prefix naming the message type (below). Unknown fields are part
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

Schemes: domain separation, and the transition to it. A ToolIntent's fields 1-8 are a
ToolResult's too, so under the first scheme, HMAC_SHA256 (the HMAC of the signing input alone),
a message one party signed as one type could be presented as another: the effector's result key
signs inquiries (ToolIntents), and an inquiry re-enveloped as a ToolResult verified. The
current scheme, HMAC_SHA256_TYPED, signs

    b"\0beam_agents signature HMAC_SHA256_TYPED\0" + <the message's full type name> + b"\0"
    + <the signing input above>

so a signature verifies only for the type it was made for (beam_agents.v1.ToolIntent,
beam_agents.v1.ToolResult, beam_agents.v1.AgentEnvelope.Approval), and the scheme is named by
the envelope's signature_scheme (2). The prefix starts with a zero byte, which no protobuf
serialization does (field number 0 is invalid), so no input of one scheme is an input of the
other: a signature cannot be carried across schemes by relabelling it.

Signers sign with the ring's `sign_scheme`: HMAC_SHA256_TYPED unless the ring says
"sign_scheme": "HMAC_SHA256". Verifiers accept both schemes while the legacy window is open and
only the typed one after it: the window ends at the ring's "legacy_until" (an RFC 3339 instant
with its offset), by default LEGACY_UNTIL (2027-03-01T00:00:00Z), and a legacy signature
verified at or after it is LEGACY_EXPIRED, never VALID. The window is measured on the
verifier's clock (the effector's clock; RunAgent's and the console's wall clock), never on a
time the message carries: a replayed message carries its original, signed times, and an
answer's event time is its producer's. While the window is open a legacy signature still
crosses types; closing it ends that. A ring that signs the legacy scheme after its own window
has ended is refused when it is loaded, since every verifier would refuse what it signs.

Rolling upgrade. RunAgent and the effector each sign one kind and verify another, so signers and
verifiers are upgraded together, not one side first:
1. Deploy the new binary with "sign_scheme": "HMAC_SHA256" in every signing ring. New
   verifiers accept both schemes; old ones still running see only legacy signatures. (Without
   the option a new signer's typed signature reaches an old verifier, which does not know
   scheme 2: UNKNOWN_SCHEME, a signature_unknown_scheme dead letter at an old effector (the
   call is not run) or a bad_answer_signature one at an old RunAgent (the effector's result is
   refused, and its call stays unanswered until its deadline although it ran). Nothing runs
   twice, but calls fail: hence the option.)
2. Once no old binary runs, drop "sign_scheme" (signers sign typed); deploy.
3. Once no legacy-signed message can still arrive (the longest intent lifetime, and any backlog
   on the topics, after step 2), close the window: "legacy_until" at or before now, or let the
   default pass. After it, a legacy signature is LEGACY_EXPIRED (signature_legacy_expired at the
   effector) wherever it is presented.
The Go and Java readers (polyglot/) implement the same schemes and window.

Keys. A `Keyring` maps key ids to secrets (at least 32 bytes each) and names the active key
that signs; verification accepts any key of the ring. It loads from the environment variable
BEAM_AGENTS_SIGNING_KEYS or from a file (BEAM_AGENTS_SIGNING_KEYS_FILE, or a path given), both
holding the same JSON:

    {"active": "2026-11", "keys": {"2026-11": "<base64 secret>", "2026-05": "<base64 secret>"},
     "sign_scheme": "HMAC_SHA256_TYPED", "legacy_until": "2027-03-01T00:00:00Z"}

"sign_scheme" and "legacy_until" are optional (their defaults above). "active" may be omitted
for a verify-only ring (the effector). Load keys on the worker (Beam DoFn.setup), never into a
pipeline's serialized graph.

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
import datetime
import enum
import functools
import hashlib
import hmac
import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path

from google.protobuf.message import Message

from beam_agents._protos import ToolIntent
from beam_agents.errors import KeyringError, with_article
from beam_agents.wire.fields import encode_varint, strip_fields

__all__ = [
    "KEYS_ENV",
    "KEYS_FILE_ENV",
    "LEGACY_UNTIL",
    "LEGACY_UNTIL_MS",
    "MIN_SECRET_BYTES",
    "SIGNATURE_BYTES",
    "SIGNATURE_FIELDS",
    "SIGNING_SCHEME",
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
#: The scheme signers use unless their ring says otherwise.
SIGNING_SCHEME = ToolIntent.HMAC_SHA256_TYPED
#: The default end of the window in which verifiers still accept the legacy scheme.
LEGACY_UNTIL = "2027-03-01T00:00:00Z"
LEGACY_UNTIL_MS = 1_803_859_200_000
_SCHEME_NAMES = {
    "HMAC_SHA256": ToolIntent.HMAC_SHA256,
    "HMAC_SHA256_TYPED": ToolIntent.HMAC_SHA256_TYPED,
}
_DOMAIN = b"\0beam_agents signature HMAC_SHA256_TYPED\0"


@functools.cache
def _layout(descriptor) -> tuple[frozenset[int], tuple[bytes, bytes, bytes]]:
    """The signature fields' numbers of a signed message type, and their tags as encoded."""
    numbers = [descriptor.fields_by_name[name].number for name in SIGNATURE_FIELDS]
    tags = tuple(
        encode_varint(number << 3 | wire_type)
        for number, wire_type in zip(numbers, (0, 2, 2), strict=True)
    )
    return frozenset(numbers), tags


@functools.cache
def _domain(descriptor, scheme: int) -> bytes:
    """What a scheme's HMAC covers before the signing input: the type's name, or nothing."""
    if scheme == ToolIntent.HMAC_SHA256:
        return b""
    return _DOMAIN + descriptor.full_name.encode("ascii") + b"\0"


class Verification(enum.Enum):
    """The outcome of `verify`."""

    VALID = "valid"
    #: No scheme and no signature: written before signing existed, or by an unsigned producer.
    UNSIGNED = "unsigned"
    UNKNOWN_KEY = "unknown key"
    BAD_SIGNATURE = "bad signature"
    #: A scheme this binary does not implement (a newer enum value).
    UNKNOWN_SCHEME = "unknown scheme"
    #: The legacy scheme (no message type in the input) verified after the ring's window ended.
    LEGACY_EXPIRED = "legacy scheme past its window"


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
    """Secrets by key id, the id of the key that signs, the scheme it signs with and the end of
    the legacy scheme's window (milliseconds since the epoch). Every malformed ring (no keys, a
    key id that is no string, a secret that is not bytes or too short, an unknown active key or
    scheme, a signer of the legacy scheme past its window) is a KeyringError naming `source`."""

    keys: Mapping[str, bytes]
    active: str | None = None
    source: str = dataclasses.field(default="Keyring", compare=False)
    sign_scheme: int = dataclasses.field(default=SIGNING_SCHEME, kw_only=True)
    legacy_until_ms: int = dataclasses.field(default=LEGACY_UNTIL_MS, kw_only=True)

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
                    f"key {key_id!r} is {with_article(type(secret).__name__)}, not bytes",
                    source=source,
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
        if type(self.legacy_until_ms) is not int:
            raise KeyringError(
                f"legacy_until_ms must be an int, not {type(self.legacy_until_ms).__name__}",
                source=source,
            )
        if self.sign_scheme not in _SCHEME_NAMES.values() or type(self.sign_scheme) is bool:
            raise KeyringError(f"no signing scheme {self.sign_scheme!r}", source=source)
        if (
            self.active is not None
            and self.sign_scheme == ToolIntent.HMAC_SHA256
            and _wall_clock_ms() >= self.legacy_until_ms
        ):
            # Every verifier of this ring's window would refuse what it signs.
            raise KeyringError(
                "signs the legacy scheme HMAC_SHA256 after its window ended", source=source
            )
        object.__setattr__(self, "keys", dict(self.keys))
        object.__setattr__(self, "_pads", {key_id: _pads(s) for key_id, s in self.keys.items()})
        object.__setattr__(self, "_envelopes", {})

    def mac(self, key_id: str, data: bytes, *, domain: bytes = b"") -> bytes:
        """HMAC-SHA256 of `domain + data` under key `key_id` (equal to hmac.digest(secret,
        domain + data, "sha256"), from the per-key pads, without joining the two)."""
        inner_pad, outer_pad = self._pads[key_id]
        inner = inner_pad.copy()
        inner.update(domain)
        inner.update(data)
        outer = outer_pad.copy()
        outer.update(inner.digest())
        return outer.digest()

    def envelope(
        self,
        key_id: str,
        signature: bytes,
        descriptor=ToolIntent.DESCRIPTOR,
        scheme: int | None = None,
    ) -> bytes:
        """The deterministic encoding of the three signature fields of a signature
        (SIGNATURE_BYTES long) of `scheme` (the ring's sign_scheme unless given) under key
        `key_id`, for a message of `descriptor`."""
        scheme = self.sign_scheme if scheme is None else scheme
        prefix = self._envelopes.get((descriptor, key_id, scheme))
        if prefix is None:
            if key_id not in self.keys:
                raise KeyError(key_id)
            prefix = _envelope_prefix(descriptor, key_id, scheme)
            self._envelopes[descriptor, key_id, scheme] = prefix
        return prefix + signature

    def __repr__(self) -> str:  # never print secrets
        return (
            f"Keyring(keys={sorted(self.keys)}, active={self.active!r}, "
            f"sign_scheme={ToolIntent.SignatureScheme.Name(self.sign_scheme)}, "
            f"legacy_until_ms={self.legacy_until_ms})"
        )

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
        scheme = document.get("sign_scheme", "HMAC_SHA256_TYPED")
        if not isinstance(scheme, str) or scheme not in _SCHEME_NAMES:
            raise KeyringError(
                f"sign_scheme {scheme!r} is none of {sorted(_SCHEME_NAMES)}", source=source
            )
        return cls(
            keys,
            document.get("active"),
            source=source,
            sign_scheme=_SCHEME_NAMES[scheme],
            legacy_until_ms=_instant_ms(document.get("legacy_until", LEGACY_UNTIL), source),
        )

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


def _instant_ms(text: object, source: str) -> int:
    """Milliseconds since the epoch of an RFC 3339 instant that states its offset."""
    if not isinstance(text, str):
        raise KeyringError(
            f"legacy_until is a JSON {type(text).__name__}, not an RFC 3339 instant",
            source=source,
        )
    try:
        instant = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise KeyringError(
            f"legacy_until {text!r} is not an RFC 3339 instant", source=source
        ) from None
    if instant.utcoffset() is None:
        # Read in the machine's zone, one ring would close at different instants on each host.
        raise KeyringError(f"legacy_until {text!r} states no UTC offset", source=source)
    return (instant - _EPOCH) // datetime.timedelta(milliseconds=1)


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


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
    """A signed copy of `intent` under the ring's active key and sign_scheme; `intent` is not
    changed."""
    key_id = keyring.active
    if key_id is None:
        raise KeyringError("no active key to sign with", source=keyring.source)
    unsigned = signing_input(intent)
    descriptor, scheme = intent.DESCRIPTOR, keyring.sign_scheme
    signature = keyring.mac(key_id, unsigned, domain=_domain(descriptor, scheme))
    # Parsing the input with the envelope appended builds the copy in one pass: field order
    # does not matter to the parser, and unknown fields stay unknown.
    return type(intent).FromString(
        unsigned + keyring.envelope(key_id, signature, descriptor, scheme)
    )


def verify(
    intent: Message, keyring: Keyring, *, wire: bytes | None = None, now_ms: int | None = None
) -> Verification:
    """Checks the intent's signature, as made for the intent's own message type; constant-time
    in the signature bytes. A legacy signature is LEGACY_EXPIRED at or after the ring's
    legacy_until_ms by `now_ms` (the wall clock unless given).

    Pass `wire`, the bytes `intent` was parsed from, wherever the caller has them: then fields
    this binary does not know, wherever their numbers sit, are covered exactly as signed.
    """
    scheme = intent.signature_scheme
    signature = intent.signature
    if scheme == ToolIntent.SIGNATURE_SCHEME_UNSPECIFIED:
        # No scheme and no bytes: unsigned. Bytes without a scheme: a broken envelope.
        return Verification.BAD_SIGNATURE if signature else Verification.UNSIGNED
    if scheme not in _SCHEME_NAMES.values():
        return Verification.UNKNOWN_SCHEME
    if scheme == ToolIntent.HMAC_SHA256:
        now_ms = _wall_clock_ms() if now_ms is None else now_ms
        if now_ms >= keyring.legacy_until_ms:
            return Verification.LEGACY_EXPIRED
    key_id = intent.signing_key_id
    if key_id not in keyring.keys:
        return Verification.UNKNOWN_KEY
    if len(signature) != SIGNATURE_BYTES:
        return Verification.BAD_SIGNATURE
    descriptor = intent.DESCRIPTOR
    try:
        envelope = keyring.envelope(key_id, signature, descriptor, scheme)
        if wire is None:
            signed_bytes = _signing_input_of_signed(intent, envelope)
        elif wire.endswith(envelope):  # the signer's deterministic layout: envelope last
            signed_bytes = wire[: len(wire) - len(envelope)]
        else:
            signed_bytes = strip_signature(wire, descriptor)
    except ValueError:
        return Verification.BAD_SIGNATURE
    expected = keyring.mac(key_id, signed_bytes, domain=_domain(descriptor, scheme))
    if hmac.compare_digest(expected, signature):
        return Verification.VALID
    return Verification.BAD_SIGNATURE


def _signing_input_of_signed(intent: Message, envelope: bytes) -> bytes:
    # A deterministic serialization ends with the signature fields unless fields numbered above
    # them follow (known or unknown): then cut them off the end, else clear them on a copy.
    data = intent.SerializeToString(deterministic=True)
    if data.endswith(envelope):
        return data[: len(data) - len(envelope)]
    return signing_input(intent)


def _envelope_prefix(descriptor, key_id: str, scheme: int) -> bytes:
    """The signature fields' encoding up to the signature bytes, for one key and scheme."""
    scheme_tag, key_id_tag, signature_tag = _layout(descriptor)[1]
    key = key_id.encode("utf-8")
    return b"".join(
        (
            scheme_tag,
            encode_varint(scheme),
            key_id_tag,
            encode_varint(len(key)),
            key,
            signature_tag,
            encode_varint(SIGNATURE_BYTES),
        )
    )
