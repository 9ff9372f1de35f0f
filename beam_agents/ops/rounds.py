"""Scripted rounds: run RunAgent in a real Beam pipeline and read back everything it emitted,
on a clock the script sets. The demo, `beam-agents replay` and the tests drive RunAgent this
way.

A pipeline cannot loop, so a script runs rounds: the inputs (envelopes, snapshots to restore,
watermark advances) in order, on a TestStream in streaming mode, inputs for distinct keys
between two advances in one event (one bundle, not a bundle each). `run_round` applies a
transform (RunAgent, or a composite around it) to {"envelopes", "snapshots"}, runs it on the
DirectRunner (or what `options` name) and returns every keyed output of the transform with its
element timestamp, read back from files a sink wrote (DoFns run on copies, so nothing
in-process could collect them); `Outputs.before(ms)` keeps what happened before a given event
time.

A round does not invent time. A bounded run ends by advancing the watermark to infinity, which
fires every event-time timer still set: a suspension's deadline would expire its calls, resume
the agent, call the model and run tools at a time the script never reached. So the round ends
at its clock (its last Advance, or its latest input if later): there every key of the script is
exported and released (`StateExportRequest.release`), which clears the key in this pipeline,
timers included, and the snapshots are `Outputs.carried`, the keys' state for the next round to
restore. Nothing happens after the clock.

    outputs = run_round(RunAgent(agent), [snapshot, envelope, Advance(ms), ...], tmp_path)
    later = run_round(RunAgent(agent), [*outputs.carried.values(), answer, ...], tmp_path)

Without `options`, the pipeline options come from $BEAM_AGENTS_PIPELINE_OPTIONS (shell words,
e.g. "--runner=PrismRunner --prism_location=PATH"): one variable runs a whole test suite on
another runner, and nothing in beam_agents knows which runner runs it.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import shlex
from collections.abc import Sequence
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms import window

from beam_agents._protos import AgentEnvelope, StateSnapshot
from beam_agents.ops import prism
from beam_agents.wire.decoding import message_type

__all__ = ["OPTIONS_ENV", "Advance", "ManualClock", "Outputs", "env_options", "run_round"]

OPTIONS_ENV = "BEAM_AGENTS_PIPELINE_OPTIONS"

_ENVELOPE, _SNAPSHOT = b"E", b"S"
#: The request id of the exports that end a round (`Outputs.carried`).
_END_OF_ROUND = "run_round:end"
_round_numbers = itertools.count()


def env_options() -> PipelineOptions:
    """The pipeline options $BEAM_AGENTS_PIPELINE_OPTIONS gives (none: the DirectRunner), for
    any test's pipeline that should run on whichever runner the suite runs on. The PrismRunner
    without `--prism_location` is the Prism `tools/engines.sh` built (`with_local_prism`), or
    PrismNotFoundError saying how to get it: Beam never downloads one."""
    return prism.with_local_prism(PipelineOptions(shlex.split(os.environ.get(OPTIONS_ENV, ""))))


@dataclasses.dataclass(frozen=True)
class Advance:
    """Advance the input watermark to this event time (ms)."""

    to_ms: int


@dataclasses.dataclass
class Outputs:
    """What the transform emitted, per output tag, as (timestamp_ms, key, value) rows in
    emission order per key; values are messages, or bytes for bytes outputs."""

    rows: dict[str, list[tuple[int, bytes, object]]]
    #: Each key's StateSnapshot at the round's end, released there: what the next round restores.
    carried: dict[bytes, StateSnapshot] = dataclasses.field(default_factory=dict)

    def __getattr__(self, tag: str) -> list[tuple[int, bytes, object]]:
        if tag.startswith("_"):
            raise AttributeError(tag)
        return self.rows.get(tag, [])

    def before(self, ms: int) -> Outputs:
        """Only what was emitted for elements or timers earlier than event time `ms`."""
        return Outputs(
            {tag: [r for r in rows if r[0] < ms] for tag, rows in self.rows.items()}, self.carried
        )

    def values(self, tag: str) -> list:
        return [value for _, _, value in self.rows.get(tag, [])]


class _Split(beam.DoFn):
    def process(self, element: bytes):
        if element[:1] == _SNAPSHOT:
            yield beam.pvalue.TaggedOutput("snapshots", element[1:])
        else:
            yield element[1:]


class _AppendLines(beam.DoFn):
    """A real sink: one line per element, appended to a file (picklable, process-safe)."""

    def __init__(self, path: str) -> None:
        self._path = path

    def process(self, element, timestamp=beam.DoFn.TimestampParam):
        key, value = element
        if isinstance(value, bytes):
            kind, data = "bytes", value
        else:
            kind, data = value.DESCRIPTOR.full_name, value.SerializeToString(deterministic=True)
        with open(self._path, "a") as sink:
            sink.write(f"{timestamp.micros // 1000} {key.hex()} {kind} {data.hex()}\n")


def run_round(
    transform: beam.PTransform,
    inputs: Sequence[AgentEnvelope | StateSnapshot | Advance],
    workdir: str | os.PathLike,
    *,
    options: PipelineOptions | None = None,
) -> Outputs:
    """Runs `transform` (a RunAgent) over the scripted inputs; returns what it emitted."""
    folder = Path(workdir) / f"round-{next(_round_numbers)}"
    folder.mkdir(parents=True)
    stream = TestStream(coder=beam.coders.BytesCoder())
    for batch in _batches([*inputs, *_end_of_round(inputs)]):
        if isinstance(batch, Advance):
            stream = stream.advance_watermark_to(batch.to_ms / 1000)
            continue
        elements = []
        for item in batch:
            tag = _SNAPSHOT if isinstance(item, StateSnapshot) else _ENVELOPE
            at = item.snapshot_at_ms if isinstance(item, StateSnapshot) else item.event_time_ms
            data = tag + item.SerializeToString(deterministic=True)
            elements.append(window.TimestampedValue(data, at / 1000))
        stream = stream.add_elements(elements)
    if options is None:
        options = env_options()
    options.view_as(StandardOptions).streaming = True
    with prism.pipeline(options) as pipeline:
        split = (
            pipeline
            | stream.advance_watermark_to_infinity()
            | beam.ParDo(_Split()).with_outputs("snapshots", main="envelopes")
        )
        outputs = {"envelopes": split.envelopes, "snapshots": split.snapshots} | transform
        for tag, pcollection in outputs.items():
            pcollection | f"Write{tag}" >> beam.ParDo(_AppendLines(str(folder / tag)))
    rows = {tag: _read(folder / tag) for tag in outputs}
    carried = {}
    for tag, tagged in rows.items():
        ended = [r for r in tagged if getattr(r[2], "request_id", None) == _END_OF_ROUND]
        if ended:
            rows[tag] = [r for r in tagged if r not in ended]
            carried.update((key, snapshot) for _, key, snapshot in ended)
    return Outputs(rows, carried)


def _batches(items: Sequence[AgentEnvelope | StateSnapshot | Advance]) -> list:
    """The script as TestStream events: each Advance, and runs of inputs for distinct keys.

    A runner takes one event's elements as one bundle (a bundle per input made a round of
    1,000 keys a few minutes long), and may take a bundle's elements in any order: two inputs
    for one key go in separate events, so the key still takes them in the script's order.
    """
    batches: list = []
    keys: set[bytes] = set()
    for item in items:
        if isinstance(item, Advance):
            batches.append(item)
            continue
        if not batches or isinstance(batches[-1], Advance) or item.entity_key in keys:
            batches.append([])
            keys = set()
        batches[-1].append(item)
        keys.add(item.entity_key)
    return batches


def _end_of_round(inputs: Sequence[AgentEnvelope | StateSnapshot | Advance]) -> list:
    """What ends a round at its clock: a watermark advance to it, when the script's last
    advance is earlier (so every input is taken before the exports, whatever order a runner
    takes a key's inputs in), and a releasing export of every key of the script."""
    times = [
        item.to_ms
        if isinstance(item, Advance)
        else item.snapshot_at_ms
        if isinstance(item, StateSnapshot)
        else item.event_time_ms
        for item in inputs
    ]
    if not times:
        return []
    clock = max(times)
    advances = [item.to_ms for item in inputs if isinstance(item, Advance)]
    ending: list = [] if advances and advances[-1] >= clock else [Advance(clock)]
    keys = dict.fromkeys(item.entity_key for item in inputs if not isinstance(item, Advance))
    for key in filter(None, keys):  # a keyless input is a dead letter, with no state to carry
        export = AgentEnvelope(entity_key=key, event_time_ms=clock)
        export.export_request.request_id = _END_OF_ROUND
        export.export_request.release = True
        ending.append(export)
    return ending


def _read(path: Path) -> list:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        at, key, kind, data = line.split(" ")
        value = bytes.fromhex(data)
        if kind != "bytes":
            value = message_type(kind).FromString(value)
        rows.append((int(at), bytes.fromhex(key), value))
    return rows


class ManualClock:
    """A clock (`Callable[[], int]`, ms) that returns `now_ms` until told otherwise, for
    anything that takes `clock=`; picklable, so Beam DoFns can carry it."""

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms

    def advance(self, ms: int) -> None:
        self.now_ms += ms
