"""`AgentLoop`, the pipeline half of the loop: the events topic read with Beam's cross-language
ReadFromKafka, RunAgent, and each output written to its topic with WriteToKafka.

Records over Kafka's size limit. A broker takes records up to its `message.max.bytes` (by
default 1,048,588 bytes, a record batch's overhead included) and a Java producer sends up to its
`max.request.size` (1,048,576): a larger record fails WriteToKafka's bundle, which the runner
retries for ever, every output of the job stuck behind it. A key near its memory and cache
caps (by default 1 MiB of memory and 4 MiB of recorded model answers) exports a StateSnapshot
over that, and a completion, an intent or a dead letter carrying a mailbox can be as large. So
the loop writes no record whose key and value are over `max_record_bytes` (default 1,000,000,
under both limits with room for the overhead): RunAgent (its `max_output_bytes`) puts in its
place a `record_too_large` dead letter, written to the dead_letters topic, naming the output,
the size, the limit and the SHA-256 of the value it refused. Nothing else changes: the key's
state is as it was (export changes no state), the key goes on, and an export refused so can be
asked again once the key is smaller (its memory and cache caps lowered, entries deleted) or the
limit raised. `max_record_bytes` above the default needs the topics' and the broker's
`max.message.bytes` raised to match; the loop raises its producers' `max.request.size` itself.
The check is inside RunAgent's DoFn rather than a step of its own: a step added after RunAgent
changes the ids Flink derives from the graph's shape for the stateful operator, and a savepoint
of the release before would no longer restore.

Its transform names (ReadEvents, Envelopes, RunAgent, DeadLetters, <Output>Records,
Write<Output>) and the DoFn class names in them are part of a running job's graph: a savepoint
restore or `--update` matches them. Flink matches more: its operator ids come from the shape
of the fused graph (each stage's inputs and outputs), which `update-check` does not compare, so
a change of shape is proven by restoring the last release's savepoint (bus/flink_upgrade_test).
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

__all__ = ["MAX_RECORD_BYTES", "AgentLoop", "FlinkCheckpointOptions", "topic_records"]

#: The largest record (key and value) the loop writes by default; see the module docstring.
MAX_RECORD_BYTES = 1_000_000
# A Java producer's default max.request.size, and what a record batch adds to its records.
_PRODUCER_REQUEST_BYTES = 1_048_576
_BATCH_OVERHEAD_BYTES = 64 * 1024


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
    first launch, since `--update` or a savepoint restore needs the same graph.

    `max_record_bytes` is the largest record (key and value) written to any topic: a larger
    one, a StateSnapshot of a key near its caps most likely, is a `record_too_large` dead
    letter instead (see the module docstring). Above the default of 1,000,000, the topics'
    and the broker's `max.message.bytes` must allow it."""

    def __init__(
        self,
        agent,
        *,
        bootstrap_servers: str,
        topics: Topics,
        expansion_service: str,
        consumer_group: str,
        idempotency_header: str | None = None,
        max_record_bytes: int = MAX_RECORD_BYTES,
        **run_agent: Any,
    ) -> None:
        super().__init__()
        self._max_record_bytes = max_record_bytes
        # Made here, so a limit RunAgent refuses is refused when the loop is built.
        self._run_agent = RunAgent(agent, max_output_bytes=max_record_bytes, **run_agent)
        self._idempotency_header = idempotency_header
        self._bootstrap_servers = bootstrap_servers
        self._topics = topics
        self._expansion_service = expansion_service
        self._consumer_group = consumer_group

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
        outputs = typed(values.envelopes, envelope_type) | "RunAgent" >> self._run_agent
        outputs = {
            **outputs,
            ERRORS: (outputs[ERRORS], typed(values[ERRORS], Tuple[bytes, ActivationErrorRecord]))
            | "DeadLetters" >> beam.Flatten(),
        }
        producer = {"bootstrap.servers": self._bootstrap_servers}
        request_bytes = self._max_record_bytes + _BATCH_OVERHEAD_BYTES
        if request_bytes > _PRODUCER_REQUEST_BYTES:
            producer["max.request.size"] = str(request_bytes)
        records = topic_records(outputs, self._topics)
        for output, topic in self._topics.for_outputs().items():
            _ = records[output] | f"Write{output.capitalize()}" >> WriteToKafka(
                producer_config=producer,
                topic=topic,
                expansion_service=self._expansion_service,
            )
        return outputs


def topic_records(outputs, topics: Topics) -> dict:
    """{RunAgent output tag: its records (key, value) for its topic}. Applied inside the
    caller's transform."""
    return {
        output: typed(
            outputs[output] | f"{output.capitalize()}Records" >> beam.ParDo(_ToRecord()),
            Tuple[bytes, bytes],
        )
        for output in topics.for_outputs()
    }
