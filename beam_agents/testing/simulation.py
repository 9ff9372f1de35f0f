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

After every step the invariants are checked against a reference model (among them: the model
is never paid again for a call whose answer a committed cache held); at the end the world is
drained (every message delivered, every due timer fired) and the answers are accounted for.
A violation raises `SimulationFailure`.

The simulation is in five modules: this one (the seeded world's state and the reference model,
bundles of RunAgent's DoFn, the run), `simulation_world` (the effector, the human, forgers and
the bus), `simulation_checks` (the invariants), `simulation_state` (the state backend) and
`simulation_agents` (the agents and the model).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import random

from beam_agents._protos import AgentEnvelope, LlmCacheBlob, StateSnapshot, ToolIntent, TraceEvent
from beam_agents.intents.effector import SqliteExecutionStore
from beam_agents.intents.identity import content_digest
from beam_agents.runtime import AtDeadline, DeadlinePolicy, RuntimeConfig, run_agent
from beam_agents.runtime.context import llm_cache_key
from beam_agents.testing import simulation_agents as agents
from beam_agents.testing import simulation_state as state
from beam_agents.testing.simulation_checks import Checks
from beam_agents.testing.simulation_state import message_bytes as _bytes
from beam_agents.testing.simulation_world import (
    APPROVAL_RING,
    INTENT_RING,
    RESULT_RING,
    World,
    answer_bytes,
)

__all__ = ["Simulation", "SimulationFailure"]

T0 = 1_764_460_800_000


class SimulationFailure(BaseException):
    """A violated invariant. Not an Exception: the runtime and the effector turn an agent's or
    a tool's exceptions into dead letters and results, and a check made inside an agent or a
    tool must stop the run instead."""


class _Recording:
    """The agent as the DoFn runs it, noting what each activation saw."""

    def __init__(self, agent, sim: Simulation) -> None:
        self._agent, self._sim = agent, sim
        self.adapter = agent.adapter
        # What the runtime reads of the agent it runs: how its resumes use the replay cache.
        self.replays_every_call = getattr(agent, "replays_every_call", False)

    def start(self, ctx, event: bytes):
        self._sim.activation = ctx
        outcome = self._agent.start(ctx, event)
        self._sim.note.started.append((ctx.entity_key, event))
        return outcome

    def resume(self, ctx, answers):
        self._sim.check_resume(ctx, answers)
        self._sim.activation = ctx
        outcome = self._agent.resume(ctx, answers)
        self._sim.note.seen.extend(answer_bytes(a.envelope()) for a in answers)
        return outcome


@dataclasses.dataclass
class _Note:
    """What one bundle's activations did, applied to the model when it commits."""

    started: list = dataclasses.field(default_factory=list)
    seen: list = dataclasses.field(default_factory=list)
    #: The cache key of every call the bundle's cache has held after an input.
    cached: set = dataclasses.field(default_factory=set)
    #: ((key, seq, step), now) of each resume of the agent, in the order they ran.
    resumed: list = dataclasses.field(default_factory=list)


class Simulation(World, Checks):
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
        intent_ttl_ms = rng.choice([3_000, 20_000, 600_000])
        self.config = RuntimeConfig(
            intent_ttl_ms=intent_ttl_ms,
            # Never shorter than the intents' lifetime (RuntimeConfigError): equal, or longer.
            suspend_deadline_ms=intent_ttl_ms + rng.choice([1_000, 0, 80_000]),
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
        self.model.on_paid = self._paid
        #: The activation running now, and the cache key of every call a committed cache held.
        self.activation = None
        self.cached: set[str] = set()
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
        #: (key, seq, step) -> the latest "now" a suspension resumed its agent at.
        self.resumed_at: dict[tuple[bytes, int, int], int] = {}
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

    def _paid(self, request) -> None:
        """The model is never paid again for a call whose answer a committed cache held: it
        replays (a call past the cache's limits aside, which these runs do not reach)."""
        ctx = self.activation
        # The call's position in its activation: the calls before it, each traced.
        position = sum(t.event_type == TraceEvent.LLM_CALL for t in ctx.traces)
        key = llm_cache_key(ctx.entity_key, ctx.seq, position, request.canonical())
        if key in self.cached or key in self.note.cached:
            self.fail(f"paid again for seq {ctx.seq}'s call {position}, which the cache held")

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
            started, paid = len(note.started), self.model.paid
            outputs = state.run(self.dofn, key, bundle, item, self.now)
            for message, data in bundle.handed:
                if _bytes(message) != data:
                    self.fail(f"{item[:2]} changed a {type(message).__name__} it read in place")
            after = bundle.view()
            note.cached.update(
                e.cache_key for e in LlmCacheBlob.FromString(after[2] or b"").entries
            )
            self._check_input(
                item, before, after, outputs, set(self.counters.counted), self.model.paid - paid
            )
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
        self.cached.update(note.cached)
        counted = sum(
            blob.input_tokens + blob.output_tokens
            for blob in (
                LlmCacheBlob.FromString(d.blobs["cache"])
                for d in self.durable.values()
                if "cache" in d.blobs
            )
        )
        if counted > self.model.paid:
            self.fail(
                f"the keys' usage counts {counted} tokens, the model was paid {self.model.paid}"
            )
        for family, at in old_timers.items():
            if at is not None and at != durable.timers[family] and self.rng.random() < 0.2:
                self.ghosts[key].append((family, at))  # the old setting fires anyway
        for item in items:
            if item[0] == "T" and self.rng.random() < 0.2:
                self.ghosts[key].append(item[1:])  # fires again
        self.reached.update(note.seen)
        self.resumed_in_order(note.resumed)
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
                self.dead_lettered.update(answer_bytes(a) for a in value.answers)
            elif tag == run_agent.COMPLETIONS:
                done = json.loads(value)
                if done.get("visits") is not None:
                    counted = sum(op == ["count"] for op in self.programs[done["nonce"]])
                    self.visits[key] += counted
                    if done["visits"] != self.visits[key]:
                        self.fail(f"visits {done['visits']}, the model says {self.visits[key]}")
            elif tag == run_agent.SNAPSHOTS:
                self.snapshot = value

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
