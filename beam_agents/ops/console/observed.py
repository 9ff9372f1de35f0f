"""What the agent viewer shows, as read from the loop's topics: each key's latest StateSnapshot,
its activations' TraceEvents and completed outputs, and the dead letters of the loop.

A StateSnapshot carries no signature, and anyone who can write to the snapshots topic can
write one. So a snapshot is trusted only as the answer to an export request this console sent
(`expect_snapshot`, recorded before it is produced): its request_id (128 random bits) and key
match the request's, and it is timed by the request's time on this console's clock, never by
the snapshot_at_ms it claims. Only a trusted snapshot decides anything (the inbox's
suspension deadline) and a key keeps its latest trusted one; a snapshot of anyone's (another
tool's export, a forgery) is shown, marked as unverified, only while the key has no trusted
one, and the next one received replaces it, so none is shown for good whatever times it
claims. A request is answered within `EXPORT_ANSWER_MS` or its answer is anyone's.

Records are stored by content (a TraceEvent or dead letter read twice, after a restart or from
a second console, is one row), so reading a topic again from its start is harmless. Every list
is paged in SQL (`offset`, `limit`) and returns its total, so large topics never load whole.

Times. The times a record claims (a TraceEvent's start_ms, a dead letter's event_time_ms, a
completion's record timestamp) are anyone's: a forged one from year 146,000,000 would stay the
"latest" for good. So every record is also stamped with when this console received it, on its
own clock, and is ordered by its claimed time clamped to that (`_at`): a real record's claim is
never later than its receipt, a forged far-future one counts as received (and among traces
received at once, one claiming a time past `MAX_CLOCK_SKEW_MS` ahead sorts last). A row kept
before receipt times were recorded (received_at_ms 0, db.py) is timed by its claim.

Size. One trace is anyone's to fill (its id is in every event and intent of it): a trace is read
and drawn up to `MAX_TRACE_EVENTS` events, the first received, and the page says how many more
were not drawn (`Activation.omitted`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from google.protobuf.message import DecodeError

from beam_agents._protos import ActivationErrorRecord, StateSnapshot, TraceEvent
from beam_agents.bus import decode_dead_letter
from beam_agents.intents.effector import wall_clock_ms
from beam_agents.ops.console.db import Database

__all__ = [
    "EXPORT_ANSWER_MS",
    "MAX_CLOCK_SKEW_MS",
    "MAX_TRACE_EVENTS",
    "Activation",
    "Observations",
]

#: How long after an export request its answer is trusted; requests older are forgotten.
EXPORT_ANSWER_MS = 24 * 60 * 60 * 1000
#: Most events of one trace read and drawn (the first received): an activation of the runtime
#: writes a few per agent step, and five timelines of this many events are about 0.7 MB of a
#: page refreshed every few seconds.
MAX_TRACE_EVENTS = 200
#: How far ahead of this console's clock a writer's clock may be (the runtime's default
#: max_clock_skew_ms): a trace claiming a time further ahead sorts after those received with it.
MAX_CLOCK_SKEW_MS = 60 * 60 * 1000


def _at(claimed: str) -> str:
    """SQL for a row's time: its `claimed` column, never later than its receipt (module
    docstring)."""
    return f"min({claimed}, CASE received_at_ms WHEN 0 THEN {claimed} ELSE received_at_ms END)"


@dataclasses.dataclass(frozen=True)
class Activation:
    """The TraceEvents of one trace (one activation and its resumes) of a key."""

    trace_id: bytes
    #: In start order; at most MAX_TRACE_EVENTS, the first received.
    events: list[TraceEvent]
    #: How many more events of the trace were received and are not drawn.
    omitted: int = 0

    @property
    def start_ms(self) -> int:
        return min(e.start_ms for e in self.events)


class Observations:
    def __init__(self, db: Database, *, clock: Callable[[], int] = wall_clock_ms) -> None:
        self._db = db
        self._clock = clock

    def _seen(self, db, key: bytes) -> None:
        db.execute("INSERT OR REPLACE INTO keys VALUES (?, ?)", (key, self._clock()))

    def expect_snapshot(self, key: bytes, request_id: str, at_ms: int) -> None:
        """Records an export request this console is about to send (`at_ms`: its event time)."""
        with self._db.transaction() as db:
            db.execute(
                "DELETE FROM export_requests WHERE requested_at_ms < ?",
                (self._clock() - EXPORT_ANSWER_MS,),
            )
            db.execute("INSERT INTO export_requests VALUES (?, ?, ?)", (request_id, key, at_ms))

    def add_snapshot(self, data: bytes) -> StateSnapshot | None:
        """Keeps the snapshot when it is the key's latest trusted one, or when the key has no
        trusted one (module docstring)."""
        try:
            snapshot = StateSnapshot.FromString(data)
        except DecodeError:
            return None
        key = snapshot.entity_key
        with self._db.transaction() as db:
            request = db.execute(
                "SELECT requested_at_ms FROM export_requests WHERE request_id = ? "
                "AND entity_key = ? AND requested_at_ms >= ?",
                (snapshot.request_id, key, self._clock() - EXPORT_ANSWER_MS),
            ).fetchone()
            db.execute(
                # An untrusted one replaces only an untrusted one, whatever time it claims.
                "INSERT INTO snapshots (entity_key, snapshot_at_ms, snapshot, trusted) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (entity_key) DO UPDATE SET "
                "snapshot_at_ms = excluded.snapshot_at_ms, snapshot = excluded.snapshot, "
                "trusted = excluded.trusted WHERE snapshots.trusted = 0 OR "
                "(excluded.trusted = 1 AND excluded.snapshot_at_ms >= snapshots.snapshot_at_ms)",
                (key, request[0] if request else 0, bytes(data), int(request is not None)),
            )
            self._seen(db, key)
        return snapshot

    def add_trace(self, data: bytes) -> TraceEvent | None:
        try:
            event = TraceEvent.FromString(data)
        except DecodeError:
            return None
        with self._db.transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO traces (entity_key, trace_id, start_ms, event, "
                "received_at_ms) VALUES (?, ?, ?, ?, ?)",
                (event.entity_key, event.trace_id, event.start_ms, bytes(data), self._clock()),
            )
            self._seen(db, event.entity_key)
        return event

    def add_dead_letter(self, data: bytes) -> ActivationErrorRecord | None:
        try:
            record = decode_dead_letter(data)
        except DecodeError:
            return None
        with self._db.transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO dead_letters (entity_key, reason, event_time_ms, record, "
                "received_at_ms) VALUES (?, ?, ?, ?, ?)",
                (
                    record.entity_key,
                    record.reason,
                    record.event_time_ms,
                    bytes(data),
                    self._clock(),
                ),
            )
            self._seen(db, record.entity_key)
        return record

    def add_completion(self, key: bytes, output: bytes, at_ms: int) -> None:
        """Keeps a completions record: the key's completed activation output `output`."""
        with self._db.transaction() as db:
            db.execute(
                "INSERT OR IGNORE INTO completions (entity_key, at_ms, output, received_at_ms) "
                "VALUES (?, ?, ?, ?)",
                (key, at_ms, bytes(output), self._clock()),
            )
            self._seen(db, key)

    def add_key(self, key: bytes) -> None:
        with self._db.transaction() as db:
            self._seen(db, key)

    # -- reading --------------------------------------------------------------------------

    def snapshot(self, key: bytes, *, trusted: bool = False) -> StateSnapshot | None:
        """The snapshot kept for the key; with `trusted`, only a trusted one (module
        docstring): what decides, or tells a person what they may do."""
        rows = self._db.read(
            "SELECT snapshot FROM snapshots WHERE entity_key = ? AND trusted >= ?",
            (key, int(trusted)),
        )
        return StateSnapshot.FromString(rows[0][0]) if rows else None

    def snapshot_trusted(self, key: bytes) -> bool:
        """Whether the snapshot kept for the key is trusted."""
        rows = self._db.read("SELECT trusted FROM snapshots WHERE entity_key = ?", (key,))
        return rows == [(1,)]

    def keys(self, *, offset: int = 0, limit: int = 20) -> tuple[list[bytes], int]:
        """Keys seen, most recently seen first."""
        (total,) = self._db.read("SELECT count(*) FROM keys")[0]
        rows = self._db.read(
            "SELECT entity_key FROM keys ORDER BY last_seen_ms DESC, entity_key LIMIT ? OFFSET ?",
            (limit, offset),
        )
        return [bytes(r[0]) for r in rows], total

    def activations(
        self, key: bytes, *, offset: int = 0, limit: int = 5
    ) -> tuple[list[Activation], int]:
        """The key's traces, latest first (by their earliest event, its time clamped to its
        receipt), each with its events in start order (`activation`)."""
        (total,) = self._db.read(
            "SELECT count(DISTINCT trace_id) FROM traces WHERE entity_key = ?", (key,)
        )[0]
        trace_ids = self._db.read(
            "SELECT trace_id FROM traces WHERE entity_key = ? GROUP BY trace_id "
            # Traces received at once (clamped alike) keep the order their claims give, those
            # claiming a time past the console's clock by more than a clock's skew last.
            f"ORDER BY min({_at('start_ms')}) DESC, max(received_at_ms != 0 AND "
            "start_ms > received_at_ms + ?) ASC, min(start_ms) DESC, trace_id LIMIT ? OFFSET ?",
            (key, MAX_CLOCK_SKEW_MS, limit, offset),
        )
        return [self.activation(key, trace_id) for (trace_id,) in trace_ids], total

    def activation(self, key: bytes, trace_id: bytes) -> Activation | None:
        """One trace of the key, its first MAX_TRACE_EVENTS events received in start order (None
        when none is known): the approval page looks its trace up by id, not among the latest
        few."""
        where = "WHERE entity_key = ? AND trace_id = ?"
        rows = self._db.read(
            f"SELECT event FROM traces {where} ORDER BY id LIMIT ?",
            (key, trace_id, MAX_TRACE_EVENTS),
        )
        if not rows:
            return None
        (total,) = self._db.read(f"SELECT count(*) FROM traces {where}", (key, trace_id))[0]
        events = sorted((TraceEvent.FromString(r[0]) for r in rows), key=lambda e: e.start_ms)
        return Activation(bytes(trace_id), events, total - len(rows))

    def completions(
        self, key: bytes, *, offset: int = 0, limit: int = 20
    ) -> tuple[list[tuple[int, bytes]], int]:
        """The key's completed outputs as (at_ms, output), newest first, and the total: at_ms is
        the record's timestamp clamped to its receipt (module docstring)."""
        (total,) = self._db.read("SELECT count(*) FROM completions WHERE entity_key = ?", (key,))[0]
        rows = self._db.read(
            f"SELECT {_at('at_ms')} AS at, output FROM completions WHERE entity_key = ? "
            "ORDER BY at DESC, id DESC LIMIT ? OFFSET ?",
            (key, limit, offset),
        )
        return [(at, bytes(output)) for at, output in rows], total

    def dead_letters(
        self, *, reason: str = "", key: bytes | None = None, offset: int = 0, limit: int = 20
    ) -> tuple[list[ActivationErrorRecord], int]:
        """Dead letters, newest first, filtered by reason and key when given."""
        where, params = [], []
        if reason:
            where.append("reason = ?")
            params.append(reason)
        if key is not None:
            where.append("entity_key = ?")
            params.append(key)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        (total,) = self._db.read(f"SELECT count(*) FROM dead_letters {clause}", tuple(params))[0]
        rows = self._db.read(
            f"SELECT record FROM dead_letters {clause} ORDER BY id DESC LIMIT ? OFFSET ?",
            (*params, limit, offset),
        )
        return [decode_dead_letter(r[0]) for r in rows], total

    def latest_dead_letter(self, key: bytes) -> tuple[int, ActivationErrorRecord] | None:
        """The key's latest dead letter with its time, its event_time_ms clamped to its receipt
        (module docstring), for the status line (None: the key has none)."""
        rows = self._db.read(
            f"SELECT {_at('event_time_ms')} AS at, record FROM dead_letters WHERE entity_key = ? "
            "ORDER BY at DESC, id DESC LIMIT 1",
            (key,),
        )
        return (rows[0][0], decode_dead_letter(rows[0][1])) if rows else None

    def reasons(self) -> list[str]:
        return [r[0] for r in self._db.read("SELECT DISTINCT reason FROM dead_letters ORDER BY 1")]
