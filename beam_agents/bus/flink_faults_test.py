"""The support-triage loop on Flink and Kafka under real faults, its invariants read from the
broker and from the tools' own execution logs.

Each test runs six keys (three refunds that suspend on a person's approval, three questions)
through one job with the effector service (`beam_agents.testing.chaos ... triage`: the demo's
tools, every call and effect logged), and faults at two moments: while the tickets are in
flight, before the first approval requests, and while the approvals are in flight. Then:
every key completes exactly once as a deduping consumer (TopicReader) sees it, every tool
intent has exactly one effect in the tools' ledger and one result (nothing lost, nothing done
twice), every approval request reached the approvals topic.

* a TaskManager SIGKILLed (`engines.sh restart-taskmanager --kill`): Flink restores the job
  from its last checkpoint on the new TaskManager;
* the broker down for 45 s (`engines.sh stop kafka`, `start kafka --keep-data`);
* the JobManager SIGKILLed (`engines.sh restart-jobmanager --kill`): a session cluster
  without HA forgets its jobs, so the job is restored from its retained checkpoint on disk
  (`engines.sh latest-checkpoint JOB`); the keys suspended before the kill resume on their
  approvals after it, and the others' state is byte for byte what it was;
* the effector service SIGKILLed and restarted, between intents; and dying inside its tools
  and in the approval window, restarted by its supervisor; and inside a refund its reconciler
  cannot settle, which a person then answers (an inquiry on the approvals topic);
* every external event (tickets, approvals) produced twice, back to back, and once more after
  every key completed;
* the Kafka read stalled (`engines.sh freeze-workers` stops the job's Java SDK harness that
  runs it): beam_agents.bus.flink.ReadWatchdog reports it within a minute, and the job restored from
  its latest checkpoint loses and repeats nothing.
* the broker SIGKILLed and started on its data (`engines.sh stop kafka --kill`), then the
  job's Java SDK harness SIGKILLed (`engines.sh kill-workers`): Flink restores the job from its
  last checkpoint with a new harness;
* 300 keys in flight and the task manager SIGKILLed twice in a row (the second while the job
  is being restored onto its replacement), then once more under the approvals;
* the Python launcher SIGKILLed (with LOOPBACK it hosts the job's Python workers: the job is
  restored from its latest checkpoint with a new launcher), then Beam's job server SIGKILLed
  (`engines.sh restart-jobserver --kill`; the job and its launcher's workers run on) and a
  task manager after it.

The new tests print their account as one JSON line: the fault, the copies a deduping consumer
dropped per topic (each recognised by its record id, on the topics the README's table says
may carry them), the job failures Flink recovered from, the effects, effector restarts and
seconds.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter

import pytest

from beam_agents._protos import AgentEnvelope, ToolIntent
from beam_agents.bus.flink import KafkaArrivals, ReadWatchdog
from beam_agents.errors import ReadStalledError
from beam_agents.intents.effector import INQUIRY_SUFFIX, INQUIRY_TOOL
from beam_agents.ops.demo import approve
from beam_agents.testing.engines import Engines
from beam_agents.testing.flink_loop import Loop

pytestmark = pytest.mark.engines

REFUNDS = [b"c-1", b"c-3", b"c-5"]  # suspend on a refund approval
QUESTIONS = [b"c-2", b"c-4", b"c-6"]  # complete at once
KEYS = REFUNDS + QUESTIONS
OUTAGE_S = 45


@pytest.fixture(scope="module")
def engines():
    started = Engines()
    try:
        yield started.up(["kafka", "java", "flink"])
    finally:
        started.down()


@pytest.fixture
def loop(engines, tmp_path):
    opened = Loop(engines, tmp_path, logged_tools=True)
    try:
        yield opened
    finally:
        opened.close()


def _tickets(loop: Loop, refunds=REFUNDS, questions=QUESTIONS, *, customers=(None, None)) -> None:
    """Each key's ticket from the customer named like the key, or from `customers`' (one for
    the refunds, one for the questions: the CRM knows c-1 to c-6 only)."""
    refunding, asking = customers
    loop.send(*(loop.ticket(k, "I was charged twice, refund me", refunding) for k in refunds))
    loop.send(*(loop.ticket(k, "how do I export my invoices?", asking) for k in questions))


def _until_suspended(
    loop: Loop, refunds=REFUNDS, questions=QUESTIONS, timeout_s: float = 300
) -> list[ToolIntent]:
    """Waits for the refunds' approval requests and the questions' answers; returns the
    requests."""
    topics = loop.topics
    loop.read(
        lambda r: (
            len(r[topics.approvals]) >= len(refunds)
            and len(r[topics.completions]) >= len(questions)
        ),
        timeout_s=timeout_s,
    )
    return loop.messages(topics.approvals, ToolIntent)


def _until_complete(loop: Loop, keys=KEYS, timeout_s: float = 300) -> None:
    loop.read(lambda r: len(r[loop.topics.completions]) == len(keys), timeout_s=timeout_s)
    loop.reader.settle(5)  # a late copy of anything would be on the topics by now


def _assert_exactly_once(
    loop: Loop,
    *,
    rerunnable: frozenset[str] = frozenset(),
    restarts: int = 0,
    refunds: list[bytes] = REFUNDS,
    questions: list[bytes] = QUESTIONS,
) -> None:
    """`rerunnable`: intents of an idempotent tool the effector may have run again after a
    crash inside it (one call more each); `restarts`: the effector deaths the test caused, all
    its supervisor may have seen. Copies on the topics are those the README's table of topics
    documents, each recognised by its record id (`TopicReader.repeats` counts them): after
    they are dropped, each key's completion, each intent, request, result and effect is there
    exactly once."""
    assert loop.effector_restarts == restarts
    topics = loop.topics
    outcomes = Counter((k, c["outcome"]) for k, c in loop.completions())
    assert outcomes == Counter(
        {**{(k, "refunded"): 1 for k in refunds}, **{(k, "answered"): 1 for k in questions}}
    )
    requests = loop.messages(topics.approvals, ToolIntent)
    # The agents' questions; the effector's about calls it lost are a test's own to count.
    assert sorted(r.entity_key for r in requests if r.tool_name != INQUIRY_TOOL) == sorted(refunds)
    intents = loop.messages(topics.intents, ToolIntent)
    tools = Counter(i.intent_id for i in intents if i.kind == ToolIntent.TOOL)
    # A lookup per key and a refund per approved key, each intent once.
    assert len(tools) == len(refunds) + len(questions) + len(refunds)
    assert set(tools.values()) == {1}
    envelopes = [AgentEnvelope.FromString(v) for _, v in loop.reader.records[topics.events]]
    results = Counter(e.tool_result.intent_id for e in envelopes if e.HasField("tool_result"))
    assert results == tools  # one result per intent, none lost
    # The tools' own account: one call and one effect per intent, whatever was redelivered.
    effects = Counter(e["key"] for e in loop.ledger.effects())
    assert effects == tools
    calls = Counter((loop.tmp_path / "calls.log").read_text().split()[1::2])
    reruns = calls - tools
    assert calls - reruns == tools and set(reruns) <= rerunnable and set(reruns.values()) <= {1}
    assert Counter(r.intent_id for r in loop.execution_records()) == Counter(
        i.intent_id for i in intents
    )


def _account(loop: Loop, fault: str, started: float, **facts) -> None:
    """Prints what a fault test saw: the copies a deduping consumer dropped per topic (all
    recognised by id), the failures Flink recovered the job from, the effects and effector
    restarts, and how long it took."""
    print(
        json.dumps(
            {
                "fault": fault,
                "job_failures": len(loop.rest.exceptions(loop.jobs[-1].jid)),
                "repeats": {t.rpartition(".")[2]: n for t, n in loop.reader.repeats.items()},
                "effects": len(loop.ledger.effects()),
                "effector_restarts": loop.effector_restarts,
                "seconds": round(time.monotonic() - started),
                **facts,
            }
        )
    )


def _loop_under(loop: Loop, fault, *, then=None, lookups_rerun: bool = False) -> None:
    """`fault` while the tickets are in flight and, unless `then` is another, while the
    approvals are; `lookups_rerun`: the fault may land inside a CRM lookup, which is then run
    again."""
    loop.start_job()
    _tickets(loop)
    fault()
    requests = _until_suspended(loop)
    loop.send(*(approve(r) for r in requests))
    (then or fault)()
    _until_complete(loop)
    _assert_exactly_once(loop, rerunnable=_lookups(loop) if lookups_rerun else frozenset())


def _lookups(loop: Loop) -> frozenset[str]:
    intents = loop.messages(loop.topics.intents, ToolIntent)
    return frozenset(i.intent_id for i in intents if i.tool_name == "crm.lookup")


def _tool_results(loop: Loop, records) -> int:
    envelopes = (AgentEnvelope.FromString(v) for _, v in records[loop.topics.events])
    return sum(e.HasField("tool_result") for e in envelopes)


def test_a_taskmanager_killed_before_and_after_the_approvals_loses_and_repeats_nothing(
    loop, engines
):
    _loop_under(loop, lambda: engines.run("restart-taskmanager", "--kill"))
    print(f"repeats a deduping consumer dropped: {loop.reader.repeats}")
    # Cancelled, the job leaves no Java harness, not even one a killed task manager started.
    (job,) = loop.jobs
    loop.rest.cancel(job.jid)
    loop.rest.wait_for_state(job.jid, {"CANCELED"})
    deadline = time.monotonic() + 60
    while left := engines.run("harnesses"):
        assert time.monotonic() < deadline, f"Java harnesses left after the job: {left.split()}"
        time.sleep(1)


def test_a_broker_down_45_s_before_and_after_the_approvals_loses_and_repeats_nothing(loop, engines):
    def outage() -> None:
        engines.run("stop", "kafka")
        time.sleep(OUTAGE_S)
        engines.run("start", "kafka", "--keep-data")

    _loop_under(loop, outage)
    print(f"repeats a deduping consumer dropped: {loop.reader.repeats}")


def test_an_effector_killed_before_and_after_the_approvals_loses_and_repeats_nothing(loop):
    def kill_between_intents() -> None:
        """SIGKILLs the effector once it has answered an intent of this phase, while the job
        is still sending it the others (uncommitted ones are delivered to the new one)."""
        answered = _tool_results(loop, loop.reader.records)
        loop.read(lambda r: _tool_results(loop, r) > answered, timeout_s=120)
        loop.kill_effector()

    _loop_under(loop, kill_between_intents, lookups_rerun=True)
    print(f"repeats a deduping consumer dropped: {loop.reader.repeats}")


def test_an_effector_dying_inside_its_tools_and_in_the_approval_window_loses_and_repeats_nothing(
    loop,
):
    """Before the approvals it dies inside the first CRM lookup, once an approval request is
    recorded but not yet sent, and once another request is acknowledged by the broker but its
    intent not yet committed; after them, inside the first refund. Its supervisor starts it
    again each time: the lookup is run again with the same key, the unsent request is sent on
    redelivery, the sent one again (repeats its consumers drop), and the refund is found done
    in the ledger, not paid twice."""
    die = loop.tmp_path
    (die / "die-in-crm.lookup").touch()
    (die / "die-after-approval").touch()
    (die / "die-after-request").touch()
    loop.start_job()
    _tickets(loop)
    requests = _until_suspended(loop)
    (die / "die-in-payments.refund").touch()
    loop.send(*(approve(r) for r in requests))
    _until_complete(loop)
    assert not list(die.glob("die-*")) and loop.effector_restarts == 4
    # A restored job would send its approval intents again, and their requests with them.
    assert loop.stalls == []
    # The acknowledged request was sent again (with the rest of its batch: at most once more
    # a restart); a deduping consumer sees each request once.
    sent = [r.intent_id for r in loop.messages(loop.topics.approvals, ToolIntent)]
    assert len(sent) == len(set(sent))
    assert 1 <= loop.reader.repeats[loop.topics.approvals] <= len(sent) * loop.effector_restarts
    intents = loop.messages(loop.topics.intents, ToolIntent)
    lookups = {i.intent_id for i in intents if i.tool_name == "crm.lookup"}
    calls = Counter((die / "calls.log").read_text().split()[1::2])
    (rerun,) = [i for i, n in calls.items() if n == 2]  # the first lookup, and only it
    assert rerun in lookups
    _assert_exactly_once(loop, rerunnable=frozenset({rerun}), restarts=4)


def test_a_refund_its_effector_lost_settled_by_a_person_completes_its_key_paid_once(loop):
    """The effector dies inside the first refund, after paying, while the payments API cannot
    say whether it paid (its reconciler fails). Restarted, it does not pay again but asks a
    person, on the approvals topic, who answers that it took effect: the agent is told the
    refund was done, its receipt unknown, and every key completes, each refund paid once."""
    die = loop.tmp_path
    loop.start_job()
    _tickets(loop)
    requests = _until_suspended(loop)
    (die / "die-in-payments.refund").touch()
    (die / "payments-down").touch()
    loop.send(*(approve(r) for r in requests))
    topics = loop.topics
    loop.read(lambda r: len(r[topics.approvals]) == len(REFUNDS) + 1, timeout_s=300)
    (inquiry,) = [
        r for r in loop.messages(topics.approvals, ToolIntent) if r.tool_name == INQUIRY_TOOL
    ]
    loop.send(approve(inquiry))
    _until_complete(loop)
    lost = inquiry.intent_id.removesuffix(INQUIRY_SUFFIX)
    summaries = dict(loop.completions())
    assert summaries[inquiry.entity_key]["receipt"] is None
    assert "ops@example.com confirmed" in summaries[inquiry.entity_key]["detail"]
    paid = [e["key"] for e in loop.ledger.effects() if e["tool"] == "payments.refund"]
    assert lost in paid and len(paid) == len(set(paid)) == len(REFUNDS)
    _assert_exactly_once(loop, restarts=1)


def test_external_events_produced_twice_and_again_after_completion_complete_each_key_once(loop):
    job = loop.start_job()
    tickets = [loop.ticket(k, "I was charged twice, refund me") for k in REFUNDS]
    tickets += [loop.ticket(k, "how do I export my invoices?") for k in QUESTIONS]
    loop.send(*tickets)
    loop.send(*tickets)  # a producer's retry: the same records again
    approvals = [approve(r) for r in _until_suspended(loop)]
    loop.send(*approvals)
    loop.send(*approvals)
    _until_complete(loop)
    read = loop.agent_reads(job.jid)
    loop.send(*tickets, *approvals)  # long after: a replayed topic
    # RunAgent took every copy in, and a checkpoint after that holds what it made of them.
    deadline = time.monotonic() + 60
    while loop.agent_reads(job.jid) < read + len(tickets) + len(approvals):
        assert time.monotonic() < deadline, "the replayed copies were not read"
        time.sleep(1)
    loop.rest.wait_for_checkpoint_after(job.jid, int(time.time() * 1000))
    loop.reader.settle(5)
    _assert_exactly_once(loop)
    # The job dropped every copy: none became a record a consumer had to drop.
    assert loop.reader.repeats[loop.topics.completions] == 0


def test_questions_one_at_a_time_under_a_checkpoint_every_second_are_each_answered(loop):
    """The loop as a person uses it: a ticket, its answer, then the next ticket. A checkpoint
    barrier can reach an operator while a bundle is open; Beam's Flink runner then finishes
    the bundle inside the snapshot and holds its outputs until the operator next starts a
    bundle or sees a new watermark, which may be never: the Impulse stage emits its one
    element and its last watermark once, and a stage whose answer is held gets nothing new in
    a loop that waits for each answer. `engines.sh flink-options` passes
    `--finish_bundle_before_checkpointing`, which finishes bundles before the barrier instead.
    With a checkpoint every second, each of a dozen rounds is answered within 30 s (without
    the option, measured: no answer to the first)."""
    job = loop.start_job(options=("--checkpointing_interval=1000",))
    assert loop.rest.checkpoint_config(job.jid)["interval"] == 1000
    assert loop.rest.pipeline_options(job.jid)["finishBundleBeforeCheckpointing"] == "true"
    for n in range(12):
        key = f"q-{n}".encode()
        loop.send(loop.ticket(key, "how do I export my invoices?"))
        loop.read(lambda r, key=key: key in dict(r[loop.topics.completions]), timeout_s=30)
    assert loop.stalls == []


def test_a_jobmanager_killed_resumes_every_key_from_the_retained_checkpoint(loop, engines):
    job1 = loop.start_job()
    # Keyed state where production keeps it (engines.sh's default), unless the engines were
    # started with the heap backend on purpose.
    heap = os.environ.get("BEAM_AGENTS_FLINK_STATE_BACKEND") == "hashmap"
    backend = "HashMapStateBackend" if heap else "EmbeddedRocksDBStateBackend"
    assert loop.rest.checkpoint_config(job1.jid)["state_backend"] == backend
    _tickets(loop)
    requests = _until_suspended(loop)
    loop.send(*(loop.export(k, f"before-{k.decode()}") for k in KEYS))
    loop.read(lambda r: len(r[loop.topics.snapshots]) == len(KEYS))
    checkpoint_id = loop.rest.wait_for_checkpoint_after(job1.jid, int(time.time() * 1000))

    engines.run("restart-jobmanager", "--kill")
    # Without HA the new JobManager knows no job: restore from the retained checkpoint.
    assert job1.jid not in loop.rest.jobs()
    job1.launcher.stop()
    checkpoint = engines.run("latest-checkpoint", job1.jid)
    assert checkpoint.startswith("file://") and int(checkpoint.rsplit("-", 1)[1]) >= checkpoint_id
    loop.start_job(savepoint=checkpoint)

    loop.send(*(approve(r) for r in requests))
    _until_complete(loop)
    loop.send(*(loop.export(k, f"after-{k.decode()}") for k in KEYS))
    loop.read(lambda r: len(r[loop.topics.snapshots]) == 2 * len(KEYS))
    before, after = loop.snapshots("before-"), loop.snapshots("after-")
    for key in QUESTIONS:  # untouched since the checkpoint: the same state
        for part in ("memory", "llm_cache", "continuation"):
            assert getattr(after[key], part).SerializeToString(deterministic=True) == getattr(
                before[key], part
            ).SerializeToString(deterministic=True)
        assert after[key].seq == before[key].seq
    for key in REFUNDS:  # suspended before the kill, resumed on their approvals after it
        assert before[key].continuation.pending_intent_ids
        assert not after[key].continuation.pending_intent_ids
        # A function agent's memory writes reach state when it completes.
        remembered = f"customer:{key.decode()}"
        assert remembered not in {e.key for e in before[key].memory.entries}
        assert remembered in {e.key for e in after[key].memory.entries}
    _assert_exactly_once(loop)
    print(json.dumps({"checkpoint": checkpoint, "repeats": loop.reader.repeats}))


def test_a_stalled_read_is_reported_within_a_minute_and_its_restored_job_loses_nothing(
    loop, engines
):
    job = loop.start_job()
    _tickets(loop)
    requests = _until_suspended(loop)
    arrivals = KafkaArrivals(loop.bootstrap, loop.topics.events)
    watchdog = ReadWatchdog(loop.rest, job.jid, arrivals=arrivals, topic=loop.topics.events)
    try:
        # Flink's metrics catch up on the job's work so far (seconds) before the stall starts.
        for _ in range(3):
            watchdog.check()
            time.sleep(5)
        engines.run("freeze-workers")
        try:
            loop.send(*(approve(r) for r in requests))  # records the job cannot read
            frozen = time.monotonic()
            with pytest.raises(ReadStalledError, match=job.jid) as stalled:
                while time.monotonic() - frozen < 120:
                    watchdog.check()
                    time.sleep(5)
            caught_s = time.monotonic() - frozen
        finally:
            engines.run("thaw-workers")
    finally:
        arrivals.close()
    # Reported at the first look past its limit (50 s), looks 5 s apart: within a minute of
    # the first record waiting.
    assert 50 <= stalled.value.stalled_s < 60
    first = job.jid
    loop.restore(job)
    assert job.jid != first and job.restores == 1
    _until_complete(loop)
    _assert_exactly_once(loop)
    print(json.dumps({"caught_s": round(caught_s, 1), "repeats": loop.reader.repeats}))


def test_a_broker_then_the_java_harness_sigkilled_lose_and_repeat_nothing(loop, engines):
    """While the tickets are in flight the broker dies (SIGKILL: no controlled shutdown, its
    logs recovered at start) and is started again on its data 5 s later; the process dies,
    not the machine, so what it wrote is in the page cache, as after a JVM crash. While the
    approvals are in flight the job's Java SDK harness (the expanded Kafka read and write, a
    JVM the task manager started for the job) is SIGKILLed: the task fails and Flink restores
    the job from its last checkpoint with a new harness."""
    started = time.monotonic()
    killed: list[str] = []

    def broker() -> None:
        engines.run("stop", "kafka", "--kill")
        time.sleep(5)
        engines.run("start", "kafka", "--keep-data")

    def harness() -> None:
        killed.extend(engines.run("harnesses").split())
        engines.run("kill-workers")

    _loop_under(loop, broker, then=harness)
    # The kill failed the job (Flink recovered it with a new harness): it did not go unnoticed.
    assert len(killed) == 1 and loop.rest.exceptions(loop.jobs[-1].jid)
    _account(loop, "broker SIGKILL, then Java SDK harness SIGKILL", started)


def test_two_taskmanager_kills_in_a_row_under_three_hundred_keys_lose_and_repeat_nothing(
    loop, engines
):
    """300 keys (30 refunds, 270 questions) in flight; the task manager SIGKILLed, and its
    replacement SIGKILLed as soon as it registered, while Flink restores the job onto it;
    then once more while the 30 approvals are in flight."""
    started = time.monotonic()
    refunds = [f"r-{n}".encode() for n in range(30)]
    questions = [f"q-{n}".encode() for n in range(270)]
    loop.start_job()
    _tickets(loop, refunds, questions, customers=("c-1", "c-2"))
    loop.read(lambda r: len(r[loop.topics.intents]) >= 20, timeout_s=120)  # under way
    engines.run("restart-taskmanager", "--kill")
    engines.run("restart-taskmanager", "--kill")
    requests = _until_suspended(loop, refunds, questions, timeout_s=600)
    loop.send(*(approve(r) for r in requests))
    engines.run("restart-taskmanager", "--kill")
    _until_complete(loop, refunds + questions, timeout_s=600)
    _assert_exactly_once(loop, refunds=refunds, questions=questions)
    _account(loop, "task manager SIGKILL x2 in a row, then x1; 300 keys", started)


def test_the_python_launcher_and_the_job_server_killed_lose_and_repeat_nothing(loop, engines):
    """The launcher (`python -m beam_agents.testing.triage_loop`) SIGKILLed while the tickets
    are in flight: with LOOPBACK its process hosts the job's Python workers, so the job cannot
    run on, and the operator restores it from its latest retained checkpoint with a new
    launcher (`Loop.restore`). Then Beam's job server SIGKILLed and replaced while the
    approvals are in flight: the job runs on Flink, and its launcher outlives the lost job
    state stream with its worker pool (it stopped the pool with the stream: the job restarted
    forever with nowhere to start its workers), which a task manager killed after it proves
    by starting the restored job's workers again."""
    started = time.monotonic()
    job = loop.start_job()
    first = job.jid
    loop.rest.wait_for_checkpoint_after(job.jid, int(time.time() * 1000))
    _tickets(loop)
    os.killpg(job.launcher.process.pid, signal.SIGKILL)
    job.launcher.stop()
    time.sleep(5)
    after_launcher = loop.rest.jobs()[first]
    loop.restore(job)
    requests = _until_suspended(loop)
    loop.send(*(approve(r) for r in requests))
    engines.run("restart-jobserver", "--kill")
    job.launcher.wait_for_output("lost the job server")
    time.sleep(5)
    job.launcher.check_alive()
    engines.run("restart-taskmanager", "--kill")
    _until_complete(loop)
    _assert_exactly_once(loop)
    _account(
        loop,
        "launcher SIGKILL (restored), then job server SIGKILL, then task manager SIGKILL",
        started,
        after_launcher=after_launcher,
    )
