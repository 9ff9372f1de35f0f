"""`EffectorService`: an `Effector` with its durable store serving a loop's intents topic, and
its events topic for people's answers to its inquiries, committing each message only after the
broker acknowledged every record it produced for it.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from google.protobuf.message import DecodeError

from beam_agents._protos import AgentEnvelope
from beam_agents.bus.records import Unacknowledged, retriable, send
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
                send(self._producer, self._records(output))
            # Events that answer no inquiry are the loop's, not this service's: no wait.
            self._consumer.commit(message=message, asynchronous=output is None)
        except KafkaException as e:
            self._failed(e.args[0], f"serving {message.topic()} offset {message.offset()}")
            self._consumer.seek(
                TopicPartition(message.topic(), message.partition(), message.offset())
            )
            return None
        except Unacknowledged as e:
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
