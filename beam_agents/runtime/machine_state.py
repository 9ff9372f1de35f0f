"""A key's state and its commit, for `machine.KeyMachine` (the design is in its docstring).

`KeyState` is a key's state as stored, each blob at whatever version wrote it, never mutated;
`Effects` is what one input produces (outputs, counters, and the whole new state with its
timers, or nothing to write); `Work` holds one input's effects as they accumulate, so chained
activations (a resume, then the mailbox) each see the state the one before committed.

`Commits`, a mixin of KeyMachine, owns the state's way in and out: every decision reads blobs
through migration (`_current`), a change is made on a new blob stamped with the current version
(`_copy`, never the blob read: a portable harness hands back the object an earlier write
stored), and `_finish` turns a Work into Effects, the deadline timer at the suspension's due
time and the TTL from the key's latest activity (`_ttl_at`). It reads KeyMachine's `_config`,
`_registry` and `_version`.

This module imports none of the machine's others; they all build on it.
"""

from __future__ import annotations

import dataclasses

from beam_agents._protos import Continuation, LlmCacheBlob, MemoryBlob, ToolIntent
from beam_agents.runtime import dead_letters as dl
from beam_agents.state.migration import migrate_to_current
from beam_agents.wire.beam_support import timer_timestamp

__all__ = [
    "COMPLETIONS",
    "COUNTERS",
    "ERRORS",
    "INT64_MAX",
    "INTENTS",
    "SNAPSHOTS",
    "TRACES",
    "Commits",
    "Effects",
    "KeyState",
    "Work",
    "due_at",
    "past_every_expiry",
    "retry_at",
    "saturating_add",
    "timer_ms",
]

COMPLETIONS = "completions"
INTENTS = "intents"
TRACES = "traces"
ERRORS = "errors"
SNAPSHOTS = "snapshots"

INT64_MAX = 2**63 - 1

#: Every counter the machine counts (`Work.count`), under RunAgent's metrics namespace: the one
#: list the DoFn declares its metrics from, so no count can name a metric it lacks (a test reads
#: every `count(...)` in the runtime's source against it).
COUNTERS = (
    "activations",
    "failed_activations",
    "duplicate_answers",
    "duplicate_events",
    "queued_events",
    "deferred_activations",
    "stale_ttl_timers",
    "deadline_timers_after_resolution",
    "stale_deadline_timers",
    "budget_asks",
)


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
    and `ttl_at` the TTL timer's (None: clear it), unless `keep_ttl` leaves that timer as it
    is."""

    outputs: list[tuple[str, tuple[bytes, object]]] = dataclasses.field(default_factory=list)
    state: KeyState | None = None
    deadline_at: int | None = None
    ttl_at: int | None = None
    keep_ttl: bool = False
    #: Names of the counters to increment, once per occurrence.
    counters: list[str] = dataclasses.field(default_factory=list)


class Work:
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
        #: Whether a commit was the key's activity, which the TTL counts from; the seq and dead
        #: calls of a start that failed for good are not (`Intake._end_start`).
        self.active = False
        self.effects = Effects()
        #: The latest event or arrival time this input brought: the TTL counts from it.
        self.anchor = 0

    def commit(self, state: KeyState, *, activity: bool = True) -> None:
        self.state = state
        self.changed = True
        self.active = self.active or activity

    def emit(self, tag: str, value) -> None:
        self.effects.outputs.append((tag, (self.key, value)))

    def dead(self, reason: str, detail: str, now: int, **fields) -> None:
        self.emit(ERRORS, dl.error_record(self.key, reason, detail, now, **fields))

    def dead_suspension(
        self, reason: str, suspended, now: int, *, detail: str, queued: str
    ) -> None:
        """Dead-letters an ended suspension: its answers in one record (`detail`), each event
        its mailbox held in one of its own (`queued`)."""
        self.dead(reason, detail, now, answers=suspended.answers)
        for envelope in suspended.mailbox:
            self.dead(reason, queued, now, input=envelope)

    def count(self, name: str) -> None:
        """Counts one occurrence of `name`, one of COUNTERS."""
        self.effects.counters.append(name)


class Commits:
    """KeyMachine's reads and commits of a key's state; see the module docstring."""

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

    def _finish(self, work: Work, continuation: Continuation | None = None) -> Effects:
        """Effects of `work`; `continuation` is the migrated view of a restored one."""
        effects = work.effects
        if work.changed:
            state = work.state
            suspended = continuation if continuation is not None else state.continuation
            effects.deadline_at = None if suspended is None else due_at(suspended)
            if work.active:
                effects.ttl_at = (
                    None if state.empty else self._ttl_at(state.memory, suspended, work.anchor)
                )
            else:
                # Only activity sets the TTL: a commit of none (a start that failed for good)
                # leaves the timer the key's last activity set, which may count from an input
                # that did not move the memory's mark.
                effects.keep_ttl = True
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

    def _readable_by_older(self, work: Work) -> bool:
        """Whether the key, as this input has left it so far, is one a binary of an older
        schema version still reads: it holds a blob such a binary wrote (one no commit
        replaced, which `_finish` writes back as read) and none of this version's."""
        older = False
        for now, read, stored in (
            (work.state.memory, work.current.memory, work.stored.memory),
            (work.state.cache, work.current.cache, work.stored.cache),
            (work.state.continuation, work.current.continuation, work.stored.continuation),
        ):
            blob = stored if now is read else now
            if blob is not None:
                if blob.state_schema_version == self._version:
                    return False
                older = True
        return older

    def _ttl_at(
        self, memory: MemoryBlob | None, suspended: Continuation | None, anchor: int
    ) -> int:
        latest = max(anchor, memory.last_activity_ms if memory is not None else 0)
        if suspended is not None:
            latest = max(latest, due_at(suspended))
        return saturating_add(latest, self._config.ttl_ms)


def due_at(suspended: Continuation) -> int:
    """When a suspension's timer is due: its retry, else its deadline."""
    return suspended.retry_at_ms or suspended.deadline_ms


def retry_at(after_ms: int, backoff_ms: int) -> int:
    """A failed attempt's Continuation.retry_at_ms: `backoff_ms` after `after_ms`, and never
    0, which says no retry is due (an event at time 0 retried without backoff)."""
    return max(saturating_add(after_ms, backoff_ms), 1)


def past_every_expiry(deadline_ms: int, intents) -> int:
    """`deadline_ms`, or the latest expires_at_ms of `intents` when that is later: until then
    the effector may still run one, and a deadline must not tell the agent it failed."""
    return max([deadline_ms, *(intent.expires_at_ms for intent in intents)])


def timer_ms(at_ms: int) -> int:
    # Portable runners keep timers to the millisecond, clamped into the global window.
    return timer_timestamp(at_ms).micros // 1000


def saturating_add(a: int, b: int) -> int:
    return min(a + b, INT64_MAX)
