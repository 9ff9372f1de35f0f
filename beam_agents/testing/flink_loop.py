"""The support-triage loop on the real engines, as the Flink tests drive it: its topics, its
effector service and its jobs (`python -m beam_agents.testing.triage_loop` launchers), and
everything read back from Kafka by a deduping `TopicReader`.

The effector is `beam-agents effector-service` with the demo's tools, or, with
`logged_tools`, the chaos service's logged copies of them (beam_agents.testing.chaos
`triage`), whose calls.log and ledger are the tools' own account of every effect.
`close()` cancels the jobs, stops the processes and deletes the jobs' retained checkpoints.

While `read` waits, a beam_agents.bus.flink.ReadWatchdog watches the running job. A job whose
Kafka read stalls (seen without `--finish_bundle_before_checkpointing`, when Beam's runner held
the outputs of a bundle a checkpoint had finished: tools/engines/RESULTS.md) is reported on
stderr, in `stalls` and
in the engines' logs/stalls.log, cancelled and restored from its latest retained checkpoint,
as an operator would; a second stall of the same job fails the test. It also restarts an
effector service that died, as a supervisor would (`effector_restarts`); `kill_effector`
is a crash of it and that restart.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import shutil
import signal
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from beam_agents._protos import AgentEnvelope, ExecutionRecord, StateSnapshot, ToolIntent
from beam_agents.bus import TopicReader, Topics, create_topics, decode_dead_letter, produce
from beam_agents.bus.flink import FlinkRest, KafkaArrivals, ReadWatchdog
from beam_agents.errors import ReadStalledError
from beam_agents.examples.support_triage import ticket
from beam_agents.intents.signing import Keyring
from beam_agents.ops.demo import demo_effector_keyring
from beam_agents.ops.processes import Launched
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION
from beam_agents.testing.chaos import Ledger
from beam_agents.testing.engines import Engines

__all__ = ["Job", "Loop"]

#: In the name of the vertex that runs RunAgent's stateful step.
_RUN_AGENT = "TriageLoop/{RunAgent"
#: How often `read` looks at the running job between records.
_WATCH_EVERY_S = 5.0


@dataclasses.dataclass
class Job:
    """One of the loop's jobs: its Flink id and launcher change when it is restored after a
    stall (`restores` counts those)."""

    jid: str
    launcher: Launched
    state_schema: int
    parallelism: int
    options: tuple[str, ...] = ()
    #: The source tree of another release the job's launcher imports first, if any.
    source: Path | None = None
    restores: int = 0


class Loop:
    """One loop's topics, effector service and jobs, and everything read back from Kafka."""

    def __init__(
        self,
        engines: Engines,
        tmp_path: Path,
        *,
        logged_tools: bool = False,
        stall_after_s: float = 50.0,
        result_keyring: str = "beam_agents.ops.demo:demo_effector_keyring",
    ) -> None:
        self.engines = engines
        self.tmp_path = tmp_path
        self.bootstrap = engines.endpoints["KAFKA_BOOTSTRAP"]
        self.topics = Topics(f"{tmp_path.name[:40]}-{time.time_ns()}")
        create_topics(self.bootstrap, self.topics)
        self.rest = FlinkRest(engines.endpoints["FLINK_REST"])
        self.savepoints = "file://" + engines.endpoints["FLINK_SAVEPOINTS"]
        self.reader = TopicReader(self.bootstrap, self.topics.all())
        self.launched: list[Launched] = []
        self.jobs: list[Job] = []
        self.stalls: list[str] = []
        self._jids: list[str] = []  # every job submitted, restored ones included
        self._watchdog: ReadWatchdog | None = None
        self._arrivals = KafkaArrivals(self.bootstrap, self.topics.events)
        self.stall_after_s = stall_after_s
        self._ids = itertools.count(1)
        self.effector_store = tmp_path / "effector.sqlite"
        self.ledger = Ledger(tmp_path)
        if logged_tools:
            module = "beam_agents.testing.chaos"
            args = [self.bootstrap, self.topics.prefix, str(tmp_path), "triage"]
        else:
            module = "beam_agents.ops.cli"
            args = [
                "effector-service", "--bootstrap-servers", self.bootstrap,
                "--topic-prefix", self.topics.prefix, "--store", str(self.effector_store),
                "--tools", "beam_agents.examples.support_triage:TOOLS",
                "--keyring", "beam_agents.ops.demo:demo_keyring",
                "--result-keyring", result_keyring,
            ]  # fmt: skip
        self._effector_command = (module, args)
        self._effector_runs = 0
        self.effector_restarts = 0
        self.effector = self._start_effector()

    def _start_effector(self) -> Launched:
        module, args = self._effector_command
        self._effector_runs += 1
        effector = self._launch(module, args, f"effector-{self._effector_runs}")
        effector.wait_for_output("serving")
        return effector

    def _supervise_effector(self) -> None:
        """Starts the effector service again if it died, as its supervisor would; counted in
        `effector_restarts`."""
        if self.effector.process.poll() is not None:
            self.effector.stop()
            self.effector = self._start_effector()
            self.effector_restarts += 1

    def kill_effector(self) -> None:
        """SIGKILLs the effector service wherever it is and starts it again, as a supervisor
        would: intents it had not committed are delivered to the new one."""
        os.killpg(self.effector.process.pid, signal.SIGKILL)
        self.effector.stop()
        self.effector = self._start_effector()

    def _launch(
        self, module: str, args: list[str], name: str, source: Path | None = None
    ) -> Launched:
        """`python -m module args`, logged to name.log and stopped by close(); with `source`,
        that release's packages (and its migration steps) shadow this one's."""
        path_first = () if source is None else (source, source / "migrations")
        log = self.tmp_path / f"{name}.log"
        launched = Launched.python(module, args, log, path_first=path_first)
        self.launched.append(launched)
        return launched

    def start_job(
        self,
        state_schema: int = CURRENT_STATE_SCHEMA_VERSION,
        savepoint: str | None = None,
        parallelism: int = 1,
        options: Sequence[str] = (),
        source: Path | None = None,
    ) -> Job:
        """Submits a job with `options` beside the engines' Flink options; an option named in
        both takes the value in `options`. With `source`, the job is that source tree's
        release (its launcher, whose LOOPBACK workers run the job's Python, imports it first)."""
        options = tuple(options)
        jid, launcher = self._submit(state_schema, savepoint, parallelism, options, source)
        job = Job(jid, launcher, state_schema, parallelism, options, source)
        self.jobs.append(job)
        return job

    def _submit(
        self,
        state_schema: int,
        savepoint: str | None,
        parallelism: int,
        options: tuple,
        source: Path | None = None,
    ) -> tuple[str, Launched]:
        known = set(self.rest.jobs())
        args = [
            "--kafka_bootstrap", self.bootstrap,
            "--topic_prefix", self.topics.prefix,
            "--expansion_service", self.engines.endpoints["EXPANSION_SERVICE"],
            "--state_schema", str(state_schema),
            *self.engines.flink_options((f"--parallelism={parallelism}", *options)),
        ]  # fmt: skip
        if savepoint is not None:
            args.append(f"--savepoint_path={savepoint}")
        name = f"job{len(self.launched)}-schema{state_schema}"
        launcher = self._launch("beam_agents.testing.triage_loop", args, name, source)
        try:
            jid = self.rest.wait_for_new_job(known, launcher.check_alive)
        except TimeoutError as e:
            raise TimeoutError(f"{e}; see {launcher.log}") from e
        self._jids.append(jid)
        # Its first look before the test sends anything: whatever arrives after it counts.
        self._watchdog = ReadWatchdog(
            self.rest,
            jid,
            arrivals=self._arrivals,
            topic=self.topics.events,
            stall_after_s=self.stall_after_s,
        )
        if not self._watchdog.first_look():
            raise TimeoutError(f"could not see job {jid} and {self.topics.events} in 60 s")
        return jid, launcher

    def savepoint(self, job: Job) -> str:
        path = self.rest.stop_with_savepoint(job.jid, self.savepoints)
        assert job.launcher.wait(60) == 0  # the job ended; the launcher saw it end
        return path

    def send(self, *envelopes: AgentEnvelope) -> None:
        produce(
            self.bootstrap,
            [(self.topics.events, e.entity_key, e, e.event_time_ms) for e in envelopes],
        )

    def ticket(self, key: bytes, text: str, customer: str | None = None) -> AgentEnvelope:
        """A ticket for `key` from `customer` (the key's own name by default)."""
        customer = customer or key.decode()
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
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.reader.read(until, min(_WATCH_EVERY_S, timeout_s))
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
            self._supervise_effector()
            if self._watch():  # a restored job gets the whole wait again
                deadline = time.monotonic() + timeout_s

    def _watch(self) -> bool:
        """Checks the latest job, if Flink knows it, for a stalled read; restores it once.
        True when it restored the job."""
        job = self.jobs[-1] if self.jobs else None
        if job is None or self._watchdog is None or job.jid not in self.rest.jobs():
            return False  # not started, or forgotten by a restarted JobManager
        try:
            self._watchdog.check()
        except ReadStalledError as e:
            self.stalls.append(str(e))
            print(f"flink_loop: {e}", file=sys.stderr, flush=True)
            # Kept beside the engines' logs: a passing test's stderr is not shown.
            with (Path(self.engines.endpoints["LOGS"]) / "stalls.log").open("a") as log:
                log.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {e}\n")
            if job.restores:
                raise
            self.restore(job)
            return True
        return False

    def restore(self, job: Job) -> None:
        """Cancels the job and starts it again from its latest retained checkpoint."""
        self.rest.cancel(job.jid)
        self.rest.wait_for_state(job.jid, {"CANCELED"})
        job.launcher.stop()
        checkpoint = self.engines.run("latest-checkpoint", job.jid)
        job.jid, job.launcher = self._submit(
            job.state_schema, checkpoint, job.parallelism, job.options, job.source
        )
        job.restores += 1

    def agent_subtasks(self, jid: str) -> list[dict]:
        """The subtasks of the job's vertex that holds the agents' state: Beam's stage that
        starts with RunAgent's stateful step (the stage before it ends with RunAgent's
        keying), chained or not."""
        placed = self.rest.subtasks(jid)
        (keyed,) = [name for name in placed if _RUN_AGENT in name]
        return placed[keyed]

    def agent_reads(self, jid: str) -> int:
        """Records RunAgent's stage took in since the job's attempt started (Flink's count,
        at most a second old)."""
        return sum(s["metrics"]["read-records"] for s in self.agent_subtasks(jid))

    def count(self, topic: str) -> int:
        return len(self.reader.records[topic])

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

    def execution_records(self) -> list[ExecutionRecord]:
        with sqlite3.connect(self.effector_store) as db:
            rows = db.execute("SELECT record FROM executions").fetchall()
        return [ExecutionRecord.FromString(r) for (r,) in rows]

    def close(self) -> None:
        self._arrivals.close()
        for job in self.jobs:
            self.rest.cancel(job.jid)
        for launched in reversed(self.launched):
            launched.stop()
        self.reader.close()
        # Retained on cancellation for a restore; nothing restores a finished test's jobs.
        checkpoints = Path(self.engines.endpoints["FLINK_CHECKPOINTS"])
        for jid in self._jids:
            shutil.rmtree(checkpoints / jid, ignore_errors=True)


def legacy_effector_keyring() -> Keyring:
    """The demo effector's ring held on the legacy signature scheme, as signing.py's rollout
    holds signers while a binary that knows only that scheme still runs (a job of the release
    before it verifies results: a typed signature is an unknown scheme to it)."""
    return dataclasses.replace(demo_effector_keyring(), sign_scheme=ToolIntent.HMAC_SHA256)
