"""An upgrade across binaries on a real Flink cluster, with Kafka as the agents' message bus.

Job 1 (the current state schema) runs the support-triage loop (beam_agents.bus.AgentLoop) and
leaves three keys suspended on a refund approval and three with memory; it is stopped with a
savepoint. Job 2, built with the synthetic migration steps to the next version (CURRENT + 1),
restores from it. What is
proved is read back from Kafka outside the pipeline: every key's state went through the step
on its first read, the suspended keys resumed with their answers, and nothing was lost or
executed twice. Then the roll-back: job 1 restored from job 2's savepoint wedges a key job 2
committed (its bundle fails, nothing is emitted for it), and job 2 restored again clears the
wedge and finds the key's bytes exactly as it left them.

The real upgrade: job 1 is the release that wrote state schema 1 (SCHEMA_1_RELEASE, taken
from this repository's history), whose blobs carry no entry index; job 2, this release,
restores from its savepoint, resumes the suspended keys and commits every key's state at the
current version with its index, each intent still run once.

Then the scale-out: a loop stopped with a savepoint at parallelism 1 is restored at
parallelism 2 on two task managers. Every key continues where it was (the suspended ones resume
on their approvals, the others' state is byte for byte what it was), both task managers run a
share of the keys, and the loop's throughput at each parallelism is printed side by side.

The effector is its own process (`beam-agents effector-service`) reading the intents topic,
with its records in SQLite. Engines are started through tools/engines.sh unless they run
already, and only those started here are stopped.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import time
from collections import Counter
from pathlib import Path

import pytest

from beam_agents._protos import AgentEnvelope, ToolIntent
from beam_agents.bus import produce
from beam_agents.bus.flink import KafkaArrivals
from beam_agents.ops.demo import approve
from beam_agents.state.memory import with_checked_index
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION
from beam_agents.testing.engines import Engines
from beam_agents.testing.flink_loop import Loop
from beam_agents.testing.synthetic_next import MIGRATED_KEY, NEXT_STATE_SCHEMA_VERSION
from tools.workspace import source_root

pytestmark = pytest.mark.engines

REFUNDS = [b"c-1", b"c-3", b"c-5"]  # suspend on a refund approval
QUESTIONS = [b"c-2", b"c-4", b"c-6"]  # complete with the customer in memory
KEYS = REFUNDS + QUESTIONS
#: Bytes that are no AgentEnvelope (a truncated varint).
UNDECODABLE = b"\xff"
#: Questions sent at once, to new keys, to measure the loop's throughput.
BURST = 60
#: Beam runs Impulse at parallelism 1: chained to the Kafka read's first steps at parallelism
#: 1 and not above, which changes Flink's generated ids of those operators, so a savepoint taken
#: at 1 cannot be restored at 2. Unchained, every operator keeps its id at any parallelism.
RESCALABLE = ("--unchained",)
#: The last commit whose binary wrote state schema 1, the release before the entry index moved
#: into state: the real upgrade's job 1.
SCHEMA_1_RELEASE = "f426924c273aa7510125453e2085bb7ac60fb004"
#: The dead letters of the junk job 1 is sent: (entity_key, reason).
JUNK = Counter({(b"", "undecodable_envelope"): 2, (b"c-9", "empty_envelope"): 1})


@pytest.fixture(scope="module")
def engines():
    started = Engines()
    try:
        yield started.up(["kafka", "java", "flink"])
    finally:
        started.down()


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

    # Job 1, the current schema: three refunds wait for approval, three questions complete.
    # Junk on the bus first (a tombstone, bytes that are no envelope, an envelope with nothing
    # in it): dead letters, and the job goes on.
    job1 = loop.start_job(state_schema=CURRENT_STATE_SCHEMA_VERSION)
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
        assert before[key].memory.state_schema_version == CURRENT_STATE_SCHEMA_VERSION
        # A function agent's memory writes reach state when it completes: a refund waiting
        # for its approval has not written the customer yet (its replay will).
        remembered = f"customer:{key.decode()}" in {e.key for e in before[key].memory.entries}
        assert remembered == (key in QUESTIONS)
        assert bool(before[key].continuation.pending_intent_ids) == (key in REFUNDS)
    savepoint1 = loop.savepoint(job1)

    # Job 2, the next schema, restored from job 1: the approvals arrive, and new questions.
    job2 = loop.start_job(state_schema=NEXT_STATE_SCHEMA_VERSION, savepoint=savepoint1)
    after = _resume_and_export(loop, "job2-")
    for key in KEYS:
        # The synthetic step ran on the key's first read in job 2 and its view was committed.
        keys_in_memory = _memory_keys_at(after[key], NEXT_STATE_SCHEMA_VERSION)
        assert MIGRATED_KEY in keys_in_memory
        assert {e.key for e in before[key].memory.entries} < set(keys_in_memory)
        assert f"customer:{key.decode()}" in keys_in_memory
        assert not after[key].continuation.pending_intent_ids  # nobody is left waiting
    outcomes = Counter((k, c["outcome"]) for k, c in loop.completions())
    assert outcomes == Counter(
        {**{(k, "refunded"): 1 for k in REFUNDS}, **{(k, "answered"): 2 for k in QUESTIONS}}
    )
    _assert_each_intent_ran_once(loop)
    assert loop.dead_letters() == JUNK  # and nothing else
    savepoint2 = loop.savepoint(job2)

    # Roll-back: job 1 restored from job 2's savepoint cannot read c-1's next-version state.
    wedged = b"c-1"
    job3 = loop.start_job(state_schema=CURRENT_STATE_SCHEMA_VERSION, savepoint=savepoint2)
    loop.send(loop.export(wedged, "rollback-c-1"))
    deadline = time.monotonic() + 120
    while not any("roll the newer binary forward" in e for e in loop.rest.exceptions(job3.jid)):
        assert time.monotonic() < deadline, "job 1 did not refuse the next version's state"
        time.sleep(1)
    time.sleep(5)  # what a wedged job could still emit would be on the topic by now
    loop.reader.settle(2)
    assert not loop.snapshots("rollback-")
    loop.rest.cancel(job3.jid)
    loop.rest.wait_for_state(job3.jid, {"CANCELED"})
    job3.launcher.wait(60)

    # Job 2 restored again from its own savepoint: the wedge clears, the bytes are as it left them.
    job4 = loop.start_job(state_schema=NEXT_STATE_SCHEMA_VERSION, savepoint=savepoint2)
    loop.read(lambda r: bool(loop.snapshots("rollback-")))
    (again,) = loop.snapshots("rollback-").values()
    left = after[wedged]
    assert again.memory.SerializeToString(deterministic=True) == left.memory.SerializeToString(
        deterministic=True
    )
    assert again.llm_cache == left.llm_cache and again.seq == left.seq
    assert loop.dead_letters() == JUNK  # and nothing else
    loop.rest.cancel(job4.jid)


def _memory_keys_at(snapshot, version: int) -> list[str]:
    """The snapshot's memory keys, once its memory and replay cache are seen committed at
    `version`."""
    assert snapshot.memory.state_schema_version == version
    assert snapshot.llm_cache.state_schema_version == version
    return [e.key for e in snapshot.memory.entries]


def _resume_and_export(loop, prefix: str) -> dict:
    """In the job restored after job 1: the refunds' approvals (one for each refund) and a
    second question for each questioned key, answered; then every key's snapshot, exported
    under `prefix`."""
    topics = loop.topics
    approvals = loop.messages(topics.approvals, ToolIntent)
    assert sorted(a.entity_key for a in approvals) == REFUNDS
    loop.send(*(approve(a) for a in approvals))
    loop.send(*(loop.ticket(k, "where is the API documentation?") for k in QUESTIONS))
    loop.read(lambda r: _count(r, topics.completions) == 9)
    loop.send(*(loop.export(k, f"{prefix}{k.decode()}") for k in KEYS))
    loop.read(lambda r: _count(r, topics.snapshots) == 2 * len(KEYS))  # job 1 exported too
    return loop.snapshots(prefix)


def _assert_each_intent_ran_once(loop) -> None:
    """Nothing executed twice: every intent has one id, one execution record, one result; the
    tool intents are each key's customer lookup and the three refunds."""
    topics = loop.topics
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
    records = loop.execution_records()
    assert sorted(r.intent_id for r in records) == sorted(i.intent_id for i in intents)


@pytest.fixture(scope="module")
def schema_1_release(tmp_path_factory) -> Path:
    """The source tree of the release that wrote state schema 1, from this repository's
    history (CI's clean clone has it)."""
    root = source_root()
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", SCHEMA_1_RELEASE, "beam_agents", "migrations"],
        capture_output=True,
    )
    if archive.returncode:
        pytest.fail(
            f"the schema 1 release comes from git history: git archive {SCHEMA_1_RELEASE} "
            f"in {root} failed: {archive.stderr.decode(errors='replace')}"
        )
    tree = tmp_path_factory.mktemp("schema-1-release")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as files:
        files.extractall(tree, filter="data")
    return tree


@pytest.fixture
def legacy_signing_loop(engines, tmp_path):
    """A loop whose effector signs its results on the legacy scheme, as the rollout of the typed
    one holds signers while a release that knows only the legacy scheme still runs."""
    opened = Loop(
        engines, tmp_path, result_keyring="beam_agents.testing.flink_loop:legacy_effector_keyring"
    )
    try:
        yield opened
    finally:
        opened.close()


def test_a_savepoint_of_the_schema_1_release_restores_in_this_one_and_every_key_migrates(
    legacy_signing_loop, schema_1_release
):
    """The real upgrade, not a synthetic one: job 1 is the release that wrote state schema 1
    (no entry index in its blobs), job 2 this release, restored from job 1's savepoint."""
    loop = legacy_signing_loop
    topics = loop.topics
    job1 = loop.start_job(state_schema=1, source=schema_1_release)
    loop.send(*(loop.ticket(k, "I was charged twice, refund me") for k in REFUNDS))
    loop.send(*(loop.ticket(k, "how do I export my invoices?") for k in QUESTIONS))
    loop.read(lambda r: _count(r, topics.completions) == 3 and _count(r, topics.approvals) == 3)
    loop.send(*(loop.export(k, f"v1-{k.decode()}") for k in KEYS))
    loop.read(lambda r: _count(r, topics.snapshots) == len(KEYS))
    before = loop.snapshots("v1-")
    for key in QUESTIONS:
        # Written by the old binary: schema 1, and no index (its fields did not exist).
        assert before[key].memory.state_schema_version == 1
        assert before[key].memory.entries and not before[key].memory.key_hashes
    for key in REFUNDS:
        assert before[key].continuation.pending_intent_ids
    savepoint = loop.savepoint(job1)

    job2 = loop.start_job(savepoint=savepoint)
    after = _resume_and_export(loop, "now-")
    for key in KEYS:
        keys_in_memory = _memory_keys_at(after[key], CURRENT_STATE_SCHEMA_VERSION)
        memory = after[key].memory
        assert {e.key for e in before[key].memory.entries} <= set(keys_in_memory)
        assert f"customer:{key.decode()}" in keys_in_memory
        # Committed with its entry index: one 8-byte hash, stamp and key stamp an entry, and
        # the very index of these entries (a stale one of the right size would hide keys).
        assert len(memory.entry_stamps) == len(memory.key_hashes) == 8 * len(memory.entries)
        assert len(memory.key_stamps) == len(memory.key_hashes)
        assert with_checked_index(memory) is memory
        assert not after[key].continuation.pending_intent_ids
    outcomes = Counter((k, c["outcome"]) for k, c in loop.completions())
    assert outcomes == Counter(
        {**{(k, "refunded"): 1 for k in REFUNDS}, **{(k, "answered"): 2 for k in QUESTIONS}}
    )
    _assert_each_intent_ran_once(loop)
    assert not loop.dead_letters()
    loop.rest.cancel(job2.jid)


def _burst(loop, label: str) -> float:
    """Questions from a known customer to BURST new keys at once; completions per second from
    the first sent to the last completed (the whole loop: Kafka, the job, the effector)."""
    before = _count(loop.reader.records, loop.topics.completions)
    keys = [f"{label}-{i}".encode() for i in range(BURST)]
    started = time.monotonic()
    loop.send(*(loop.ticket(k, "how do I export my invoices?", customer="c-2") for k in keys))
    loop.read(lambda r: _count(r, loop.topics.completions) == before + BURST, timeout_s=300)
    return BURST / (time.monotonic() - started)


def test_a_loop_saved_at_parallelism_1_continues_every_key_at_parallelism_2_on_two_task_managers(
    loop, engines
):
    topics = loop.topics
    job1 = loop.start_job(options=RESCALABLE)
    loop.send(*(loop.ticket(k, "I was charged twice, refund me") for k in REFUNDS))
    loop.send(*(loop.ticket(k, "how do I export my invoices?") for k in QUESTIONS))
    loop.read(lambda r: _count(r, topics.completions) == 3 and _count(r, topics.approvals) == 3)
    one = _burst(loop, "p1")
    assert len(loop.agent_subtasks(job1.jid)) == 1
    loop.send(*(loop.export(k, f"p1-{k.decode()}") for k in KEYS))
    loop.read(lambda r: _count(r, topics.snapshots) == len(KEYS))
    before = loop.snapshots("p1-")
    savepoint = loop.savepoint(job1)

    engines.run("add-taskmanager")
    arrivals = KafkaArrivals(loop.bootstrap, topics.events)
    try:
        arrivals()  # its first count: what arrives from now on is counted
        job2 = loop.start_job(savepoint=savepoint, parallelism=2, options=RESCALABLE)
        subtasks = loop.agent_subtasks(job2.jid)
        assert len({s["taskmanager-id"] for s in subtasks}) == 2  # one on each task manager
        loop.send(*(approve(a) for a in loop.messages(topics.approvals, ToolIntent)))
        loop.read(lambda r: _count(r, topics.completions) == 3 + BURST + 3)
        two = _burst(loop, "p2")
        # Both subtasks ran agents: the keys, old and new, are split between them.
        assert all(s["metrics"]["read-records"] > 0 for s in loop.agent_subtasks(job2.jid))
        loop.send(*(loop.export(k, f"p2-{k.decode()}") for k in KEYS))
        loop.read(lambda r: len(loop.snapshots("p2-")) == len(KEYS))
        after = loop.snapshots("p2-")
        # Each event read once: the restored read, with its Impulse's state mapped, started no
        # second reader of the partition.
        arrived, deadline = arrivals(), time.monotonic() + 30
        while loop.agent_reads(job2.jid) != arrived and time.monotonic() < deadline:
            time.sleep(1)  # Flink's metrics trail by a second
        assert loop.agent_reads(job2.jid) == arrived
        loop.rest.cancel(job2.jid)  # before its task manager goes: no failover to wait out
        loop.rest.wait_for_state(job2.jid, {"CANCELED"})
    finally:
        arrivals.close()
        engines.run("remove-taskmanager")

    for key in QUESTIONS:  # untouched since the savepoint: the same state, wherever it went
        for part in ("memory", "llm_cache", "continuation"):
            assert getattr(after[key], part).SerializeToString(deterministic=True) == getattr(
                before[key], part
            ).SerializeToString(deterministic=True)
        assert after[key].seq == before[key].seq
    for key in REFUNDS:  # suspended at parallelism 1, resumed on their approvals at 2
        assert before[key].continuation.pending_intent_ids
        assert not after[key].continuation.pending_intent_ids
        assert f"customer:{key.decode()}" in {e.key for e in after[key].memory.entries}
    outcomes = Counter(c["outcome"] for _, c in loop.completions())
    assert outcomes == Counter({"refunded": 3, "answered": 3 + 2 * BURST})
    intents = loop.messages(topics.intents, ToolIntent)
    records = loop.execution_records()
    assert sorted(r.intent_id for r in records) == sorted(i.intent_id for i in intents)
    print(
        json.dumps(
            {
                "completions_per_s": {
                    "parallelism_1": round(one, 2),
                    "parallelism_2": round(two, 2),
                },
                "ratio_2_to_1": round(two / one, 2),
                "repeats": loop.reader.repeats,
            }
        )
    )
