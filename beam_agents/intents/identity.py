"""A ToolIntent's identity, its canonical arguments, and how its kind is read.

Identity. `intent_id` is a uuid5 under `INTENT_NAMESPACE` of the canonical string

    "tool-intent/v1|<entity_key as lowercase hex>|<seq>|<step_index>|<call_index>"

seq numbers the key's activations, step_index the agent step within the activation, and
call_index the tool call within the step (an LLM may ask for several in parallel). The id is
therefore the same in any process and on every retry or replay of the activation, which is what
lets the effector execute each intent once and the agent match results to intents. Retries of an
intent (`attempt`) keep its id. INTENT_NAMESPACE and the string's layout are frozen: changing
either would give in-flight intents new ids after an update, and they would run twice.

Arguments. `args_json` holds RFC 8785 canonical JSON (the JSON Canonicalization Scheme, through
the `rfc8785` package): keys sorted by their UTF-16 code units, no insignificant whitespace,
ECMAScript number formatting (`1.0` and `1` are both `1`), UTF-8. Go and Java have RFC 8785
libraries too, so any service can reproduce the text of an intent it receives. Only I-JSON
values are accepted, so every reader sees the same value: objects (dicts) with string keys,
arrays (lists), strings of valid Unicode, booleans, null, finite floats and integers within
+/-(2^53 - 1), nested at most `MAX_ARGS_DEPTH` deep, without cycles. Dict order never changes an
intent's bytes, so its signature and its replay-cache key are stable. `parse_args_json` is the
reading side: the effector parses a received args_json with the same rules and the same limits,
so a hostile 5,000-digit number or a 100,000-deep array is a refusal, never a crash.

Content. `content_digest` is the SHA-256 of a serialized intent without its signature and
delivery fields (attempt, created_at_ms, expires_at_ms, trace_id): what a copy must share with
an intent to be the same intent. The effector remembers it per intent_id and stamps it on every
ToolResult (`intent_digest`), so a result answers the content it was computed for, not just an
id, and the runtime can refuse a result computed for other content under the same id.

Kind. `kind` was added without a schema bump; TOOL_KIND_UNSPECIFIED (an intent written before
it existed) reads as TOOL, and only an explicit APPROVAL goes to a human.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import uuid
from collections.abc import Mapping

import rfc8785

from beam_agents._protos import ToolIntent
from beam_agents.errors import CanonicalJsonError, with_article
from beam_agents.wire.fields import strip_fields

__all__ = [
    "DELIVERY_FIELDS",
    "INTENT_NAMESPACE",
    "MAX_ARGS_DEPTH",
    "MAX_SAFE_INTEGER",
    "canonical_args_json",
    "content_digest",
    "effective_kind",
    "intent_id",
    "intent_id_name",
    "parse_args_json",
]

#: Frozen. The uuid5 namespace of every intent_id.
INTENT_NAMESPACE = uuid.UUID("ad73fd52-ef5c-497f-8bab-c8f837f2c57a")

#: Fields a retry or redelivery of the same intent may change; the content digest omits them.
DELIVERY_FIELDS = ("attempt", "created_at_ms", "expires_at_ms", "trace_id")
_CONTENT_EXCLUDED = frozenset(
    ToolIntent.DESCRIPTOR.fields_by_name[name].number
    for name in (*DELIVERY_FIELDS, "signature_scheme", "signing_key_id", "signature")
)

#: How deep objects and arrays may nest in tool arguments ("$" itself is depth 1).
MAX_ARGS_DEPTH = 64
#: The largest integer a double holds exactly (I-JSON, RFC 7493 2.2); -MAX_SAFE_INTEGER is the
#: smallest.
MAX_SAFE_INTEGER = 2**53 - 1
# A JSON integer has at most this many digits before it is certainly out of range; longer
# digit runs are refused before int() sees them (CPython refuses 4,300+ digits with ValueError).
_MAX_INTEGER_DIGITS = len(str(MAX_SAFE_INTEGER))
# RFC 8785 (ECMAScript) writes floats from 1e21 up with an exponent, smaller ones without.
_EXPONENT_FORM = 1e21
# A string (to its closing quote, or to the end of text that never closes it, so an unclosed
# string is one linear match, not a new scan from each quote inside it) or a bracket.
_STRING_OR_BRACKET = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


def intent_id_name(entity_key: bytes, seq: int, step_index: int, call_index: int = 0) -> str:
    """The canonical string an intent_id is the uuid5 of."""
    for name, value in (("seq", seq), ("step_index", step_index), ("call_index", call_index)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, not {value!r}")
    if not isinstance(entity_key, bytes):
        raise TypeError(f"entity_key must be bytes, not {type(entity_key).__name__}")
    return f"tool-intent/v1|{entity_key.hex()}|{seq}|{step_index}|{call_index}"


def intent_id(entity_key: bytes, seq: int, step_index: int, call_index: int = 0) -> str:
    """The deterministic intent_id of the call_index-th tool call of a step."""
    return str(
        uuid.uuid5(INTENT_NAMESPACE, intent_id_name(entity_key, seq, step_index, call_index))
    )


def content_digest(wire: bytes) -> bytes:
    """SHA-256 of a serialized intent without its signature and delivery fields: what a copy
    must share with an intent to be the same intent (see the module docstring)."""
    return hashlib.sha256(strip_fields(wire, _CONTENT_EXCLUDED)).digest()


def canonical_args_json(args: Mapping[str, object]) -> str:
    """`args` as RFC 8785 canonical JSON; raises CanonicalJsonError naming the first value
    canonical JSON cannot carry exactly."""
    if not isinstance(args, dict):
        raise CanonicalJsonError(
            f"tool arguments must be a JSON object (a dict), not {type(args).__name__}", path="$"
        )
    if type(args) is dict and _plain(args, 1):
        # The same text rfc8785 writes, at a fraction of its cost (it is on every activation's
        # path: each intent's arguments and each model call's cache key).
        return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    _check(args, "$", 1, set())
    return rfc8785.dumps(args).decode("utf-8")


#: Lone surrogates (not Unicode text), and characters beyond the BMP, which sort by UTF-16 code
#: units (RFC 8785) otherwise than by code points (json.dumps).
_SURROGATE = re.compile("[\ud800-\udfff]")
_NOT_BMP_TEXT = re.compile("[\ud800-\udfff\U00010000-\U0010ffff]")


def _plain(value: object, depth: int) -> bool:
    """Whether `value` is valid arguments that `json.dumps` (sorted keys, no whitespace, no
    ASCII escaping) writes exactly as RFC 8785 does: only dict, list, str, int (within the
    I-JSON range), bool and None, of exactly those types (a float is written otherwise, `1.0`
    for `1`), keys in the BMP, nested at most MAX_ARGS_DEPTH deep (so a cycle is not plain).
    Both write a string alike: quote and backslash escaped, the two-character escapes of
    backspace, tab, newline, form feed and carriage return, other control characters as
    lowercase u00xx escapes, everything else as itself. Anything else goes the checked way."""
    kind = type(value)
    if kind is str:
        return value.isascii() or _SURROGATE.search(value) is None
    if kind is int:
        return -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER
    if value is None or kind is bool:
        return True
    if depth > MAX_ARGS_DEPTH:
        return False
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or not (key.isascii() or _NOT_BMP_TEXT.search(key) is None):
                return False
            if not _plain(item, depth + 1):
                return False
        return True
    if kind is list:
        return all(_plain(item, depth + 1) for item in value)
    return False


def parse_args_json(text: str) -> dict:
    """The tool arguments an intent carries, parsed under the rules and limits of
    `canonical_args_json` (the text need not be canonical). Raises CanonicalJsonError naming
    where the text breaks them; never RecursionError or ValueError."""
    depth = _max_depth(text)
    if depth > MAX_ARGS_DEPTH:
        raise CanonicalJsonError(f"nests {depth} deep, more than {MAX_ARGS_DEPTH}", path="$")
    try:
        args = json.loads(
            text,
            parse_int=_parse_int,
            parse_constant=_refuse_constant,
            object_pairs_hook=_unique_keys,
        )
    except json.JSONDecodeError as e:
        raise CanonicalJsonError(
            f"not JSON: {e.msg} at line {e.lineno} column {e.colno}", path="$"
        ) from None
    except _Refused as e:
        raise CanonicalJsonError(e.reason, path="$") from None
    if not isinstance(args, dict):
        raise CanonicalJsonError(
            f"tool arguments must be a JSON object, not {type(args).__name__}", path="$"
        )
    _check(args, "$", 1, set())
    return args


class _Refused(Exception):
    """A value json.loads must not build; becomes a CanonicalJsonError for the whole text."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _max_depth(text: str) -> int:
    # Brackets inside strings do not nest; a linear scan keeps json.loads out of recursion.
    depth = deepest = 0
    for token in _STRING_OR_BRACKET.findall(text):
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def _parse_int(digits: str) -> int:
    if len(digits.lstrip("-")) > _MAX_INTEGER_DIGITS:
        raise _Refused(f"an integer of {len(digits.lstrip('-'))} digits is beyond +/-(2^53 - 1)")
    return int(digits)


def _refuse_constant(name: str) -> None:
    raise _Refused(f"{name} is not a JSON number")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    args = dict(pairs)
    if len(args) != len(pairs):
        seen: set[str] = set()
        duplicate = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _Refused(f"object key {duplicate!r} appears twice (I-JSON forbids it)")
    return args


def _check(value: object, path: str, depth: int, open_containers: set[int]) -> None:
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if not -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            raise CanonicalJsonError(
                "integer beyond +/-(2^53 - 1), which JSON readers cannot hold exactly; "
                "send it as a string",
                path=path,
            )
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CanonicalJsonError(f"{value!r} is not a JSON number", path=path)
        if MAX_SAFE_INTEGER < abs(value) < _EXPONENT_FORM:
            # RFC 8785 writes it without an exponent, so a reader parses an integer beyond
            # the I-JSON range rather than this float.
            raise CanonicalJsonError(
                f"{value!r} prints as an integer beyond +/-(2^53 - 1); send it as a string",
                path=path,
            )
        return
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise CanonicalJsonError(
                f"string is not valid Unicode ({e.reason})", path=path
            ) from None
        return
    if not isinstance(value, dict | list):
        kind = "a mapping other than dict" if isinstance(value, Mapping) else "not a JSON value"
        raise CanonicalJsonError(
            f"{type(value).__name__} is {kind} (use dict, list, str, int, float, bool, None)",
            path=path,
        )
    if id(value) in open_containers:
        raise CanonicalJsonError("a cycle: this value contains itself", path=path)
    if depth > MAX_ARGS_DEPTH:
        raise CanonicalJsonError(f"nests deeper than {MAX_ARGS_DEPTH}", path=path)
    open_containers.add(id(value))
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalJsonError(
                    f"object key {key!r} is {with_article(type(key).__name__)}, not a string",
                    path=path,
                )
            _check(key, f"{path}.{key}", depth, open_containers)
            _check(item, f"{path}.{key}", depth + 1, open_containers)
    else:
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]", depth + 1, open_containers)
    open_containers.discard(id(value))


def effective_kind(intent: ToolIntent) -> ToolIntent.Kind.ValueType | None:
    """TOOL or APPROVAL; TOOL_KIND_UNSPECIFIED reads as TOOL. None for a kind this binary does
    not know (a newer enum value): fail closed, never run it as a tool call."""
    if intent.kind in (ToolIntent.TOOL_KIND_UNSPECIFIED, ToolIntent.TOOL):
        return ToolIntent.TOOL
    if intent.kind == ToolIntent.APPROVAL:
        return ToolIntent.APPROVAL
    return None
