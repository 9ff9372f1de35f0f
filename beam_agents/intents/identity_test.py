"""Deterministic intent ids and canonical argument JSON."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types
import uuid

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_agents.errors import BeamAgentsError, CanonicalJsonError
from beam_agents.intents.identity import (
    INTENT_NAMESPACE,
    MAX_ARGS_DEPTH,
    MAX_SAFE_INTEGER,
    canonical_args_json,
    intent_id,
    intent_id_name,
    parse_args_json,
)


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
    code = (
        "from beam_agents.intents.identity import intent_id; print(intent_id(b'\\x00k|1', 7, 3, 2))"
    )
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


def _nested(depth: int) -> dict:
    value: dict = {}
    for _ in range(depth):
        value = {"a": value}
    return value


def _cycle() -> dict:
    outer: dict = {"self": {}}
    outer["self"]["self"] = outer["self"]
    return outer


def test_canonical_json_follows_rfc_8785_number_and_string_rules():
    # RFC 8785 section 3.2.2's example values.
    numbers = [333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001]
    assert canonical_args_json({"numbers": numbers}) == (
        '{"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27]}'
    )
    assert canonical_args_json({"a": 1.0}) == canonical_args_json({"a": 1}) == '{"a":1}'
    assert canonical_args_json({"a": -0.0}) == '{"a":0}'
    assert canonical_args_json({"s": "\u20ac$\x0f\nA'B\"\\/"}) == '{"s":"€$\\u000f\\nA\'B\\"\\\\/"}'


def test_keys_sort_by_utf16_code_units_as_rfc_8785_requires():
    # U+10000 is D800 DC00 in UTF-16, so it sorts before U+FFFF (whose code point is lower).
    assert canonical_args_json({"\uffff": 1, "\U00010000": 2}) == '{"\U00010000":2,"\uffff":1}'


def test_floats_outside_the_integer_form_range_are_kept():
    assert canonical_args_json({"big": 1e21, "safe": 2.0**53 - 1}) == (
        '{"big":1e+21,"safe":9007199254740991}'
    )


def test_the_largest_safe_integers_are_kept():
    text = canonical_args_json({"max": MAX_SAFE_INTEGER, "min": -MAX_SAFE_INTEGER})
    assert text == '{"max":9007199254740991,"min":-9007199254740991}'
    assert parse_args_json(text) == {"max": MAX_SAFE_INTEGER, "min": -MAX_SAFE_INTEGER}


def test_nesting_up_to_the_limit_is_accepted():
    assert parse_args_json(canonical_args_json(_nested(MAX_ARGS_DEPTH - 1))) == _nested(
        MAX_ARGS_DEPTH - 1
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('{"id":' + "9" * 5000 + "}", "5000 digits"),
        ('{"id":-' + "9" * 17 + "}", "17 digits"),
        ('{"id":9007199254740992}', "beyond +/-(2^53 - 1)"),
        ('{"id":' + "[" * 100_000 + "]" * 100_000 + "}", "nests 100001 deep"),
        ('{"id":NaN}', "NaN is not a JSON number"),
        ('{"id":-Infinity}', "-Infinity is not a JSON number"),
        ('{"id":1e400}', "inf is not a JSON number"),
        ('{"id":"\\udc00"}', "not valid Unicode"),
        ('{"id":1,"id":2}', "'id' appears twice"),
        ("[1]", "must be a JSON object"),
        ("{", "not JSON"),
        ("", "not JSON"),
    ],
)
def test_parsing_hostile_args_json_is_a_typed_refusal(text, reason):
    with pytest.raises(CanonicalJsonError) as raised:
        parse_args_json(text)
    assert reason in str(raised.value)


def test_a_text_nested_past_the_limit_is_refused_at_its_root_before_it_is_parsed():
    # Counted on the text, before json.loads builds anything: no value to point at but "$".
    with pytest.raises(CanonicalJsonError) as raised:
        parse_args_json('{"id":' + "[" * MAX_ARGS_DEPTH + "]" * MAX_ARGS_DEPTH + "}")
    assert raised.value.path == "$" and f"more than {MAX_ARGS_DEPTH}" in str(raised.value)


def test_brackets_inside_strings_do_not_count_as_nesting():
    text = '{"a":"' + "[" * 10_000 + '\\"{"}'
    assert parse_args_json(text) == {"a": "[" * 10_000 + '"{'}


def test_an_unclosed_string_full_of_escaped_quotes_is_refused_in_linear_time():
    # A model cut off at its token limit leaves an unclosed string; a scan that restarts at
    # each quote inside it takes seconds per 40 kB and minutes per 200 kB.
    text = '{"a":"' + '\\"' * 30_000
    started = time.perf_counter()
    with pytest.raises(CanonicalJsonError, match="not JSON"):
        parse_args_json(text)
    assert time.perf_counter() - started < 1.0


def test_nesting_after_a_string_that_ends_in_an_escaped_backslash_is_counted():
    text = '{"a":"\\\\","b":' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(CanonicalJsonError, match="nests 100001 deep"):
        parse_args_json(text)


def test_canonical_json_sorts_keys_drops_whitespace_and_keeps_utf8():
    assert canonical_args_json({"b": [1, 2.5, None, True], "a": {"z": "café", "y": ""}}) == (
        '{"a":{"y":"","z":"café"},"b":[1,2.5,null,true]}'
    )


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not 2**53 <= abs(f) < 1e21)
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
        ({"x": {1: "one"}}, "$.x", "object key 1 is an int"),
        ({"x": "\ud800"}, "$.x", "not valid Unicode"),
        ([1, 2], "$", "must be a JSON object"),
        ({"x": 2**53}, "$.x", "beyond +/-(2^53 - 1)"),
        ({"x": [-(2**53)]}, "$.x[0]", "beyond +/-(2^53 - 1)"),
        ({"x": 10**5000}, "$.x", "beyond +/-(2^53 - 1)"),
        (
            {"x": types.MappingProxyType({"a": 1})},
            "$.x",
            "mappingproxy is a mapping other than dict",
        ),
        (types.MappingProxyType({"a": 1}), "$", "must be a JSON object (a dict)"),
        (_nested(MAX_ARGS_DEPTH), "$" + ".a" * MAX_ARGS_DEPTH, "nests deeper than 64"),
        ({"x": 2.0**53}, "$.x", "prints as an integer beyond"),
        ({"x": -1e20}, "$.x", "prints as an integer beyond"),
        (_cycle(), "$.self.self", "a cycle"),
    ],
)
def test_values_json_cannot_carry_are_rejected_naming_where(args, path, reason):
    with pytest.raises(CanonicalJsonError) as raised:
        canonical_args_json(args)
    assert raised.value.path == path
    assert reason in str(raised.value)
    assert isinstance(raised.value, BeamAgentsError)


@settings(max_examples=500, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=8),
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)
            | st.text(st.characters(codec="utf-8"), max_size=12)
            | st.sampled_from(['\x00\x1f\x7f\b\t\n\f\r"\\/', "\u2028\ue000\U0001f600"]),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(st.text(max_size=4), inner, max_size=4)
            ),
            max_leaves=20,
        ),
        max_size=6,
    )
)
def test_plain_arguments_are_written_exactly_as_rfc8785_writes_them(args):
    # canonical_args_json writes these through json.dumps: the text must be RFC 8785's.
    assert canonical_args_json(args) == rfc8785.dumps(args).decode("utf-8")
