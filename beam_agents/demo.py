"""`beam-agents demo`: the support-triage agent end to end, locally, with no network and no keys.

Each round is one real Beam pipeline (`TriageRound`): RunAgent runs the example agent
(beam_agents.examples.support_triage) for the customer's key, ExecuteIntents executes its tool
intents once with the stand-in tools, and a scripted approver answers approval requests. A
pipeline cannot loop, so the rounds are chained the way a message bus would close the loop in
production: each round ends by exporting the key's StateSnapshot, and the next round restores it
together with the answers the previous round produced. Intents are signed with a demo key made
for this run and verified by the effector in REQUIRE mode.

The account it prints follows the conversation: each activation, the intents it emitted and
what the effector or the approver answered, each suspension and resume, the exported snapshots,
and at the end the activation's traces as a tree. `python examples/support_triage.py` runs the
same rounds with ordinary Beam pipeline options (`--runner=...`).

`--bus=kafka` runs the same conversation as a production deployment would: one streaming job
(`add_triage_loop`, beam_agents.kafka_bus.AgentLoop) reads its events from Kafka, the effector
runs as its own process (`beam-agents effector-service`) on the intents topic, and the demo
plays the approver on the approvals topic. It needs a Kafka broker and Beam's Java expansion
service (`--kafka_bootstrap`, `--expansion_service`) and a runner that runs unbounded
cross-language pipelines: `bash tools/engines.sh flink-demo` runs it on a local Flink cluster.

`--bus=kafka --console` leaves the approval to a person: `beam-agents console` runs as its own
process on the loop (`launch_console`; the beam-agents[console] extra), verifying the approval
intents with the demo's intent key and signing the decision with the demo approver's key, which
the agent verifies answers with. The demo prints its URL and the one demo user's password (a
fixed, public demo credential, hashed with argon2 when the console starts) and waits, up to
the intent's hour, for the decision to come back on the events topic.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.typehints import Tuple

from beam_agents._protos import (
    AgentEnvelope,
    StateSnapshot,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.beam_support import typed
from beam_agents.core.intent import content_digest
from beam_agents.core.migration import MigrationRegistry
from beam_agents.core.signing import Keyring, sign
from beam_agents.effector import APPROVALS, DEAD_LETTERS, RESULTS, ExecuteIntents, VerifyMode
from beam_agents.errors import FlinkRestError, ReadStalledError
from beam_agents.examples.support_triage import TOOLS, scripted_model, ticket, triage
from beam_agents.flink import FlinkRest, KafkaArrivals, ReadWatchdog
from beam_agents.kafka_bus import (
    AgentLoop,
    TopicReader,
    Topics,
    create_topics,
    decode_dead_letter,
    produce,
)
from beam_agents.processes import Launched
from beam_agents.rounds import Advance, ManualClock, Outputs, run_round
from beam_agents.runtime import COMPLETIONS, ERRORS, INTENTS, SNAPSHOTS, TRACES, RunAgent

__all__ = [
    "DEMO_KEY_ID",
    "DEMO_PASSWORD",
    "DEMO_USER",
    "ScriptedApprover",
    "TriageRound",
    "add_triage_loop",
    "approve",
    "demo_approver_keyring",
    "demo_effector_keyring",
    "demo_keyring",
    "demo_ticket",
    "launch_console",
    "launch_effector",
    "run_bus_demo",
    "run_demo",
    "triage_agent",
]

DEMO_KEY_ID = "demo-key"
CUSTOMER = b"c-1"
_TICKET = ("t-1", "c-1", "I was charged twice, please refund me")
_MAX_ROUNDS = 8
DEMO_USER = "demo"
#: The demo console's one password: printed by the demo for anyone to use, never a secret.
DEMO_PASSWORD = "beam-agents-demo"


def demo_keyring() -> Keyring:
    """The demo's signing key: fixed bytes, labelled as what they are (never a real secret)."""
    return Keyring(
        {DEMO_KEY_ID: b"beam_agents demo key, not a secret, 32+ bytes"}, active=DEMO_KEY_ID
    )


def demo_effector_keyring() -> Keyring:
    """The demo effector's key, which signs its results (as fixed and as public as the rest)."""
    return Keyring(
        {"demo-effector": b"beam_agents demo effector key, not a secret"}, active="demo-effector"
    )


def demo_approver_keyring() -> Keyring:
    """The demo approvals channel's key, which signs its decisions."""
    return Keyring(
        {"demo-approver": b"beam_agents demo approver key, not a secret"}, active="demo-approver"
    )


def approve(intent: ToolIntent) -> AgentEnvelope:
    """The scripted approver's answer to an approval intent: approved, by ops@example.com, a
    millisecond after the intent was made, bound to the intent's content and signed."""
    decision = AgentEnvelope.Approval(
        intent_id=intent.intent_id,
        approved=True,
        approver="ops@example.com",
        decided_at_ms=intent.created_at_ms + 1,
        intent_digest=content_digest(intent.SerializeToString(deterministic=True)),
    )
    return AgentEnvelope(
        entity_key=intent.entity_key,
        event_time_ms=intent.created_at_ms + 1,
        approval=sign(decision, demo_approver_keyring()),
    )


def triage_agent() -> RunAgent:
    """RunAgent running the support-triage agent with the scripted model, signing its intents
    with the demo key and verifying results with the effector's key and approvals with the
    approver's."""
    return RunAgent(
        triage,
        llm_client=scripted_model(),
        keyring_loader=demo_keyring,
        result_keyring_loader=demo_effector_keyring,
        approval_keyring_loader=demo_approver_keyring,
    )


def launch_effector(workdir: Path, *, kafka_bootstrap: str, topics: Topics) -> Launched:
    """`beam-agents effector-service` as its own process on the demo's loop: the stand-in tools,
    intents verified with the demo key, results signed with the demo effector's key; its store
    and log in `workdir`."""
    return Launched.python(
        "beam_agents.cli",
        ["effector-service", "--bootstrap-servers", kafka_bootstrap,
         "--topic-prefix", topics.prefix, "--store", str(workdir / "effector.sqlite"),
         "--tools", "beam_agents.examples.support_triage:TOOLS",
         "--keyring", "beam_agents.demo:demo_keyring",
         "--result-keyring", "beam_agents.demo:demo_effector_keyring"],
        workdir / "effector.log",
    )  # fmt: skip


def demo_ticket(event_time_ms: int) -> AgentEnvelope:
    """The demo's one external event: customer c-1's ticket asking for a refund."""
    ticket_id, customer_id, text = _TICKET
    return AgentEnvelope(
        entity_key=CUSTOMER,
        event_time_ms=event_time_ms,
        external_event=ticket(ticket_id, customer_id, text),
    )


def launch_console(
    workdir: Path, *, kafka_bootstrap: str, topics: Topics, port: int = 8080
) -> tuple[Launched, str]:
    """`beam-agents console` as its own process on the demo's loop (module docstring), its
    configuration, database and log in `workdir`; port 0 takes a free one. Returns the process
    once it serves, and its URL."""
    # Deferred: the console is an optional extra, which the rest of the demo does not need.
    from beam_agents.console.auth import hash_password

    config = workdir / "console.toml"
    config.write_text(
        f"""[kafka]
bootstrap_servers = "{kafka_bootstrap}"
topic_prefix = "{topics.prefix}"

[console]
database = "console.sqlite"
port = {port}
verify_mode = "require"
intent_keyring = "beam_agents.demo:demo_keyring"
approvals_keyring = "beam_agents.demo:demo_approver_keyring"

[users.{DEMO_USER}]
role = "approver"
password_hash = "{hash_password(DEMO_PASSWORD)}"
""",
        "utf-8",
    )
    console = Launched.python(
        "beam_agents.cli", ["console", "--bus=kafka", "--config", str(config)],
        workdir / "console.log",
    )  # fmt: skip
    try:
        console.wait_for_output("Uvicorn running on")
    except (RuntimeError, TimeoutError):
        console.stop()
        raise
    url = re.search(r"Uvicorn running on (http://\S+)", console.log.read_text(errors="replace"))
    return console, url.group(1)


class ScriptedApprover(beam.DoFn):
    """A human stand-in: approves every approval intent (`approve`)."""

    def process(self, element):
        key, intent = element
        yield (key, approve(intent))


class TriageRound(beam.PTransform):
    """One round: RunAgent, then ExecuteIntents and the scripted approver on its intents.
    Outputs RunAgent's five, plus "results" (tool results) and "approved" (approval answers)
    as AgentEnvelopes for the next round, and the effector's dead letters."""

    def __init__(self, clock) -> None:
        super().__init__()
        self._clock = clock

    def expand(self, inputs):
        outputs = inputs | "RunAgent" >> triage_agent()
        effected = (
            outputs[INTENTS]
            | "Intents" >> beam.Values()
            | "ExecuteIntents"
            >> ExecuteIntents(
                TOOLS,
                mode=VerifyMode.REQUIRE,
                keyring_loader=demo_keyring,
                result_keyring_loader=demo_effector_keyring,
                clock=self._clock,
            )
        )
        approved = effected[APPROVALS] | "Approve" >> beam.ParDo(ScriptedApprover())
        return {
            **outputs,
            "results": effected[RESULTS],
            "approved": typed(approved, Tuple[bytes, AgentEnvelope]),
            "effector_errors": effected[DEAD_LETTERS],
        }


def run_demo(
    options: PipelineOptions | None = None, *, out: TextIO = sys.stdout, workdir: str | None = None
) -> int:
    """Runs the demo, printing its account to `out`; returns 0 when the agent completed."""
    t0 = int(time.time() * 1000)
    with tempfile.TemporaryDirectory(prefix="beam-agents-demo-") as scratch:
        return _Demo(out, workdir or scratch, options, t0).run()


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
    """The demo over Kafka (module docstring); returns 0 when the agent completed. With a
    `console_port` a person decides the approval in the console (port 0: a free one). With
    `flink_rest` (the job runs on that Flink cluster) a read that stalls ends the demo within
    a minute, saying so (beam_agents.flink.ReadWatchdog)."""
    t0 = int(time.time() * 1000)
    if timeout_s is None:
        # A person gets the approval intent's lifetime (RunAgent's default TTL, one hour).
        timeout_s = 300 if console_port is None else 3600
    with tempfile.TemporaryDirectory(prefix="beam-agents-demo-") as scratch:
        demo = _BusDemo(out, scratch, options, t0, console_port=console_port, flink_rest=flink_rest)
        return demo.run_on_bus(kafka_bootstrap, expansion_service, timeout_s)


class _Demo:
    approver = "a scripted approver"

    def __init__(self, out: TextIO, workdir: str, options, t0: int) -> None:
        self.out = out
        self.workdir = workdir
        self.options = options
        self.t0 = t0
        self.traces: list[TraceEvent] = []

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def introduce(self, where: str) -> AgentEnvelope:
        ticket_id, customer_id, text = _TICKET
        self.say("beam_agents demo: support-ticket triage, one durable agent per customer key,")
        self.say(f"{where}. No model service, no keys: a scripted model, stand-in")
        self.say(f"tools, {self.approver} and a demo signing key made for this run.")
        self.say()
        self.say(f"ticket {ticket_id} from customer {customer_id}: {text!r}")
        return demo_ticket(self.t0)

    def run(self) -> int:
        runner = (self.options or PipelineOptions()).view_as(StandardOptions).runner
        event = self.introduce(f"on Apache Beam's {runner or 'DirectRunner'}")
        inputs: list = [event]
        for number in range(1, _MAX_ROUNDS + 1):
            now = self.t0 + number * 1000
            outputs = self._round(number, inputs, now)
            completed = outputs.values(COMPLETIONS)
            self._account(outputs)
            if outputs.values(ERRORS) or outputs.values("effector_errors"):
                return 1
            if completed:
                self.say()
                self._trace_tree()
                return 0
            (snapshot,) = outputs.values(SNAPSHOTS)
            self._snapshot(snapshot)
            answers = outputs.values("results") + outputs.values("approved")
            for answer in answers:
                answer.event_time_ms = now + 10
            inputs = [snapshot, *answers]
        self.say(f"the agent did not complete in {_MAX_ROUNDS} rounds")
        return 1

    def _round(self, number: int, inputs: Sequence, now: int):
        self.say()
        self.say(
            f"round {number}: one pipeline run, {len(inputs)} input(s)"
            f"{' (the snapshot of the last round first)' if number > 1 else ''} ..."
        )
        started = time.perf_counter()
        export = AgentEnvelope(entity_key=CUSTOMER, event_time_ms=now)
        export.export_request.request_id = f"round-{number}"
        script = [*inputs, Advance(now), export, Advance(now + 1)]
        outputs = run_round(
            TriageRound(ManualClock(now)), script, self.workdir, options=self.options
        )
        self.say(f"  done in {time.perf_counter() - started:.1f} s")
        # A bounded run ends by firing every timer; what happened after the round is not
        # part of the conversation.
        return outputs.before(now + 2)

    def _account(self, outputs) -> None:
        traces = outputs.values(TRACES)
        self.traces += traces
        intents = {i.intent_id: i for i in outputs.values(INTENTS)}
        for event in traces:
            kind = TraceEvent.EventType.Name(event.event_type)
            if kind == "ACTIVATION_START":
                how = (
                    "resumed with its answers"
                    if event.attributes.get("beam_agents.resume") == "true"
                    else "started on a new event"
                )
                self.say(f"  activation seq {event.seq} {how}")
            elif kind == "LLM_CALL":
                replayed = event.attributes.get("beam_agents.replayed") == "true"
                source = "replayed from the cache, no model call" if replayed else "model called"
                self.say(f"    llm {event.attributes['gen_ai.request.model']}: {source}")
            elif kind == "INTENT_EMITTED":
                intent = intents[event.attributes["beam_agents.intent_id"]]
                self.say(
                    f"    intent {intent.tool_name} {intent.args_json} "
                    f"(id {intent.intent_id[:8]}, signed {intent.signing_key_id})"
                )
            elif kind == "SUSPENDED":
                pending = event.attributes["beam_agents.pending"].split(",")
                self.say(f"  suspended, waiting for {len(pending)} answer(s)")
        for _, _, result in outputs.results:
            tool_result = result.tool_result
            intent = intents.get(tool_result.intent_id)
            name = intent.tool_name if intent else tool_result.intent_id
            status = ToolResult.Status.Name(tool_result.status)
            self.say(f"  effector ran {name}: {status} {tool_result.payload.decode()}")
        for _, _, answer in outputs.approved:
            intent = intents.get(answer.approval.intent_id)
            question = json.loads(intent.args_json)["question"] if intent else ""
            verdict = "approved" if answer.approval.approved else "declined"
            self.say(f"  approver {answer.approval.approver} {verdict}: {question}")
        for output in outputs.values(COMPLETIONS):
            self.say(f"  completed: {output.decode()}")
        for _, _, error in outputs.rows.get(ERRORS, []) + outputs.rows.get("effector_errors", []):
            self.say(f"  DEAD LETTER {error.reason}: {error.detail}")

    def _snapshot(self, snapshot: StateSnapshot) -> None:
        memory = [e.key for e in snapshot.memory.entries]
        self.say(
            f"  exported snapshot {snapshot.request_id}: seq {snapshot.seq}, memory "
            f"{memory}, {len(snapshot.llm_cache.entries)} cached LLM answer(s), "
            f"{len(snapshot.pending)} pending intent(s)"
        )

    def _trace_tree(self) -> None:
        roots = [
            e
            for e in self.traces
            if e.event_type == TraceEvent.ACTIVATION_START and not e.parent_span_id
        ]
        for root in roots:
            self.say(f"trace {root.trace_id.hex()} (OpenTelemetry ids; one tree per activation)")
            self._branch(root, "")

    def _branch(self, span_event: TraceEvent, indent: str) -> None:
        label = "activation" if span_event.parent_span_id == b"" else "resume"
        self.say(f"{indent}{label} span {span_event.span_id.hex()}")
        # ACTIVATION_END shares its activation's span: it closes the span, it is no child.
        children = [
            e
            for e in self.traces
            if e.parent_span_id == span_event.span_id and e.event_type != TraceEvent.ACTIVATION_END
        ]
        for child in children:
            if child.event_type == TraceEvent.ACTIVATION_START:
                self._branch(child, indent + "  ")
                continue
            kind = TraceEvent.EventType.Name(child.event_type)
            detail = (
                child.attributes.get("gen_ai.tool.name")
                or child.attributes.get("gen_ai.request.model")
                or ""
            )
            self.say(f"{indent}  {kind.lower()} {detail}".rstrip())


class _BusDemo(_Demo):
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
            pipeline = beam.Pipeline(options=self.options)
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
    """Kafka records in the shape of a round's outputs, for `_Demo._account`; the approvals
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


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m beam_agents.demo [--bus kafka ...] [Beam pipeline options]`; 2 when Beam
    refuses the options."""
    parser = argparse.ArgumentParser(prog="beam-agents demo", add_help=False)
    parser.add_argument("--bus", choices=["rounds", "kafka"], default="rounds")
    parser.add_argument("--kafka_bootstrap")
    parser.add_argument("--expansion_service")
    parser.add_argument("--console", action="store_true")
    parser.add_argument("--console_port", type=int, default=8080)
    # On Flink: the cluster's REST address, for the stalled-read watchdog (beam_agents.flink).
    parser.add_argument("--flink_rest")
    args, pipeline_args = parser.parse_known_args(list(argv) if argv is not None else sys.argv[1:])
    options = PipelineOptions(pipeline_args)
    try:
        beam.Pipeline(options=options)  # Beam checks the runner and its options here
    except ValueError as e:
        print(f"beam-agents demo: {e}", file=sys.stderr)
        return 2
    if args.console and args.bus != "kafka":
        print("beam-agents demo: --console needs --bus kafka", file=sys.stderr)
        return 2
    if args.bus == "rounds":
        return run_demo(options)
    if not args.kafka_bootstrap or not args.expansion_service:
        print("beam-agents demo: --bus kafka needs --kafka_bootstrap and --expansion_service",
              file=sys.stderr)  # fmt: skip
        return 2
    return run_bus_demo(
        options,
        kafka_bootstrap=args.kafka_bootstrap,
        expansion_service=args.expansion_service,
        console_port=args.console_port if args.console else None,
        flink_rest=args.flink_rest,
    )


if __name__ == "__main__":
    sys.exit(main())
