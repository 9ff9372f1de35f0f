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
An intent that has an answer is never presented as EXPIRED. An accepted external event is
marked in the key's MemoryBlob (`event_marks`, a digest of its time and bytes, and of a
transport's idempotency key), so a copy within `dedupe_window_ms` does nothing; events for a
suspended key wait in the Continuation's mailbox and run in event-time order when it ends.

Answers are checked before they are recorded: the key must be suspended on that intent, the
answer in time and of the intent's kind and entity, signed by a key of the answer keyring when
one is configured, and computed for the pending intent's content (`intent_digest`). Each refusal
is a dead letter carrying the refused envelope, and the key keeps waiting.

Time. "Now" is the input's event time; timers fire at the Continuation's next due time
(`retry_at_ms`, else `deadline_ms`) and at the TTL, which counts from the key's latest activity
(the high-water mark of its event times and arrival times, `last_activity_ms`) and so only ever
moves forward: an event stamped 0 cannot wipe the memory it just wrote.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Iterable

from beam_agents._protos import (
    AgentEnvelope,
    Continuation,
    LlmCacheBlob,
    MemoryBlob,
    StateSnapshot,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.beam_support import timer_timestamp
from beam_agents.core.intent import content_digest
from beam_agents.core.migration import MigrationRegistry, migrate_to_current, new_state_blob
from beam_agents.core.signing import Keyring, Verification, verify
from beam_agents.errors import (
    AgentContractError,
    BudgetExceededError,
    CheckpointRejectedError,
    LlmCallError,
    MemoryBudgetError,
)
from beam_agents.runtime import dead_letters as dl
from beam_agents.runtime.budget import BUDGET_TOOL, Budget, BudgetMeter, OnBudget
from beam_agents.runtime.config import AtDeadline, RuntimeConfig
from beam_agents.runtime.context import (
    ESCALATION_TOOL,
    ActivationContext,
    Agent,
    Answer,
    Completion,
    LlmClient,
    Suspension,
)
from beam_agents.runtime.memory import Memory, ReplayCache, share_index

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

COMPLETIONS = "completions"
INTENTS = "intents"
TRACES = "traces"
ERRORS = "errors"
SNAPSHOTS = "snapshots"

_INT64_MAX = 2**63 - 1
_SEQ_PER_MS = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class KeyState:
    """A key's state as stored, each blob at whatever version wrote it. Never mutated."""

    seq: int | None = None
    memory: MemoryBlob | None = None
    cache: LlmCacheBlob | None = None
    continuation: Continuation | None = None
    pending: tuple[ToolIntent, ...] = ()

    @property
    def empty(self) -> bool:
        """No state but perhaps a seq (which outlives the TTL)."""
        return (
            not self.pending
            and self.memory is None
            and self.cache is None
            and self.continuation is None
        )


@dataclasses.dataclass
class Effects:
    """What one input produces. `state` is None when nothing is to be written; otherwise it
    is the key's whole new state, `deadline_at` the deadline timer's time (None: clear it)
    and `ttl_at` the TTL timer's (None: clear it)."""

    outputs: list[tuple[str, tuple[bytes, object]]] = dataclasses.field(default_factory=list)
    state: KeyState | None = None
    deadline_at: int | None = None
    ttl_at: int | None = None
    #: Names of the counters to increment, once per occurrence.
    counters: list[str] = dataclasses.field(default_factory=list)


def event_digests(envelope: AgentEnvelope, idempotency_key: bytes = b"") -> list[bytes]:
    """What marks an external event as seen (16 bytes each): its time and bytes, and a
    transport's idempotency key where it has one."""
    digests = [
        hashlib.sha256(b"event|%d|" % envelope.event_time_ms + envelope.external_event).digest()
    ]
    if idempotency_key:
        digests.append(hashlib.sha256(b"idempotency|" + idempotency_key).digest())
    return [d[:_DIGEST] for d in digests]


# MemoryBlob.event_marks: 24-byte marks, the time (8 bytes, big-endian) and the digest.
_DIGEST = 16
_MARK = 8 + _DIGEST
_TIME = struct.Struct(">q")


def _seen(marks: bytes, digest: bytes) -> bool:
    """Whether `digest` is one of the marks' digests (a match must sit at a mark's digest)."""
    at = marks.find(digest, 8)
    while at != -1:
        if at % _MARK == 8:
            return True
        at = marks.find(digest, at + 1)
    return False


def _first_after(marks: bytes, horizon: int) -> int:
    """The byte offset of the first mark made at or after `horizon` (marks are in time
    order)."""
    low, high = 0, len(marks) // _MARK
    if not high or _TIME.unpack_from(marks)[0] >= horizon:
        return 0  # the common case: every mark is inside the window
    while low < high:
        middle = (low + high) // 2
        if _TIME.unpack_from(marks, middle * _MARK)[0] < horizon:
            low = middle + 1
        else:
            high = middle
    return low * _MARK


class _Work:
    """The effects of one input as they accumulate: chained activations (a resume, then the
    mailbox) each see the state the previous one committed."""

    def __init__(self, key: bytes, state: KeyState, stored: KeyState | None = None) -> None:
        self.key = key
        self.state = state
        #: The state as read, through migration (`state` before any change) and before it: a
        #: blob still the migrated one is written back as it was read.
        self.current = state
        self.stored = state if stored is None else stored
        self.changed = False
        self.effects = Effects()
        #: The latest event or arrival time this input brought: the TTL counts from it.
        self.anchor = 0

    def commit(self, state: KeyState) -> None:
        self.state = state
        self.changed = True

    def emit(self, tag: str, value) -> None:
        self.effects.outputs.append((tag, (self.key, value)))

    def dead(self, reason: str, detail: str, now: int, **fields) -> None:
        self.emit(ERRORS, dl.error_record(self.key, reason, detail, now, **fields))

    def count(self, name: str) -> None:
        self.effects.counters.append(name)


@dataclasses.dataclass
class _Run:
    """One agent call's outcome: `result` on success, `error` on failure."""

    ctx: ActivationContext
    result: Completion | Suspension | None = None
    error: Exception | None = None
    memory: MemoryBlob | None = None
    cache: LlmCacheBlob | None = None


class KeyMachine:
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

    # -- entry points -----------------------------------------------------------------------

    def on_envelope(
        self,
        key: bytes,
        stored: KeyState,
        envelope: AgentEnvelope,
        *,
        arrival_ms: int = 0,
        idempotency_key: bytes = b"",
    ) -> Effects:
        now = envelope.event_time_ms
        payload = envelope.WhichOneof("payload")
        if payload is None:
            work = _Work(key, stored)
            work.dead(dl.EMPTY_ENVELOPE, "the envelope carries no payload", now)
            return work.effects
        work = _Work(key, self._current(stored), stored)
        work.anchor = max(now, arrival_ms)
        if payload == "export_request":
            work.emit(SNAPSHOTS, self._snapshot(key, stored, envelope))
        elif payload == "external_event":
            self._external(work, envelope, idempotency_key)
        else:
            self._answer(work, envelope, payload)
        return self._finish(work)

    def on_snapshot(
        self, key: bytes, stored: KeyState, snapshot: StateSnapshot, *, arrival_ms: int = 0
    ) -> Effects:
        now = snapshot.snapshot_at_ms
        work = _Work(key, stored)
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
        continuation = (
            self._migrate(snapshot.continuation) if snapshot.HasField("continuation") else None
        )
        work.anchor = max(now, arrival_ms)
        # The blobs are written verbatim and migrate on their first read, like state restored
        # by --update; a snapshot with no seq (0) keeps the key's time-based first seq.
        work.commit(
            KeyState(
                seq=max(snapshot.seq, stored.seq or 0) if snapshot.seq else stored.seq,
                memory=snapshot.memory if snapshot.HasField("memory") else None,
                cache=snapshot.llm_cache if snapshot.HasField("llm_cache") else None,
                continuation=snapshot.continuation if continuation is not None else None,
                pending=tuple(snapshot.pending),
            )
        )
        return self._finish(work, continuation=continuation)

    def on_deadline_timer(self, key: bytes, stored: KeyState, fired_ms: int) -> Effects:
        work = _Work(key, self._current(stored), stored)
        self._due(work, fired_ms)
        return self._finish(work)

    def on_ttl_timer(self, key: bytes, stored: KeyState, fired_ms: int) -> Effects:
        state = self._current(stored)
        work = _Work(key, state, stored)
        suspended = state.continuation
        if suspended is not None and _ms(_due_at(suspended)) <= fired_ms:
            # The watermark passed the suspension's due time too (a bounded run's end, a
            # backlog) and timers of two families need not fire in time order: that comes
            # first, as if its timer had fired, and sets the TTL anew.
            self._due(work, _ms(_due_at(suspended)))
            return self._finish(work)
        if self._ttl_at(state.memory, state.continuation, 0) > fired_ms:
            work.count("stale_ttl_timers")  # the TTL moved forward since it was set
            return work.effects
        if suspended is not None:
            work.dead(
                dl.TTL_WIPED_SUSPENDED,
                "idle past its TTL while suspended on "
                f"{list(suspended.pending_intent_ids)}; state cleared",
                fired_ms,
                answers=suspended.answers,
            )
            for queued in suspended.mailbox:
                work.dead(
                    dl.TTL_WIPED_SUSPENDED,
                    "queued while the key was suspended; the key was wiped first",
                    fired_ms,
                    input=queued,
                )
        work.commit(KeyState(seq=state.seq))
        return self._finish(work)

    # -- state ------------------------------------------------------------------------------

    def _migrate(self, blob):
        return None if blob is None else migrate_to_current(blob, self._registry)

    def _current(self, stored: KeyState) -> KeyState:
        """The state every decision reads: each blob through migrate_to_current, which
        returns a current blob itself. StateSchemaFromFutureError propagates on purpose: the
        bundle fails and the key waits, untouched, for the binary that wrote it.

        `stored` itself when every blob is current, the common case: one field read a blob."""
        version = self._version
        memory, cache, continuation = stored.memory, stored.cache, stored.continuation
        if (
            (memory is None or memory.state_schema_version == version)
            and (cache is None or cache.state_schema_version == version)
            and (continuation is None or continuation.state_schema_version == version)
        ):
            return stored
        return dataclasses.replace(
            stored,
            memory=self._migrate(stored.memory),
            cache=self._migrate(stored.cache),
            continuation=self._migrate(stored.continuation),
        )

    def _copy(self, blob):
        """A new blob equal to `blob`, stamped with the current version: what a change is
        made on, never the blob that was read."""
        copied = type(blob)()
        copied.CopyFrom(blob)
        copied.state_schema_version = self._version
        return copied

    def _finish(self, work: _Work, continuation: Continuation | None = None) -> Effects:
        """Effects of `work`; `continuation` is the migrated view of a restored one."""
        effects = work.effects
        if work.changed:
            state = work.state
            suspended = continuation if continuation is not None else state.continuation
            effects.deadline_at = None if suspended is None else _due_at(suspended)
            effects.ttl_at = (
                None if state.empty else self._ttl_at(state.memory, suspended, work.anchor)
            )
            # A blob the input did not replace is written back as it was read: its migrated
            # view reaches state only with a change of its own.
            current, stored = work.current, work.stored
            effects.state = KeyState(
                seq=state.seq,
                memory=stored.memory if state.memory is current.memory else state.memory,
                cache=stored.cache if state.cache is current.cache else state.cache,
                continuation=(
                    stored.continuation
                    if state.continuation is current.continuation
                    else state.continuation
                ),
                pending=state.pending,
            )
        return effects

    def _ttl_at(
        self, memory: MemoryBlob | None, suspended: Continuation | None, anchor: int
    ) -> int:
        latest = max(anchor, memory.last_activity_ms if memory is not None else 0)
        if suspended is not None:
            latest = max(latest, _due_at(suspended))
        return _saturating_add(latest, self._config.ttl_ms)

    def _marked(
        self, memory: MemoryBlob | None, digests: Iterable[bytes], now: int, *, owned: bool
    ) -> MemoryBlob:
        """`memory` with the event marks added, old marks dropped, and the activity high-water
        mark moved forward: changed in place when the caller `owned` it (a blob it just built),
        else on a copy; `memory` itself when there is nothing to mark and the mark is ahead
        already, so an answer or timer that did not touch memory writes none."""
        if memory is None:
            blob = MemoryBlob()
        elif owned:
            blob = memory
        elif not digests and memory.last_activity_ms >= now:
            return memory
        else:
            blob = self._copy(memory)
            share_index(blob, memory)
        blob.state_schema_version = self._version
        latest = max(blob.last_activity_ms, now)
        blob.last_activity_ms = latest
        marks = blob.event_marks
        if digests or marks:
            config = self._config
            stamp = _TIME.pack(latest)
            added = b"".join([stamp + digest for digest in digests])
            # The new marks are the latest, so the window and the cap cut only old ones (or,
            # with a cap below the new marks, some of those); one copy of what stays.
            start = max(
                _first_after(marks, latest - config.dedupe_window_ms),
                len(marks) + len(added) - config.dedupe_max_events * _MARK,
            )
            if start or added:
                blob.event_marks = (
                    b"".join((memoryview(marks)[start:], added))
                    if start <= len(marks)
                    else added[start - len(marks) :]
                )
        return blob

    # -- external events --------------------------------------------------------------------

    def _external(self, work: _Work, envelope: AgentEnvelope, idempotency_key: bytes) -> None:
        now = envelope.event_time_ms
        state = work.state
        digests = event_digests(envelope, idempotency_key)
        marks = state.memory.event_marks if state.memory is not None else b""
        if any(_seen(marks, d) for d in digests):
            work.count("duplicate_events")
            return
        suspended = state.continuation
        if suspended is None:
            self._start(work, envelope, digests, work.anchor)
            return
        config = self._config
        queued_bytes = sum(len(e.external_event) for e in suspended.mailbox)
        if (
            len(suspended.mailbox) >= config.mailbox_max_events
            or queued_bytes + len(envelope.external_event) > config.mailbox_max_bytes
        ):
            work.dead(
                dl.MAILBOX_FULL,
                f"the key is suspended on {list(suspended.pending_intent_ids)} and its mailbox "
                f"holds {len(suspended.mailbox)} events of {queued_bytes} bytes",
                now,
                input=envelope,
            )
            return
        queued = self._copy(suspended)
        queued.mailbox.append(envelope)
        work.count("queued_events")
        work.commit(
            dataclasses.replace(
                state,
                memory=self._marked(state.memory, digests, work.anchor, owned=False),
                continuation=queued,
            )
        )

    def _start(
        self, work: _Work, envelope: AgentEnvelope, digests, anchor: int, failures: int = 0
    ) -> None:
        now = envelope.event_time_ms
        state = work.state
        seq = _next_seq(state.seq, now)
        run = self._run(work, now, seq, lambda ctx: self._agent.start(ctx, envelope.external_event))
        if run.error is None:
            self._commit_run(work, run, now, marks=digests, anchor=anchor, mailbox=())
        elif _busy(run.error) and failures < self._config.retryable_resume_retries:
            self._defer(work, envelope, digests, anchor, failures + 1)
        elif self._asks(run.error):
            self._ask_budget(work, run, now, event=envelope, digests=digests, anchor=anchor)
        else:
            # The record carries the event: one drained from a mailbox was marked as seen, so
            # nothing else holds it.
            self._failed(work, run, now, event=envelope)

    def _defer(self, work: _Work, envelope: AgentEnvelope, digests, anchor: int, failures: int):
        """A start whose model stayed busy past its client's retries: the key waits on its
        deadline timer, the event first in its mailbox (events after it queue behind), and
        the start is tried again with backoff. Nothing else changes, so the retry runs the
        same seq and emits the same ids."""
        work.count("deferred_activations")
        retry_at = _saturating_add(
            max(anchor, envelope.event_time_ms), self._config.backoff_ms(failures)
        )
        deferred = new_state_blob(
            Continuation,
            adapter=self._agent.adapter,
            suspended_at_ms=envelope.event_time_ms,
            deadline_ms=retry_at,
            retry_at_ms=retry_at,
            resume_failures=failures,
            mailbox=[envelope],
        )
        deferred.state_schema_version = self._version
        work.commit(
            dataclasses.replace(
                work.state,
                memory=self._marked(work.state.memory, digests, anchor, owned=False),
                continuation=deferred,
                pending=(),
            )
        )

    def _retry_start(self, work: _Work, deferred: Continuation, fired_ms: int) -> None:
        """The deferred start is due: its event runs again, then the events queued after it."""
        first, *rest = deferred.mailbox
        work.commit(dataclasses.replace(work.state, continuation=None, pending=()))
        self._start(work, first, (), max(work.anchor, fired_ms), deferred.resume_failures)
        suspended = work.state.continuation
        if suspended is None:
            self._drain(work, rest, work.anchor)
        elif rest:
            waiting = self._copy(suspended)
            waiting.mailbox.extend(rest)
            work.commit(dataclasses.replace(work.state, continuation=waiting))

    def _drain(self, work: _Work, mailbox, anchor: int) -> None:
        """Runs the events queued during a suspension that just ended, in event-time order,
        until one suspends again; the rest wait in its mailbox. They were marked as seen when
        they were queued."""
        queued = sorted(mailbox, key=lambda e: e.event_time_ms)
        while queued:
            envelope = queued.pop(0)
            self._start(work, envelope, (), max(anchor, envelope.event_time_ms))
            suspended = work.state.continuation
            if suspended is not None:
                rest = self._copy(suspended)
                rest.mailbox.extend(queued)
                work.commit(dataclasses.replace(work.state, continuation=rest))
                return

    # -- answers ----------------------------------------------------------------------------

    def _answer(self, work: _Work, envelope: AgentEnvelope, payload: str) -> None:
        now = envelope.event_time_ms
        answered_id = _answered_id(envelope)
        suspended = work.state.continuation

        def refuse(reason: str, detail: str) -> None:
            work.dead(reason, detail, now, input=envelope)

        if suspended is None:
            refuse(dl.NO_SUSPENSION, f"an answer to {answered_id}, but the key is not suspended")
            return
        # An EXPIRED the runtime made is still recorded only while the resume it was made for
        # awaits its retry: the agent has seen nothing yet, so a genuine answer on time takes
        # its place.
        stand_in = next(
            (a for a in suspended.answers if _answered_id(a) == answered_id and _made_here(a)),
            None,
        )
        if stand_in is None and any(_answered_id(a) == answered_id for a in suspended.answers):
            # A copy of an answer already recorded (a redelivery): the recorded one stands.
            if _same_answer(envelope, suspended.answers, answered_id):
                work.count("duplicate_answers")
                return
            refuse(dl.UNKNOWN_INTENT, f"{answered_id} has another answer recorded already")
            return
        if now > suspended.deadline_ms:
            refuse(
                dl.AFTER_DEADLINE,
                f"the answer to {answered_id} at {now} came after the deadline "
                f"{suspended.deadline_ms}",
            )
            return
        intent = next((i for i in work.state.pending if i.intent_id == answered_id), None)
        if intent is None or answered_id not in suspended.pending_intent_ids:
            refuse(
                dl.UNKNOWN_INTENT,
                f"{answered_id} is pending but its intent is missing"  # a partial restore
                if answered_id in suspended.pending_intent_ids
                else f"{answered_id} is not pending ({list(suspended.pending_intent_ids)})",
            )
            return
        mismatch = _mismatch(work.key, intent, envelope, payload)
        if mismatch:
            refuse(dl.ANSWER_MISMATCH, mismatch)
            return
        answer = getattr(envelope, payload)
        ring = self._answer_keyrings[payload]
        if ring is not None:
            outcome = verify(answer, ring)
            if outcome is not Verification.VALID:
                refuse(
                    dl.BAD_ANSWER_SIGNATURE,
                    f"the {payload} for {answered_id} is {outcome.value} "
                    f"(key id {answer.signing_key_id!r})",
                )
                return
        if answer.intent_digest or ring is not None:
            want = content_digest(intent.SerializeToString(deterministic=True))
            if answer.intent_digest != want:
                refuse(
                    dl.ANSWER_FOR_OTHER_CONTENT,
                    f"the {payload} for {answered_id} was computed for content "
                    f"{answer.intent_digest.hex() or '(none)'}, the pending intent is "
                    f"{want.hex()}",
                )
                return
        recorded = self._copy(suspended)
        if stand_in is not None:
            recorded.answers.remove(stand_in)
        recorded.answers.append(envelope)
        if intent.tool_name == BUDGET_TOOL:
            self._budget_answered(work, recorded, envelope, now)
            return
        if intent.tool_name == ESCALATION_TOOL:
            if not envelope.approval.approved:
                # The human declined to keep waiting: resume now, the rest expired.
                self._expire_and_resume(work, recorded, now)
            else:
                work.commit(dataclasses.replace(work.state, continuation=recorded))
            return
        if _unanswered(recorded, work.state.pending):
            work.commit(dataclasses.replace(work.state, continuation=recorded))
            return
        self._resume(work, recorded, now)

    # -- activations ------------------------------------------------------------------------

    def _run(self, work: _Work, now: int, seq: int, call, resume_of=None) -> _Run:
        config = self._config
        state = work.state
        memory = Memory.from_blob(
            state.memory or MemoryBlob(), budget_bytes=config.memory_budget_bytes, now_ms=now
        )
        cache = ReplayCache.from_blob(
            state.cache or LlmCacheBlob(),
            max_entries=config.cache_max_entries,
            max_bytes=config.cache_max_bytes,
            max_response_bytes=config.cache_max_response_bytes,
            now_ms=now,
        )
        ctx = ActivationContext(
            entity_key=work.key,
            seq=seq,
            now_ms=now,
            memory=memory,
            cache=cache,
            llm_client=self._llm_client,
            adapter=self._agent.adapter,
            first_step=resume_of.step_index if resume_of is not None else 0,
            resume_of=resume_of,
            keyring=self._keyring,
            intent_ttl_ms=config.intent_ttl_ms,
            suspend_deadline_ms=config.suspend_deadline_ms,
            llm_concurrency=config.llm_concurrency,
            meter=BudgetMeter(config.budget or Budget(), state.cache),
        )
        ctx.trace_activation(
            TraceEvent.ACTIVATION_START,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": self._agent.adapter,
                "beam_agents.resume": "true" if resume_of is not None else "false",
            },
        )
        try:
            result = call(ctx)
            if not isinstance(result, Completion | Suspension):
                raise AgentContractError(
                    f"returned {type(result).__name__}, not a Completion or Suspension",
                    agent=self._agent.adapter,
                )
            if isinstance(result, Completion) and not isinstance(result.output, bytes):
                raise AgentContractError(
                    f"completed with {type(result.output).__name__}, not bytes",
                    agent=self._agent.adapter,
                )
            if isinstance(result, Suspension) and not isinstance(result.continuation, Continuation):
                raise AgentContractError(
                    f"suspended with a {type(result.continuation).__name__}, not a Continuation",
                    agent=self._agent.adapter,
                )
            # An adapter may replace ctx.memory (a function agent keeps its writes apart
            # until it completes): commit what the context holds at the end.
            # What nothing changed is the blob read (to_blob), or no cache at all.
            cache = ctx.cache.to_blob() if ctx.cache.changed else state.cache
            return _Run(ctx, result, memory=ctx.memory.to_blob(), cache=cache)
        except Exception as e:  # the agent's failure is a dead letter, never the bundle's
            return _Run(ctx, error=e)

    def _commit_run(self, work: _Work, run: _Run, now: int, *, marks, anchor, mailbox) -> None:
        """Commits a successful activation and emits its outputs; a completion that ends a
        suspension runs its mailbox next."""
        ctx, result, state = run.ctx, run.result, work.state
        work.count("activations")
        if isinstance(result, Suspension):
            suspended = self._copy(result.continuation)
            suspended.mailbox.extend(mailbox)
            ctx.trace_child(
                TraceEvent.SUSPENDED,
                "suspended",
                {
                    "beam_agents.pending": ",".join(suspended.pending_intent_ids),
                    "beam_agents.deadline_ms": str(suspended.deadline_ms),
                },
            )
        else:
            suspended = None
        ctx.trace_activation(
            TraceEvent.ACTIVATION_END,
            {"beam_agents.outcome": "suspended" if suspended is not None else "completed"},
        )
        # A blob the activation did not change is the one read: never stamped in place.
        memory = self._marked(run.memory, marks, anchor, owned=run.memory is not state.memory)
        cache = run.cache
        if cache is not None and cache is not state.cache:
            cache.state_schema_version = self._version
            # The key's usage, this activation's included (only a model call changes it, and
            # a model call changes the cache).
            ctx.meter.write(cache)
        work.commit(
            KeyState(
                seq=max(ctx.seq, state.seq or 0),
                memory=memory,
                cache=cache,
                continuation=suspended,
                pending=tuple(ctx.intents) if suspended is not None else (),
            )
        )
        for intent in ctx.intents:
            work.emit(INTENTS, intent)
        for trace in ctx.traces:
            work.emit(TRACES, trace)
        if suspended is None:
            work.emit(COMPLETIONS, result.output)
            if mailbox:
                self._drain(work, mailbox, anchor)

    def _failed(
        self,
        work: _Work,
        run: _Run,
        now: int,
        note: str = "",
        answers=(),
        reason: str = "",
        event: AgentEnvelope | None = None,
    ) -> None:
        """Dead-letters a failed activation (under `reason`, else the error's own) with one
        ERROR trace event."""
        ctx, error = run.ctx, run.error
        work.count("failed_activations")
        reason = reason or {
            BudgetExceededError: dl.BUDGET_EXCEEDED,
            CheckpointRejectedError: dl.CHECKPOINT_REJECTED,
            MemoryBudgetError: dl.MEMORY_BUDGET,
            AgentContractError: dl.AGENT_CONTRACT,
            LlmCallError: dl.LLM_FAILED,
        }.get(type(error), dl.AGENT_RAISED)
        ctx.traces.clear()
        ctx.trace_child(
            TraceEvent.ERROR,
            "error",
            {"error.type": type(error).__name__, "beam_agents.reason": reason},
        )
        detail = f"seq {ctx.seq}: {type(error).__name__}: {error}{note}"
        work.dead(reason, detail, now, answers=answers, input=event)
        for trace in ctx.traces:
            work.emit(TRACES, trace)

    def _resume(self, work: _Work, suspended: Continuation, now: int) -> None:
        """Resumes the agent with `suspended`'s answers (a new blob holding every answer
        accepted so far); a failure keeps them and schedules a retry."""
        answers = _ordered_answers(suspended, work.state.pending)
        run = self._run(
            work,
            now,
            suspended.seq,
            lambda ctx: self._agent.resume(ctx, answers),
            resume_of=suspended,
        )
        if run.error is None:
            self._commit_run(
                work, run, now, marks=(), anchor=work.anchor, mailbox=list(suspended.mailbox)
            )
            return
        if self._asks(run.error):
            self._ask_budget(work, run, now, suspended=suspended)
            return
        failures = suspended.resume_failures + 1
        limit = (
            self._config.retryable_resume_retries
            if _busy(run.error)
            else self._config.resume_retries
        )
        if failures > limit:
            self._failed(
                work,
                run,
                now,
                f"; the resume failed {failures} times, so the suspension on "
                f"{list(suspended.pending_intent_ids)} ended; its answers are in the record",
                answers=suspended.answers,
                reason=dl.RESUME_FAILED,
            )
            self._end_suspension(work, suspended)
            return
        retry = self._copy(suspended)
        retry.resume_failures = failures
        # From the later of the answer's time and the input's, so an answer stamped far behind
        # does not make its retries due at once.
        retry.retry_at_ms = _saturating_add(
            max(now, work.anchor), self._config.backoff_ms(failures)
        )
        self._failed(
            work,
            run,
            now,
            f"; the resume keeps its {len(suspended.answers)} answers and is tried again at "
            f"{retry.retry_at_ms} (retry {failures} of {limit})",
            answers=suspended.answers,
        )
        work.commit(dataclasses.replace(work.state, continuation=retry))

    def _end_suspension(self, work: _Work, suspended: Continuation) -> None:
        work.commit(dataclasses.replace(work.state, continuation=None, pending=()))
        self._drain(work, list(suspended.mailbox), work.anchor)

    # -- due times: retries and deadlines -----------------------------------------------------

    def _due(self, work: _Work, fired_ms: int) -> None:
        suspended = work.state.continuation
        if suspended is None:
            # Resolved already (runners may still fire a timer they were told to clear):
            # nothing to do, and nothing for anyone to act on.
            work.count("deadline_timers_after_resolution")
            return
        due = _ms(_due_at(suspended))
        if due != fired_ms:
            work.dead(
                dl.STALE_TIMER,
                f"a deadline timer at {fired_ms} found the suspension due at {due}; nothing "
                "changed",
                fired_ms,
            )
            return
        work.anchor = max(work.anchor, fired_ms)
        if suspended.retry_at_ms and not suspended.pending_intent_ids:
            self._retry_start(work, suspended, fired_ms)
        elif suspended.retry_at_ms:
            retry = self._copy(suspended)
            retry.retry_at_ms = 0
            self._resume(work, retry, fired_ms)
        else:
            self._deadline(work, suspended, fired_ms)

    def _deadline(self, work: _Work, suspended: Continuation, now: int) -> None:
        if _budget_asked(suspended, work.state.pending):
            self._budget_refused(work, suspended, now, "no one raised the budget by its deadline")
            return
        policy = self._config.deadline_policy
        unanswered = _unanswered(suspended, work.state.pending)
        if not unanswered:
            self._resume(work, self._copy(suspended), now)
        elif policy.action is AtDeadline.DEAD_LETTER:
            work.dead(
                dl.DEADLINE_EXCEEDED,
                f"no answer to {[i.intent_id for i in unanswered]} by {suspended.deadline_ms}",
                now,
                answers=suspended.answers,
            )
            self._end_suspension(work, suspended)
        elif policy.action is AtDeadline.ESCALATE and suspended.escalations < (
            policy.max_escalations
        ):
            self._escalate(work, suspended, unanswered, now)
        else:
            self._expire_and_resume(work, self._copy(suspended), now)

    def _expire_and_resume(self, work: _Work, suspended: Continuation, now: int) -> None:
        """Resumes the agent with EXPIRED results for its intents still unanswered
        (`suspended` is a new blob, changed here)."""
        for intent in _unanswered(suspended, work.state.pending):
            suspended.answers.append(
                AgentEnvelope(
                    entity_key=work.key,
                    event_time_ms=now,
                    tool_result=ToolResult(
                        intent_id=intent.intent_id,
                        entity_key=work.key,
                        seq=intent.seq,
                        status=ToolResult.EXPIRED,
                        error_message=f"no answer by {suspended.deadline_ms}",
                        completed_at_ms=now,
                    ),
                )
            )
        self._resume(work, suspended, now)

    # -- budgets ------------------------------------------------------------------------------

    def _asks(self, error: Exception | None) -> bool:
        budget = self._config.budget
        # Only a key's limits can be raised; an activation's or a missing price cannot.
        return (
            isinstance(error, BudgetExceededError)
            and error.scope.startswith("key")
            and budget is not None
            and budget.on_exceed is OnBudget.ASK
        )

    def _ask_budget(
        self,
        work: _Work,
        run: _Run,
        now: int,
        *,
        event=None,
        digests=(),
        anchor=0,
        suspended: Continuation | None = None,
    ) -> None:
        """Puts the budget before a person: an APPROVAL intent of BUDGET_TOOL, on which the key
        waits with its event first in the mailbox (a start) or with its answers (a resume)."""
        work.count("budget_asks")
        config = self._config
        seq = suspended.seq if suspended is not None else run.ctx.seq
        # Numbered by the raises granted so far (kept in the key's cache blob): each question
        # of the key has an id of its own, whatever ran or waited in between.
        grants = work.state.cache.budget_grants if work.state.cache is not None else 0
        ctx = ActivationContext(
            entity_key=work.key,
            seq=seq,
            now_ms=now,
            memory=Memory(),
            cache=ReplayCache(),
            llm_client=None,
            adapter=self._agent.adapter,
            # Steps no agent reaches, so the question never shares an id with an intent of
            # the activation it holds up.
            first_step=_BUDGET_STEP + grants,
            resume_of=suspended,
            keyring=self._keyring,
            intent_ttl_ms=config.suspend_deadline_ms,
        )
        (question,) = ctx.escalate(
            "The agent's next model call would pass its budget; approve to raise the key's "
            "limits and let it go on, decline to end it.",
            tool=BUDGET_TOOL,
            reason=str(run.error),
            raise_tokens=config.budget.raise_tokens,
            raise_cost_micros=config.budget.raise_cost_micros,
        )
        deadline = _saturating_add(now, config.suspend_deadline_ms)
        if suspended is None:
            waiting = new_state_blob(
                Continuation,
                seq=seq,
                adapter=self._agent.adapter,
                suspended_at_ms=now,
                deadline_ms=deadline,
                mailbox=[event],
            )
            waiting.state_schema_version = self._version
            memory = self._marked(work.state.memory, digests, anchor, owned=False)
            pending = (question,)
        else:
            waiting = self._copy(suspended)
            waiting.deadline_ms = max(waiting.deadline_ms, deadline)
            waiting.retry_at_ms = 0
            memory = work.state.memory
            pending = (*work.state.pending, question)
        waiting.pending_intent_ids.append(question.intent_id)
        work.commit(
            dataclasses.replace(work.state, memory=memory, continuation=waiting, pending=pending)
        )
        work.emit(INTENTS, question)
        for trace in ctx.traces:
            work.emit(TRACES, trace)

    def _budget_answered(self, work: _Work, recorded: Continuation, envelope, now: int) -> None:
        """A person's answer on a budget: approved, the key's limits rise and the activation
        it held up runs again; declined, it ends as `budget_exceeded`."""
        if not envelope.approval.approved:
            self._budget_refused(
                work, recorded, now, f"{envelope.approval.approver} declined to raise it"
            )
            return
        meter = BudgetMeter(self._config.budget or Budget(), work.state.cache)
        meter.grant()
        cache = (
            self._copy(work.state.cache)
            if work.state.cache is not None
            else new_state_blob(LlmCacheBlob)
        )
        cache.state_schema_version = self._version
        meter.write(cache)
        work.commit(dataclasses.replace(work.state, cache=cache))
        if _holds_a_start(recorded, work.state.pending):
            self._retry_start(work, recorded, now)
        else:
            self._resume(work, recorded, now)

    def _budget_refused(self, work: _Work, suspended: Continuation, now: int, why: str) -> None:
        start = _holds_a_start(suspended, work.state.pending)
        work.dead(
            dl.BUDGET_EXCEEDED,
            f"seq {suspended.seq}: {why}; the "
            + ("event is in the record" if start else "answers are in the record"),
            now,
            input=suspended.mailbox[0] if start else None,
            answers=() if start else suspended.answers,
        )
        if start:
            rest = self._copy(suspended)
            del rest.mailbox[0]
            self._end_suspension(work, rest)
        else:
            self._end_suspension(work, suspended)

    def _escalate(self, work: _Work, suspended: Continuation, unanswered, now: int) -> None:
        ctx = ActivationContext(
            entity_key=work.key,
            seq=suspended.seq,
            now_ms=now,
            memory=Memory(),
            cache=ReplayCache(),
            llm_client=None,
            adapter=self._agent.adapter,
            first_step=suspended.step_index,
            resume_of=suspended,
            keyring=self._keyring,
            intent_ttl_ms=self._config.deadline_policy.extension_ms,
        )
        (escalation,) = ctx.escalate(
            "These intents got no answer by their deadline; approve to keep waiting, decline "
            "to let the agent go on without them.",
            unanswered=[i.intent_id for i in unanswered],
            deadline_ms=suspended.deadline_ms,
        )
        escalated = self._copy(suspended)
        escalated.escalations += 1
        escalated.step_index = ctx.next_step
        escalated.pending_intent_ids.append(escalation.intent_id)
        escalated.deadline_ms = _saturating_add(now, self._config.deadline_policy.extension_ms)
        work.commit(
            dataclasses.replace(
                work.state, continuation=escalated, pending=(*work.state.pending, escalation)
            )
        )
        work.emit(INTENTS, escalation)
        for trace in ctx.traces:
            work.emit(TRACES, trace)

    # -- export -------------------------------------------------------------------------------

    def _snapshot(self, key: bytes, stored: KeyState, envelope: AgentEnvelope) -> StateSnapshot:
        """The committed blobs, verbatim (export never migrates); a key with no seq exports
        none (0), so a restore keeps the time-based first seq."""
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


#: The runtime's own questions to people: their answers go to the runtime, never the agent.
_RUNTIME_TOOLS = frozenset({ESCALATION_TOOL, BUDGET_TOOL})
#: The first step of the runtime's budget questions (uint32, beyond any agent's steps).
_BUDGET_STEP = 2**31


def _budget_asked(suspended: Continuation, pending) -> bool:
    """A budget question is pending with no answer."""
    answered = {_answered_id(a) for a in suspended.answers}
    return any(i.tool_name == BUDGET_TOOL and i.intent_id not in answered for i in pending)


def _holds_a_start(suspended: Continuation, pending) -> bool:
    """The suspension holds up a start (its event first in the mailbox), not a resume: it
    waits on no intent of the agent's."""
    return bool(suspended.mailbox) and all(i.tool_name in _RUNTIME_TOOLS for i in pending)


def _busy(error: Exception) -> bool:
    """A model that stayed busy or unreachable past its client's own retries."""
    return isinstance(error, LlmCallError) and error.retryable


def _due_at(suspended: Continuation) -> int:
    """When a suspension's timer is due: its retry, else its deadline."""
    return suspended.retry_at_ms or suspended.deadline_ms


def _ms(at_ms: int) -> int:
    # Portable runners keep timers to the millisecond, clamped into the global window.
    return timer_timestamp(at_ms).micros // 1000


def _saturating_add(a: int, b: int) -> int:
    return min(a + b, _INT64_MAX)


def _next_seq(stored: int | None, now_ms: int) -> int:
    # A key with no seq starts at its first event's time in microsecond steps, so a key that
    # starts over in a new job (no state restored) does not re-issue the ids of an earlier one.
    # Never 0: an exported seq of 0 means "none".
    if stored is not None:
        return stored + 1
    return max(1, min(now_ms, _INT64_MAX // _SEQ_PER_MS - 1) * _SEQ_PER_MS)


def _answered_id(envelope: AgentEnvelope) -> str:
    if envelope.WhichOneof("payload") == "approval":
        return envelope.approval.intent_id
    return envelope.tool_result.intent_id


def _made_here(answer: AgentEnvelope) -> bool:
    """An EXPIRED result `_expire_and_resume` made (unsigned, bound to no content)."""
    result = answer.tool_result
    return (
        answer.WhichOneof("payload") == "tool_result"
        and result.status == ToolResult.EXPIRED
        and not result.signature
        and not result.intent_digest
    )


def _same_answer(envelope: AgentEnvelope, answers, answered_id: str) -> bool:
    payload = envelope.WhichOneof("payload")
    for recorded in answers:
        if _answered_id(recorded) == answered_id:
            return recorded.WhichOneof("payload") == payload and getattr(
                recorded, payload
            ) == getattr(envelope, payload)
    return False


def _mismatch(key: bytes, intent: ToolIntent, envelope: AgentEnvelope, payload: str) -> str:
    approval = intent.kind == ToolIntent.APPROVAL
    if approval != (payload == "approval"):
        want = "an approval" if approval else "a tool result"
        return f"{intent.intent_id} ({intent.tool_name}) wants {want}, got a {payload}"
    if payload == "tool_result" and envelope.tool_result.entity_key not in (b"", key):
        return f"the result of {intent.intent_id} names another entity"
    return ""


def _unanswered(suspended: Continuation, pending: Iterable[ToolIntent]) -> list[ToolIntent]:
    """The agent's own pending intents (not the runtime's escalations) with no answer yet, in
    the Continuation's intent order."""
    answered = {_answered_id(a) for a in suspended.answers}
    by_id = {i.intent_id: i for i in pending}
    return [
        by_id[i]
        for i in suspended.pending_intent_ids
        if i not in answered and i in by_id and by_id[i].tool_name not in _RUNTIME_TOOLS
    ]


def _ordered_answers(suspended: Continuation, pending: Iterable[ToolIntent]) -> list[Answer]:
    """The answers to the agent's own intents (escalations are the runtime's), in the
    Continuation's intent order: never the order a bag, an export or a restore returns."""
    by_id = {_answered_id(a): a for a in suspended.answers}
    intents = {i.intent_id: i for i in pending}
    return [
        Answer.from_envelope(intents[i], by_id[i])
        for i in suspended.pending_intent_ids
        if i in by_id and i in intents and intents[i].tool_name not in _RUNTIME_TOOLS
    ]
