"""The agent loop over Kafka: RunAgent in a streaming pipeline, the effector as its own service.

A pipeline cannot feed its outputs back to its input; a message bus closes the loop. One loop
uses one set of topics, named by a prefix (`Topics`), every record keyed by its entity_key:

    events        AgentEnvelope   what RunAgent reads: external events, tool results,
                                  approvals, export requests
    intents       ToolIntent      what the agents ask the world to do; the effector reads it
    approvals     ToolIntent      approval intents the effector routes to people
    completions   bytes           each completed activation's output
    traces        TraceEvent
    snapshots     StateSnapshot   answers to export requests
    dead_letters  AgentEnvelope   an ActivationErrorRecord in external_event (the wire
                                  convention of an errors sink), from RunAgent and from the
                                  effector alike; `decode_dead_letter` reads one

`AgentLoop` is the pipeline half: Beam's own cross-language Kafka IO (ReadFromKafka and
WriteToKafka, expanded by a Java expansion service) around RunAgent. Record timestamps are the
records' create times, which producers set to the envelope's event time. On a runner that
checkpoints (Flink), the read positions live in the pipeline's checkpoints and savepoints with
the agents' state, so a job restored from a savepoint reads on from where its state was taken.

`EffectorService` is the other half: an `Effector` with its durable store reading the intents
topic. It commits an intent's offset only after every record it produced for that intent was
acknowledged by the broker, so a crash anywhere redelivers the intent; the effector's store
then answers the copy with the first result (the tool does not run again) and the result
reaches the events topic at least once. RunAgent refuses a second copy of an answer with a
dead letter (`unknown_intent`): nothing resumes twice.

The service needs the `kafka` extra (confluent-kafka); the pipeline half needs only Beam, and a
Java expansion service and workers (`bash tools/engines.sh start java`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import apache_beam as beam
from apache_beam.io.kafka import ReadFromKafka, WriteToKafka
from apache_beam.typehints import Tuple

from beam_agents._protos import ActivationErrorRecord, AgentEnvelope
from beam_agents.beam_support import typed
from beam_agents.effector import Effector, Route
from beam_agents.errors import BeamAgentsError
from beam_agents.runtime import COMPLETIONS, ERRORS, INTENTS, SNAPSHOTS, TRACES, RunAgent
from beam_agents.runtime.dead_letters import UNDECODABLE, error_record, to_envelope

__all__ = [
    "AgentLoop",
    "EffectorService",
    "KafkaBusError",
    "TopicReader",
    "Topics",
    "create_topics",
    "decode_dead_letter",
    "produce",
    "record_value",
]


class KafkaBusError(BeamAgentsError):
    """The broker refused or lost a record the loop produced, or a topic could not be made."""


@dataclasses.dataclass(frozen=True)
class Topics:
    """The topic names of one loop: `<prefix>.<role>`."""

    prefix: str

    def __post_init__(self) -> None:
        # Kafka's own rule for topic names, checked before any broker sees them.
        allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
        if not self.prefix or not set(self.prefix) <= allowed or len(self.prefix) > 200:
            raise ValueError(f"{self.prefix!r} is no topic prefix: use [A-Za-z0-9._-], 1-200")

    events = property(lambda self: f"{self.prefix}.events")
    intents = property(lambda self: f"{self.prefix}.intents")
    approvals = property(lambda self: f"{self.prefix}.approvals")
    completions = property(lambda self: f"{self.prefix}.completions")
    traces = property(lambda self: f"{self.prefix}.traces")
    snapshots = property(lambda self: f"{self.prefix}.snapshots")
    dead_letters = property(lambda self: f"{self.prefix}.dead_letters")

    def all(self) -> list[str]:
        return [
            self.events,
            self.intents,
            self.approvals,
            self.completions,
            self.traces,
            self.snapshots,
            self.dead_letters,
        ]

    def for_outputs(self) -> dict[str, str]:
        """{RunAgent output tag: the topic the loop writes it to}."""
        return {
            COMPLETIONS: self.completions,
            INTENTS: self.intents,
            TRACES: self.traces,
            SNAPSHOTS: self.snapshots,
            ERRORS: self.dead_letters,
        }


def create_topics(bootstrap_servers: str, topics: Topics, *, partitions: int = 1) -> None:
    """Creates the loop's topics (those that exist are left alone). ReadFromKafka lists a
    topic's partitions when the job starts, so the topics must exist before it does."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1) for name in topics.all()]
    )
    for name, future in futures.items():
        try:
            future.result(timeout=30)
        except Exception as e:
            error = e.args[0] if e.args else None
            if getattr(error, "code", lambda: None)() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise KafkaBusError(f"cannot create topic {name}: {e}") from e


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


def record_value(value) -> bytes:
    """A RunAgent output's value (a message or bytes) as its record's value on the loop's
    topic; a dead letter inside its envelope."""
    if isinstance(value, ActivationErrorRecord):
        value = to_envelope(value)
    if not isinstance(value, bytes):
        value = value.SerializeToString(deterministic=True)
    return value


class _ToRecord(beam.DoFn):
    """(entity_key, RunAgent output value) as a Kafka record's (key, value)."""

    def process(self, element):
        key, value = element
        yield (key, record_value(value))


def decode_dead_letter(value: bytes) -> ActivationErrorRecord:
    """The ActivationErrorRecord of a dead_letters record."""
    return ActivationErrorRecord.FromString(AgentEnvelope.FromString(value).external_event)


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


class EffectorService:
    """An `Effector` serving the intents topic of `topics`.

    Each intent's records (a result to the events topic, an approval intent to the approvals
    topic, a dead letter) are produced and acknowledged before the intent's offset is
    committed; a record the broker does not acknowledge raises KafkaBusError with the offset
    uncommitted. A copy of a decided intent sends its recorded result or approval request
    again; an intent another live effector is running is left uncommitted and read again.
    `run` serves until `stop` is set; `serve_one` handles at most one intent.
    `producer_config` adds to or overrides the producer's librdkafka settings.
    """

    def __init__(
        self,
        effector: Effector,
        *,
        bootstrap_servers: str,
        topics: Topics,
        group_id: str = "beam-agents-effector",
        poll_timeout_s: float = 0.5,
        producer_config: Mapping[str, Any] | None = None,
    ) -> None:
        from confluent_kafka import Consumer, Producer

        self.effector = effector
        self.topics = topics
        self._poll_timeout_s = poll_timeout_s
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": group_id,
                "auto.offset.reset": "earliest",
                # Offsets are committed by hand, after the intent's records are acknowledged.
                "enable.auto.commit": False,
            }
        )
        self._consumer.subscribe([topics.intents])
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap_servers,
                "enable.idempotence": True,
                **(producer_config or {}),
            }
        )

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self.serve_one()
        finally:
            self.close()

    def serve_one(self) -> Route | None:
        """Polls once; handles the intent it got. Returns the effector's route, or None."""
        message = self._consumer.poll(self._poll_timeout_s)
        if message is None:
            return None
        if message.error():
            raise KafkaBusError(f"reading {self.topics.intents}: {message.error()}")
        output = self.effector(message.value() or b"")
        if output.route is Route.IN_FLIGHT:
            from confluent_kafka import TopicPartition

            # Another live effector runs it now: read it again later, so that if that process
            # dies this one answers it (outcome unknown) instead of leaving it unanswered.
            self._consumer.seek(
                TopicPartition(message.topic(), message.partition(), message.offset())
            )
            time.sleep(self._poll_timeout_s)
            return output.route
        _send(self._producer, self._records(output))
        self._consumer.commit(message=message, asynchronous=False)
        return output.route

    def _records(self, output) -> Iterable[tuple[str, bytes, Any, int]]:
        if output.result is not None:
            result = output.result
            yield self.topics.events, result.entity_key, result, result.event_time_ms
        elif output.approval is not None:
            approval = output.approval
            yield self.topics.approvals, approval.entity_key, approval, approval.created_at_ms
        elif output.dead_letter is not None:
            letter = output.dead_letter
            yield (
                self.topics.dead_letters,
                letter.entity_key,
                to_envelope(letter),
                letter.event_time_ms,
            )

    def close(self) -> None:
        self._producer.flush(30)
        self._consumer.close()


def produce(bootstrap_servers: str, records: Iterable[tuple[str, bytes, Any, int]]) -> None:
    """Produces (topic, key, value, timestamp_ms) records, a value being a message, bytes or
    None (a tombstone); returns once every one of them is acknowledged."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True})
    _send(producer, records)


def _send(producer, records: Iterable[tuple[str, bytes, Any, int]]) -> None:
    failures: list[str] = []

    def delivered(error, message) -> None:
        if error is not None:
            failures.append(f"{message.topic()}: {error}")

    for topic, key, value, timestamp_ms in records:
        if value is not None and not isinstance(value, bytes):
            value = value.SerializeToString(deterministic=True)
        producer.produce(
            topic,
            key=key,
            value=value,
            timestamp=timestamp_ms,
            on_delivery=delivered,
        )
    if producer.flush(30) or failures:
        raise KafkaBusError(f"records not acknowledged: {failures or 'flush timed out'}")


class TopicReader:
    """Reads topics from their start, outside any pipeline: how tests and the demo see what a
    loop produced. `read(until, timeout_s)` returns {topic: [(key, value bytes)]} once
    `until(records)` is true, or raises TimeoutError with what it has."""

    def __init__(self, bootstrap_servers: str, topics: Iterable[str]) -> None:
        from confluent_kafka import Consumer

        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": f"beam-agents-reader-{time.time_ns()}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        self._topics = list(topics)
        self._consumer.subscribe(self._topics)
        self.records: dict[str, list[tuple[bytes, bytes]]] = {t: [] for t in self._topics}

    def read(
        self, until: Callable[[Mapping[str, list]], bool], timeout_s: float
    ) -> dict[str, list[tuple[bytes, bytes]]]:
        deadline = time.monotonic() + timeout_s
        while not until(self.records):
            if time.monotonic() > deadline:
                counts = {t: len(r) for t, r in self.records.items()}
                raise TimeoutError(f"gave up after {timeout_s} s with {counts}")
            message = self._consumer.poll(0.5)
            if message is None or message.error():
                continue
            self.records[message.topic()].append((message.key(), message.value()))
        return self.records

    def settle(self, seconds: float) -> dict[str, list[tuple[bytes, bytes]]]:
        """Reads whatever arrives in the next `seconds`."""
        end = time.monotonic() + seconds
        return self.read(lambda _: time.monotonic() >= end, seconds + 1)

    def close(self) -> None:
        self._consumer.close()
