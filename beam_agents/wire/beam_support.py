"""Small Beam helpers shared by the effector and the runtime transforms."""

from __future__ import annotations

from apache_beam.transforms import window
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Timestamp

__all__ = ["timer_timestamp", "typed"]

_LATEST_MICROS = window.GlobalWindow().max_timestamp().micros


def timer_timestamp(ms: int) -> Timestamp:
    """An event-time timer's firing time for any int64 of milliseconds, clamped into what a
    global-window timer can hold."""
    return Timestamp(micros=max(MIN_TIMESTAMP.micros, min(ms * 1000, _LATEST_MICROS)))


def typed(pcollection, element_type):
    """`pcollection` with a declared element type. Multi-output ParDos leave tagged outputs
    untyped, and an untyped PCollection of protos would be pickled between stages; a declared
    type gives Tuple(Bytes/StrUtf8, ProtoCoder)."""
    pcollection.element_type = element_type
    return pcollection
