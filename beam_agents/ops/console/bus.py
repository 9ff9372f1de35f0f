"""The console on the Kafka loop: what it reads, what it produces, and in which order.

Reading. `ConsoleBus.run` reads the approvals, snapshots, traces, completions and dead_letters
topics into the Inbox and the Observations (as a consumer group, committing, every second, the
offsets of records whose rows are stored, so a restart reads on and a copy read twice is one
row). Nothing the broker
or a record does ends it: a consumer error the client recovers from (a broker down, a topic
not made yet) is noted and reading goes on; anything else closes the consumer and opens a new
one after a backoff (0.5 s doubling to 10 s), which reads on from the committed offsets. For
each new approval the inbox admits (verified as the effector verifies it) it asks the agent
for a StateSnapshot (an export_request envelope on the events topic), so the viewer shows the
suspension and its deadline; a refused copy asks for nothing and writes nothing to the loop:
its cost is one decode, one HMAC and one SQLite row.

Writing, through an outbox. `ConsoleBus.decide` only records: the Inbox commits the decision,
its exact AgentEnvelope and TraceEvent bytes and its audit row in one SQLite transaction (the
decisions table, `produced = 0`, is the outbox), wakes the sender and returns at once. The
sender (a thread of `run`, or `send`) produces every recorded, unproduced decision, the
envelope to the events topic and its TraceEvent to the traces topic, and marks it produced
only once the broker acknowledged both; on a failure it tries again after a backoff (0.5 s
doubling to 10 s), and every `RETRY_S` it looks for decisions another console process on the
same file recorded. So a decision made while the broker is down is answered "recorded, will
be sent" at once and reaches the agent once the broker answers, without a click. The snapshot
requests go the same way, from a bounded in-memory queue (best effort: a lost one is asked for
again from the agent's page), so the reader never waits for the broker.

Once: one idempotent producer for the process's life (`KafkaPublisher`), whose delivery
timeout is shorter than the wait for it, so every attempt ends with every record reported,
delivered or failed: an attempt that failed left nothing in flight to arrive later beside
its retry. A copy can still reach the topic twice when a process dies between the broker's
acknowledgement and the mark (or a record timed out after the broker wrote it); it carries the
same bytes and record id, which RunAgent takes as a duplicate answer: the agent sees one
decision, never two, never none.

Health (`health`): whether the reader reads (a metadata probe every `PROBE_S`, and the
consumer's errors), how many records it is behind and since when, whether the sender's last
attempt failed and how long the oldest undelivered decision has waited; what /healthz answers
and the banner of every page shows. It names error codes and topic roles, never an address.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from beam_agents._protos import AgentEnvelope
from beam_agents.bus import KafkaBusError, Topics
from beam_agents.bus.records import Sending
from beam_agents.intents.effector import wall_clock_ms
from beam_agents.ops.console.inbox import Decision, Inbox
from beam_agents.ops.console.observed import Observations

__all__ = ["ConsoleBus", "KafkaPublisher", "Publisher"]

Record = tuple[str, bytes, Any, int]

#: Seconds between the sender's looks for decisions recorded by another process on the file.
RETRY_S = 2.0
#: The backoff after a failure, doubling from the first to the last.
BACKOFF_S = (0.5, 10.0)
#: Seconds between the reader's probes of the broker (its topics, its lag), and the longest
#: a probe waits for its answer.
PROBE_S = 2.0
PROBE_TIMEOUT_S = 2.0
#: Seconds the reader may be behind (records left to read) before it counts as behind.
BEHIND_AFTER_S = 10.0
#: Seconds a decision may wait for the broker's acknowledgement before it counts as late.
LATE_AFTER_S = 10.0
#: How long the producer tries to deliver a record before it reports it failed.
DELIVERY_TIMEOUT_S = 15.0
#: Most snapshot requests waiting for the sender (one per key).
MAX_QUEUED_EXPORTS = 1000


class Publisher(Protocol):
    def __call__(self, records: Iterable[Record]) -> None:
        """Produces the records; returns once the broker acknowledged every one, else raises
        KafkaBusError."""


class KafkaPublisher:
    """One idempotent producer, made on first use and kept (a producer per call paid a
    connection and a metadata round trip each time), and made again after a fatal error
    (an idempotent producer fenced or out of sequence produces nothing more)."""

    def __init__(self, bootstrap_servers: str) -> None:
        self._config = {
            "bootstrap.servers": bootstrap_servers,
            "enable.idempotence": True,
            # Below Sending.wait's 30 s flush: every record is reported before the wait ends,
            # so nothing of a failed attempt stays in flight to arrive beside its retry.
            "message.timeout.ms": int(DELIVERY_TIMEOUT_S * 1000),
            "error_cb": self._on_error,
        }
        self._producer = None
        self._fatal = False

    def _on_error(self, error) -> None:
        self._fatal = self._fatal or error.fatal()

    def __call__(self, records: Iterable[Record]) -> None:
        if self._producer is None or self._fatal:
            from confluent_kafka import Producer

            self._producer, self._fatal = Producer(self._config), False
        sending = Sending(self._producer)
        sending.produce(records)
        sending.wait()


def _backoff(previous: float) -> float:
    first, last = BACKOFF_S
    return min(max(previous * 2, first), last)


def _log(text: str) -> None:
    print(f"beam_agents.console: {text}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class _Trouble:
    """One side's (reading or writing) failure: since when (None: none), and what."""

    since_ms: int | None = None
    error: str = ""

    def failed(self, now_ms: int, error: str) -> None:
        if self.since_ms is None:
            self.since_ms = now_ms
        self.error = error

    def ok(self) -> None:
        self.since_ms, self.error = None, ""


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
        self._consumer = self._prober = None
        self._consumer_config: dict = {}
        # One sending at a time: two would both read a decision as unproduced and produce it
        # twice.
        self._producing = threading.Lock()
        self._wake = threading.Event()
        # Keys whose agent is to be asked for a snapshot, oldest first (a dict: one per key).
        self._exports: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._exports_lock = threading.Lock()
        self._reading, self._writing = _Trouble(), _Trouble()
        self._lag = 0
        self._behind_since_ms: int | None = None
        self._probe_at = 0.0

    # -- producing ------------------------------------------------------------------------

    def decide(
        self,
        intent_id: str,
        *,
        approved: bool,
        user: str,
        comment: str,
        address: str,
        edits: Mapping[str, object] | None = None,
    ) -> tuple[Decision, bool]:
        """Records the decision (approving with `edits`, Inbox.decide) and wakes the sender,
        which produces it (module docstring). Returns the decision and whether this call made
        it; raises DecisionRefused."""
        decision, made = self.inbox.decide(
            intent_id, approved=approved, user=user, comment=comment, address=address,
            edits=edits,
        )  # fmt: skip
        self._wake.set()
        return decision, made

    def produce_recorded(self) -> int:
        """Produces the decisions recorded but not acknowledged yet, then the snapshot
        requests queued; returns how many decisions. Raises KafkaBusError at the first the
        broker did not acknowledge (what is left stays for the next try)."""
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
            while key := self._next_export():
                try:
                    self._produce_export(key)
                except KafkaBusError:
                    self.request_export(key)  # asked again on the next try
                    raise
            return len(decisions)

    def _produce_export(self, key: bytes) -> None:
        now = self._clock()
        envelope = AgentEnvelope(entity_key=key, event_time_ms=now)
        request_id = f"console-{uuid.uuid4().hex}"
        envelope.export_request.request_id = request_id
        # Recorded first: the answer is trusted as this request's (observed.py).
        self.observations.expect_snapshot(key, request_id, now)
        self._publish([(self.topics.events, key, envelope, now)])

    def request_export(self, key: bytes) -> None:
        """Queues a request to the key's agent for a StateSnapshot; the sender produces it.
        A full queue keeps the keys it has (the agent page's button asks again)."""
        with self._exports_lock:
            if key not in self._exports and len(self._exports) < MAX_QUEUED_EXPORTS:
                self._exports[bytes(key)] = None
        self._wake.set()

    def _next_export(self) -> bytes | None:
        with self._exports_lock:
            return self._exports.popitem(last=False)[0] if self._exports else None

    def send(self, stop: threading.Event) -> None:
        """Produces what is recorded until `stop` is set: at once, when woken (a decision, a
        snapshot request), every RETRY_S, after a failure once its backoff passed, and once
        more when stopped (what was decided last is not left for the next start): a pass
        that began before the stop may have missed a decision recorded during it, so the last
        pass is one that began after."""
        backoff = 0.0
        while True:
            stopping = stop.is_set()
            self._wake.clear()
            try:
                self.produce_recorded()
            except Exception as e:  # the sender outlives any failure
                backoff = _backoff(backoff)
                unacknowledged = isinstance(e, KafkaBusError)
                self._writing.failed(
                    self._clock(), "not acknowledged" if unacknowledged else _code(e)
                )
                _log(f"decisions not delivered yet, trying again in {backoff:.1f} s: {e}")
            else:
                backoff = 0.0
                self._writing.ok()
            if stopping:
                return
            self._wake.wait(backoff or RETRY_S)

    # -- consuming ------------------------------------------------------------------------

    def handle(self, topic: str, value: bytes | None, key: bytes = b"", at_ms: int = 0) -> None:
        """Stores one record of the topics the console reads (a completion by its record's
        key and timestamp: its value is the bare output)."""
        if value is None:
            return
        if topic == self.topics.approvals:
            approval, kept = self.inbox.receive(value)
            # Only a copy the inbox admits names a key to show and to ask: a forged one would
            # make the console write to the loop for any key the forger chose.
            if kept and approval.approvable:
                key = approval.intent.entity_key
                self.observations.add_key(key)
                self.request_export(key)
        elif topic == self.topics.snapshots:
            self.observations.add_snapshot(value)
        elif topic == self.topics.traces:
            self.observations.add_trace(value)
        elif topic == self.topics.dead_letters:
            self.observations.add_dead_letter(value)
        elif topic == self.topics.completions and key:
            self.observations.add_completion(key, value, at_ms)

    def _subscribed(self) -> list[str]:
        topics = self.topics
        return [
            topics.approvals, topics.snapshots, topics.traces, topics.completions,
            topics.dead_letters,
        ]  # fmt: skip

    def connect(self, bootstrap_servers: str, group_id: str) -> None:
        """Opens the consumer (and, after a failure, `run` opens a new one the same way)."""
        self._consumer_config = {
            "bootstrap.servers": bootstrap_servers,
            "group.id": group_id,
            "auto.offset.reset": "earliest",
            # At least once: the client commits only the offsets `poll` stored, each after its
            # record was stored, every second and on close. A commit each record (one request
            # each) made close wait for thousands of them.
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
            "auto.commit.interval.ms": 1000,
            # A topic made after the console started is read within seconds, not at the
            # client's default metadata refresh of five minutes.
            "topic.metadata.refresh.interval.ms": 5000,
        }
        self._open()

    def _open(self) -> None:
        from confluent_kafka import Consumer

        self._consumer = Consumer(self._consumer_config)
        self._consumer.subscribe(self._subscribed())
        # The probe's own client: a metadata request on the reading consumer held its fetches
        # back for half a second each.
        self._prober = Consumer({**self._consumer_config, "group.id": "beam-agents-probe"})

    def _close(self) -> None:
        clients, self._consumer, self._prober = (self._consumer, self._prober), None, None
        for client in clients:
            if client is None:
                continue
            try:
                client.close()
            except Exception as e:  # one that cannot close is dropped
                _log(f"closing the reader's consumer: {e}")

    def poll(self, timeout_s: float = 0.5) -> bool:
        """Reads and stores at most one record; True when it got one. A consumer error the
        client recovers from is noted (`health`); a fatal one raises KafkaBusError."""
        message = self._consumer.poll(timeout_s)
        if message is None:
            return False
        if error := message.error():
            if error.fatal():
                raise KafkaBusError(f"console reading: fatal broker error {error.name()}")
            self._reading.failed(self._clock(), error.name())
            return False
        _, at_ms = message.timestamp()
        self.handle(message.topic(), message.value(), message.key() or b"", at_ms)
        # Committed within a second (connect): a record read again after a crash stores
        # nothing twice; waiting for a commit each held every record behind a round trip.
        self._consumer.store_offsets(message=message)
        return True

    def _probe(self) -> None:
        """Every PROBE_S: asks the broker for the topics' metadata (is it there, are they)
        and measures how far behind the reader is."""
        from confluent_kafka import KafkaException

        if time.monotonic() < self._probe_at:
            return
        self._probe_at = time.monotonic() + PROBE_S
        now = self._clock()
        try:
            known = self._prober.list_topics(timeout=PROBE_TIMEOUT_S).topics
        except KafkaException as e:
            self._reading.failed(now, e.args[0].name())
            return
        missing = [t for t in self._subscribed() if t not in known or known[t].error is not None]
        if missing:
            role = missing[0].rpartition(".")[2]
            self._reading.failed(now, f"no {role} topic")
        else:
            self._reading.ok()
        lag = 0
        try:
            for position in self._consumer.position(self._consumer.assignment()):
                _, high = self._consumer.get_watermark_offsets(position, cached=True) or (0, 0)
                if position.offset >= 0 and high >= 0:
                    lag += max(high - position.offset, 0)
        except KafkaException:  # a rebalance under way: measured at the next probe
            return
        self._lag = lag
        if not lag:
            self._behind_since_ms = None
        elif self._behind_since_ms is None:
            self._behind_since_ms = now

    def run(self, stop: threading.Event) -> None:
        """Reads until `stop` is set, with the sender in a thread of its own (module
        docstring): nothing the broker or a record does ends either."""
        sender = threading.Thread(target=self.send, args=(stop,), name="console-send", daemon=True)
        sender.start()
        backoff = 0.0
        try:
            while not stop.is_set():
                try:
                    if self._consumer is None:
                        self._open()
                    self._probe()
                    self.poll()
                    backoff = 0.0
                except Exception as e:  # the reader outlives any failure
                    backoff = _backoff(backoff)
                    self._reading.failed(self._clock(), _code(e))
                    _log(f"reading again on a new consumer in {backoff:.1f} s: {e}")
                    self._close()
                    stop.wait(backoff)
        finally:
            self._wake.set()
            sender.join(2 * DELIVERY_TIMEOUT_S + 5)
            self._close()

    # -- health ---------------------------------------------------------------------------

    def health(self) -> dict:
        """Whether the console reads and writes its broker, as /healthz answers it (module
        docstring): durations in whole seconds, error codes, no address or secret."""
        now = self._clock()

        def seconds(since_ms: int | None) -> int | None:
            return None if since_ms is None else max(now - since_ms, 0) // 1000

        undelivered, oldest_ms = self.inbox.undelivered()
        behind_s = seconds(self._behind_since_ms)
        behind = behind_s is not None and behind_s >= BEHIND_AFTER_S
        waited_s = seconds(oldest_ms)
        reading, writing = self._reading, self._writing
        reader = {
            "ok": reading.since_ms is None and not behind,
            "failing_for_s": seconds(reading.since_ms),
            "error": reading.error or None,
            "behind_records": self._lag,
            "behind_for_s": behind_s if behind else None,
        }
        writer = {
            "ok": writing.since_ms is None and (waited_s is None or waited_s < LATE_AFTER_S),
            "failing_for_s": seconds(writing.since_ms),
            "error": writing.error or None,
            "undelivered_decisions": undelivered,
            "oldest_undelivered_s": waited_s,
        }
        return {"healthy": reader["ok"] and writer["ok"], "reader": reader, "writer": writer}


def _code(error: Exception) -> str:
    """A failure named without its message (which names the broker's address): the broker's
    error code when there is one, else the error's type."""
    from confluent_kafka import KafkaException

    if isinstance(error, KafkaException) and error.args:
        return error.args[0].name()
    return type(error).__name__
