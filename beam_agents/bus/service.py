"""`EffectorService`: an `Effector` with its durable store serving a loop's intents topic, and
its events topic for people's answers to its inquiries, committing each message only after the
broker acknowledged every record it produced for it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from google.protobuf.message import DecodeError

from beam_agents._protos import AgentEnvelope
from beam_agents.bus.records import Sending, Unacknowledged, retriable
from beam_agents.bus.topics import KafkaBusError, Topics
from beam_agents.intents.effector import Effector, EffectorOutput, Route
from beam_agents.runtime.dead_letters import to_envelope

__all__ = ["EffectorService"]


class EffectorService:
    """An `Effector` serving the intents topic of `topics`, and the events topic for people's
    answers to its inquiries about calls whose outcome was unknown (`Effector.resolve`).

    Each intent's records (a result to the events topic, an approval intent to the approvals
    topic, a dead letter) are produced and acknowledged before the intent's offset is
    committed. A copy of a decided intent sends its recorded result or approval request
    again; an intent another effector is running (its claim's lease unexpired) is left
    uncommitted and read again, until its result is recorded or its lease expires.
    Every record carries its id (`RECORD_ID_HEADER`, `record_id`), the same for every copy.

    Faults: an error the broker or client calls retriable (a coordinator loading, a broker
    that is down, a record not acknowledged in time) is retried with backoff, the batch
    read again from its first message; a fatal one raises KafkaBusError naming it, offset
    uncommitted. `instance_id` makes the service a static member of its group, so a restart
    under the same id takes its partitions back at once instead of after the session timeout
    (`session_timeout_ms`, which also bounds how long a crashed member holds them).
    `run` serves until `stop` is set, then leaves the group. `serve` handles what one poll
    returns, up to `max_batch` messages and for at most `max_batch_s`, in order: each output's
    records are produced at once, acknowledged together at the batch's end, and only then its
    offsets committed together, so the broker's round trips (about 5 ms for a synchronous
    commit) are paid once a batch rather than once an intent. `max_batch_s` bounds how long a
    record waits for that and how long the consumer goes between polls. A process that dies
    inside a batch has committed none of it: a restart reads it again, the store answers what
    had run, and the batch's records are sent again (the same records, by id).
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
        max_batch: int = 500,
        max_batch_s: float = 1.0,
        producer_config: Mapping[str, Any] | None = None,
        instance_id: str | None = None,
        session_timeout_ms: int = 10_000,
    ) -> None:
        from confluent_kafka import Consumer, Producer

        self.effector = effector
        self.topics = topics
        self._poll_timeout_s = poll_timeout_s
        self._max_batch = max_batch
        self._max_batch_s = max_batch_s
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
                for route in self.serve(stop):
                    if on_served is not None:
                        on_served(route)
                if self._backoff_s:
                    stop.wait(self._backoff_s)
        finally:
            self.close()

    def serve(self, stop: threading.Event | None = None) -> list[Route]:
        """Polls once, for up to `max_batch` messages, and serves them in order for at most
        `max_batch_s` (and until `stop` is set): the effector's route of each intent (or answer
        to an inquiry) served. Each output's records are produced at once; at the batch's end
        they are acknowledged together, then its offsets committed together, and what it did
        not get to is read again. A retriable failure sets a backoff that `run` waits out, and
        the batch is read again from its first message."""
        from confluent_kafka import KafkaException

        # Waits for the first message only: consume() would wait out its whole timeout unless
        # max_batch messages came; the rest is what the client has fetched already.
        first = self._consumer.poll(self._poll_timeout_s)
        if first is None:
            return []
        messages = [first, *self._consumer.consume(self._max_batch - 1, 0)]
        served, sending = _Batch(), Sending(self._producer)
        ends = time.monotonic() + self._max_batch_s
        error = None
        try:
            for message in messages:
                if (stop is not None and stop.is_set()) or time.monotonic() > ends:
                    break
                if served.holds(message):
                    continue  # a partition stopped at an earlier message of this batch
                if message.error():
                    error = (message.error(), f"reading {message.topic() or 'the topics'}")
                    break
                if message.topic() == self.topics.events:
                    output = self._answer(message.value())
                else:
                    output = self.effector(message.value() or b"")
                if output is not None and output.route is Route.IN_FLIGHT:
                    # Another effector runs it now, its lease renewed: read it again later, so
                    # that if that effector dies this one answers it once its lease expired,
                    # instead of leaving it unanswered.
                    served.hold(message)
                    continue
                served.add(message, output)
                if output is not None:
                    sending.produce(self._records(output))
            if served.outputs:
                sending.wait()
            if served.done:
                # Events that answer no inquiry are the loop's, not this service's: no wait.
                self._consumer.commit(offsets=served.offsets(), asynchronous=not served.outputs)
        except KafkaException as e:
            return self._retry(messages, e.args[0], "serving a batch")
        except Unacknowledged as e:
            return self._retry(messages, None, str(e))
        except BaseException:
            # For a caller that serves on, nothing is skipped; a failing seek must not hide
            # what failed.
            with contextlib.suppress(KafkaException):
                self._rewind(_Batch(), messages)
            raise
        self._rewind(served, messages)
        if error is not None:
            self._failed(*error)
            return served.routes
        if served.in_flight:
            (time.sleep if stop is None else stop.wait)(self._poll_timeout_s)
        self._backoff_s = 0.0
        return served.routes

    def _retry(self, messages, error, what: str) -> list[Route]:
        """Reads every message of the batch again, from its first, after a backoff."""
        self._rewind(_Batch(), messages)
        self._failed(error, what)
        return []

    def _rewind(self, batch: _Batch, messages) -> None:
        """Seeks each partition of `messages` back to its first message `batch` did not
        finish: the consumer's position moved past every message the poll returned."""
        from confluent_kafka import KafkaError, KafkaException

        for position in batch.unfinished(messages):
            try:
                self._consumer.seek(position)
            except KafkaException as e:
                # Revoked since the poll (or being revoked): its new owner reads on from the
                # committed offset.
                if e.args[0].code() not in (
                    KafkaError._STATE,
                    KafkaError._UNKNOWN_PARTITION,
                    KafkaError._PREV_IN_PROGRESS,
                ):
                    raise

    def _answer(self, value: bytes | None) -> EffectorOutput | None:
        try:
            envelope = AgentEnvelope.FromString(value or b"")
        except DecodeError:
            return None  # RunAgent dead-letters it; it answers nothing of ours
        return self.effector.resolve(envelope)

    def _failed(self, error, what: str) -> None:
        """Raises KafkaBusError for a fatal or permanent error; sets the next backoff for a
        retriable one (0.5 s doubling to 10 s)."""
        if error is not None and (error.fatal() or not retriable(error)):
            kind = "fatal" if error.fatal() else "permanent"
            raise KafkaBusError(f"{what}: {kind} broker error {error.name()}: {error.str()}")
        self._backoff_s = min(max(self._backoff_s * 2, 0.5), 10.0)
        detail = what if error is None else f"{what}: {error.name()}"
        print(
            f"beam_agents.bus: retrying in {self._backoff_s:.1f} s after {detail}",
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


class _Batch:
    """What one `EffectorService.serve` finished: per partition, its messages in order up to
    the first one held back (an intent another effector runs), whose records are acknowledged
    and whose offsets are committed together."""

    def __init__(self) -> None:
        self.routes: list[Route] = []
        self.outputs: list[EffectorOutput] = []
        #: (topic, partition): the offset and leader epoch of its last finished message.
        self.done: dict[tuple[str, int], tuple[int, int]] = {}
        self.in_flight = False
        self._held: set[tuple[str, int]] = set()

    def holds(self, message) -> bool:
        return (message.topic(), message.partition()) in self._held

    def hold(self, message) -> None:
        self._held.add((message.topic(), message.partition()))
        self.in_flight = True
        self.routes.append(Route.IN_FLIGHT)

    def add(self, message, output: EffectorOutput | None) -> None:
        self.done[message.topic(), message.partition()] = (message.offset(), _epoch(message))
        if output is not None:
            self.routes.append(output.route)
            self.outputs.append(output)

    def offsets(self) -> list:
        """What to commit: the offset after each partition's last finished message, with its
        leader epoch (so the broker can tell a log truncated under it)."""
        from confluent_kafka import TopicPartition

        return [
            TopicPartition(topic, partition, offset + 1, leader_epoch=epoch)
            for (topic, partition), (offset, epoch) in self.done.items()
        ]

    def unfinished(self, messages) -> list:
        """Each partition of `messages` at its first message not finished."""
        from confluent_kafka import TopicPartition

        first = {}
        for message in messages:
            if message.error():
                continue
            where = (message.topic(), message.partition())
            finished = self.done.get(where, (-1, -1))[0]
            if where not in first and message.offset() > finished:
                first[where] = TopicPartition(
                    *where, message.offset(), leader_epoch=_epoch(message)
                )
        return list(first.values())


def _epoch(message) -> int:
    """The message's leader epoch, -1 where the broker gave none (TopicPartition's "unknown")."""
    epoch = message.leader_epoch()
    return -1 if epoch is None else epoch
