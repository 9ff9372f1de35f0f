"""The topics of one agent loop, named by a prefix (`Topics`), made before a job reads them
(`create_topics`), and the error the loop's Kafka side raises (`KafkaBusError`)."""

from __future__ import annotations

import dataclasses

from beam_agents.errors import BeamAgentsError
from beam_agents.runtime import COMPLETIONS, ERRORS, INTENTS, SNAPSHOTS, TRACES

__all__ = ["KafkaBusError", "Topics", "create_topics"]


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
