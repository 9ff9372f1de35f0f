"""An upgrade across binaries on a real Flink cluster, with Kafka as the agents' message bus.

Job 1 (state schema 1) runs the support-triage loop (beam_agents.kafka_bus.AgentLoop) and leaves
three keys suspended on a refund approval and three with memory; it is stopped with a
savepoint. Job 2, built with the synthetic version-2 migration steps, restores from it. What is
proved is read back from Kafka outside the pipeline: every key's state went through the step
on its first read, the suspended keys resumed with their answers, and nothing was lost or
executed twice. Then the roll-back: job 1 restored from job 2's savepoint wedges a key job 2
committed (its bundle fails, nothing is emitted for it), and job 2 restored again clears the
wedge and finds the key's bytes exactly as it left them.

The effector is its own process (`beam-agents effector-service`) reading the intents topic,
with its records in SQLite. Engines are started through tools/engines.sh unless they run
already, and only those started here are stopped.
"""

from __future__ import annotations

import itertools
import json
import sqlite3
import time
from collections import Counter

import pytest

from beam_agents._protos import (
    AgentEnvelope,
    ExecutionRecord,
    StateSnapshot,
    ToolIntent,
)
from beam_agents.demo import approve
from beam_agents.examples.support_triage import ticket
from beam_agents.kafka_bus import TopicReader, Topics, create_topics, decode_dead_letter, produce
from beam_agents.testing.engines import Engines, FlinkRest, Launched
from beam_agents.testing.synthetic_v2 import MIGRATED_KEY

pytestmark = pytest.mark.engines

REFUNDS = [b"c-1", b"c-3", b"c-5"]  # suspend on a refund approval
QUESTIONS = [b"c-2", b"c-4", b"c-6"]  # complete with the customer in memory
KEYS = REFUNDS + QUESTIONS
#: Bytes that are no AgentEnvelope (a truncated varint).
UNDECODABLE = b"\xff"
#: The dead letters of the junk job 1 is sent: (entity_key, reason).
JUNK = Counter({(b"", "undecodable_envelope"): 2, (b"c-9", "empty_envelope"): 1})


@pytest.fixture(scope="module")
def engines():
    started = Engines()
    try:
        yield started.up(["kafka", "java", "flink"])
    finally:
        started.down()


class Loop:
    """One loop's topics, effector service and jobs, and everything read back from Kafka."""

    def __init__(self, engines: Engines, tmp_path) -> None:
        self.engines = engines
        self.tmp_path = tmp_path
        self.bootstrap = engines.endpoints["KAFKA_BOOTSTRAP"]
        self.topics = Topics(f"upgrade-{time.time_ns()}")
        create_topics(self.bootstrap, self.topics)
        self.rest = FlinkRest(engines.endpoints["FLINK_REST"])
        self.savepoints = "file://" + engines.endpoints["FLINK_SAVEPOINTS"]
        self.reader = TopicReader(self.bootstrap, self.topics.all())
        self.launched: list[Launched] = []
        self.jobs: list[str] = []
        self._ids = itertools.count(1)
        self.effector_store = tmp_path / "effector.sqlite"
        self.effector = self._launch(
            "beam_agents.cli",
            ["effector-service", "--bootstrap-servers", self.bootstrap,
             "--topic-prefix", self.topics.prefix, "--store", str(self.effector_store),
             "--tools", "beam_agents.examples.support_triage:TOOLS",
             "--keyring", "beam_agents.demo:demo_keyring",
             "--result-keyring", "beam_agents.demo:demo_effector_keyring"],
            "effector",
        )  # fmt: skip
        self.effector.wait_for_output("serving")

    def _launch(self, module: str, args: list[str], name: str) -> Launched:
        """`python -m module args`, logged to name.log and stopped by close()."""
        launched = Launched.python(module, args, self.tmp_path / f"{name}.log")
        self.launched.append(launched)
        return launched

    def start_job(self, state_schema: int, savepoint: str | None = None) -> tuple[str, Launched]:
        known = set(self.rest.jobs())
        args = [
            "--kafka_bootstrap", self.bootstrap,
            "--topic_prefix", self.topics.prefix,
            "--expansion_service", self.engines.endpoints["EXPANSION_SERVICE"],
            "--state_schema", str(state_schema),
            *self.engines.flink_options(),
        ]  # fmt: skip
        if savepoint is not None:
            args.append(f"--savepoint_path={savepoint}")
        name = f"job{len(self.jobs) + 1}-schema{state_schema}"
        launcher = self._launch("beam_agents.testing.triage_loop", args, name)
        jid = self.rest.wait_for_new_job(known, launcher)
        self.jobs.append(jid)
        return jid, launcher

    def savepoint(self, jid: str, launcher: Launched) -> str:
        path = self.rest.stop_with_savepoint(jid, self.savepoints)
        assert launcher.wait(60) == 0  # the job ended; the launcher saw it end
        return path

    def send(self, *envelopes: AgentEnvelope) -> None:
        produce(
            self.bootstrap,
            [(self.topics.events, e.entity_key, e, e.event_time_ms) for e in envelopes],
        )

    def ticket(self, key: bytes, text: str) -> AgentEnvelope:
        customer = key.decode()
        return AgentEnvelope(
            entity_key=key,
            event_time_ms=int(time.time() * 1000),
            external_event=ticket(f"t-{customer}-{next(self._ids)}", customer, text),
        )

    def export(self, key: bytes, request_id: str) -> AgentEnvelope:
        envelope = AgentEnvelope(entity_key=key, event_time_ms=int(time.time() * 1000))
        envelope.export_request.request_id = request_id
        return envelope

    def read(self, until, timeout_s: float = 120):
        return self.reader.read(until, timeout_s)

    def messages(self, topic: str, message_type) -> list:
        return [message_type.FromString(v) for _, v in self.reader.records[topic]]

    def dead_letters(self) -> Counter:
        letters = [decode_dead_letter(v) for _, v in self.reader.records[self.topics.dead_letters]]
        return Counter((letter.entity_key, letter.reason) for letter in letters)

    def completions(self) -> list[tuple[bytes, dict]]:
        return [(k, json.loads(v)) for k, v in self.reader.records[self.topics.completions]]

    def snapshots(self, prefix: str) -> dict[bytes, StateSnapshot]:
        found = {}
        for snapshot in self.messages(self.topics.snapshots, StateSnapshot):
            if snapshot.request_id.startswith(prefix):
                assert snapshot.entity_key not in found, "one export, one snapshot"
                found[snapshot.entity_key] = snapshot
        return found

    def close(self) -> None:
        for jid in self.jobs:
            self.rest.cancel(jid)
        for launched in reversed(self.launched):
            launched.stop()
        self.reader.close()


@pytest.fixture
def loop(engines, tmp_path):
    opened = Loop(engines, tmp_path)
    try:
        yield opened
    finally:
        opened.close()


def _count(records, topic) -> int:
    return len(records[topic])


def test_a_savepoint_upgrade_migrates_every_key_on_first_read_and_a_roll_back_wedges_it(loop):
    topics = loop.topics

    # Job 1, schema 1: three refunds wait for approval, three questions complete. Junk on the
    # bus first (a tombstone, bytes that are no envelope, an envelope with nothing in it): dead
    # letters, and the job goes on.
    job1, launcher1 = loop.start_job(state_schema=1)
    now = int(time.time() * 1000)
    produce(
        loop.bootstrap,
        [
            (topics.events, b"c-1", None, now),
            (topics.events, b"c-1", UNDECODABLE, now),
            (topics.events, b"c-9", AgentEnvelope(entity_key=b"c-9", event_time_ms=now), now),
        ],
    )
    loop.send(*(loop.ticket(k, "I was charged twice, refund me") for k in REFUNDS))
    loop.send(*(loop.ticket(k, "how do I export my invoices?") for k in QUESTIONS))
    loop.read(
        lambda r: (
            _count(r, topics.completions) == 3
            and _count(r, topics.approvals) == 3
            and _count(r, topics.dead_letters) == 3
        )
    )
    assert loop.dead_letters() == JUNK
    loop.send(*(loop.export(k, f"job1-{k.decode()}") for k in KEYS))
    loop.read(lambda r: _count(r, topics.snapshots) == 6)
    before = loop.snapshots("job1-")
    for key in KEYS:
        assert before[key].memory.state_schema_version == 1
        # A function agent's memory writes reach state when it completes: a refund waiting
        # for its approval has not written the customer yet (its replay will).
        remembered = f"customer:{key.decode()}" in {e.key for e in before[key].memory.entries}
        assert remembered == (key in QUESTIONS)
        assert bool(before[key].continuation.pending_intent_ids) == (key in REFUNDS)
    savepoint1 = loop.savepoint(job1, launcher1)

    # Job 2, schema 2, restored from job 1: the approvals arrive, and new questions.
    job2, launcher2 = loop.start_job(state_schema=2, savepoint=savepoint1)
    approvals = loop.messages(topics.approvals, ToolIntent)
    assert sorted(a.entity_key for a in approvals) == REFUNDS
    loop.send(*(approve(a) for a in approvals))
    loop.send(*(loop.ticket(k, "where is the API documentation?") for k in QUESTIONS))
    loop.read(lambda r: _count(r, topics.completions) == 9)
    loop.send(*(loop.export(k, f"job2-{k.decode()}") for k in KEYS))
    loop.read(lambda r: _count(r, topics.snapshots) == 12)
    after = loop.snapshots("job2-")
    for key in KEYS:
        memory = after[key].memory
        # The synthetic step ran on the key's first read in job 2 and its view was committed.
        assert memory.state_schema_version == 2
        assert after[key].llm_cache.state_schema_version == 2
        keys_in_memory = [e.key for e in memory.entries]
        assert MIGRATED_KEY in keys_in_memory
        assert {e.key for e in before[key].memory.entries} < set(keys_in_memory)
        assert f"customer:{key.decode()}" in keys_in_memory
        assert not after[key].continuation.pending_intent_ids  # nobody is left waiting
    outcomes = Counter((k, c["outcome"]) for k, c in loop.completions())
    assert outcomes == Counter(
        {**{(k, "refunded"): 1 for k in REFUNDS}, **{(k, "answered"): 2 for k in QUESTIONS}}
    )
    # Nothing executed twice: every intent has one id, one execution record, one result.
    intents = loop.messages(topics.intents, ToolIntent)
    tool_intents = [i.intent_id for i in intents if i.kind == ToolIntent.TOOL]
    assert len(tool_intents) == len(set(tool_intents)) == len(KEYS) + 3 + 3  # lookups, refunds
    envelopes = [
        AgentEnvelope.FromString(value)
        for _, value in loop.reader.records[topics.events]
        if value not in (None, UNDECODABLE)
    ]
    results = [e.tool_result.intent_id for e in envelopes if e.HasField("tool_result")]
    assert sorted(results) == sorted(tool_intents)
    with sqlite3.connect(loop.effector_store) as db:
        records = [
            ExecutionRecord.FromString(r) for (r,) in db.execute("SELECT record FROM executions")
        ]
    assert sorted(r.intent_id for r in records) == sorted(i.intent_id for i in intents)
    assert loop.dead_letters() == JUNK  # and nothing else
    savepoint2 = loop.savepoint(job2, launcher2)

    # Roll-back: job 1 restored from job 2's savepoint cannot read c-1's v2 state.
    wedged = b"c-1"
    job3, launcher3 = loop.start_job(state_schema=1, savepoint=savepoint2)
    loop.send(loop.export(wedged, "rollback-c-1"))
    deadline = time.monotonic() + 120
    while not any("roll the newer binary forward" in e for e in loop.rest.exceptions(job3)):
        assert time.monotonic() < deadline, "job 1 did not refuse the version-2 state"
        time.sleep(1)
    time.sleep(5)  # what a wedged job could still emit would be on the topic by now
    loop.reader.settle(2)
    assert not loop.snapshots("rollback-")
    loop.rest.cancel(job3)
    loop.rest.wait_for_state(job3, {"CANCELED"})
    launcher3.wait(60)

    # Job 2 restored again from its own savepoint: the wedge clears, the bytes are as it left them.
    job4, _ = loop.start_job(state_schema=2, savepoint=savepoint2)
    loop.read(lambda r: bool(loop.snapshots("rollback-")))
    (again,) = loop.snapshots("rollback-").values()
    left = after[wedged]
    assert again.memory.SerializeToString(deterministic=True) == left.memory.SerializeToString(
        deterministic=True
    )
    assert again.llm_cache == left.llm_cache and again.seq == left.seq
    assert loop.dead_letters() == JUNK  # and nothing else
    loop.rest.cancel(job4)
