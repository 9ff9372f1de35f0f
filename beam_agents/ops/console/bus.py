"""The console on the Kafka loop: what it reads, what it produces, and in which order.

`ConsoleBus.poll` reads the approvals, snapshots, traces, completions and dead_letters topics
into the Inbox and the Observations (as a consumer group, committing offsets after the rows
are stored, so a restart reads on and a copy read twice is one row). For each new approval it
asks the agent for a StateSnapshot (an export_request envelope on the events topic), so the
viewer shows the suspension and its deadline.

`ConsoleBus.decide` is the one way a decision leaves: the Inbox records it (with its audit row)
first, then the recorded AgentEnvelope goes to the events topic and its TraceEvent to the
traces topic, and only once the broker acknowledged both is it marked produced. A crash or a
broker failure in between leaves it recorded and unproduced: `produce_recorded`, run by the
reader on start and every `RETRY_S` after (and on every click), produces the same bytes again,
so a decision made while the broker was down reaches the agent once it answers.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from beam_agents._protos import AgentEnvelope
from beam_agents.bus import KafkaBusError, Topics, produce
from beam_agents.intents.effector import wall_clock_ms
from beam_agents.ops.console.inbox import Decision, Inbox
from beam_agents.ops.console.observed import Observations

__all__ = ["ConsoleBus", "KafkaPublisher", "Publisher"]

Record = tuple[str, bytes, Any, int]

#: Seconds between the reader's tries at producing what is recorded and unacknowledged.
RETRY_S = 2.0


class Publisher(Protocol):
    def __call__(self, records: Iterable[Record]) -> None:
        """Produces the records; returns once the broker acknowledged every one, else raises
        KafkaBusError."""


class KafkaPublisher:
    def __init__(self, bootstrap_servers: str) -> None:
        self._bootstrap_servers = bootstrap_servers

    def __call__(self, records: Iterable[Record]) -> None:
        produce(self._bootstrap_servers, records)


class ConsoleBus:
    def __init__(
        self,
        inbox: Inbox,
        observations: Observations,
        topics: Topics,
        publish: Publisher,
        *,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.inbox = inbox
        self.observations = observations
        self.topics = topics
        self._publish = publish
        self._clock = clock
        self._consumer = None
        # Producing is serialized: two clicks (thread-pool threads) producing at once would
        # both read the first one's decision as unproduced and produce it twice.
        self._producing = threading.Lock()

    # -- producing ------------------------------------------------------------------------

    def decide(
        self, intent_id: str, *, approved: bool, user: str, comment: str, address: str
    ) -> tuple[Decision, bool]:
        """Records the decision, then produces every recorded, unproduced one (this one
        included). Returns the decision and whether this call made it; raises
        DecisionRefused, or KafkaBusError when the broker did not acknowledge (the decision
        stays recorded and is produced on the next try)."""
        decision, made = self.inbox.decide(
            intent_id, approved=approved, user=user, comment=comment, address=address
        )
        self.produce_recorded()
        return decision, made

    def produce_recorded(self) -> int:
        """Produces the decisions recorded but not acknowledged yet; returns how many."""
        with self._producing:
            decisions = self.inbox.unproduced()
            for decision in decisions:
                key, at = decision.entity_key, decision.decided_at_ms
                self._publish(
                    [
                        (self.topics.events, key, decision.envelope, at),
                        (self.topics.traces, key, decision.trace, at),
                    ]
                )
                self.inbox.mark_produced(decision.intent_id)
            return len(decisions)

    def request_export(self, key: bytes) -> str:
        """Asks the key's agent for a StateSnapshot; returns the request id."""
        now = self._clock()
        request_id = f"console-{uuid.uuid4().hex}"
        envelope = AgentEnvelope(entity_key=key, event_time_ms=now)
        envelope.export_request.request_id = request_id
        # Recorded first: the answer is trusted as this request's (observed.py).
        self.observations.expect_snapshot(key, request_id, now)
        self._publish([(self.topics.events, key, envelope, now)])
        return request_id

    # -- consuming ------------------------------------------------------------------------

    def handle(self, topic: str, value: bytes | None, key: bytes = b"", at_ms: int = 0) -> None:
        """Stores one record of the topics the console reads (a completion by its record's
        key and timestamp: its value is the bare output)."""
        if value is None:
            return
        if topic == self.topics.approvals:
            approval, new = self.inbox.receive(value)
            if new:
                key = approval.intent.entity_key
                self.observations.add_key(key)
                # A snapshot only shows the deadline (the agent page's button asks again): a
                # broker refusing the request must not end the reader, which would read no
                # more approvals.
                try:
                    self.request_export(key)
                except KafkaBusError as e:
                    print(
                        f"beam_agents.console: no snapshot asked of key {key.hex()}: {e}",
                        file=sys.stderr,
                        flush=True,
                    )
        elif topic == self.topics.snapshots:
            self.observations.add_snapshot(value)
        elif topic == self.topics.traces:
            self.observations.add_trace(value)
        elif topic == self.topics.dead_letters:
            self.observations.add_dead_letter(value)
        elif topic == self.topics.completions and key:
            self.observations.add_completion(key, value, at_ms)

    def connect(self, bootstrap_servers: str, group_id: str) -> None:
        from confluent_kafka import Consumer

        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": group_id,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        topics = self.topics
        self._consumer.subscribe(
            [topics.approvals, topics.snapshots, topics.traces, topics.completions,
             topics.dead_letters]
        )  # fmt: skip

    def poll(self, timeout_s: float = 0.5) -> bool:
        """Reads and stores at most one record; True when it got one."""
        message = self._consumer.poll(timeout_s)
        if message is None:
            return False
        if message.error():
            raise KafkaBusError(f"console reading {message.topic()}: {message.error()}")
        _, at_ms = message.timestamp()
        self.handle(message.topic(), message.value(), message.key() or b"", at_ms)
        self._consumer.commit(message=message, asynchronous=False)
        return True

    def run(self, stop: threading.Event) -> None:
        """Reads until `stop` is set, producing what is recorded and unacknowledged (a crash's,
        a click's that met the broker down) at start and every RETRY_S after: a broker down
        delays a decision, never ends the loop or loses it."""
        retry_at = 0.0
        try:
            while not stop.is_set():
                if time.monotonic() >= retry_at:
                    retry_at = time.monotonic() + RETRY_S
                    try:
                        self.produce_recorded()
                    except KafkaBusError as e:
                        print(
                            f"beam_agents.console: decisions not delivered yet, retrying in "
                            f"{RETRY_S:.0f} s: {e}",
                            file=sys.stderr,
                            flush=True,
                        )
                self.poll()
        finally:
            self._consumer.close()
