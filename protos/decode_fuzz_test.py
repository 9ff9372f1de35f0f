"""Decoding never crashes on bad bytes: every parser either succeeds or raises DecodeError.

Inputs are random bytes and byte-level mutations (flips, truncations, insertions) of valid
serializations of every message, so the fuzzer reaches deep into nested and length-delimited
fields instead of failing at the first tag.
"""

from __future__ import annotations

import contextlib

from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_agents.errors import MessageDecodeError
from beam_agents.testing.samples import ALL_MESSAGES, sample
from beam_agents.wire.decoding import MESSAGE_TYPES, decode

SEEDS = [sample(cls).SerializeToString() for cls in ALL_MESSAGES]


@st.composite
def mutated(draw):
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "delete"]))
        position = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[position] ^= draw(st.integers(1, 255))
        elif op == "truncate":
            del data[position:]
        elif op == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete" and data:
            del data[position]
    return bytes(data)


def _parse_everywhere(data: bytes) -> None:
    # Anything but success or the documented error escapes and fails the test.
    for cls in MESSAGE_TYPES.values():
        with contextlib.suppress(DecodeError):
            cls.FromString(data)
    with contextlib.suppress(MessageDecodeError):
        decode(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512))
def test_random_bytes_parse_or_raise_decode_error(data):
    _parse_everywhere(data)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_messages_parse_or_raise_decode_error(data):
    _parse_everywhere(data)
