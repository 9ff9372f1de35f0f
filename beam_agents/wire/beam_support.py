"""Small Beam helpers shared by the effector, the runtime transforms and the launchers."""

from __future__ import annotations

from apache_beam.coders import Coder
from apache_beam.options.pipeline_options import DebugOptions
from apache_beam.transforms import window
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Timestamp

__all__ = [
    "NO_PRISM_SPLITS",
    "HexLinesCoder",
    "keep_each_key_in_one_bundle",
    "timer_timestamp",
    "typed",
]

#: Prism (Beam 2.77; also what the DirectRunner hands every pipeline Prism supports, whenever
#: the Prism binary can be fetched) splits a bundle that makes no progress for two of its
#: 100 ms ticks, and frees the split-off elements' keys before the first part has committed
#: its state. A stateful DoFn then runs one key in two bundles at once, each from the state
#: before both: an activation's memory writes are lost, a copy of an intent runs its tool
#: again. This experiment turns the splitting off; other runners do not read it.
NO_PRISM_SPLITS = "prism_disable_sdf_split"

_LATEST_MICROS = window.GlobalWindow().max_timestamp().micros


def timer_timestamp(ms: int) -> Timestamp:
    """An event-time timer's firing time for any int64 of milliseconds, clamped into what a
    global-window timer can hold."""
    return Timestamp(micros=max(MIN_TIMESTAMP.micros, min(ms * 1000, _LATEST_MICROS)))


def keep_each_key_in_one_bundle(pipeline) -> None:
    """Adds NO_PRISM_SPLITS to `pipeline`'s experiments: the keyed transforms call it as they
    expand, so a pipeline that holds them keeps each key in one bundle on any runner its
    options pick, the DirectRunner's choice of Prism included."""
    pipeline.options.view_as(DebugOptions).add_experiment(NO_PRISM_SPLITS)


def typed(pcollection, element_type):
    """`pcollection` with a declared element type. Multi-output ParDos leave tagged outputs
    untyped, and an untyped PCollection of protos would be pickled between stages; a declared
    type gives Tuple(Bytes/StrUtf8, ProtoCoder)."""
    pcollection.element_type = element_type
    return pcollection


class HexLinesCoder(Coder):
    """Serialized messages as text lines of hex, for Beam's text sinks and sources (which split
    on newlines, and need no compression library as TFRecord's checksums do)."""

    def encode(self, value: bytes) -> bytes:
        return value.hex().encode()

    def decode(self, encoded: bytes) -> bytes:
        return bytes.fromhex(encoded.decode())

    def is_deterministic(self) -> bool:
        return True
