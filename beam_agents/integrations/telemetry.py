"""TraceEvents as OpenTelemetry spans, with `opentelemetry-sdk` (the `beam-agents[otel]` extra).

RunAgent's TRACES output already carries W3C-width ids and a parent link per event; this module
turns them into SDK spans that any SpanExporter sends on (OTLP/HTTP to a collector, or the SDK's
in-memory exporter in tests), ids and parents preserved:

* an activation's ACTIVATION_START and ACTIVATION_END share its span id and become one span,
  `invoke_agent <agent>`, from the start's time to the end's (a resume is a child span of the
  activation that suspended, so one conversation is one trace);
* LLM_CALL becomes `chat <model>`, INTENT_EMITTED `intent <tool>`, SUSPENDED `suspended`, ERROR
  `error` with an error status; each is a child of its activation's span.

GenAI attribute names are the semantic conventions' (`opentelemetry-semantic-conventions`); the
runtime writes the same names as plain strings so that the Dataflow worker needs no OpenTelemetry
package, and a test holds the two together. Attribute values travel as strings in TraceEvent;
the token counts become integers here, as the conventions type them.

`ExportTraces(exporter_factory)` is the pipeline sink (one exporter per worker, spans exported at
the end of each bundle); `export_file(path, exporter)` sends a file of TraceEvents written by
`write_trace_file` (length-delimited protobuf), as `beam-agents export-traces FILE` does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence

import apache_beam as beam
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from beam_agents._protos import TraceEvent
from beam_agents.wire.fields import join_delimited, split_delimited

__all__ = [
    "SERVICE_NAME",
    "ExportTraces",
    "export_file",
    "read_trace_file",
    "to_spans",
    "write_trace_file",
]

SERVICE_NAME = "beam_agents"

#: Attributes the conventions type as integers; TraceEvent carries every value as a string.
_INTEGER_ATTRIBUTES = frozenset(
    {gen_ai.GEN_AI_USAGE_INPUT_TOKENS, gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS}
)
#: Attributes the conventions type as string arrays.
_ARRAY_ATTRIBUTES = frozenset({gen_ai.GEN_AI_RESPONSE_FINISH_REASONS})
_MS = 1_000_000  # nanoseconds
# The namespace operators' dashboards and alerts know the counter by: the module's old path.
_METRICS = "beam_agents.telemetry"


def _context(trace_id: bytes, span_id: bytes) -> SpanContext:
    return SpanContext(
        trace_id=int.from_bytes(trace_id, "big"),
        span_id=int.from_bytes(span_id, "big"),
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


def _attributes(event: TraceEvent) -> dict:
    attributes = {
        "beam_agents.entity_key": event.entity_key.decode("utf-8", "backslashreplace"),
        "beam_agents.seq": event.seq,
        "beam_agents.step_index": event.step_index,
    }
    for name, value in event.attributes.items():
        if name in _INTEGER_ATTRIBUTES and value.lstrip("-").isdigit():
            attributes[name] = int(value)
        elif name in _ARRAY_ATTRIBUTES:
            attributes[name] = value.split(",")
        else:
            attributes[name] = value
    return attributes


def _name(event: TraceEvent) -> str:
    a = event.attributes
    if event.event_type == TraceEvent.LLM_CALL:
        operation = a.get(gen_ai.GEN_AI_OPERATION_NAME, "chat")
        return f"{operation} {a.get(gen_ai.GEN_AI_REQUEST_MODEL, '')}"
    if event.event_type == TraceEvent.INTENT_EMITTED:
        return f"intent {a.get(gen_ai.GEN_AI_TOOL_NAME, '')}"
    if event.event_type in (TraceEvent.ACTIVATION_START, TraceEvent.ACTIVATION_END):
        # An end carries no agent name: alone, it names the operation only.
        return f"invoke_agent {a.get(gen_ai.GEN_AI_AGENT_NAME, '')}".rstrip()
    if event.event_type not in TraceEvent.EventType.values():
        return f"event_{event.event_type}"  # a newer runtime's: its number, never an error
    return TraceEvent.EventType.Name(event.event_type).lower()


def to_spans(events: Iterable[TraceEvent], resource: Resource | None = None) -> list[ReadableSpan]:
    """Spans of the events, in the order their spans first appear; an ACTIVATION_END merges
    into its ACTIVATION_START's span, or without it among `events` is a span of its own, last."""
    resource = resource or Resource.create({"service.name": SERVICE_NAME})
    starts: dict[bytes, TraceEvent] = {}
    ends: dict[bytes, TraceEvent] = {}
    order: list[TraceEvent] = []
    for event in events:
        if event.event_type == TraceEvent.ACTIVATION_START:
            starts[event.span_id] = event
            order.append(event)
        elif event.event_type == TraceEvent.ACTIVATION_END:
            ends[event.span_id] = event
        else:
            order.append(event)
    # An end whose start is not among `events` (another bundle's) is a span of its own.
    order += [end for span_id, end in ends.items() if span_id not in starts]
    spans = []
    for event in order:
        end = ends.get(event.span_id) if event.event_type == TraceEvent.ACTIVATION_START else event
        attributes = _attributes(event)
        if end is not None and end is not event:
            attributes.update(_attributes(end))
        failed = event.event_type == TraceEvent.ERROR
        spans.append(
            ReadableSpan(
                name=_name(event),
                context=_context(event.trace_id, event.span_id),
                parent=(
                    _context(event.trace_id, event.parent_span_id) if event.parent_span_id else None
                ),
                resource=resource,
                attributes=attributes,
                kind=SpanKind.INTERNAL,
                status=Status(StatusCode.ERROR, event.attributes.get(error_attributes.ERROR_TYPE))
                if failed
                else Status(StatusCode.UNSET),
                start_time=event.start_ms * _MS,
                end_time=(end.end_ms if end is not None else event.start_ms) * _MS,
            )
        )
    return spans


class _Export(beam.DoFn):
    def __init__(self, exporter_factory: Callable[[], SpanExporter]) -> None:
        self._factory = exporter_factory
        self._exporter: SpanExporter | None = None
        self._events: list[TraceEvent] = []
        self._failed = beam.metrics.Metrics.counter(_METRICS, "failed_exports")

    def setup(self) -> None:
        self._exporter = self._factory()

    def start_bundle(self) -> None:
        self._events = []

    def process(self, element) -> None:
        _, event = element
        self._events.append(event)

    def finish_bundle(self) -> None:
        # An activation's start and end may fall in different bundles: each then becomes a
        # span of its own bundle under the same span id, the end's with its time and outcome
        # but not the start's attributes (`to_spans`). Telemetry
        # is best effort; a failed export is counted, never a failed bundle.
        if (
            self._events
            and self._exporter.export(to_spans(self._events)) != SpanExportResult.SUCCESS
        ):
            self._failed.inc()
        self._events = []

    def teardown(self) -> None:
        if self._exporter is not None:
            self._exporter.shutdown()


class ExportTraces(beam.PTransform):
    """A sink for RunAgent's TRACES output: (entity_key, TraceEvent) in, spans out through the
    SpanExporter `exporter_factory` makes on each worker."""

    def __init__(self, exporter_factory: Callable[[], SpanExporter]) -> None:
        super().__init__()
        self._factory = exporter_factory

    def expand(self, traces):
        return traces | "ExportSpans" >> beam.ParDo(_Export(self._factory))


def write_trace_file(events: Sequence[TraceEvent], path: str | os.PathLike) -> None:
    with open(path, "wb") as out:
        out.write(join_delimited(events))


def read_trace_file(path: str | os.PathLike) -> list[TraceEvent]:
    """TraceEvents of a file `write_trace_file` wrote. Raises ValueError on malformed bytes."""
    with open(path, "rb") as source:
        return [TraceEvent.FromString(data) for data in split_delimited(source.read())]


def export_file(path: str | os.PathLike, exporter: SpanExporter) -> int:
    """Exports the spans of a trace file; returns how many."""
    spans = to_spans(read_trace_file(path))
    if spans and exporter.export(spans) != SpanExportResult.SUCCESS:
        raise OSError(f"the span exporter refused {len(spans)} spans")
    return len(spans)
