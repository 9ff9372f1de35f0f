"""A ToolIntent's identity, its canonical arguments, and how its kind is read.

Identity. `intent_id` is a uuid5 under `INTENT_NAMESPACE` of the canonical string

    "tool-intent/v1|<entity_key as lowercase hex>|<seq>|<step_index>|<call_index>"

seq numbers the key's activations, step_index the agent step within the activation, and
call_index the tool call within the step (an LLM may ask for several in parallel). The id is
therefore the same in any process and on every retry or replay of the activation, which is what
lets the effector execute each intent once and the agent match results to intents. Retries of an
intent (`attempt`) keep its id. INTENT_NAMESPACE and the string's layout are frozen: changing
either would give in-flight intents new ids after an update, and they would run twice.

Arguments. `args_json` holds canonical JSON: keys sorted, no insignificant whitespace, UTF-8
(non-ASCII kept as is), only what JSON carries exactly (objects with string keys, arrays from
lists, strings, finite numbers, booleans, null). Dict order never changes an intent's bytes, so
its signature and its replay-cache key are stable.

Kind. `kind` was added without a schema bump; TOOL_KIND_UNSPECIFIED (an intent written before
it existed) reads as TOOL, and only an explicit APPROVAL goes to a human.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping

from beam_agents._protos import ToolIntent
from beam_agents.errors import CanonicalJsonError

__all__ = [
    "INTENT_NAMESPACE",
    "canonical_args_json",
    "effective_kind",
    "intent_id",
    "intent_id_name",
]

#: Frozen. The uuid5 namespace of every intent_id.
INTENT_NAMESPACE = uuid.UUID("ad73fd52-ef5c-497f-8bab-c8f837f2c57a")


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


def canonical_args_json(args: Mapping[str, object]) -> str:
    """`args` as canonical JSON; raises CanonicalJsonError naming the first value JSON cannot
    carry exactly."""
    if not isinstance(args, Mapping):
        raise CanonicalJsonError(
            f"tool arguments must be a JSON object, not {type(args).__name__}", path="$"
        )
    _check(args, "$")
    return json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _check(value: object, path: str) -> None:
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CanonicalJsonError(f"{value!r} is not a JSON number", path=path)
        return
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise CanonicalJsonError(
                f"string is not valid Unicode ({e.reason})", path=path
            ) from None
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise CanonicalJsonError(
                    f"object key {key!r} is a {type(key).__name__}, not a string", path=path
                )
            _check(key, f"{path}.{key}")
            _check(item, f"{path}.{key}")
        return
    if isinstance(value, list):
        for i, item in enumerate(value):
            _check(item, f"{path}[{i}]")
        return
    raise CanonicalJsonError(
        f"{type(value).__name__} is not a JSON value (use dict, list, str, int, float, bool, None)",
        path=path,
    )


def effective_kind(intent: ToolIntent) -> ToolIntent.Kind.ValueType:
    """TOOL or APPROVAL; TOOL_KIND_UNSPECIFIED reads as TOOL."""
    if intent.kind == ToolIntent.APPROVAL:
        return ToolIntent.APPROVAL
    return ToolIntent.TOOL
