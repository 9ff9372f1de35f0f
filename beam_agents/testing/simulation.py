"""A deterministic simulation of RunAgent under faults, in the spirit of FoundationDB's and
TigerBeetle's: one seed drives everything, and a failing seed replays exactly.

What runs is the real thing: RunAgent's own DoFn (`_AgentDoFn`: its `process` and timer
callbacks, `_read`, the `KeyMachine`, `write`) over many keys with random deterministic agents
(`simulation_agents`), and the real `Effector` with a SQLite store and a result key. What is
simulated is everything around them:

* the state backend of a portable SDK harness: a read hands back the very object the last
  write stored (never a copy), committed state is also kept as bytes, and a worker restart
  drops the objects so the next read decodes the bytes;
* bundles of one to three inputs of a key that fail after emitting part of their outputs:
  their writes are discarded, the outputs that escaped travel on, and the inputs are retried
  from the last commit (where the model may now answer differently);
* timers that fire again, or at a time they no longer hold;
* a message bus that delays, duplicates and reorders answers and intents, an effector that
  crashes between its claim and its result, a human who answers approvals (signed), forged
  answers, events stamped 0 or far behind, duplicate events, exports, and a new job that
  restores a key from its last snapshot.

After every step the invariants are checked against a reference model; at the end the world
is drained (every message delivered, every due timer fired) and the answers are accounted for.
A violation raises `SimulationFailure`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import random

from beam_agents._protos import (
    AgentEnvelope,
    Continuation,
    ExecutionRecord,
    MemoryBlob,
    StateSnapshot,
    ToolIntent,
    ToolResult,
)
from beam_agents.core.intent import content_digest
from beam_agents.core.signing import Keyring, Verification, sign, verify
from beam_agents.effector import INQUIRY_TOOL, Effector, Route, SqliteExecutionStore, VerifyMode
from beam_agents.runtime import AtDeadline, DeadlinePolicy, RuntimeConfig, run_agent
from beam_agents.runtime import dead_letters as dl
from beam_agents.runtime.context import ESCALATION_TOOL
from beam_agents.testing import simulation_agents as agents
from beam_agents.testing import simulation_state as state
from beam_agents.testing.simulation_state import message_bytes as _bytes

__all__ = ["Simulation", "SimulationFailure"]

T0 = 1_764_460_800_000
INTENT_RING = Keyring({"rt": b"r" * 32}, active="rt")
RESULT_RING = Keyring({"fx": b"f" * 32}, active="fx")
APPROVAL_RING = Keyring({"ap": b"a" * 32}, active="ap")
FORGER_RING = Keyring({"fx": b"x" * 32}, active="fx")
#: A claimant that cannot be running: beyond any pid_max.
DEAD_CLAIMANT = f"{2**22 + 7}:0:crashed"
_FAILED = {dl.AGENT_RAISED, dl.AGENT_CONTRACT, dl.LLM_FAILED, dl.MEMORY_BUDGET}
#: What may end a suspension in an input whose activations all failed.
_ENDINGS = {dl.RESUME_FAILED, dl.DEADLINE_EXCEEDED}
_ANSWERS = ("tool_result", "approval")


class _Crash(BaseException):
    """The effector's process dies inside a tool."""


class SimulationFailure(BaseException):
    """A violated invariant. Not an Exception: the runtime and the effector turn an agent's or
    a tool's exceptions into dead letters and results, and a check made inside an agent or a
    tool must stop the run instead."""


def _deferred(continuation: bytes) -> bool:
    suspended = Continuation.FromString(continuation)
    return (
        not suspended.pending_intent_ids
        and suspended.retry_at_ms > 0
        and len(suspended.mailbox) > 0
    )


def _answer_bytes(envelope: AgentEnvelope) -> bytes:
    which = envelope.WhichOneof("payload")
    return which[0].encode() + _bytes(getattr(envelope, which))


class _Recording:
    """The agent as the DoFn runs it, noting what each activation saw."""

    def __init__(self, agent, sim: Simulation) -> None:
        self._agent, self._sim = agent, sim
        self.adapter = agent.adapter

    def start(self, ctx, event: bytes):
        outcome = self._agent.start(ctx, event)
        self._sim.note.started.append((ctx.entity_key, event))
        return outcome

    def resume(self, ctx, answers):
        self._sim.check_resume(ctx, answers)
        outcome = self._agent.resume(ctx, answers)
        self._sim.note.seen.extend(_answer_bytes(a.envelope()) for a in answers)
        return outcome


@dataclasses.dataclass
class _Note:
    """What one bundle's activations did, applied to the model when it commits."""

    started: list = dataclasses.field(default_factory=list)
    seen: list = dataclasses.field(default_factory=list)


class Simulation:
    """One seed's world; `run()` raises SimulationFailure on a violated invariant."""

    def __init__(self, seed: int, *, steps: int = 80, keys: int = 3) -> None:
        self.seed = seed
        self.rng = rng = random.Random(seed)
        self.steps = steps
        self.keys = [b"k%d" % i for i in range(keys)]
        policy = DeadlinePolicy(
            rng.choice(list(AtDeadline)),
            max_escalations=rng.randint(1, 2),
            extension_ms=rng.choice([2_000, 10_000]),
        )
        self.config = RuntimeConfig(
            intent_ttl_ms=rng.choice([3_000, 20_000, 600_000]),
            suspend_deadline_ms=rng.choice([4_000, 20_000, 100_000]),
            ttl_ms=rng.choice([30_000, 10**9]),
            deadline_policy=policy,
            resume_retries=rng.randint(0, 2),
            retryable_resume_retries=rng.randint(1, 3),
            resume_backoff_ms=rng.choice([100, 2_000]),
            resume_backoff_max_ms=8_000,
            dedupe_window_ms=rng.choice([5_000, 10**9]),
            mailbox_max_events=rng.randint(0, 3),
        )
        self.function_agent = rng.random() < 0.5
        agent = agents.FUNCTION if self.function_agent else agents.StepAgent()
        self.model = agents.SimModel(rng, fail_p=rng.choice([0, 0.1, 0.3]), variant_p=0.5)
        self.dofn = run_agent._AgentDoFn(
            _Recording(agent, self),
            self.model,
            {
                "intent": lambda: INTENT_RING,
                "result": lambda: RESULT_RING,
                "approval": lambda: APPROVAL_RING,
            },
            self.config,
            None,
        )
        self.dofn.setup()
        self.counters = self.dofn._counters = state.Counters()
        self.now = T0 + rng.randrange(10**6)
        self.store = SqliteExecutionStore(":memory:")
        self.effector = self._new_effector()
        self.durable = {key: state.Durable() for key in self.keys}
        self.inbox: dict[bytes, list] = {key: [] for key in self.keys}
        self.ghosts: dict[bytes, list] = {key: [] for key in self.keys}
        self.intent_bus: list[bytes] = []
        self.approval_bus: list[ToolIntent] = []
        #: The approvals channel's recorded decision per intent_id.
        self.decisions: dict[str, AgentEnvelope] = {}
        self.note = _Note()
        # The reference model.
        self.executions: collections.Counter = collections.Counter()
        self.committed_content: dict[str, bytes] = {}
        self.produced: set[bytes] = set()
        self.forged: set[bytes] = set()
        #: (intent_id, content digest) of every answer of the effector or the human.
        self.answered: set[tuple[str, bytes]] = set()
        self.reached: set[bytes] = set()
        self.dead_lettered: set[bytes] = set()
        self.visits: collections.Counter = collections.Counter()
        self.programs: dict[int, list] = {}
        #: The tick of each event's latest start, and of each key's latest wipe.
        self.last_start: dict[int, int] = {}
        self.last_wipe: collections.Counter = collections.Counter()
        self.snapshot: StateSnapshot | None = None
        self.nonce = 0
        self.step = 0
        #: Counts committed inputs: orders starts and wipes.
        self.tick = 0

    def fail(self, message: str) -> None:
        raise SimulationFailure(f"seed {self.seed}, step {self.step}: {message}")

    # -- the effector, the human, the bus ------------------------------------------------------

    def _new_effector(self) -> Effector:
        tools = {name: self._tool(name) for name in agents.TOOLS}
        effector = Effector(
            tools,
            mode=VerifyMode.REQUIRE,
            store=self.store,
            keyring=INTENT_RING,
            result_keyring=RESULT_RING,
            approval_keyring=APPROVAL_RING,
            clock=lambda: self.now,
        )
        # Its claims name a process that is gone by the time anyone reads them: effectors here
        # run one call at a time, and one that crashed must be seen as dead.
        effector.instance_id = DEAD_CLAIMANT
        return effector

    def _tool(self, name: str):
        def run(args: dict, intent: ToolIntent) -> bytes:
            self.executions[intent.intent_id] += 1
            if self.executions[intent.intent_id] > 1:
                self.fail(f"tool {name} ran twice for {intent.intent_id}")
            if self.rng.random() < 0.05:
                raise _Crash  # the effector process dies while the tool acts
            if name == "flaky":
                raise ValueError("flaky tool failed")
            return f"{name}:{args['i']}:{args['llm']}".encode()

        return run

    def _deliver(self, envelope: AgentEnvelope, *, produced: bool = True) -> None:
        """Puts an answer on the bus to its key, maybe twice, maybe stamped 0 or far behind."""
        if produced:
            self.produced.add(_answer_bytes(envelope))
        copies = 2 if self.rng.random() < 0.15 else 1
        for _ in range(copies):
            copy = AgentEnvelope()
            copy.CopyFrom(envelope)
            pick = self.rng.random()
            copy.event_time_ms = 0 if pick < 0.05 else self.now - 10**6 if pick < 0.08 else self.now
            self.inbox[envelope.entity_key].append(("E", _bytes(copy), b""))

    def _effect(self) -> None:
        index = self.rng.randrange(len(self.intent_bus))
        data = self.intent_bus[index]
        if self.rng.random() < 0.7:  # else redelivered later too
            self.intent_bus.pop(index)
        intent = ToolIntent.FromString(data)
        if self.rng.random() < 0.08 and self.store.get(intent.intent_id) is None:
            # An effector claims the intent, starts the tool and dies: it may have acted.
            record = ExecutionRecord(
                intent_id=intent.intent_id,
                entity_key=intent.entity_key,
                content_digest=content_digest(data),
                outcome=ExecutionRecord.OUTCOME_RUNNING,
                latest_expires_at_ms=intent.expires_at_ms,
                claimed_by=DEAD_CLAIMANT,
            )
            self.store.claim(record, self.now + 10**9)
            self.executions[intent.intent_id] += 1
            self.intent_bus.append(data)
            self.effector = self._new_effector()
            return
        try:
            output = self.effector(data)
        except _Crash:
            self.intent_bus.append(data)
            self.effector = self._new_effector()
            return
        # It dies after its record, before its result or approval request is acknowledged: the
        # redelivered copy must send the recorded output again.
        if self.rng.random() < 0.05:
            self.intent_bus.append(data)
            self.effector = self._new_effector()
            return
        if output.route is Route.DEAD_LETTER:
            self.fail(f"the effector refused {intent.intent_id}: {output.dead_letter.detail}")
        if output.approval is not None:  # put before a human, or sent again on a redelivery
            self.approval_bus.append(output.approval)
        elif output.result is not None:
            result = output.result.tool_result
            self.answered.add((result.intent_id, result.intent_digest))
            self._deliver(output.result)

    def _human(self) -> None:
        intent = self.approval_bus.pop(self.rng.randrange(len(self.approval_bus)))
        decided = self.decisions.get(intent.intent_id)
        if decided is not None and intent.tool_name == INQUIRY_TOOL:
            self._inquiry_answered(decided)
            return
        if decided is not None:
            # The approvals channel dedupes by intent_id: a request sent again gets the
            # recorded decision again.
            self._deliver(decided, produced=intent.tool_name != ESCALATION_TOOL)
            return
        approval = AgentEnvelope.Approval(
            intent_id=intent.intent_id,
            approved=self.rng.random() < 0.7,
            approver="sim@example.com",
            decided_at_ms=self.now,
            intent_digest=content_digest(_bytes(intent)),
        )
        envelope = AgentEnvelope(
            entity_key=intent.entity_key,
            event_time_ms=self.now,
            approval=sign(approval, APPROVAL_RING),
        )
        self.decisions[intent.intent_id] = envelope
        if intent.tool_name == INQUIRY_TOOL:
            # The effector asked whether a call it lost took effect: the person's answer goes
            # to the effector, which makes it the call's result.
            self._inquiry_answered(envelope)
            return
        self.answered.add((intent.intent_id, approval.intent_digest))
        # The runtime's own escalations are answered to the runtime, not to the agent.
        self._deliver(envelope, produced=intent.tool_name != ESCALATION_TOOL)
        if self.rng.random() < 0.1:  # a human who changes their mind: a second answer
            approval.approved = not approval.approved
            envelope.approval.CopyFrom(sign(approval, APPROVAL_RING))
            self._deliver(envelope, produced=intent.tool_name != ESCALATION_TOOL)

    def _inquiry_answered(self, envelope: AgentEnvelope) -> None:
        output = self.effector.resolve(envelope)
        if output is None or output.result is None:
            self.fail(
                f"the effector took no result from the answer to {envelope.approval.intent_id}"
            )
        result = output.result.tool_result
        self.answered.add((result.intent_id, result.intent_digest))
        self._deliver(output.result)

    def _forge(self, key: bytes, intent: ToolIntent) -> None:
        """Someone who can write to the events topic answers a pending intent: with a key of
        their own, unsigned, or, holding an effector's key, approving an approval intent."""
        if intent.kind == ToolIntent.APPROVAL and self.rng.random() < 0.5:
            approval = AgentEnvelope.Approval(
                intent_id=intent.intent_id,
                approved=True,
                approver="an effector",
                intent_digest=content_digest(_bytes(intent)),
            )
            envelope = AgentEnvelope(
                entity_key=key, event_time_ms=self.now, approval=sign(approval, RESULT_RING)
            )
            self.forged.add(_answer_bytes(envelope))
            self._deliver(envelope, produced=False)
            return
        result = ToolResult(
            intent_id=intent.intent_id,
            entity_key=key,
            status=ToolResult.OK,
            payload=b"forged",
            intent_digest=content_digest(_bytes(intent)),
        )
        if self.rng.random() < 0.5:
            result = sign(result, FORGER_RING)
        envelope = AgentEnvelope(entity_key=key, event_time_ms=self.now, tool_result=result)
        self.forged.add(_answer_bytes(envelope))
        self._deliver(envelope, produced=False)

    def _event(self, key: bytes) -> None:
        self.nonce += 1
        program = {"nonce": self.nonce, "ops": agents.random_program(self.rng)}
        self.programs[self.nonce] = program["ops"]
        pick = self.rng.random()
        at = 0 if pick < 0.05 else self.now - 10**6 if pick < 0.08 else self.now
        envelope = AgentEnvelope(
            entity_key=key,
            event_time_ms=at,
            external_event=json.dumps(program, sort_keys=True).encode(),
        )
        idempotency = b"idem-%d" % self.nonce if self.rng.random() < 0.3 else b""
        for _ in range(2 if self.rng.random() < 0.2 else 1):  # an at-least-once producer
            self.inbox[key].append(("E", _bytes(envelope), idempotency))
        if self.rng.random() < 0.1:
            export = AgentEnvelope(entity_key=key, event_time_ms=self.now)
            export.export_request.request_id = f"x{self.nonce}"
            self.inbox[key].append(("E", _bytes(export), b""))

    # -- the DoFn ------------------------------------------------------------------------------

    def _take(self, key: bytes, count: int) -> list:
        durable, items, taken = self.durable[key], [], set()
        for _ in range(count):
            choices = [("inbox", i) for i in range(len(self.inbox[key]))]
            choices += [("ghost", i) for i in range(len(self.ghosts[key]))]
            choices += [
                ("timer", family)
                for family, at in durable.timers.items()
                if at is not None and at <= self.now and family not in taken
            ]
            if not choices:
                break
            source, which = self.rng.choice(choices)
            if source == "inbox":
                items.append(self.inbox[key].pop(which))
            elif source == "ghost":
                items.append(("G", *self.ghosts[key].pop(which)))
            else:
                taken.add(which)
                items.append(("T", which, durable.timers[which]))
        return items

    def _has_work(self, key: bytes) -> bool:
        timers = self.durable[key].timers.values()
        return bool(
            self.inbox[key]
            or self.ghosts[key]
            or any(t is not None and t <= self.now for t in timers)
        )

    def _bundle(self, key: bytes, items=None, *, faults: bool = True) -> list:
        """Runs inputs of `key` as one bundle, which may fail after some outputs escaped;
        returns the outputs of a committed bundle ([] when it failed)."""
        if items is None:
            items = self._take(key, self.rng.randint(1, 3))
        durable = self.durable[key]
        bundle = state.Bundle(durable)
        self.note = note = _Note()
        steps = []
        for item in items:
            if item[0] == "T" and item[1] in bundle.timers:
                item = ("G", *item[1:])  # reset by this bundle already: a stale firing
            before = bundle.view()
            del self.counters.counted[:]
            started = len(note.started)
            outputs = state.run(self.dofn, key, bundle, item, self.now)
            for message, data in bundle.handed:
                if _bytes(message) != data:
                    self.fail(f"{item[:2]} changed a {type(message).__name__} it read in place")
            after = bundle.view()
            self._check_input(item, before, after, outputs, set(self.counters.counted))
            steps.append((outputs, after, note.started[started:]))
        if faults and self.rng.random() < 0.15:
            every = [output for outputs, _, _ in steps for output in outputs]
            self._route(key, every[: self.rng.randint(0, len(every))], committed=False)
            for item in items:  # retried from the last commit, in any order
                if item[0] in ("E", "S"):
                    self.inbox[key].append(item)
                elif item[0] == "G":
                    self.ghosts[key].append(item[1:])
            return []
        old_timers = dict(durable.timers)
        bundle.commit()
        for family, at in old_timers.items():
            if at is not None and at != durable.timers[family] and self.rng.random() < 0.2:
                self.ghosts[key].append((family, at))  # the old setting fires anyway
        for item in items:
            if item[0] == "T" and self.rng.random() < 0.2:
                self.ghosts[key].append(item[1:])  # fires again
        self.reached.update(note.seen)
        for outputs, after, started in steps:
            for started_key, event in started:
                nonce = json.loads(event)["nonce"]
                previous = self.last_start.get(nonce)
                deduped = self.config.dedupe_window_ms > 10**8
                if previous is not None and deduped and self.last_wipe[started_key] < previous:
                    self.fail(f"event {nonce} of {started_key!r} started twice")
                self.last_start[nonce] = self.tick
            self._route(key, outputs, committed=True)
            self.tick += 1
            if after[1] is None:
                self.visits[key] = 0
                self.last_wipe[key] = self.tick
        return [output for outputs, _, _ in steps for output in outputs]

    # -- invariants ----------------------------------------------------------------------------

    def check_resume(self, ctx, answers) -> None:
        """What a resume is handed: each genuine answer signed and bound to its intent's
        content, never a forged one, one per intent, in the Continuation's intent order."""
        suspended = ctx.resume_of
        recorded = [_answered_id(a) for a in suspended.answers]
        if len(recorded) != len(set(recorded)):
            self.fail(f"a Continuation records two answers for one intent: {recorded}")
        ids = [a.intent.intent_id for a in answers]
        if ids != [i for i in suspended.pending_intent_ids if i in ids]:
            self.fail(f"answers {ids} out of intent order {list(suspended.pending_intent_ids)}")
        for answer in answers:
            message = answer.result if answer.result is not None else answer.approval
            made_here = (
                answer.result is not None
                and answer.result.status == ToolResult.EXPIRED
                and not answer.result.signature
            )
            if made_here:
                continue
            if _answer_bytes(answer.envelope()) in self.forged:
                self.fail(f"a forged answer to {answer.intent.intent_id} reached the agent")
            ring = APPROVAL_RING if answer.approval is not None else RESULT_RING
            if verify(message, ring) is not Verification.VALID:
                self.fail(f"an unsigned answer to {answer.intent.intent_id} reached the agent")
            if message.intent_digest != content_digest(_bytes(answer.intent)):
                self.fail(f"the answer to {answer.intent.intent_id} is for other content")

    def _check_input(self, item, before, after, outputs, counted) -> None:
        envelope = AgentEnvelope.FromString(item[1]) if item[0] == "E" else None
        if envelope is not None and envelope.HasField("export_request"):
            if before != after:
                self.fail("an export changed the key's state")
            return
        # A suspension with no pending intent is a start deferred while its model was busy:
        # its event waits first in the mailbox, on a retry.
        deferred = after[3] is not None and not after[4] and _deferred(after[3])
        if (after[3] is None) != (not after[4]) and not deferred:
            self.fail("pending intents without a suspension, or a suspension without them")
        reasons = {value.reason for tag, (_, value) in outputs if tag == run_agent.ERRORS}
        if before[1] is not None and after[1] is None:
            idle = MemoryBlob.FromString(before[1]).last_activity_ms + self.config.ttl_ms
            if item[0] not in ("T", "G") or item[2] < idle:
                self.fail(f"{item[:2]} wiped the key's memory before its TTL {idle}")
        if dl.AFTER_DEADLINE in reasons and before[3] is not None:
            deadline = Continuation.FromString(before[3]).deadline_ms
            if envelope.event_time_ms <= deadline:
                self.fail(f"an answer at {envelope.event_time_ms} refused as after {deadline}")
        # Only an input whose every activation failed is held to "changes nothing"; one that
        # also ran or deferred another (a drained mailbox) changed state on purpose.
        if "failed_activations" not in counted or {"activations", "deferred_activations"} & set(
            counted
        ):
            return
        # A failed activation changes nothing but its durable inputs (the answers).
        if before[:3] != after[:3]:
            self.fail(f"a failed activation ({item[:2]}) changed seq, memory or cache")
        answer = envelope is not None and envelope.WhichOneof("payload") in _ANSWERS
        if answer and after[3] is not None:
            kept = {_answer_bytes(a) for a in Continuation.FromString(after[3]).answers}
            if _answer_bytes(envelope) not in kept:
                self.fail("a failed resume dropped the answer that started it")
        if not reasons & _FAILED and dl.RESUME_FAILED not in reasons:
            self.fail(f"a failed activation without its dead letter: {reasons}")
        if after[3] is None:
            # A deferred start that fails for good ends as the start's own failure.
            ended = before[3] is not None and not _deferred(before[3])
            if ended and not reasons & _ENDINGS:
                self.fail(
                    f"a failed activation ended a suspension without resume_failed: {reasons}"
                )
            return
        if before[3] is None:
            self.fail("a failed activation created a suspension")
        old, new = (Continuation.FromString(b) for b in (before[3], after[3]))
        answered = {_answered_id(a) for a in new.answers}
        for kept in old.answers:
            # Only an EXPIRED the runtime made may give way, to a genuine answer for its intent.
            result = kept.tool_result
            made_here = result.status == ToolResult.EXPIRED and not result.signature
            if kept not in new.answers and not (made_here and _answered_id(kept) in answered):
                self.fail("a failed activation lost an answer")
        for blob in (old, new):
            for name in ("answers", "resume_failures", "retry_at_ms", "state_schema_version"):
                blob.ClearField(name)
        if old != new or before[4] != after[4]:
            self.fail("a failed activation changed its suspension beyond its answers")

    def _route(self, key: bytes, outputs, *, committed: bool) -> None:
        for tag, (_, value) in outputs:
            if tag == run_agent.INTENTS:
                data = _bytes(value)
                if committed:
                    known = self.committed_content.setdefault(value.intent_id, content_digest(data))
                    if known != content_digest(data):
                        self.fail(f"{value.intent_id} committed for two contents")
                self.intent_bus.append(data)
                if self.rng.random() < 0.05:
                    self._forge(key, value)
            elif not committed:
                continue
            elif tag == run_agent.ERRORS:
                if value.input.WhichOneof("payload") in ("tool_result", "approval"):
                    self._refused(value)
                self.dead_lettered.update(_answer_bytes(a) for a in value.answers)
            elif tag == run_agent.COMPLETIONS:
                done = json.loads(value)
                if done.get("visits") is not None:
                    counted = sum(op == ["count"] for op in self.programs[done["nonce"]])
                    self.visits[key] += counted
                    if done["visits"] != self.visits[key]:
                        self.fail(f"visits {done['visits']}, the model says {self.visits[key]}")
            elif tag == run_agent.SNAPSHOTS:
                self.snapshot = value

    def _refused(self, letter) -> None:
        """A refused answer is carried by its letter; a genuine one is never refused as
        forged, nor as computed for other content when it was computed for the intent's."""
        answer = _answer_bytes(letter.input)
        self.dead_lettered.add(answer)
        payload = letter.input.WhichOneof("payload")
        message = getattr(letter.input, payload)
        if letter.reason == dl.BAD_ANSWER_SIGNATURE and answer in self.produced:
            self.fail(f"a genuine {payload} for {message.intent_id} was refused as forged")
        committed = self.committed_content.get(message.intent_id)
        if letter.reason == dl.ANSWER_FOR_OTHER_CONTENT and message.intent_digest == committed:
            self.fail(f"the {payload} for {message.intent_id} was refused for its own content")

    def _new_job(self, key: bytes) -> None:
        """Exports the key, starts a new job without its state, restores the snapshot there
        and exports again: the two snapshots hold the same state."""

        def export(name: str) -> StateSnapshot:
            envelope = AgentEnvelope(entity_key=key, event_time_ms=self.now)
            envelope.export_request.request_id = name
            self.snapshot = None
            self._bundle(key, [("E", _bytes(envelope), b"")], faults=False)
            snapshot, self.snapshot = self.snapshot, None
            snapshot.ClearField("request_id")
            snapshot.ClearField("snapshot_at_ms")
            return snapshot

        first = export("before")
        self.durable[key] = state.Durable()
        self.ghosts[key] = []
        self._bundle(key, [("S", _bytes(first), b"")], faults=False)
        if self.rng.random() < 0.3:  # delivered twice: refused onto the restored key
            self._bundle(key, [("S", _bytes(first), b"")], faults=False)
        second = export("after")
        if _bytes(first) != _bytes(second):
            self.fail(f"export, restore, export is lossy:\n{first}\n!=\n{second}")

    # -- the run -------------------------------------------------------------------------------

    def _step(self) -> None:
        rng, key = self.rng, self.rng.choice(self.keys)
        pick = rng.random()
        if pick < 0.15:
            self._event(key)
        elif pick < 0.45:
            if self._has_work(key):
                self._bundle(key)
        elif pick < 0.6:
            if self.intent_bus:
                self._effect()
        elif pick < 0.68:
            if self.approval_bus:
                self._human()
        elif pick < 0.84:
            self.now += rng.randint(1, 4_000)
        elif pick < 0.87:
            for durable in self.durable.values():  # a worker restart: the cache is gone
                durable.cache = {}
            self.effector = self._new_effector()
        elif pick < 0.9:
            self._new_job(key)
        elif pick < 0.93:
            if self.durable[key].pending:
                self._forge(key, ToolIntent.FromString(rng.choice(self.durable[key].pending)))
        elif pick < 0.95:
            self.ghosts[key].append(
                (rng.choice(["deadline", "ttl"]), self.now - rng.randrange(10**5))
            )
        else:
            self.now += rng.randint(5_000, 60_000)

    def run(self) -> None:
        for step in range(self.steps):
            self.step = step
            self._step()
        # Drain: every message delivered, every due timer fired, until nothing is suspended.
        for step in range(self.steps, self.steps + 5_000):
            self.step = step
            busy = [key for key in self.keys if self.inbox[key] or self.ghosts[key]]
            if busy or self.intent_bus or self.approval_bus:
                pick = self.rng.random()
                if busy and pick < 0.5:
                    self._bundle(self.rng.choice(busy))
                elif self.intent_bus and pick < 0.8:
                    self._effect()
                elif self.approval_bus:
                    self._human()
                elif busy:
                    self._bundle(self.rng.choice(busy))
                else:
                    self._effect()
                continue
            due = [
                (durable.timers["deadline"], key)
                for key, durable in self.durable.items()
                if durable.timers["deadline"] is not None
            ]
            if not due:
                break
            at, key = min(due)
            self.now = max(self.now, at)
            self._bundle(key)
        else:
            self.fail("the world did not quiesce")
        for key, durable in self.durable.items():
            if "continuation" in durable.blobs:
                self.fail(f"{key!r} is suspended with no deadline timer")
        unanswered = set(self.committed_content.items()) - self.answered
        if unanswered:
            self.fail(f"the effector never answered {sorted(unanswered)}")
        lost = self.produced - self.reached - self.dead_lettered
        if lost:
            self.fail(f"{len(lost)} answers neither reached the agent nor a dead letter")


def _answered_id(envelope: AgentEnvelope) -> str:
    if envelope.WhichOneof("payload") == "approval":
        return envelope.approval.intent_id
    return envelope.tool_result.intent_id
