"""`AgentLoop`, the pipeline half of the loop: the events topic read with Beam's cross-language
ReadFromKafka, RunAgent, and each output written to its topic with WriteToKafka.

Its transform names (ReadEvents, Envelopes, RunAgent, DeadLetters, <Output>Records,
Write<Output>) and the DoFn class names in them are part of a running job's graph: a savepoint
restore or `--update` matches them.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.io.kafka import ReadFromKafka, WriteToKafka
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.typehints import Tuple

from beam_agents._protos import ActivationErrorRecord
from beam_agents.bus.records import record_value
from beam_agents.bus.topics import Topics
from beam_agents.runtime import ERRORS, RunAgent
from beam_agents.runtime.dead_letters import UNDECODABLE, error_record
from beam_agents.wire.beam_support import typed

__all__ = ["AgentLoop", "FlinkCheckpointOptions"]


class FlinkCheckpointOptions(PipelineOptions):
    """`--checkpointing_interval` (ms) and `--finish_bundle_before_checkpointing`, read by
    Beam's Flink runner on the job server. Python's own options do not declare them, so
    without this class Beam warns `Unparseable argument` for options that work."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument(
            "--checkpointing_interval",
            type=int,
            default=None,
            help="Flink checkpoint interval in milliseconds (Beam's Flink runner)",
        )
        parser.add_argument(
            "--finish_bundle_before_checkpointing",
            type=_flag,
            nargs="?",
            const=True,
            default=None,
            help="finish each bundle before a checkpoint barrier passes (Beam's Flink runner): "
            "without it the outputs of a bundle a checkpoint finished wait for the next input",
        )


def _flag(value: str) -> bool:
    """`--flag`, `--flag=true` or `--flag=false`, as Beam's Java options read a boolean."""
    if value.lower() not in ("true", "false"):
        raise ValueError(f"not a boolean: {value!r}")
    return value.lower() == "true"


class _RecordValues(beam.DoFn):
    """A Kafka record's value, the bytes of an envelope; a record with no value (a tombstone,
    which Kafka's compaction uses) is a dead letter, never a failed bundle. With
    `idempotency_header`, records come with their metadata (a Row with key, value and headers)
    and each value leaves paired with that header's bytes (b"" where the record has none): the
    producer's idempotency key, by which RunAgent drops a second copy of an event."""

    def __init__(self, idempotency_header: str | None = None) -> None:
        self._header = idempotency_header

    def process(self, record, timestamp=beam.DoFn.TimestampParam):
        if self._header is None:
            key, value = record
        else:
            key, value = record.key, record.value
        if value is not None:
            if self._header is None:
                yield value
            else:
                headers = [h.value for h in (record.headers or ()) if h.key == self._header]
                yield (value, bytes(headers[-1] or b"") if headers else b"")
            return
        detail = f"a record with no value (a tombstone, key {bytes(key or b'')[:64]!r})"
        letter = error_record(b"", UNDECODABLE, detail, timestamp.micros // 1000)
        yield beam.pvalue.TaggedOutput(ERRORS, (b"", letter))


class _ToRecord(beam.DoFn):
    """(entity_key, RunAgent output value) as a Kafka record's (key, value)."""

    def process(self, element):
        key, value = element
        yield (key, record_value(value))


class AgentLoop(beam.PTransform):
    """Applied to a pipeline: reads the events topic, runs `agent` with RunAgent, and writes its
    five outputs to their topics. `run_agent` takes RunAgent's keyword arguments.

    `idempotency_header` names a record header a producer sets to its own idempotency key for
    an event; RunAgent then drops a second copy of the event carrying the same key even if its
    bytes differ (copies with the same time and bytes are dropped without it). Setting it reads
    the topic with its metadata, which changes the read's output type: choose it before the
    first launch, since `--update` or a savepoint restore needs the same graph."""

    def __init__(
        self,
        agent,
        *,
        bootstrap_servers: str,
        topics: Topics,
        expansion_service: str,
        consumer_group: str,
        idempotency_header: str | None = None,
        **run_agent: Any,
    ) -> None:
        super().__init__()
        self._idempotency_header = idempotency_header
        self._agent = agent
        self._bootstrap_servers = bootstrap_servers
        self._topics = topics
        self._expansion_service = expansion_service
        self._consumer_group = consumer_group
        self._run_agent = run_agent

    def expand(self, pbegin):
        records = pbegin | "ReadEvents" >> ReadFromKafka(
            consumer_config={
                "bootstrap.servers": self._bootstrap_servers,
                "group.id": self._consumer_group,
                # A new loop reads its topic from the start; a restored job from its savepoint.
                "auto.offset.reset": "earliest",
            },
            topics=[self._topics.events],
            timestamp_policy=ReadFromKafka.create_time_policy,
            expansion_service=self._expansion_service,
            **({"with_metadata": True} if self._idempotency_header else {}),
        )
        values = records | "Envelopes" >> beam.ParDo(
            _RecordValues(self._idempotency_header)
        ).with_outputs(ERRORS, main="envelopes")
        envelope_type = bytes if self._idempotency_header is None else Tuple[bytes, bytes]
        outputs = typed(values.envelopes, envelope_type) | "RunAgent" >> RunAgent(
            self._agent, **self._run_agent
        )
        outputs = {
            **outputs,
            ERRORS: (outputs[ERRORS], typed(values[ERRORS], Tuple[bytes, ActivationErrorRecord]))
            | "DeadLetters" >> beam.Flatten(),
        }
        for output, topic in self._topics.for_outputs().items():
            name = output.capitalize()
            records = typed(
                outputs[output] | f"{name}Records" >> beam.ParDo(_ToRecord()), Tuple[bytes, bytes]
            )
            _ = records | f"Write{name}" >> WriteToKafka(
                producer_config={"bootstrap.servers": self._bootstrap_servers},
                topic=topic,
                expansion_service=self._expansion_service,
            )
        return outputs
