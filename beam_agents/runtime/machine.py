"""The per-key state machine behind RunAgent: every decision of the runtime, free of Beam.

`KeyMachine` takes a key's state as stored (`KeyState`) and one input (an envelope, a
snapshot, a timer firing) and returns `Effects`: the outputs, and the whole new state to
commit with the timers it implies, or nothing to write. The stateful DoFn (`run_agent`) only
reads state into a KeyState, calls the machine and writes back what changed; the deterministic
simulation (`simulation_test`) drives the same machine over a model of the portable harness.

Never mutate what was read. A portable SDK harness (Prism, Flink, Dataflow Runner v2) hands
back the very object an earlier write stored, so a change made in place to a read blob is a
change to state, committed or not. Every blob in a KeyState is treated as frozen: the machine
builds new messages (`_copy`) and the DoFn writes the new objects.

Durable inputs. An accepted answer is recorded in the Continuation before anything can fail
with it: a resume that fails keeps every answer, dead-letters the failure (with the answers)
and is tried again on the deadline timer (`retry_at_ms`, backoff per RuntimeConfig); only when
its retries are spent is the suspension ended, its answers inside a `resume_failed` dead letter.
A failed activation's model calls are counted in the key's usage, and, when the model or the
budget stopped it, kept in its cache as durable inputs that its retry replays (`_keep_paid`).
An intent that has an answer is never presented as EXPIRED. An accepted external event is
marked in the key's MemoryBlob (`event_marks`, a digest of its time and bytes, and of a
transport's idempotency key), so a copy within `dedupe_window_ms` does nothing; events for a
suspended key wait in the Continuation's mailbox and run in event-time order when it ends.

Answers are checked before they are recorded: the key must be suspended on that intent, the
answer in time and of the intent's kind and entity, signed by a key of the answer keyring when
one is configured, and computed for the pending intent's content (`intent_digest`). Each refusal
is a dead letter carrying the refused envelope, and the key keeps waiting.

Time. "Now" is the input's event time on the key's clock: no more than `ttl_ms` ahead of the
key's activity mark (a key idle that long is wiped, so only a wrong clock is further ahead),
and, for an event that waited in a mailbox, no earlier than the time it is drained; for a
genuine answer that takes the place of an EXPIRED the runtime made at a deadline, no earlier
than that deadline or a retry that ran since (`Continuation.attempted_at_ms`). Timers fire
at the Continuation's next due time (`retry_at_ms`, else `deadline_ms`) and at the TTL, which
counts from the key's latest activity (the high-water mark of its event times and arrival times
on that clock, `last_activity_ms`) and so only ever moves forward: an event stamped 0 cannot wipe
the memory it just wrote.

The machine's parts, each a module of its own and, but the first, a mixin of KeyMachine that
reads its configuration (`_config`, `_agent`, the keyrings, `_version`) and calls the others'
methods through `self`, so no activation pays for the split:

* `machine_state`: KeyState, Effects, the output tags, and the commit (`Commits`);
* `machine_events`: intake, dedupe marks, the mailbox and starts (`Intake`);
* `machine_answers`: answers checked and recorded (`AnswerChecks`);
* `machine_activations`: the agent's calls, failures and resumes (`Activations`);
* `machine_deadlines`: retries, deadlines and escalations (`DueTimes`);
* `machine_budgets`: a key's budget put before a person (`BudgetQuestions`);
* `machine_inputs`: Continuations and restored usage checked where they come in (`Checks`).

This module holds the entry points (an envelope, a snapshot, a timer firing) and export.
"""

from __future__ import annotations

from beam_agents._protos import AgentEnvelope, StateSnapshot
from beam_agents.intents.signing import Keyring
from beam_agents.runtime import dead_letters as dl
from beam_agents.runtime.config import RuntimeConfig
from beam_agents.runtime.context import Agent, LlmClient
from beam_agents.runtime.machine_activations import Activations
from beam_agents.runtime.machine_answers import AnswerChecks
from beam_agents.runtime.machine_budgets import BudgetQuestions
from beam_agents.runtime.machine_deadlines import DueTimes
from beam_agents.runtime.machine_events import Intake, event_digests, marks_problem
from beam_agents.runtime.machine_inputs import Checks, snapshot_problem
from beam_agents.runtime.machine_state import (
    COMPLETIONS,
    ERRORS,
    INTENTS,
    SNAPSHOTS,
    TRACES,
    Commits,
    Effects,
    KeyState,
    Work,
    due_at,
    timer_ms,
)
from beam_agents.runtime.recording import Recording
from beam_agents.state.memory import with_checked_index
from beam_agents.state.migration import MigrationRegistry

__all__ = [
    "COMPLETIONS",
    "ERRORS",
    "INTENTS",
    "SNAPSHOTS",
    "TRACES",
    "Effects",
    "KeyMachine",
    "KeyState",
    "event_digests",
]


class KeyMachine(Commits, Checks, Intake, AnswerChecks, Activations, DueTimes, BudgetQuestions):
    """RunAgent's decisions for one key at a time; see the module docstring."""

    def __init__(
        self,
        agent: Agent,
        *,
        llm_client: LlmClient | None,
        keyring: Keyring | None,
        result_keyring: Keyring | None,
        approval_keyring: Keyring | None,
        config: RuntimeConfig,
        registry: MigrationRegistry | None,
        current_version: int,
        recording: Recording | None = None,
    ) -> None:
        self._agent = agent
        self._llm_client = llm_client
        self._keyring = keyring
        #: Verify ToolResults (the effectors' keys) and Approvals (the approvals channel's):
        #: two rings, so that no effector can approve what it is asked to wait for.
        self._answer_keyrings = {"tool_result": result_keyring, "approval": approval_keyring}
        self._config = config
        self._registry = registry
        self._version = current_version
        #: Emit an ActivationRecord per activation on RECORDS (None: off, the default).
        self._recording = recording

    # -- entry points -----------------------------------------------------------------------

    def on_envelope(
        self,
        key: bytes,
        stored: KeyState,
        envelope: AgentEnvelope,
        *,
        arrival_ms: int = 0,
        idempotency_key: bytes = b"",
        taken_in_ms: int | None = None,
        deferred: int = 0,
    ) -> Effects:
        """One envelope into the key. `taken_in_ms` and `deferred` are for a recorded start
        run again (the backtest, the shadow): the live key took its event in earlier and ran
        it from its mailbox or a retry at that time, so a start runs no earlier than then, as
        it did; and it had deferred it `deferred` times on a busy model, which count against
        `retryable_resume_retries` as they did."""
        now = envelope.event_time_ms
        payload = envelope.WhichOneof("payload")
        if payload is None:
            work = Work(key, stored)
            work.dead(dl.EMPTY_ENVELOPE, "the envelope carries no payload", now)
            return work.effects
        work = Work(key, self._current(stored), stored)
        work.anchor = self._on_clock(work.state, max(now, arrival_ms))
        if payload == "export_request":
            work.emit(SNAPSHOTS, self._snapshot(key, stored, envelope))
            if envelope.export_request.release and not stored.empty:
                # Handed off: the snapshot is the key's state now. Only the seq stays, so an
                # event here later never re-issues an intent id; no timer is left to fire.
                work.commit(KeyState(seq=stored.seq))
            return self._finish(work)
        self._checked(work, now)
        if payload == "external_event":
            self._external(work, envelope, idempotency_key, taken_in_ms, deferred)
        else:
            self._answer(work, envelope, payload)
        return self._finish(work)

    def on_snapshot(
        self, key: bytes, stored: KeyState, snapshot: StateSnapshot, *, arrival_ms: int = 0
    ) -> Effects:
        now = snapshot.snapshot_at_ms
        work = Work(key, stored)
        self._current(stored)  # a stored blob from a newer binary wedges the key here too
        if not stored.empty:
            work.dead(
                dl.RESTORE_CONFLICT,
                "the key already has state; a snapshot "
                f"(request {snapshot.request_id!r}) is restored only onto an empty key",
                now,
            )
            return work.effects
        future = [
            name
            for name, version in (
                ("snapshot", snapshot.state_schema_version),
                ("memory", snapshot.memory.state_schema_version),
                ("llm_cache", snapshot.llm_cache.state_schema_version),
                ("continuation", snapshot.continuation.state_schema_version),
            )
            if version > self._version
        ]
        if future:
            work.dead(
                dl.SNAPSHOT_FROM_FUTURE,
                f"request {snapshot.request_id!r}: {', '.join(future)} written at a schema newer "
                f"than {self._version}; restore it with the binary that wrote it",
                now,
            )
            return work.effects
        if snapshot.seq < 0:
            # Any seq up to int64's last is one a key can reach (a first seq, then one more
            # an activation) and export: refused, the key would start over at a first seq and
            # issue its ids again. At the last one, its next start is `seq_exhausted`.
            work.dead(
                dl.INVALID_SNAPSHOT,
                f"request {snapshot.request_id!r}: seq {snapshot.seq} is negative: no seq this "
                "runtime issues",
                now,
            )
            return work.effects
        torn = marks_problem(snapshot.memory.event_marks)
        if torn:
            # Restored, every mark added after a torn one would sit where no digest is looked
            # for: the key's dedupe off for good, and nothing would say so.
            work.dead(
                dl.INVALID_SNAPSHOT,
                f"request {snapshot.request_id!r}: the memory's event_marks {torn}",
                now,
            )
            return work.effects
        continuation = (
            self._migrate(snapshot.continuation) if snapshot.HasField("continuation") else None
        )
        problem = snapshot_problem(snapshot, continuation)
        if problem:
            work.dead(dl.INVALID_SNAPSHOT, f"request {snapshot.request_id!r}: {problem}", now)
            return work.effects
        work.anchor = max(now, arrival_ms)
        # The blobs are written as exported (an entry index that no longer fits entries people
        # edited is dropped, as it would hide keys) and migrate on their first read, like state
        # restored by --update; a snapshot with no seq (0) keeps the key's time-based first seq.
        work.commit(
            KeyState(
                seq=max(snapshot.seq, stored.seq or 0) if snapshot.seq else stored.seq,
                memory=with_checked_index(snapshot.memory) if snapshot.HasField("memory") else None,
                cache=(
                    with_checked_index(snapshot.llm_cache)
                    if snapshot.HasField("llm_cache")
                    else None
                ),
                continuation=snapshot.continuation if continuation is not None else None,
                # Pending intents belong to a suspension: without one they answer nothing.
                pending=tuple(snapshot.pending) if continuation is not None else (),
            )
        )
        return self._finish(work, continuation=continuation)

    def on_deadline_timer(self, key: bytes, stored: KeyState, fired_ms: int) -> Effects:
        work = Work(key, self._current(stored), stored)
        self._checked(work, fired_ms)
        self._due(work, fired_ms)
        return self._finish(work)

    def on_ttl_timer(self, key: bytes, stored: KeyState, fired_ms: int) -> Effects:
        work = Work(key, self._current(stored), stored)
        self._checked(work, fired_ms)
        state = work.state
        suspended = state.continuation
        if suspended is not None and timer_ms(due_at(suspended)) <= fired_ms:
            # The watermark passed the suspension's due time too (a bounded run's end, a
            # backlog) and timers of two families need not fire in time order. Its own timer
            # is set and due, so it runs there, at its time: run here, what it emits would be
            # stamped with this firing, a TTL later, and its intents born expired (and the
            # outputs would depend on the order the runner fired the two in). Nothing changes:
            # the commit only sets both timers again (the deadline's at that due time, so it
            # fires even were it lost), the TTL for a key still idle that long after it. Not
            # the TTL at this very firing (a suspension due past the global window's end, where
            # both timers clamp to its last millisecond): a runner that fired the TTL first
            # every time would loop; the due suspension's own commit sets it.
            work.count("stale_ttl_timers")
            ttl_at = timer_ms(self._ttl_at(state.memory, suspended, work.anchor))
            work.commit(state, activity=ttl_at > fired_ms)
            return self._finish(work)
        # A suspension counts in the TTL from its due time on, so a key suspended still (not
        # due) is not past its TTL either: only an idle key is wiped, and no answer is lost.
        if self._ttl_at(state.memory, suspended, 0) > fired_ms:
            work.count("stale_ttl_timers")  # the TTL moved forward since it was set
            return self._finish(work)  # what the state's checks changed, if anything
        work.commit(KeyState(seq=state.seq))
        return self._finish(work)

    # -- export -------------------------------------------------------------------------------

    def _snapshot(self, key: bytes, stored: KeyState, envelope: AgentEnvelope) -> StateSnapshot:
        """The committed blobs, verbatim (export never migrates); a key with no seq exports
        none (0), so a restore keeps the time-based first seq. An export with `release` hands
        the key off (`on_envelope` clears it here)."""
        snapshot = StateSnapshot(
            state_schema_version=self._version,
            entity_key=key,
            seq=stored.seq or 0,
            snapshot_at_ms=envelope.event_time_ms,
            pending=stored.pending,
            request_id=envelope.export_request.request_id,
        )
        for field, blob in (
            ("memory", stored.memory),
            ("llm_cache", stored.cache),
            ("continuation", stored.continuation),
        ):
            if blob is not None:
                getattr(snapshot, field).CopyFrom(blob)
        return snapshot
