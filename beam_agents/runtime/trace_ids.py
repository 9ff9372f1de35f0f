"""Trace and span ids of an activation's TraceEvents (`context.ActivationContext` stamps them).

Each id is a pure function of the key, the activation's seq and the span's place (its step, a
model call's position), never of the wall clock or a random source, so a retried bundle emits
byte-identical traces and a resume joins the trace of the activation it resumes. Sizes are W3C
trace-context's (16-byte trace ids, 8-byte span ids), and never all zeros.
"""

from __future__ import annotations

import hashlib

__all__ = ["span_id", "trace_id"]


def trace_id(entity_key: bytes, seq: int) -> bytes:
    """The 16-byte trace id of activation `seq` of a key (its resumes share it)."""
    return _id(16, "trace", entity_key.hex(), seq)


def span_id(entity_key: bytes, seq: int, *path: object) -> bytes:
    """An 8-byte span id, a pure function of the key, seq and the span's place."""
    return _id(8, "span", entity_key.hex(), seq, *path)


def _id(size: int, *parts: object) -> bytes:
    digest = hashlib.sha256("|".join(map(str, parts)).encode("utf-8")).digest()[:size]
    # W3C trace-context forbids all-zero ids.
    return digest if any(digest) else digest[:-1] + b"\x01"
