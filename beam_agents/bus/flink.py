"""Operating the Kafka loop on a Flink session cluster: the part of Flink's REST API an
operator (and the engine tests) need, and a watchdog for a job whose Kafka read has stalled.

The stall. On the portable Flink runner a job has been seen to stop emitting (3 of 17 jobs on
engines up for 70 minutes, and 2 of 2 runs with a 2 s checkpoint interval): the job RUNNING,
every checkpoint completing, no exception, no record read. Beam's runner holds the outputs of
a bundle a checkpoint barrier finished until the operator's next input, watermark or timer;
`--finish_bundle_before_checkpointing` avoids that (tools/engines/RESULTS.md). A stall of any
other cause must not be silent either: `ReadWatchdog` counts the records that arrive on the topic
(`KafkaArrivals`) against the records the job moves and raises ReadStalledError within a
minute of records starting to wait unread while every task runs.

What to do about a stalled job is the caller's choice: cancelling it keeps its last
checkpoint (the clusters `tools/engines.sh` starts retain them), and a job restored from that
checkpoint reads on from the offsets it holds. Nothing is lost; what was read after the
checkpoint is read again, and RunAgent drops the events it already took (its dedupe marks).
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from collections.abc import Callable

from beam_agents.errors import FlinkRestError, ReadStalledError

__all__ = ["FlinkRest", "KafkaArrivals", "ReadWatchdog"]

#: Job states in which Flink still owns the job: it can be cancelled.
_LIVE = frozenset({"RUNNING", "RESTARTING", "CREATED", "INITIALIZING"})


class FlinkRest:
    """The part of a Flink cluster's REST API (`base_url`, e.g. http://127.0.0.1:8081) that
    runs the loop: the jobs, their tasks, checkpoints and exceptions, stop-with-savepoint and
    cancel."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def _call(self, path: str, method: str = "GET", body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                text = response.read()
            return json.loads(text) if text else {}
        # URLError and HTTPError are OSErrors; a reply cut short is an HTTPException.
        except (OSError, ValueError, http.client.HTTPException) as e:
            raise FlinkRestError(f"{method} {self.base_url}{path}: {e}") from e

    def jobs(self) -> dict[str, str]:
        """{job id: state} of every job the cluster knows."""
        return {j["jid"]: j["state"] for j in self._call("/jobs/overview")["jobs"]}

    def job(self, jid: str) -> dict:
        """The job's details: its state and its vertices with their status and metrics."""
        return self._call(f"/jobs/{jid}")

    def checkpoint_config(self, jid: str) -> dict:
        """How the job checkpoints: its `interval` (ms), `state_backend` (the class Flink
        built, e.g. EmbeddedRocksDBStateBackend) and `checkpoint_storage`, among others."""
        return self._call(f"/jobs/{jid}/checkpoints/config")

    def pipeline_options(self, jid: str) -> dict[str, str]:
        """The Beam pipeline options the job runs with, by their Java names
        (`finishBundleBeforeCheckpointing`), as Beam's runner copies them into the job's
        execution config; every value a string."""
        return self._call(f"/jobs/{jid}/config")["execution-config"]["user-config"]

    def subtasks(self, jid: str) -> dict[str, list[dict]]:
        """{vertex name: its subtasks}, each with its task manager (`taskmanager-id`), status
        and record counts: where a job runs, and how much each subtask did."""
        return {
            vertex["name"]: self._call(f"/jobs/{jid}/vertices/{vertex['id']}")["subtasks"]
            for vertex in self.job(jid)["vertices"]
        }

    def wait_for_new_job(
        self, known: set[str], check_alive: Callable[[], None], timeout_s: float = 180
    ) -> str:
        """The id of a job not in `known` once it runs every task and completed a checkpoint
        (so its sources have started and a savepoint can be taken). `check_alive` raises if
        whatever submits the job gave up. The first such job is taken: submit one job at a
        time to a cluster while waiting."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            check_alive()
            for jid, state in self.jobs().items():
                if jid in known or state != "RUNNING":
                    continue
                tasks_running = all(v["status"] == "RUNNING" for v in self.job(jid)["vertices"])
                checkpoints = self._call(f"/jobs/{jid}/checkpoints")["counts"]
                if tasks_running and checkpoints["completed"] > 0:
                    return jid
            time.sleep(1)
        raise TimeoutError(f"no new running job in {timeout_s} s")

    def wait_for_checkpoint_after(self, jid: str, after_ms: int, timeout_s: float = 60) -> int:
        """Waits until a checkpoint of `jid` triggered after `after_ms` (epoch ms) completed,
        so it holds every state change made before then; returns its id."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            latest = self._call(f"/jobs/{jid}/checkpoints").get("latest", {}).get("completed")
            if latest and latest["trigger_timestamp"] > after_ms:
                return latest["id"]
            time.sleep(0.5)
        raise TimeoutError(f"no checkpoint of {jid} after {after_ms} in {timeout_s} s")

    def exceptions(self, jid: str) -> list[str]:
        history = self._call(f"/jobs/{jid}/exceptions").get("exceptionHistory", {})
        return [entry.get("stacktrace", "") for entry in history.get("entries", [])]

    def stop_with_savepoint(self, jid: str, directory: str, timeout_s: float = 120) -> str:
        """Stops `jid` with a savepoint into `directory`; returns the savepoint's path."""
        request = self._call(
            f"/jobs/{jid}/stop", "POST", {"drain": False, "targetDirectory": directory}
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self._call(f"/jobs/{jid}/savepoints/{request['request-id']}")
            if status["status"]["id"] == "COMPLETED":
                operation = status["operation"]
                if "location" not in operation:
                    raise RuntimeError(f"savepoint of {jid} failed: {operation}")
                return operation["location"]
            time.sleep(0.5)
        raise TimeoutError(f"savepoint of {jid} not done in {timeout_s} s")

    def cancel(self, jid: str) -> None:
        if self.jobs().get(jid) in _LIVE:
            self._call(f"/jobs/{jid}?mode=cancel", "PATCH")

    def wait_for_state(self, jid: str, states: set[str], timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.jobs().get(jid)
            if state in states:
                return state
            time.sleep(0.5)
        raise TimeoutError(f"job {jid} not in {states} after {timeout_s} s")


class KafkaArrivals:
    """A callable counting the records that arrived on `topic` since its first call (which
    returns 0), or returning None while the broker cannot be asked (a stalled job is not to
    blame for a broker outage).

    It reads the topic itself, committed records only: a transaction's markers and aborted
    records, and offsets the broker's retention deleted, take offsets but are no records for a
    job to read. Each call counts up to the end offsets the broker gives at that moment, so
    nothing that arrived before a call is left for a later one (a call that cannot get there in
    `timeout_s` returns None). A partition added later is counted from its start; a partition
    gone (the topic deleted) makes it None. It joins no group and commits nothing.
    """

    def __init__(self, bootstrap_servers: str, topic: str, *, timeout_s: float = 10.0) -> None:
        from confluent_kafka import Consumer

        self.topic = topic
        self.timeout_s = timeout_s
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": "beam-agents-watchdog",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
            }
        )
        self._count: int | None = None
        #: Where counting starts in each partition: its end at the first look, or 0 for a
        #: partition added after it (all its records arrived since).
        self._starts: dict[int, int] = {}

    def __call__(self) -> int | None:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            metadata = self._consumer.list_topics(self.topic, timeout=self.timeout_s)
            topic = metadata.topics.get(self.topic)
            if topic is None or topic.error is not None or not topic.partitions:
                return None  # deleted, or not known to the broker yet
            ends = {
                p: self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=self.timeout_s, cached=False
                )[1]
                for p in sorted(topic.partitions)
            }
            if self._count is None:  # the first look: count from here
                self._starts = dict(ends)
                self._consumer.assign([TopicPartition(self.topic, p, e) for p, e in ends.items()])
                self._count = 0
                return 0
            if set(self._starts) - set(ends):
                return None  # a partition gone: the topic was deleted and made again
            added = {p: 0 for p in ends if p not in self._starts}
            if added:
                self._starts.update(added)
                self._consumer.incremental_assign([TopicPartition(self.topic, p, 0) for p in added])
            return self._count if self._read_up_to(ends) else None
        except KafkaException:
            return None

    def _read_up_to(self, ends: dict[int, int]) -> bool:
        """Counts the records of the assigned partitions up to `ends` into the count; False if
        it could not get there in its timeout (a partial count is not given out: the job's
        count could pass it and later fake a wait; what it read stays counted)."""
        from confluent_kafka import TopicPartition

        wanted = [TopicPartition(self.topic, p) for p in ends]

        def behind() -> bool:
            # A position below 0 is not known yet: nothing consumed there since the start.
            return any(
                (tp.offset if tp.offset >= 0 else self._starts[tp.partition]) < ends[tp.partition]
                for tp in self._consumer.position(wanted)
            )

        deadline = time.monotonic() + self.timeout_s
        while behind():
            if time.monotonic() > deadline:
                return False
            for message in self._consumer.consume(num_messages=500, timeout=0.2):
                if message.error() is None:
                    self._count += 1
        return True

    def close(self) -> None:
        self._consumer.close()


class ReadWatchdog:
    """Raises ReadStalledError from `check()` once records wait on the read topic
    (`arrivals`, e.g. a KafkaArrivals) and the job `jid` moved none of them for
    `stall_after_s` while all its tasks ran.

    Call `check()` every few seconds. What waits is counted, not guessed: each record the
    read emits crosses at least one of the job's network edges (in AgentLoop every event goes
    through RunAgent's keyed shuffle or to the dead-letter sink's own stage), so the records
    that arrived minus the records those edges carried falls as the job reads and rises as
    records arrive; above its lowest value so far, records wait. Progress restarts the clock.
    The job's counters are asked for before the arrivals, so every record they show moved is
    already counted as arrived.

    Time the job spends restarting or with a task neither running nor finished, time Flink's
    metrics are incomplete, and time the broker or Flink cannot be asked, do not count: Flink
    is recovering the job, or nothing can be seen. A new attempt (a restart from a checkpoint,
    told by its tasks' start times) counts from zero again; what waited before it still waits
    until the new attempt moves something. Flink's REST metrics trail the job by seconds: late
    metrics never fake a stall, they only show progress later than it happened; they can hide
    records from the count while they catch up on earlier ones (at the first look), and such
    records, like a backlog there at the first look, arm it only once a record more arrives.
    """

    def __init__(
        self,
        rest: FlinkRest,
        jid: str,
        *,
        arrivals: Callable[[], int | None],
        topic: str,
        stall_after_s: float = 50.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rest = rest
        self.jid = jid
        self.topic = topic
        self.stall_after_s = stall_after_s
        self._arrivals = arrivals
        self._clock = clock
        self._attempt: tuple | None = None
        self._moved: int | None = None
        self._unread: int | None = None
        self._least: int | None = None  # the lowest arrived-minus-moved of this attempt
        self._armed_at: float | None = None
        self._paused = False

    def _job_moved(self) -> tuple[tuple, int] | None:
        """(the attempt, records that crossed the job's network edges), or None unless every
        task runs (or finished) and Flink's counts are complete."""
        try:
            job = self.rest.job(self.jid)
            vertices = job["vertices"]
            if job["state"] != "RUNNING" or any(
                v["status"] not in {"RUNNING", "FINISHED"}
                or not v["metrics"].get("read-records-complete", True)
                for v in vertices
            ):
                return None
            attempt = tuple(v["start-time"] for v in vertices)
            return attempt, sum(v["metrics"]["read-records"] for v in vertices)
        except (FlinkRestError, KeyError, TypeError):
            return None

    def first_look(self, timeout_s: float = 60.0) -> bool:
        """Checks until it has seen the job run and the topic once, so that every record
        arriving after it returns is counted; False if it could not in `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while not self.check():
            if time.monotonic() > deadline:
                return False
            time.sleep(1)
        return True

    def check(self) -> bool:
        """One look; False when it could not see both the job and the topic."""
        now = self._clock()
        seen = self._job_moved()
        arrived = None if seen is None else self._arrivals()
        if seen is None or arrived is None:
            # Nothing to blame the read for: its clock starts again once both can be seen.
            self._paused = self._armed_at is not None
            return False
        attempt, moved = seen
        unread = arrived - moved
        if attempt != self._attempt:
            # A new attempt counts from zero. What waited before still waits while it has
            # moved nothing; once it moves, whether that was the waiting records or the ones
            # before them it reads again from its checkpoint cannot be told, and the next
            # arrival shows whether it reads.
            waiting = 0 if self._least is None else self._unread - self._least
            self._attempt, self._moved = attempt, moved
            self._least = unread - waiting if moved == 0 else unread
            # The time before it started is not the new attempt's.
            self._paused = self._paused or self._armed_at is not None
        progressed = moved > self._moved
        self._moved, self._unread = moved, unread
        self._least = min(self._least, unread)
        if unread <= self._least:
            self._armed_at = None
        elif progressed or self._paused or self._armed_at is None:
            self._armed_at = now
        self._paused = False
        if self._armed_at is not None and now - self._armed_at >= self.stall_after_s:
            raise ReadStalledError(
                job_id=self.jid, topic=self.topic, stalled_s=now - self._armed_at
            )
        return True
