"""RunAgent's pipeline contract on the DirectRunner: every output is coded by protobuf or bytes
coders, traces form one tree per activation, dead letters in batch sit beside real work, int64
time saturates, and an answer in another window resumes its suspension."""

from __future__ import annotations

import json
import re
import time

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import DebugOptions, PipelineOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

from beam_agents._protos import (
    AgentEnvelope,
    TraceEvent,
)
from beam_agents.intents.identity import intent_id
from beam_agents.intents.signing import Keyring
from beam_agents.ops.rounds import Advance, run_round
from beam_agents.runtime import AtDeadline, DeadlinePolicy, RunAgent, RuntimeConfig, agent
from beam_agents.testing.probe import (
    CHARGED_TWICE,
    FAR,
    KEY,
    SEQ,
    T0,
    command,
    event,
    export,
    probe,
    result,
    run_agent,
)
from beam_agents.wire.beam_support import NO_PRISM_SPLITS

_PROTO_CODERS = {"ProtoCoder", "DeterministicProtoCoder"}


def _coder_names(components, coder_id: str) -> set[str]:
    """The URN, or for Python-only coders the class name, of a coder and its components."""
    coder = components.coders[coder_id]
    name = coder.spec.urn
    if name == "beam:coder:pickled_python:v1":
        name = re.search(rb"(\w+)\$", coder.spec.payload).group(1).decode()
    names = {name}
    for component in coder.component_coder_ids:
        names |= _coder_names(components, component)
    return names


def test_every_output_is_coded_by_protobuf_or_bytes_coders_never_pickle():
    pipeline = beam.Pipeline()
    _ = (
        pipeline
        | beam.Create([event(T0, CHARGED_TWICE).SerializeToString()])
        | "RunAgent" >> (run_agent())
    )
    proto = pipeline.to_runner_api()
    components = proto.components
    (transform,) = [t for t in components.transforms.values() if t.unique_name == "RunAgent"]
    assert set(transform.outputs) == {"completions", "intents", "traces", "errors", "snapshots"}
    allowed = _PROTO_CODERS | {
        "beam:coder:bytes:v1",
        "beam:coder:kv:v1",
        "beam:coder:length_prefix:v1",
    }
    for tag, pcollection_id in transform.outputs.items():
        names = _coder_names(components, components.pcollections[pcollection_id].coder_id)
        assert names <= allowed, (tag, names)
        assert names & (_PROTO_CODERS | {"beam:coder:bytes:v1"}), tag


def test_traces_form_one_tree_per_activation_and_a_resume_continues_its_trace(tmp_path):
    outputs = run_round(
        probe(),
        [
            command(T0, calls=["a.tool"], llm="hi", deadline_ms=FAR),
            Advance(T0 + 1),
            result(T0 + 5, intent_id(KEY, SEQ, 0)),
            Advance(T0 + 6),
        ],
        tmp_path,
    ).before(T0 + 6)
    traces = outputs.values("traces")
    assert [TraceEvent.EventType.Name(t.event_type) for t in traces] == [
        "ACTIVATION_START",
        "LLM_CALL",
        "INTENT_EMITTED",
        "SUSPENDED",
        "ACTIVATION_END",
        "ACTIVATION_START",
        "ACTIVATION_END",
    ]
    assert {len(t.trace_id) for t in traces} == {16} and len({t.trace_id for t in traces}) == 1
    assert {len(t.span_id) for t in traces} == {8}
    first, resumed = traces[0], traces[5]
    assert first.parent_span_id == b"" and resumed.parent_span_id == first.span_id
    for child in traces[1:4]:
        assert child.parent_span_id == first.span_id and child.span_id != first.span_id
    assert traces[4].span_id == first.span_id and traces[6].span_id == resumed.span_id
    llm = traces[1]
    assert llm.attributes["gen_ai.request.model"] == "probe-model"
    assert llm.attributes["gen_ai.operation.name"] == "chat"
    assert traces[2].attributes["beam_agents.intent_id"] == intent_id(KEY, SEQ, 0)


def test_in_batch_undecodable_and_empty_envelopes_are_dead_letters_beside_real_work():
    pipeline = BeamPipeline(runner="DirectRunner")
    outputs = (
        pipeline
        | beam.Create(
            [
                command(T0, put={"a": "1"}).SerializeToString(),
                AgentEnvelope(entity_key=b"c-9", event_time_ms=T0).SerializeToString(),
                b"\xff\xff not an envelope",
            ],
            reshuffle=False,
        )
        | probe()
    )
    assert_that(outputs["completions"], equal_to([(KEY, b"done")]), label="completions")
    assert_that(
        outputs["errors"] | beam.Map(lambda kv: (kv[0], kv[1].reason)),
        equal_to([(b"c-9", "empty_envelope"), (b"", "undecodable_envelope")]),
        label="errors",
    )
    pipeline.run().wait_until_finish()


def test_a_dead_letter_travels_in_an_envelope_as_deterministicmessage_bytes():
    from beam_agents._protos import ActivationErrorRecord
    from beam_agents.runtime.dead_letters import REASONS, error_record, to_envelope

    record = error_record(KEY, "agent_raised", "boom \ud800", T0)
    envelope = to_envelope(record)
    assert (envelope.entity_key, envelope.event_time_ms) == (KEY, T0)
    assert ActivationErrorRecord.FromString(envelope.external_event) == record
    assert envelope.external_event == record.SerializeToString(deterministic=True)
    assert "agent_raised" in REASONS and record.detail == "boom \\ud800"


def test_an_event_at_the_end_of_int64_time_suspends_with_saturated_times():
    pipeline = BeamPipeline(runner="DirectRunner")
    outputs = (
        pipeline
        | beam.Create([command(2**63 - 1, calls=["a.tool"]).SerializeToString()], reshuffle=False)
        | probe()
    )
    assert_that(
        outputs["intents"] | beam.Map(lambda kv: (kv[1].tool_name, kv[1].expires_at_ms)),
        equal_to([("a.tool", 2**63 - 1)]),
        label="intents",
    )
    assert_that(outputs["errors"], equal_to([]), label="no errors")
    pipeline.run().wait_until_finish()


class _InFixedWindows(beam.PTransform):
    """RunAgent behind a one-second fixed windowing: every input in a window of its own."""

    def __init__(self, transform):
        super().__init__()
        self._transform = transform

    def expand(self, inputs):
        windowed = {
            name: pcollection | f"Window{name}" >> beam.WindowInto(window.FixedWindows(1))
            for name, pcollection in inputs.items()
        }
        return windowed | self._transform


def test_an_answer_in_another_window_than_its_suspension_resumes_it(tmp_path):
    outputs = run_round(
        _InFixedWindows(probe()),
        [
            command(T0, calls=["a.tool"], deadline_ms=FAR),
            Advance(T0 + 10),
            result(T0 + 5000, intent_id(KEY, SEQ, 0)),
            Advance(T0 + 6000),
        ],
        tmp_path,
    ).before(T0 + 6000)
    assert outputs.errors == []
    (done,) = outputs.values("completions")
    assert json.loads(done) == [["a.tool", "OK"], ["escalations", 0]]


@agent(name="test.slow_count/v1")
def slow_count(ctx, data: bytes) -> bytes:
    """Counts its activations in memory, each taking half a second."""
    count = int(ctx.memory.get("count", b"0")) + 1
    time.sleep(0.5)
    ctx.memory.put("count", b"%d" % count)
    return b"%d" % count


def test_two_events_of_a_key_behind_a_slow_activation_each_start_from_the_one_before(tmp_path):
    # On Prism, a bundle that makes no progress for two 100 ms ticks is split and its keys
    # freed before it commits; without keep_each_key_in_one_bundle both activations started
    # from empty state (completions 1 and 1, memory 1).
    outputs = run_round(
        RunAgent(slow_count),
        [event(T0, b"a"), event(T0 + 1, b"b"), Advance(T0 + 5), export(T0 + 10, "end")],
        tmp_path,
    )
    assert sorted(outputs.values("completions")) == [b"1", b"2"]
    (snapshot,) = outputs.values("snapshots")
    assert {e.key: e.value for e in snapshot.memory.entries} == {"count": b"2"}


def test_run_agent_turns_prisms_bundle_splits_off_in_its_pipeline():
    pipeline = beam.Pipeline(options=PipelineOptions())
    _ = pipeline | beam.Create([b""]) | RunAgent(slow_count)
    assert NO_PRISM_SPLITS in pipeline.options.view_as(DebugOptions).experiments


def test_a_watermark_jump_on_the_fnapirunner_dead_letters_nothing_for_timers_that_change_nothing():
    # At the end of a batch the watermark jumps past every timer; the FnApiRunner often fires a
    # key's TTL timer first, which runs the due suspension (an escalation moves its deadline),
    # then the deadline timer set for the old due time. That firing changes nothing: counted,
    # never a dead letter (it was three `stale_timer` records in every run).
    policy = DeadlinePolicy(AtDeadline.ESCALATE, max_escalations=3, extension_ms=1000)
    config = RuntimeConfig(
        deadline_policy=policy, suspend_deadline_ms=1000, intent_ttl_ms=1000, ttl_ms=1000
    )
    # Which timer fires first varies per run and with the key's clock, so a run may fire no
    # stale timer at all; each run must leave no dead letter whichever order it took
    # (machine_deadlines_test fires the stale timer itself, deterministically).
    for _ in range(5):
        pipeline = beam.Pipeline(options=PipelineOptions(["--runner=FnApiRunner"]))
        outputs = (
            pipeline
            | beam.Create([command(T0, calls=["a.tool"]).SerializeToString()])
            | probe(config)
        )
        assert_that(outputs["errors"], equal_to([]), label="NoDeadLetters")
        assert_that(
            outputs["completions"] | beam.Values(),
            equal_to([b'[["a.tool", "EXPIRED"], ["escalations", 3]]']),
            label="Completed",
        )
        pipeline.run().wait_until_finish()


@pytest.mark.parametrize("option", ["keyring_loader", "result_keyring_loader"])
def test_a_keyring_given_where_a_loader_is_wanted_names_the_loader_it_wants(option):
    ring = Keyring({"k-1": bytes(32)}, active="k-1")
    with pytest.raises(TypeError, match=rf"{option} takes a function the workers call"):
        RunAgent(slow_count, **{option: ring})
