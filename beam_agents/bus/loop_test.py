"""AgentLoop's read step without a broker: records as ReadFromKafka gives them, through the
loop's own DoFn and RunAgent."""

from __future__ import annotations

import logging
import subprocess

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from beam_agents._protos import AgentEnvelope
from beam_agents.bus.loop import FlinkCheckpointOptions, _RecordValues
from beam_agents.ops.rounds import env_options
from beam_agents.runtime import COMPLETIONS, RunAgent, agent
from tools.workspace import data_root


def test_a_producers_idempotency_header_drops_a_second_copy_through_the_loops_read_path():
    """Records as ReadFromKafka gives them with their metadata, through the loop's own read
    step and RunAgent: a copy re-sent with the same idempotency header runs once, though its
    bytes (a re-stamped time) differ; a record without the header still runs."""

    @agent(name="tests.echo/v1")
    def echo(ctx, event: bytes) -> bytes:
        return b"echo " + event

    def record(at: int, data: bytes, key: bytes | None):
        value = AgentEnvelope(entity_key=b"c-1", event_time_ms=at, external_event=data)
        headers = [] if key is None else [beam.Row(key="idempotency-key", value=key)]
        return beam.Row(key=b"c-1", value=value.SerializeToString(), headers=headers)

    with beam.Pipeline(options=env_options()) as pipeline:
        values = (
            pipeline
            | beam.Create(
                [
                    record(1, b"refund 42", b"order-42"),
                    record(2, b"refund 42", b"order-42"),
                    record(3, b"other", None),
                ],
                reshuffle=False,
            )
            | beam.ParDo(_RecordValues("idempotency-key")).with_outputs("errors", main="values")
        )
        outputs = values.values | RunAgent(echo)
        assert_that(
            outputs[COMPLETIONS] | beam.Values(), equal_to([b"echo refund 42", b"echo other"])
        )


def test_the_engines_flink_options_parse_without_a_warning(caplog):
    engines = data_root() / "tools" / "engines.sh"
    flags = subprocess.run(
        ["bash", str(engines), "flink-options"], check=True, capture_output=True, text=True
    ).stdout.split()
    with caplog.at_level(logging.WARNING):
        options = PipelineOptions(flags)
        parsed = options.get_all_options(retain_unknown_options=True, display_warnings=True)
    assert not [r for r in caplog.records if "Unparseable" in r.getMessage()]
    assert parsed["finish_bundle_before_checkpointing"] is True
    assert parsed["checkpointing_interval"] == 10_000
    view = PipelineOptions([*flags, "--finish_bundle_before_checkpointing=false"])
    assert view.view_as(FlinkCheckpointOptions).finish_bundle_before_checkpointing is False
