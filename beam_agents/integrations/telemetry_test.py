"""TraceEvents from real RunAgent runs as OpenTelemetry spans: in memory, over OTLP/HTTP to a
receiver on 127.0.0.1, from a pipeline sink and from a file."""

from __future__ import annotations

import functools
import subprocess
import sys

import apache_beam as beam
import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes
from opentelemetry.trace import StatusCode

from beam_agents._protos import AgentEnvelope, TraceEvent
from beam_agents.integrations.telemetry import ExportTraces, to_spans, write_trace_file
from beam_agents.intents.identity import intent_id
from beam_agents.ops.rounds import Advance, run_round
from beam_agents.runtime import TRACES, RunAgent, ScriptedLlmClient, agent
from beam_agents.testing.local_http import LocalHttpServer, Reply

T0, KEY = 1_764_460_800_000, b"k-1"


@agent(name="tests.ask_then_look_up/v1")
def ask_then_look_up(ctx, event: bytes) -> bytes:
    reply = ctx.llm([{"role": "user", "content": event.decode()}], model="small-model")
    found = ctx.call_tool("kb.search", {"q": reply.text})
    if found.payload == b"boom":
        raise RuntimeError("boom")
    return found.payload


def _model():
    return ScriptedLlmClient(lambda request: "terms")


def _script(payload: bytes = b"found"):
    answer = AgentEnvelope(entity_key=KEY, event_time_ms=T0 + 10)
    answer.tool_result.intent_id = intent_id(KEY, T0 * 1000, 0)
    answer.tool_result.payload = payload
    event = AgentEnvelope(entity_key=KEY, event_time_ms=T0, external_event=b"question")
    return [event, Advance(T0 + 1), answer, Advance(T0 + 20)]


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> list[TraceEvent]:
    outputs = run_round(
        RunAgent(ask_then_look_up, llm_client=_model()), _script(), tmp_path_factory.mktemp("round")
    )
    return outputs.before(T0 + 20).values(TRACES)


def test_spans_keep_the_trace_and_span_ids_and_the_parent_links(traces):
    exporter = InMemorySpanExporter()
    exporter.export(to_spans(traces))
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == [
        "invoke_agent tests.ask_then_look_up/v1",
        "chat small-model",
        "intent kb.search",
        "suspended",
        "invoke_agent tests.ask_then_look_up/v1",
        "chat small-model",
    ]
    by_id = {event.span_id: event for event in traces}
    for span in spans:
        event = by_id[span.context.span_id.to_bytes(8, "big")]
        assert span.context.trace_id.to_bytes(16, "big") == event.trace_id
        parent = span.parent.span_id.to_bytes(8, "big") if span.parent else b""
        assert parent == event.parent_span_id
    first, resumed = spans[0], spans[4]
    assert first.parent is None and resumed.parent.span_id == first.context.span_id
    assert all(s.parent.span_id == first.context.span_id for s in spans[1:4])
    assert spans[5].parent.span_id == resumed.context.span_id
    assert spans[5].attributes["beam_agents.replayed"] == "true"
    chat = spans[1]
    assert chat.attributes["gen_ai.usage.input_tokens"] == 0  # integers, as the conventions say
    assert chat.attributes["gen_ai.request.model"] == "small-model"
    assert first.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert first.start_time == T0 * 1_000_000 and first.end_time >= first.start_time


def test_an_activations_start_and_end_in_two_batches_are_two_spans_none_dropped(traces):
    # The pipeline sink exports each bundle's events: an activation may straddle two.
    (end_at,) = [i for i, e in enumerate(traces) if e.event_type == TraceEvent.ACTIVATION_END][:1]
    before, after = traces[:end_at], traces[end_at:]
    whole = {s.context.span_id: s for s in to_spans(traces)}
    first, second = to_spans(before), to_spans(after)
    assert {s.context.span_id for s in first + second} == set(whole)
    (closing,) = [s for s in second if s.context.span_id == first[0].context.span_id]
    assert closing.name == "invoke_agent"  # the agent's name is the start's
    assert closing.end_time == whole[closing.context.span_id].end_time
    assert first[0].end_time == first[0].start_time  # its end is the other batch's


def test_an_event_type_this_binary_does_not_know_is_a_span_named_by_its_number(traces):
    newer = TraceEvent()
    newer.CopyFrom(traces[1])
    newer.event_type = 42
    (span,) = to_spans([newer])
    assert span.name == "event_42"


def test_the_runtime_writes_the_semantic_conventions_names(traces):
    names = {name for event in traces for name in event.attributes if name.startswith("gen_ai.")}
    conventions = {
        value
        for name, value in vars(gen_ai_attributes).items()
        if name.startswith("GEN_AI_") and isinstance(value, str)
    }
    assert names and names <= conventions


def test_a_failed_activation_is_an_error_span(tmp_path):
    outputs = run_round(
        RunAgent(ask_then_look_up, llm_client=_model()), _script(b"boom"), tmp_path
    ).before(T0 + 20)
    (error,) = [s for s in to_spans(outputs.values(TRACES)) if s.name == "error"]
    assert error.status.status_code is StatusCode.ERROR and error.status.description == (
        "RuntimeError"
    )


def _receiver():
    received = []

    def reply(request):
        received.append(ExportTraceServiceRequest.FromString(request.body))
        return Reply(200, b"", {"content-type": "application/x-protobuf"})

    return received, LocalHttpServer(reply)


def _exported_span_ids(received) -> list[bytes]:
    return [
        span.span_id
        for request in received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]


def test_spans_travel_over_otlp_http_to_a_receiver(traces):
    received, server = _receiver()
    with server:
        exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", timeout=10)
        exporter.export(to_spans(traces))
        exporter.shutdown()
    (request,) = received
    (resource,) = request.resource_spans
    attributes = {a.key: a.value.string_value for a in resource.resource.attributes}
    assert attributes["service.name"] == "beam_agents"
    spans = resource.scope_spans[0].spans
    assert {s.trace_id for s in spans} == {traces[0].trace_id}
    assert [s.name for s in spans][:2] == [
        "invoke_agent tests.ask_then_look_up/v1",
        "chat small-model",
    ]


def test_the_pipeline_sink_exports_every_span_of_a_run(tmp_path):
    received, server = _receiver()
    with server:
        factory = functools.partial(OTLPSpanExporter, endpoint=f"{server.url}/v1/traces")

        class WithSink(beam.PTransform):
            def expand(self, inputs):
                outputs = inputs | RunAgent(ask_then_look_up, llm_client=_model())
                outputs[TRACES] | ExportTraces(factory)
                return outputs

        outputs = run_round(WithSink(), _script(), tmp_path)
    emitted = {t.span_id for t in outputs.values(TRACES)}
    assert emitted and set(_exported_span_ids(received)) == emitted


def test_a_trace_file_exports_from_the_command_line(tmp_path, traces):
    path = tmp_path / "traces.binpb"
    write_trace_file(traces, path)
    received, server = _receiver()
    with server:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "beam_agents.ops.cli",
                "export-traces",
                str(path),
                "--endpoint",
                f"{server.url}/v1/traces",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 0, result.stderr
    assert (
        result.stdout.strip() == f"exported {len(to_spans(traces))} spans to {server.url}/v1/traces"
    )
    assert len(_exported_span_ids(received)) == len(to_spans(traces))
    broken = tmp_path / "broken.binpb"
    broken.write_bytes(b"\x80")
    result = subprocess.run(
        [sys.executable, "-m", "beam_agents.ops.cli", "export-traces", str(broken)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "not a trace file" in result.stderr
