"""Operating the Kafka loop on a Flink session cluster: the part of Flink's REST API an
operator (and the engine tests) need, and a watchdog for a job whose Kafka read has stalled.

The stall. Beam's cross-language Kafka read runs as a splittable DoFn in the Java SDK harness;
on the portable Flink runner it has been seen to stop emitting (3 of 17 jobs on engines up for
70 minutes, and 2 of 2 runs with a 2 s checkpoint interval): the job RUNNING, every checkpoint
completing, no exception, no record read. Its cause inside the runner is not known yet, so a
stall must not be silent. `ReadWatchdog` compares what the broker holds with what the job
moves and raises ReadStalledError within a minute of records starting to wait unread while
every task runs.

What to do about a stalled job is the caller's choice: cancelling it keeps its last
checkpoint (the clusters `tools/engines.sh` starts retain them), and a job restored from that
checkpoint reads from the offsets it holds, so nothing is lost or read twice by the agents.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable

from beam_agents.errors import ReadStalledError

__all__ = ["FlinkRest", "KafkaEndOffsets", "ReadWatchdog"]

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
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
        return json.loads(text) if text else {}

    def jobs(self) -> dict[str, str]:
        """{job id: state} of every job the cluster knows."""
        return {j["jid"]: j["state"] for j in self._call("/jobs/overview")["jobs"]}

    def job(self, jid: str) -> dict:
        """The job's details: its state and its vertices with their status and metrics."""
        return self._call(f"/jobs/{jid}")

    def wait_for_new_job(
        self, known: set[str], check_alive: Callable[[], None], timeout_s: float = 180
    ) -> str:
        """The id of a job not in `known` once it runs every task and completed a checkpoint
        (so its sources have started and a savepoint can be taken). `check_alive` raises if
        whatever submits the job gave up."""
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


class KafkaEndOffsets:
    """A callable returning the sum of `topic`'s partitions' end offsets on the broker, or None
    while the broker cannot say (a stalled job is not to blame for a broker outage)."""

    def __init__(self, bootstrap_servers: str, topic: str, *, timeout_s: float = 10.0) -> None:
        from confluent_kafka import Consumer

        self.topic = topic
        self.timeout_s = timeout_s
        # Reads only the partitions' end offsets: it joins no group and commits nothing.
        self._consumer = Consumer(
            {"bootstrap.servers": bootstrap_servers, "group.id": "beam-agents-watchdog"}
        )

    def __call__(self) -> int | None:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            metadata = self._consumer.list_topics(self.topic, timeout=self.timeout_s)
            return sum(
                self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, p), timeout=self.timeout_s
                )[1]
                for p in metadata.topics[self.topic].partitions
            )
        except KafkaException:
            return None

    def close(self) -> None:
        self._consumer.close()


class ReadWatchdog:
    """Raises ReadStalledError from `check()` once records wait on the read topic
    (`end_offsets`, e.g. a KafkaEndOffsets) and the job `jid` moved none of them for
    `stall_after_s` while all its tasks ran.

    Call `check()` every few seconds. What waits is counted, not guessed: each record the
    read emits crosses at least one of the job's network edges, so the broker's end offsets
    minus the records those edges carried falls as the job reads and rises as records
    arrive; above its lowest value so far, records wait. Progress restarts the clock. Time
    the job spends restarting or with a task not running, and time the broker cannot be
    asked, do not count: Flink is recovering the job, or nothing can be read. A restart
    resets Flink's counters, so a drop in them starts the count afresh.

    Flink's REST metrics trail the job by seconds (its metric fetcher's interval,
    `metrics.fetcher.update-interval`, and the tasks' own reporting). Late metrics never fake
    a stall: they only show progress later than it happened. They can hide records from the
    count while they still catch up on earlier ones (at the first look, or after a restart):
    such records, like a backlog there at the first look, arm it only once a record more
    arrives.
    """

    def __init__(
        self,
        rest: FlinkRest,
        jid: str,
        *,
        end_offsets: Callable[[], int | None],
        topic: str,
        stall_after_s: float = 50.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rest = rest
        self.jid = jid
        self.topic = topic
        self.stall_after_s = stall_after_s
        self._end_offsets = end_offsets
        self._clock = clock
        self._moved: int | None = None
        self._least: int | None = None  # the lowest end-offsets-minus-moved seen
        self._armed_at: float | None = None
        self._paused = False

    def _job_moved(self) -> int | None:
        """Records that crossed the job's network edges, or None unless every task runs."""
        job = self.rest.job(self.jid)
        vertices = job["vertices"]
        if job["state"] != "RUNNING" or any(v["status"] != "RUNNING" for v in vertices):
            return None
        return sum(v["metrics"]["read-records"] for v in vertices)

    def check(self) -> None:
        now = self._clock()
        moved, end = self._job_moved(), self._end_offsets()
        if moved is None or end is None:
            # Nothing to blame the read for: its clock starts again once both can be seen.
            self._paused = self._armed_at is not None
            return
        if self._moved is not None and moved < self._moved:
            self._least = None  # a new attempt: Flink counts from zero again
        progressed = self._moved is not None and moved > self._moved
        self._moved = moved
        unread = end - moved
        self._least = unread if self._least is None else min(self._least, unread)
        if unread <= self._least:
            self._armed_at = None
        elif progressed or self._paused or self._armed_at is None:
            self._armed_at = now
        self._paused = False
        if self._armed_at is not None and now - self._armed_at >= self.stall_after_s:
            raise ReadStalledError(
                job_id=self.jid, topic=self.topic, stalled_s=now - self._armed_at
            )
