"""The loop's records outside a pipeline: a RunAgent output's record value (`record_value`), a
dead letter read back (`decode_dead_letter`), every record's id (`record_id`, carried in the
`RECORD_ID_HEADER`), producing records until the broker acknowledged them (`produce`, `send`),
and reading topics from their start without repeats (`TopicReader`: tests and the demo).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from beam_agents._protos import ActivationErrorRecord, AgentEnvelope
from beam_agents.bus.topics import KafkaBusError
from beam_agents.runtime.dead_letters import to_envelope

__all__ = [
    "RECORD_ID_HEADER",
    "Sending",
    "TopicReader",
    "Unacknowledged",
    "decode_dead_letter",
    "produce",
    "record_id",
    "record_id_of",
    "record_value",
    "retriable",
    "send",
]


def record_value(value) -> bytes:
    """A RunAgent output's value (a message or bytes) as its record's value on the loop's
    topic; a dead letter inside its envelope."""
    if isinstance(value, ActivationErrorRecord):
        value = to_envelope(value)
    if not isinstance(value, bytes):
        value = value.SerializeToString(deterministic=True)
    return value


def decode_dead_letter(value: bytes) -> ActivationErrorRecord:
    """The ActivationErrorRecord of a dead_letters record."""
    return ActivationErrorRecord.FromString(AgentEnvelope.FromString(value).external_event)


def produce(bootstrap_servers: str, records: Iterable[tuple[str, bytes, Any, int]]) -> None:
    """Produces (topic, key, value, timestamp_ms) records, a value being a message, bytes or
    None (a tombstone); returns once every one of them is acknowledged."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True})
    send(producer, records)


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


class Unacknowledged(KafkaBusError):
    """Records the broker did not acknowledge for a retriable reason (a timeout, a broker
    down): sending them again is safe, their ids make copies recognisable."""


def retriable(error) -> bool:
    from confluent_kafka import KafkaError

    # librdkafka marks a broker outage's local errors (transport, all brokers down, timed
    # out) as not retriable; for a service that waits the broker out they are.
    return error.retriable() or error.code() in {
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._TIMED_OUT,
        KafkaError._MSG_TIMED_OUT,
        # Too long between polls: the consumer left its group and rejoins on its next poll.
        KafkaError._MAX_POLL_EXCEEDED,
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


class Sending:
    """Records produced as they come (`produce`) and acknowledged together (`wait`): what a
    batch sends costs one wait for the broker, and none of it waits for the batch to end."""

    def __init__(self, producer) -> None:
        self._producer = producer
        self._failures: list = []

    def _delivered(self, error, message) -> None:
        if error is not None:
            self._failures.append((message.topic(), error))

    def produce(self, records: Iterable[tuple[str, bytes, Any, int]]) -> None:
        """Produces (topic, key, value, timestamp_ms) records, each with its id header."""
        for topic, key, value, timestamp_ms in records:
            if value is not None and not isinstance(value, bytes):
                value = value.SerializeToString(deterministic=True)
            record = {
                "key": key,
                "value": value,
                "timestamp": timestamp_ms,
                "headers": [(RECORD_ID_HEADER, record_id(_role(topic), key, value))],
                "on_delivery": self._delivered,
            }
            deadline = time.monotonic() + 30
            while True:
                try:
                    self._producer.produce(topic, **record)
                    break
                except BufferError:  # the client's queue is full: let the broker drain it
                    if time.monotonic() > deadline:
                        raise Unacknowledged("records not acknowledged: queue full") from None
                    self._producer.poll(0.1)
        self._producer.poll(0)  # serves delivery reports, so the queue does not fill

    def wait(self) -> None:
        """Waits for every acknowledgement: Unacknowledged when what failed may be sent
        again, else KafkaBusError."""
        if self._producer.flush(30):
            # What was never sent is dropped: the caller sends it all again, and copies left
            # queued would pile up with every retry during an outage.
            self._producer.purge(in_queue=True, in_flight=False)
            self._producer.poll(0)
            raise Unacknowledged("records not acknowledged: flush timed out")
        if self._failures:
            named = [f"{topic}: {error.name()} {error.str()}" for topic, error in self._failures]
            if all(retriable(error) for _, error in self._failures):
                raise Unacknowledged(f"records not acknowledged: {named}")
            raise KafkaBusError(f"records not acknowledged: {named}")


def send(producer, records: Iterable[tuple[str, bytes, Any, int]]) -> None:
    """Produces (topic, key, value, timestamp_ms) records, each with its id header, and waits
    for every acknowledgement (`Sending`)."""
    sending = Sending(producer)
    sending.produce(records)
    sending.wait()


class TopicReader:
    """Reads topics from their start, outside any pipeline: how tests and the demo see what a
    loop produced. `read(until, timeout_s)` returns {topic: [(key, value bytes)]} once
    `until(records)` is true, or raises TimeoutError with what it has. A record whose id
    (`record_id_of`) was read before is a repeat of an at-least-once sink: it is counted in
    `repeats` and, with `dedupe` (the default), left out.

    It reads every partition of topics that exist when it is made, by assignment: it commits
    nothing, so it joins no consumer group and needs no group coordinator. A subscribed reader
    did, and after a broker SIGKILL its coordinator answered `NOT_COORDINATOR` until the
    session timed out (45 s measured, and one test's reader read nothing in 300 s), while the
    broker served every fetch (flink_faults_test's broker SIGKILL)."""

    def __init__(
        self, bootstrap_servers: str, topics: Iterable[str], *, dedupe: bool = True
    ) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                # Required by the client; never joined (no subscribe, no commit).
                "group.id": f"beam-agents-reader-{time.time_ns()}",
                "enable.auto.commit": False,
            }
        )
        self._topics = list(topics)
        known = self._consumer.list_topics(timeout=30).topics
        missing = [t for t in self._topics if t not in known]
        if missing:
            self._consumer.close()
            raise KafkaBusError(f"no such topics: {missing}")
        self._consumer.assign(
            [
                TopicPartition(topic, partition, OFFSET_BEGINNING)
                for topic in self._topics
                for partition in known[topic].partitions
            ]
        )
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
