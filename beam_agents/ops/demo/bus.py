"""The demo as a production deployment runs it: one streaming job (`add_triage_loop`) on Kafka,
the effector service and, with `--console`, the console as their own processes
(`launch_effector`, `launch_console`), and the conversation followed on the loop's topics."""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from beam_agents._protos import AgentEnvelope, ToolIntent, TraceEvent
from beam_agents.bus import (
    AgentLoop,
    TopicReader,
    Topics,
    create_topics,
    decode_dead_letter,
    produce,
)
from beam_agents.bus.flink import FlinkRest, KafkaArrivals, ReadWatchdog
from beam_agents.errors import FlinkRestError, ReadStalledError
from beam_agents.examples.support_triage import scripted_model, triage
from beam_agents.ops import prism
from beam_agents.ops.demo.account import Account
from beam_agents.ops.demo.parts import (
    CUSTOMER,
    DEMO_PASSWORD,
    DEMO_USER,
    approve,
    demo_approver_keyring,
    demo_effector_keyring,
    demo_keyring,
)
from beam_agents.ops.processes import Launched
from beam_agents.ops.rounds import Outputs
from beam_agents.runtime import COMPLETIONS, ERRORS, INTENTS, TRACES
from beam_agents.state.migration import MigrationRegistry

__all__ = ["add_triage_loop", "launch_console", "launch_effector", "run_bus_demo"]


def launch_effector(workdir: Path, *, kafka_bootstrap: str, topics: Topics) -> Launched:
    """`beam-agents effector-service` as its own process on the demo's loop: the stand-in tools,
    intents verified with the demo key, results signed with the demo effector's key, inquiries
    about lost calls with its inquiry key (the console's), answers to them verified with the
    demo approver's key; its store and log in `workdir`."""
    return Launched.python(
        "beam_agents.ops.cli",
        ["effector-service", "--bootstrap-servers", kafka_bootstrap,
         "--topic-prefix", topics.prefix, "--store", str(workdir / "effector.sqlite"),
         "--tools", "beam_agents.examples.support_triage:TOOLS",
         "--keyring", "beam_agents.ops.demo:demo_keyring",
         "--result-keyring", "beam_agents.ops.demo:demo_effector_keyring",
         "--inquiry-keyring", "beam_agents.ops.demo:demo_inquiry_keyring",
         "--approval-keyring", "beam_agents.ops.demo:demo_approver_keyring"],
        workdir / "effector.log",
    )  # fmt: skip


def launch_console(
    workdir: Path, *, kafka_bootstrap: str, topics: Topics, port: int = 8080
) -> tuple[Launched, str]:
    """`beam-agents console` as its own process on the demo's loop (the package docstring), its
    configuration, database and log in `workdir`; port 0 takes a free one. Returns the process
    once it serves, and its URL."""
    # Deferred: the console is an optional extra, which the rest of the demo does not need.
    from beam_agents.ops.console.auth import hash_password

    config = workdir / "console.toml"
    config.write_text(
        f"""[kafka]
bootstrap_servers = "{kafka_bootstrap}"
topic_prefix = "{topics.prefix}"

[console]
database = "console.sqlite"
port = {port}
verify_mode = "require"
intent_keyring = "beam_agents.ops.demo:demo_keyring"
approvals_keyring = "beam_agents.ops.demo:demo_approver_keyring"
inquiry_keyring = "beam_agents.ops.demo:demo_inquiry_keyring"

[users.{DEMO_USER}]
role = "approver"
password_hash = "{hash_password(DEMO_PASSWORD)}"
""",
        "utf-8",
    )
    console = Launched.python(
        "beam_agents.ops.cli", ["console", "--bus=kafka", "--config", str(config)],
        workdir / "console.log",
    )  # fmt: skip
    try:
        console.wait_for_output("Uvicorn running on")
    except (RuntimeError, TimeoutError):
        console.stop()
        raise
    url = re.search(r"Uvicorn running on (http://\S+)", console.log.read_text(errors="replace"))
    return console, url.group(1)


def add_triage_loop(
    pipeline: beam.Pipeline,
    *,
    kafka_bootstrap: str,
    topics: Topics,
    expansion_service: str,
    registry: MigrationRegistry | None = None,
):
    """Adds the support-triage agent's Kafka loop (AgentLoop, the scripted model, the demo
    signing key) to `pipeline`; returns RunAgent's outputs."""
    return pipeline | "TriageLoop" >> AgentLoop(
        triage,
        bootstrap_servers=kafka_bootstrap,
        topics=topics,
        expansion_service=expansion_service,
        consumer_group=f"{topics.prefix}.agents",
        llm_client=scripted_model(),
        keyring_loader=demo_keyring,
        result_keyring_loader=demo_effector_keyring,
        approval_keyring_loader=demo_approver_keyring,
        registry=registry,
    )


def run_bus_demo(
    options: PipelineOptions,
    *,
    kafka_bootstrap: str,
    expansion_service: str,
    out: TextIO = sys.stdout,
    timeout_s: float | None = None,
    console_port: int | None = None,
    flink_rest: str | None = None,
) -> int:
    """The demo over Kafka (the package docstring); returns 0 when the agent completed. With a
    `console_port` a person decides the approval in the console (port 0: a free one). With
    `flink_rest` (the job runs on that Flink cluster) a read that stalls ends the demo within
    a minute, saying so (beam_agents.bus.flink.ReadWatchdog)."""
    t0 = int(time.time() * 1000)
    if timeout_s is None:
        # A person gets the approval intent's lifetime (RunAgent's default TTL, one hour).
        timeout_s = 300 if console_port is None else 3600
    with tempfile.TemporaryDirectory(prefix="beam-agents-demo-") as scratch:
        demo = _BusDemo(out, scratch, options, t0, console_port=console_port, flink_rest=flink_rest)
        return demo.run_on_bus(kafka_bootstrap, expansion_service, timeout_s)


class _BusDemo(Account):
    def __init__(
        self, *args, console_port: int | None = None, flink_rest: str | None = None
    ) -> None:
        super().__init__(*args)
        self.console_port = console_port
        self.flink = None if flink_rest is None else FlinkRest(flink_rest)
        self.watchdog: ReadWatchdog | None = None
        self.console_url = ""
        if console_port is not None:
            self.approver = "you as the approver, in the console"

    def run_on_bus(self, kafka_bootstrap: str, expansion_service: str, timeout_s: float) -> int:
        event = self.introduce("as one streaming job with Kafka as its message bus")
        topics = Topics(f"beam-agents-demo-{time.time_ns()}")
        create_topics(kafka_bootstrap, topics)
        self.say(f"topics {topics.prefix}.*; the effector runs as its own process")
        workdir = Path(self.workdir)
        effector = launch_effector(workdir, kafka_bootstrap=kafka_bootstrap, topics=topics)
        console = None
        reader = TopicReader(kafka_bootstrap, topics.all())
        job = arrivals = None
        try:
            if self.console_port is not None:
                console, self.console_url = launch_console(
                    workdir, kafka_bootstrap=kafka_bootstrap, topics=topics,
                    port=self.console_port,
                )  # fmt: skip
                self.say(f"the console runs as its own process: {self.console_url}")
                self.say(f"  sign in as {DEMO_USER!r} with password {DEMO_PASSWORD!r}")
                self.say("  (a demo credential, printed for anyone: never use it elsewhere)")
            first_event = [(topics.events, CUSTOMER, event, event.event_time_ms)]
            if self.flink is None:
                produce(kafka_bootstrap, first_event)  # the job's first read finds it waiting
            pipeline = prism.pipeline(self.options)
            add_triage_loop(
                pipeline,
                kafka_bootstrap=kafka_bootstrap,
                topics=topics,
                expansion_service=expansion_service,
            )
            started = time.perf_counter()
            try:
                known = set() if self.flink is None else set(self.flink.jobs())
                job = pipeline.run()
                if self.flink is not None:
                    jid = self.flink.wait_for_new_job(known, lambda: None)
                    arrivals = KafkaArrivals(kafka_bootstrap, topics.events)
                    self.watchdog = ReadWatchdog(
                        self.flink, jid, arrivals=arrivals, topic=topics.events
                    )
                    # Its first look before the ticket: a job that never reads it is caught.
                    if not self.watchdog.first_look():
                        raise TimeoutError(f"could not see job {jid} and its topic in 60 s")
                    produce(kafka_bootstrap, first_event)
            except (FlinkRestError, TimeoutError) as e:
                self.say(f"the job did not start on Flink: {e}")
                return 1
            self.say("job submitted; the conversation as it comes back from Kafka:")
            return self._follow(reader, topics, kafka_bootstrap, effector, started + timeout_s)
        finally:
            if arrivals is not None:
                arrivals.close()
            if job is not None:
                job.cancel()
            if console is not None:
                console.stop()
            effector.stop()
            reader.close()

    def _follow(self, reader, topics: Topics, kafka_bootstrap: str, effector, deadline) -> int:
        seen = {topic: 0 for topic in topics.all()}
        started = time.perf_counter()
        while True:
            try:
                reader.read(lambda rows, seen=seen: any(len(rows[t]) > seen[t] for t in seen), 5)
            except TimeoutError:
                try:
                    effector.check_alive()
                except RuntimeError as e:
                    self.say(f"the effector service stopped: {e}")
                    return 1
                if time.perf_counter() > deadline:
                    self.say("the agent did not complete in time")
                    return 1
                try:
                    if self.watchdog is not None:
                        self.watchdog.check()
                except ReadStalledError as e:
                    self.say(str(e))
                    return 1
                continue
            time.sleep(0.5)  # let one step's records arrive together
            reader.settle(0.5)
            new = {t: reader.records[t][seen[t] :] for t in seen}
            seen = {t: len(reader.records[t]) for t in seen}
            # Every intent so far: a result names the intent that an earlier step emitted.
            new[topics.intents] = reader.records[topics.intents]
            outputs = _bus_outputs(topics, new)
            approvals = [ToolIntent.FromString(v) for _, v in new[topics.approvals]]
            if any(outputs.values(tag) for tag in (TRACES, "results", "approved", ERRORS)):
                self.say(f"at {time.perf_counter() - started:.1f} s:")
                self._account(outputs)
            if self.console_url:
                for intent in approvals:
                    self.say(f"  waiting for your decision: {self.console_url}/approvals/"
                             f"{intent.intent_id} (signed in as {DEMO_USER!r})")  # fmt: skip
            else:
                answers = [approve(intent) for intent in approvals]
                produce(
                    kafka_bootstrap,
                    [(topics.events, a.entity_key, a, a.event_time_ms) for a in answers],
                )
            if outputs.values(ERRORS):
                return 1
            if outputs.values(COMPLETIONS):
                self.say()
                self._trace_tree()
                return 0


def _bus_outputs(topics: Topics, records) -> Outputs:
    """Kafka records in the shape of a round's outputs, for `Account._account`; the approvals
    are the decisions seen on the events topic, whoever made them."""
    events = [AgentEnvelope.FromString(v) for _, v in records[topics.events]]
    decoded = {
        TRACES: [TraceEvent.FromString(v) for _, v in records[topics.traces]],
        INTENTS: [ToolIntent.FromString(v) for _, v in records[topics.intents]],
        COMPLETIONS: [v for _, v in records[topics.completions]],
        ERRORS: [decode_dead_letter(v) for _, v in records[topics.dead_letters]],
        "results": [envelope for envelope in events if envelope.HasField("tool_result")],
        "approved": [envelope for envelope in events if envelope.HasField("approval")],
    }
    return Outputs({tag: [(0, b"", v) for v in values] for tag, values in decoded.items()})
