"""Deterministic intent ids and canonical argument JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_agents.core.intent import (
    INTENT_NAMESPACE,
    canonical_args_json,
    intent_id,
    intent_id_name,
)
from beam_agents.errors import BeamAgentsError, CanonicalJsonError


def test_intent_id_is_the_uuid5_of_the_documented_canonical_string():
    name = intent_id_name(b"customer-42", 41, 2, 0)
    assert name == "tool-intent/v1|637573746f6d65722d3432|41|2|0"
    assert intent_id(b"customer-42", 41, 2, 0) == str(uuid.uuid5(INTENT_NAMESPACE, name))
    assert uuid.UUID(intent_id(b"k", 1, 1)).version == 5


def test_the_frozen_namespace_still_gives_the_ids_already_in_flight():
    # Pinned: a change to the namespace or the string layout re-ids in-flight intents.
    assert str(INTENT_NAMESPACE) == "ad73fd52-ef5c-497f-8bab-c8f837f2c57a"
    assert intent_id(b"customer-42", 41, 2, 0) == "dbdb2ce7-9f14-5dbe-8e10-c85311c99413"


def test_the_same_inputs_give_the_same_id_in_another_process():
    code = "from beam_agents.core.intent import intent_id; print(intent_id(b'\\x00k|1', 7, 3, 2))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == intent_id(b"\x00k|1", 7, 3, 2)


def test_every_identity_input_distinguishes_intents():
    base = (b"key", 5, 2, 0)
    variants = [(b"key2", 5, 2, 0), (b"key", 6, 2, 0), (b"key", 5, 3, 0), (b"key", 5, 2, 1)]
    ids = {intent_id(*base)} | {intent_id(*v) for v in variants}
    assert len(ids) == 5
    # Hex keys keep the separator out of the key: no two (key, seq) pairs share a string.
    assert intent_id(b"a|1", 2, 0) != intent_id(b"a", 12, 0)


@pytest.mark.parametrize("bad", [-1, True, 1.0, "3"])
def test_identity_numbers_must_be_non_negative_ints(bad):
    with pytest.raises(ValueError):
        intent_id(b"k", bad, 0)


def test_canonical_json_sorts_keys_drops_whitespace_and_keeps_utf8():
    assert canonical_args_json({"b": [1, 2.5, None, True], "a": {"z": "café", "y": ""}}) == (
        '{"a":{"y":"","z":"café"},"b":[1,2.5,null,true]}'
    )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


def _reordered(value, seed: int):
    if isinstance(value, dict):
        items = list(value.items())
        items = items[seed % len(items) :] + items[: seed % len(items)] if items else items
        return {k: _reordered(v, seed + 1) for k, v in reversed(items)}
    if isinstance(value, list):
        return [_reordered(v, seed + 1) for v in value]
    return value


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), json_values, max_size=6), st.integers(0, 50))
def test_dict_order_never_changes_the_canonical_json(args, seed):
    text = canonical_args_json(args)
    assert canonical_args_json(_reordered(args, seed)) == text
    assert json.loads(text) == args
    assert text.encode("utf-8")  # always encodable: a valid proto3 string


@pytest.mark.parametrize(
    ("args", "path", "reason"),
    [
        ({"x": float("nan")}, "$.x", "not a JSON number"),
        ({"x": [1, float("inf")]}, "$.x[1]", "not a JSON number"),
        ({"x": b"raw"}, "$.x", "bytes is not a JSON value"),
        ({"x": {1, 2}}, "$.x", "set is not a JSON value"),
        ({"x": (1, 2)}, "$.x", "tuple is not a JSON value"),
        ({"x": {1: "one"}}, "$.x", "object key 1 is a int"),
        ({"x": "\ud800"}, "$.x", "not valid Unicode"),
        ([1, 2], "$", "must be a JSON object"),
    ],
)
def test_values_json_cannot_carry_are_rejected_naming_where(args, path, reason):
    with pytest.raises(CanonicalJsonError) as raised:
        canonical_args_json(args)
    assert raised.value.path == path
    assert reason in str(raised.value)
    assert isinstance(raised.value, BeamAgentsError)
