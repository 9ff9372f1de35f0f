"""External events, for `machine.KeyMachine`: intake, dedupe, the mailbox and starts.

An accepted event is marked in the key's MemoryBlob (`event_marks`: 24-byte marks, the time
and a 16-byte digest of the event's time and bytes, and of a transport's idempotency key,
`event_digests`), so a copy within `dedupe_window_ms` does nothing; the marks are cut to the
window and to `dedupe_max_events` as new ones are added (`_marked`, which also moves the
key's activity high-water mark that the TTL counts from). Marks are whole and in time order:
a snapshot whose marks are not is refused (`marks_problem`), and marks an older binary
restored so are made whole on an event's read, once, with an `invalid_state` dead letter
(`_whole_marks`).

Two clocks, each moved by one input only so far, since an event's time is its sender's word.
The dedupe clock (the latest mark's time, which the window counts back from) moves by at most
`max_clock_skew_ms` an input. A mark's time is the key's, not its sender's: the time the key
accepted the event on that clock. An event stamped behind the clock is marked at the clock; one
stamped beyond the bound is marked at the bound. Such an input (or the first that finds marks
at no time, 0, or none) says that its own clock or the key's is wrong, and the key cannot tell
which: an event ten years ahead, or a first event stamped 0 (or far behind) followed by events
stamped now, which then all look far ahead. So it cuts no mark by time, and the marks it keeps
are taken as made at the clock it moves to. Marked at its own stamp, a first event stamped 0
fell out of the window as soon as later events moved the clock on from 0 a step each, and its
copy ran again under a new seq (a tool effect twice). Only an input within the bound moves the
clock as it says and cuts the marks the window has passed. So a copy of any accepted event
does nothing until the clock has moved `dedupe_window_ms` past its mark by inputs within the
bound; a key whose inputs keep disagreeing with its clock keeps its marks longer than the
window, `dedupe_max_events` at most.

The key's activity mark (the TTL's anchor) and an activation's "now" move by at most `ttl_ms`
(`_on_clock`): a key idle that long is wiped, so only a wrong clock is further ahead, and one
cannot pin the TTL or its suspension's deadline far ahead; a key with no activity mark takes
the time as it is. Such an event is clamped, not refused: its content is the sender's, only its
clock is wrong, and a dead letter would drop a real request. An event taken in earlier (queued,
or deferred) runs no earlier than the time it is drained or retried, so its intents are not
born expired, and no later than the key's mark; its own time stays in its mark's digest, its
first seq, its dead letter and its activation's trace.

`Intake`, a mixin of KeyMachine, owns what happens to an event: a duplicate is counted and
dropped; for a suspended key it waits in the Continuation's mailbox (bounded in events and
bytes, else a `mailbox_full` dead letter); otherwise it starts an activation at the key's
next seq (`_start`). A start whose model stays busy past its client's retries is deferred: the
key waits on its deadline timer with the event first in its mailbox (`_defer`,
`_retry_start`). A start that fails for good moves the key past its seq (`_end_start`). When
a suspension ends, its mailbox runs in event-time order until one suspends again (`_drain`).
Activations themselves are `machine_activations`'.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import struct
from collections.abc import Iterable

from beam_agents._protos import AgentEnvelope, Continuation, MemoryBlob
from beam_agents.runtime import dead_letters as dl
from beam_agents.runtime.machine_activations import model_busy
from beam_agents.runtime.machine_state import (
    INT64_MAX,
    KeyState,
    Work,
    due_at,
    retry_at,
    saturating_add,
)
from beam_agents.state.memory import calls_dropped
from beam_agents.state.migration import new_state_blob

__all__ = ["Intake", "event_digests", "first_seq", "marks_problem"]

_SEQ_PER_MS = 1000
#: The largest first seq of a key (its first event's time, clamped), so the largest seq a key
#: can reach but for one activation after another past it.
MAX_FIRST_SEQ = (INT64_MAX // _SEQ_PER_MS - 1) * _SEQ_PER_MS


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


def marks_problem(marks: bytes) -> str:
    """What is wrong with `marks` as this runtime writes them (whole marks, in time order),
    or "" when nothing is."""
    if len(marks) % _MARK:
        return f"are {len(marks)} bytes, not whole {_MARK}-byte marks"
    times = [_TIME.unpack_from(marks, at)[0] for at in range(0, len(marks), _MARK)]
    if any(later < earlier for earlier, later in itertools.pairwise(times)):
        return "are not in time order"
    return ""


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


class Intake:
    """KeyMachine's external events: dedupe, mailbox, starts; see the module docstring."""

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
        blob.state_schema_version = self._version
        before = blob.last_activity_ms
        latest = max(before, now)
        blob.last_activity_ms = latest
        marks = blob.event_marks
        if digests or marks:
            config = self._config
            # The dedupe clock (the latest mark's time) moves by at most max_clock_skew_ms an
            # input; marks at no time (0 or less) give no clock: the activity mark's, if any.
            last = len(marks) - _MARK
            stamped = _TIME.unpack_from(marks, last)[0] if last >= 0 else 0
            clock = stamped if stamped > 0 else (before if before > 0 else latest)
            bound = clock + config.max_clock_skew_ms
            at = max(clock, min(now, bound))
            stamp = _TIME.pack(at)
            added = b"".join([stamp + digest for digest in digests])
            # The new marks are the latest, so the window and the cap cut only old ones (or,
            # with a cap below the new marks, some of those); one copy of what stays.
            start = max(0, len(marks) + len(added) - config.dedupe_max_events * _MARK)
            # An input past the bound (or a key with no clock) says the key's clock or the
            # input's is wrong, and which is unknown: it cuts no mark by time, and a mark it
            # keeps is taken as made at the clock it moves to, never older than that.
            trusted = stamped > 0 and now <= bound
            if trusted:
                start = max(start, _first_after(marks, at - config.dedupe_window_ms))
            if start or added:
                if start > len(marks):
                    blob.event_marks = added[start - len(marks) :]
                elif trusted or not added:
                    blob.event_marks = b"".join((memoryview(marks)[start:], added))
                else:
                    kept = range(start + 8, len(marks), _MARK)
                    blob.event_marks = b"".join([stamp + marks[d : d + _DIGEST] for d in kept])
                    blob.event_marks += added
        return blob

    def _on_clock(self, state: KeyState, at: int, *, taken_in: bool = False) -> int:
        """`at` as the key's clock takes it: no more than ttl_ms past the key's activity mark,
        or its suspension's due time when later (no later than the mark for an event the key
        `taken_in` already, when it queued). A key idle that long is wiped, so no genuine input
        is further ahead of a key that still has state; one stamped further is handled at that
        bound (clamped, not refused: its sender's clock is wrong, not its content), so it can
        neither pin the TTL nor its activation's deadlines. A key with no mark yet (a first
        event) takes `at` as it is."""
        clock = state.memory.last_activity_ms if state.memory is not None else 0
        if clock <= 0:
            return at
        if taken_in:
            return min(at, clock)
        if state.continuation is not None:
            clock = max(clock, due_at(state.continuation))
        return min(at, saturating_add(clock, self._config.ttl_ms))

    # -- external events --------------------------------------------------------------------

    def _external(
        self,
        work: Work,
        envelope: AgentEnvelope,
        idempotency_key: bytes,
        taken_in_ms: int | None = None,
        deferred: int = 0,
    ) -> None:
        now = envelope.event_time_ms
        state = work.state
        digests = event_digests(envelope, idempotency_key)
        marks = state.memory.event_marks if state.memory is not None else b""
        problem = marks_problem(marks)
        if problem:
            state = self._whole_marks(work, problem, now)
            marks = state.memory.event_marks
        if any(_seen(marks, d) for d in digests):
            work.count("duplicate_events")
            return
        suspended = state.continuation
        if suspended is None:
            self._start(work, envelope, digests, since=taken_in_ms, failures=deferred)
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

    def _whole_marks(self, work: Work, problem: str, now: int) -> KeyState:
        """Stored marks that are not whole marks in time order (a restore by a binary that did
        not check them): the whole ones, in time order, committed once, with a dead letter
        saying what was lost. Left as they were, every mark added after a torn one would sit
        where no digest is looked for: the key's dedupe off for good, silently."""
        repaired = self._copy(work.state.memory)
        marks = repaired.event_marks
        whole = sorted(
            (marks[at : at + _MARK] for at in range(0, len(marks) - _MARK + 1, _MARK)),
            key=lambda mark: _TIME.unpack_from(mark)[0],
        )
        repaired.event_marks = b"".join(whole)
        torn = len(marks) % _MARK
        work.dead(
            dl.INVALID_STATE,
            f"the key's stored event_marks {problem}; kept the {len(whole)} whole marks in time "
            "order"
            + (
                f", dropped the {torn} bytes after them: a copy of an event whose mark they "
                "held runs again"
                if torn
                else ""
            ),
            now,
        )
        state = dataclasses.replace(work.state, memory=repaired)
        work.commit(state, activity=False)
        return state

    def _start(
        self,
        work: Work,
        envelope: AgentEnvelope,
        digests,
        *,
        since: int | None = None,
        failures: int = 0,
        waited: Continuation | None = None,
    ) -> None:
        """Starts the agent on `envelope` at its own time on the key's clock; an event taken
        in earlier (queued in a mailbox, `since` the time it is drained or retried) runs no
        earlier than then, or the intents it emits could be born expired. Its own time still
        makes its mark and names its seq, and its dead letter carries it."""
        state = work.state
        own = envelope.event_time_ms
        now = self._on_clock(state, own, taken_in=since is not None)
        if since is not None:
            now = max(since, now)
        if state.seq is not None and state.seq >= INT64_MAX:
            # Every seq is issued (a key that began near the end of time, then ran on): another
            # would overflow int64 or issue an intent id again.
            work.dead(
                dl.SEQ_EXHAUSTED,
                f"the key's seq is {state.seq}, the last there is: it starts no activation",
                now,
                input=envelope,
            )
            return
        anchor = max(work.anchor, now)
        seq = _next_seq(state.seq, own)
        run = self._run(
            work,
            now,
            seq,
            lambda ctx: self._agent.start(ctx, envelope.external_event),
            event=envelope,
            waited=waited,
        )
        if run.error is None:
            self._commit_run(work, run, now, marks=digests, anchor=anchor, mailbox=())
        elif model_busy(run.error) and failures < self._config.retryable_resume_retries:
            self._defer(work, envelope, digests, anchor, failures + 1, waited)
            self._keep_paid(work, run, ended=False)
        elif self._asks(run.error):
            self._ask_budget(
                work, run, now, event=envelope, digests=digests, anchor=anchor, deferred=failures
            )
            self._keep_paid(work, run, ended=False)
        else:
            # Ended for good, whatever this attempt paid: an earlier one may have kept answers.
            self._keep_paid(work, run, ended=True)
            # The record carries the event: one drained from a mailbox was marked as seen, so
            # nothing else holds it.
            self._failed(work, run, now, event=envelope)

    def _end_start(self, work: Work, seq: int) -> None:
        """A start failed for good: the key moves past its seq, so no later event's start can
        replay an answer its attempts paid for. Every call its cache holds is then dead (a
        start runs only when no suspension could replay one), so they are dropped, on a key
        no older binary reads. Its memory and TTL stay as they are."""
        state = work.state
        cache = state.cache
        if cache is not None and cache.entries and not self._readable_by_older(work):
            cache = calls_dropped(cache)
            cache.state_schema_version = self._version
        # A snapshot restored while the start waited on a budget question may have moved the
        # key past it: the seq never goes back, or a later start would issue its ids again.
        seq = max(seq, state.seq or 0)
        work.commit(dataclasses.replace(state, seq=seq, cache=cache), activity=False)

    def _defer(
        self,
        work: Work,
        envelope: AgentEnvelope,
        digests,
        anchor: int,
        failures: int,
        waited: Continuation | None,
    ):
        """A start whose model stayed busy past its client's retries: the key waits on its
        deadline timer, the event first in its mailbox (events after it queue behind), and
        the start is tried again with backoff. Nothing else changes, so the retry runs the
        same seq and emits the same ids, and records the raises it `waited` on and the
        attempts they held."""
        work.count("deferred_activations")
        due = retry_at(anchor, self._config.backoff_ms(failures))
        deferred = new_state_blob(
            Continuation,
            adapter=self._agent.adapter,
            suspended_at_ms=envelope.event_time_ms,
            deadline_ms=due,
            retry_at_ms=due,
            resume_failures=failures,
            mailbox=[envelope],
            answers=waited.answers if waited is not None else (),
            held_attempts=waited.held_attempts if waited is not None else 0,
            held_calls=waited.held_calls if waited is not None else (),
            held_failures=waited.held_failures if waited is not None else (),
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

    def _retry_start(self, work: Work, deferred: Continuation, fired_ms: int) -> None:
        """The deferred start is due (or a budget raise it waited on was granted): its event
        runs again, then the events queued after it. The answers it waited on (the raises)
        go in its record."""
        first, *rest = deferred.mailbox
        work.commit(dataclasses.replace(work.state, continuation=None, pending=()))
        self._start(
            work,
            first,
            (),
            since=max(work.anchor, fired_ms),
            failures=deferred.resume_failures,
            waited=deferred,
        )
        suspended = work.state.continuation
        if suspended is None:
            self._drain(work, rest, work.anchor)
        elif rest:
            waiting = self._copy(suspended)
            waiting.mailbox.extend(rest)
            work.commit(dataclasses.replace(work.state, continuation=waiting))

    def _drain(self, work: Work, mailbox, anchor: int) -> None:
        """Runs the events queued during a suspension that just ended, in event-time order,
        until one suspends again; the rest wait in its mailbox. They were marked as seen when
        they were queued, and each runs no earlier than `anchor`, the time the suspension
        ended."""
        queued = sorted(mailbox, key=lambda e: e.event_time_ms)
        while queued:
            envelope = queued.pop(0)
            self._start(work, envelope, (), since=anchor)
            suspended = work.state.continuation
            if suspended is not None:
                rest = self._copy(suspended)
                rest.mailbox.extend(queued)
                work.commit(dataclasses.replace(work.state, continuation=rest))
                return


def _next_seq(stored: int | None, now_ms: int) -> int:
    return first_seq(now_ms) if stored is None else stored + 1


def first_seq(event_time_ms: int) -> int:
    """The seq of a key's first activation, started by an event of `event_time_ms`: that time
    in microsecond steps, so a key that starts over in a new job (no state restored) does not
    re-issue the ids of an earlier one. Never 0: an exported seq of 0 means "none"."""
    return max(1, min(event_time_ms * _SEQ_PER_MS, MAX_FIRST_SEQ))
