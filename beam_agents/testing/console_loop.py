"""The demo's support-triage loop on a real Kafka broker with a person deciding in the console:
what the console's Kafka and browser tests drive end to end, in about ten seconds of rounds.

The effector service and the console run as their own processes, started as `beam-agents demo
--bus=kafka --console` starts them (`launch_effector`, `launch_console`). Only the streaming job
is replaced: RunAgent runs as DirectRunner rounds (`run_round`), each reading what arrived on
the events topic since the last one (tool results, the console's decision, its export
requests) after the key's snapshot from the round before, and writing its outputs to their
topics as AgentLoop writes them. So every answer the agent resumes with went through Kafka,
and the approval is the exact record the console produced.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from beam_agents._protos import AgentEnvelope, StateSnapshot
from beam_agents.bus import TopicReader, Topics, create_topics, produce, record_value
from beam_agents.ops.demo import (
    CUSTOMER,
    demo_ticket,
    launch_console,
    launch_effector,
    triage_agent,
)
from beam_agents.ops.rounds import Advance, Outputs, run_round
from beam_agents.runtime import COMPLETIONS, ERRORS, SNAPSHOTS
from beam_agents.testing.engines import Engines

__all__ = ["DemoLoop", "kafka_broker"]


@contextlib.contextmanager
def kafka_broker() -> Iterator[str]:
    """A Kafka broker's address: the running one of tools/engines.sh, or one started for the
    block and stopped after it."""
    engines = Engines()
    try:
        yield engines.up(["kafka"]).endpoints["KAFKA_BOOTSTRAP"]
    finally:
        engines.down()


class DemoLoop:
    """`start()` produces the ticket; each `advance()` runs rounds until the agent completes
    or waits for an answer that has not arrived (an approval nobody decided yet)."""

    def __init__(self, bootstrap: str, workdir: Path) -> None:
        self.bootstrap = bootstrap
        self.workdir = workdir
        self.topics = Topics(f"console-loop-{time.time_ns()}")
        create_topics(bootstrap, self.topics)
        self.effector = launch_effector(workdir, kafka_bootstrap=bootstrap, topics=self.topics)
        self.console, self.url = launch_console(
            workdir, kafka_bootstrap=bootstrap, topics=self.topics, port=0
        )
        self.reader = TopicReader(bootstrap, [self.topics.events])
        self.snapshot: StateSnapshot | None = None
        self.completions: list[bytes] = []
        self.answers: list[AgentEnvelope] = []
        self._read = self._seen = 0
        self._rounds = 0
        self._now = int(time.time() * 1000)

    def start(self) -> None:
        ticket = demo_ticket(self._now)
        produce(self.bootstrap, [(self.topics.events, CUSTOMER, ticket, self._now)])

    @property
    def waiting_for(self) -> set[str]:
        """The intents the agent is suspended on that no event answered yet."""
        if self.snapshot is None or not self.snapshot.HasField("continuation"):
            return set()
        answered = {a.tool_result.intent_id or a.approval.intent_id for a in self.answers}
        return set(self.snapshot.continuation.pending_intent_ids) - answered

    def advance(self, timeout_s: float = 30) -> None:
        """Rounds until the agent completed, or until it waits for answers that do not come
        within `timeout_s` (then `waiting_for` names them)."""
        while not self.completions:
            self.effector.check_alive()
            self.console.check_alive()
            events = self._events(timeout_s)
            if not events or self.waiting_for:
                return
            self._round(events)

    def _events(self, timeout_s: float) -> list[AgentEnvelope]:
        """The events read since the last round, once there are some and they answer every
        pending intent (or `timeout_s` passed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.reader.settle(0.5)
            read = [AgentEnvelope.FromString(v) for _, v in self.reader.records[self.topics.events]]
            events, self._seen = read[self._read :], len(read)
            self.answers = [e for e in read if e.HasField("tool_result") or e.HasField("approval")]
            if (events and not self.waiting_for) or time.monotonic() > deadline:
                return events

    def _round(self, events: list[AgentEnvelope]) -> Outputs:
        """One RunAgent round over the snapshot and `events`, its outputs produced to the
        loop's topics."""
        self._rounds += 1
        previous, self._now = self._now, max(self._now + 1000, int(time.time() * 1000))
        for event in events:
            # After the restored snapshot, before the round's end (as the rounds demo does);
            # an envelope's time is the record's, outside any signature.
            event.event_time_ms = previous + 10
        export = AgentEnvelope(entity_key=CUSTOMER, event_time_ms=self._now)
        export.export_request.request_id = f"loop-round-{self._rounds}"
        script = [*([self.snapshot] if self.snapshot else []), *events]
        script += [Advance(self._now), export, Advance(self._now + 1)]
        outputs = run_round(triage_agent(), script, self.workdir).before(self._now + 2)
        self._read = self._seen
        if outputs.values(ERRORS):
            raise RuntimeError(f"the agent dead-lettered: {outputs.values(ERRORS)}")
        produce(
            self.bootstrap,
            [
                (topic, key, record_value(value), at)
                for tag, topic in self.topics.for_outputs().items()
                for at, key, value in outputs.rows.get(tag, [])
            ],
        )
        self.completions += outputs.values(COMPLETIONS)
        (self.snapshot,) = [
            s for s in outputs.values(SNAPSHOTS) if s.request_id == export.export_request.request_id
        ]
        return outputs

    def close(self) -> None:
        self.console.stop()
        self.effector.stop()
        self.reader.close()
