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
import hashlib
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import apache_beam as beam
from apache_beam.io.kafka import ReadFromKafka, WriteToKafka
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.typehints import Tuple
from google.protobuf.message import DecodeError

from beam_agents._protos import ActivationErrorRecord, AgentEnvelope
from beam_agents.beam_support import typed
from beam_agents.effector import Effector, EffectorOutput, Route
from beam_agents.errors import BeamAgentsError
from beam_agents.runtime import COMPLETIONS, ERRORS, INTENTS, SNAPSHOTS, TRACES, RunAgent
from beam_agents.runtime.dead_letters import UNDECODABLE, error_record, to_envelope

__all__ = [
    "RECORD_ID_HEADER",
    "AgentLoop",
    "EffectorService",
    "FlinkCheckpointOptions",
    "KafkaBusError",
    "TopicReader",
    "Topics",
    "create_topics",
    "decode_dead_letter",
    "produce",
    "record_id",
    "record_id_of",
    "record_value",
]


class FlinkCheckpointOptions(PipelineOptions):
    """`--checkpointing_interval` (ms), read by Beam's Flink runner on the job server. Python's
    own options do not declare it, so without this class Beam warns `Unparseable argument`
    for an option that works."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument(
            "--checkpointing_interval",
            type=int,
            default=None,
            help="Flink checkpoint interval in milliseconds (Beam's Flink runner)",
        )


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
    """An `Effector` serving the intents topic of `topics`, and the events topic for people's
    answers to its inquiries about calls whose outcome was unknown (`Effector.resolve`).

    Each intent's records (a result to the events topic, an approval intent to the approvals
    topic, a dead letter) are produced and acknowledged before the intent's offset is
    committed. A copy of a decided intent sends its recorded result or approval request
    again; an intent another live effector is running is left uncommitted and read again.
    Every record carries its id (`RECORD_ID_HEADER`, `record_id`), the same for every copy.

    Faults: an error the broker or client calls retriable (a coordinator loading, a broker
    that is down, a record not acknowledged in time) is retried with backoff, the message
    read again from its offset; a fatal one raises KafkaBusError naming it, offset
    uncommitted. `instance_id` makes the service a static member of its group, so a restart
    under the same id takes its partitions back at once instead of after the session timeout
    (`session_timeout_ms`, which also bounds how long a crashed member holds them).
    `run` serves until `stop` is set, then leaves the group; `serve_one` handles at most one
    message. `producer_config` adds to or overrides the producer's librdkafka settings.
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
        instance_id: str | None = None,
        session_timeout_ms: int = 10_000,
    ) -> None:
        from confluent_kafka import Consumer, Producer

        self.effector = effector
        self.topics = topics
        self._poll_timeout_s = poll_timeout_s
        self._backoff_s = 0.0
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": group_id,
                "auto.offset.reset": "earliest",
                # Offsets are committed by hand, after the intent's records are acknowledged.
                "enable.auto.commit": False,
                "session.timeout.ms": session_timeout_ms,
                "heartbeat.interval.ms": max(session_timeout_ms // 5, 100),
                **({"group.instance.id": instance_id} if instance_id else {}),
            }
        )
        self._consumer.subscribe([topics.intents, topics.events])
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap_servers,
                "enable.idempotence": True,
                **(producer_config or {}),
            }
        )

    def run(self, stop: threading.Event, on_served: Callable[[Route], None] | None = None) -> None:
        try:
            while not stop.is_set():
                route = self.serve_one()
                if route is not None and on_served is not None:
                    on_served(route)
                if self._backoff_s:
                    stop.wait(self._backoff_s)
        finally:
            self.close()

    def serve_one(self) -> Route | None:
        """Polls once; handles the intent (or answer to an inquiry) it got. Returns the
        effector's route, or None. A retriable failure returns None and sets a backoff that
        `run` waits out; the message is read again."""
        from confluent_kafka import KafkaException, TopicPartition

        message = self._consumer.poll(self._poll_timeout_s)
        if message is None:
            return None
        if message.error():
            self._failed(message.error(), f"reading {message.topic()}")
            return None
        try:
            if message.topic() == self.topics.events:
                output = self._answer(message.value())
            else:
                output = self.effector(message.value() or b"")
            if output is not None and output.route is Route.IN_FLIGHT:
                # Another live effector runs it now: read it again later, so that if that
                # process dies this one answers it instead of leaving it unanswered.
                self._consumer.seek(
                    TopicPartition(message.topic(), message.partition(), message.offset())
                )
                time.sleep(self._poll_timeout_s)
                return output.route
            if output is not None:
                _send(self._producer, self._records(output))
            # Events that answer no inquiry are the loop's, not this service's: no wait.
            self._consumer.commit(message=message, asynchronous=output is None)
        except KafkaException as e:
            self._failed(e.args[0], f"serving {message.topic()} offset {message.offset()}")
            self._consumer.seek(
                TopicPartition(message.topic(), message.partition(), message.offset())
            )
            return None
        except _Unacknowledged as e:
            self._failed(None, str(e))
            self._consumer.seek(
                TopicPartition(message.topic(), message.partition(), message.offset())
            )
            return None
        self._backoff_s = 0.0
        return None if output is None else output.route

    def _answer(self, value: bytes | None) -> EffectorOutput | None:
        try:
            envelope = AgentEnvelope.FromString(value or b"")
        except DecodeError:
            return None  # RunAgent dead-letters it; it answers nothing of ours
        return self.effector.resolve(envelope)

    def _failed(self, error, what: str) -> None:
        """Raises KafkaBusError for a fatal or permanent error; sets the next backoff for a
        retriable one (0.5 s doubling to 10 s)."""
        if error is not None and (error.fatal() or not _retriable(error)):
            kind = "fatal" if error.fatal() else "permanent"
            raise KafkaBusError(f"{what}: {kind} broker error {error.name()}: {error.str()}")
        self._backoff_s = min(max(self._backoff_s * 2, 0.5), 10.0)
        detail = what if error is None else f"{what}: {error.name()}"
        print(
            f"beam_agents.kafka_bus: retrying in {self._backoff_s:.1f} s after {detail}",
            file=sys.stderr,
            flush=True,
        )

    def _records(self, output: EffectorOutput) -> Iterable[tuple[str, bytes, Any, int]]:
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
        """Leaves the consumer group now (a static member only closes: its id keeps its
        partitions for a restart within the session timeout)."""
        self._consumer.close()
        self._producer.flush(10)


def produce(bootstrap_servers: str, records: Iterable[tuple[str, bytes, Any, int]]) -> None:
    """Produces (topic, key, value, timestamp_ms) records, a value being a message, bytes or
    None (a tombstone); returns once every one of them is acknowledged."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True})
    _send(producer, records)


#: The header carrying a record's id (`record_id`): every copy of one record has the same.
RECORD_ID_HEADER = "beam-agents-id"


def record_id(role: str, key: bytes | None, value: bytes | None) -> str:
    """The id of a record of the topic role `role` (`events`, `intents`, ...): hex SHA-256 of
    the role, key and value. Deterministic because what we produce is: an activation's outputs
    are a function of its state and input (RunAgent replays, never re-asks, a model), and a
    result or approval request the effector sends again is its recorded bytes. ToolIntents,
    results and traces name their entity_key, seq and step inside the value, so ids of records
    of different steps never meet."""
    digest = hashlib.sha256()
    for part in (role.encode(), key or b"", value or b""):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def record_id_of(message) -> str:
    """A consumed record's id: its header when it has one (records the effector service and
    `produce` write), else computed from its topic's role, key and value (records the Beam
    pipeline writes), which is the same value."""
    for name, value in message.headers() or ():
        if name == RECORD_ID_HEADER and value:
            return bytes(value).decode("ascii", "replace")
    return record_id(_role(message.topic()), message.key(), message.value())


def _role(topic: str) -> str:
    return topic.rpartition(".")[2]


class _Unacknowledged(KafkaBusError):
    """Records the broker did not acknowledge for a retriable reason (a timeout, a broker
    down): sending them again is safe, their ids make copies recognisable."""


def _retriable(error) -> bool:
    from confluent_kafka import KafkaError

    # librdkafka marks a broker outage's local errors (transport, all brokers down, timed
    # out) as not retriable; for a service that waits the broker out they are.
    return error.retriable() or error.code() in {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._MSG_TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError._WAIT_COORD,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.ILLEGAL_GENERATION,
        # Metadata a restarted broker has not loaded yet, or a topic being made.
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
    }


def _send(producer, records: Iterable[tuple[str, bytes, Any, int]]) -> None:
    failures: list = []

    def delivered(error, message) -> None:
        if error is not None:
            failures.append((message.topic(), error))

    for topic, key, value, timestamp_ms in records:
        if value is not None and not isinstance(value, bytes):
            value = value.SerializeToString(deterministic=True)
        producer.produce(
            topic,
            key=key,
            value=value,
            timestamp=timestamp_ms,
            headers=[(RECORD_ID_HEADER, record_id(_role(topic), key, value))],
            on_delivery=delivered,
        )
    if producer.flush(30):
        raise _Unacknowledged("records not acknowledged: flush timed out")
    if failures:
        named = [f"{topic}: {error.name()} {error.str()}" for topic, error in failures]
        if all(_retriable(error) for _, error in failures):
            raise _Unacknowledged(f"records not acknowledged: {named}")
        raise KafkaBusError(f"records not acknowledged: {named}")


class TopicReader:
    """Reads topics from their start, outside any pipeline: how tests and the demo see what a
    loop produced. `read(until, timeout_s)` returns {topic: [(key, value bytes)]} once
    `until(records)` is true, or raises TimeoutError with what it has. A record whose id
    (`record_id_of`) was read before is a repeat of an at-least-once sink: it is counted in
    `repeats` and, with `dedupe` (the default), left out."""

    def __init__(
        self, bootstrap_servers: str, topics: Iterable[str], *, dedupe: bool = True
    ) -> None:
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
        self.repeats: dict[str, int] = dict.fromkeys(self._topics, 0)
        self._dedupe = dedupe
        self._seen: set[str] = set()

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
            seen = record_id_of(message)
            if seen in self._seen:
                self.repeats[message.topic()] += 1
                if self._dedupe:
                    continue
            self._seen.add(seen)
            self.records[message.topic()].append((message.key(), message.value()))
        return self.records

    def settle(self, seconds: float) -> dict[str, list[tuple[bytes, bytes]]]:
        """Reads whatever arrives in the next `seconds`."""
        end = time.monotonic() + seconds
        return self.read(lambda _: time.monotonic() >= end, seconds + 1)

    def close(self) -> None:
        self._consumer.close()
