"""The console's one SQLite file: its schema and the transaction every writer goes through.

Every table the console keeps lives in one file so that one transaction can cover a decision
and its audit row, and so that two console processes on one machine share pending approvals,
decisions, sessions and login failures (WAL mode, synchronous=FULL: a committed decision
survives a crash of the process or the machine). Transactions are `BEGIN IMMEDIATE`: the
write lock is taken before the first read, so two processes deciding the same intent are
serialized and the second reads the first one's decision.

The file outlives the binary: a column added since is added to an older file on open
(`_COLUMNS`, additive only, each with the default an older row means), never a table rebuilt.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator

__all__ = ["Database"]

_SCHEMA = (
    # One row per APPROVAL intent read from the approvals topic (the first admissible copy).
    """CREATE TABLE IF NOT EXISTS approvals (
        intent_id TEXT PRIMARY KEY,
        entity_key BLOB NOT NULL,
        intent BLOB NOT NULL,
        verification TEXT NOT NULL,
        approvable INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL,
        expires_at_ms INTEGER NOT NULL,
        received_at_ms INTEGER NOT NULL)""",
    # The inbox lists verified copies first, by when this console received them (never by
    # an unsigned created_at_ms), and bounds the refused ones by age and count.
    "CREATE INDEX IF NOT EXISTS approvals_received ON approvals (approvable DESC, received_at_ms)",
    # The agent page pages a key's approvals; without it every page scans the whole table.
    "CREATE INDEX IF NOT EXISTS approvals_key_received ON approvals "
    "(entity_key, approvable DESC, received_at_ms)",
    # The one decision of an intent (UNIQUE by the primary key), with the exact bytes produced,
    # so a re-production after a crash sends the same records again.
    """CREATE TABLE IF NOT EXISTS decisions (
        intent_id TEXT PRIMARY KEY,
        entity_key BLOB NOT NULL,
        approved INTEGER NOT NULL,
        approver TEXT NOT NULL,
        comment TEXT NOT NULL,
        decided_at_ms INTEGER NOT NULL,
        address TEXT NOT NULL,
        envelope BLOB NOT NULL,
        trace BLOB NOT NULL,
        produced INTEGER NOT NULL DEFAULT 0)""",
    "CREATE INDEX IF NOT EXISTS decisions_decided ON decisions (decided_at_ms)",
    # The reader looks for unproduced decisions every few seconds (bus.RETRY_S).
    "CREATE INDEX IF NOT EXISTS decisions_unproduced ON decisions (decided_at_ms) "
    "WHERE produced = 0",
    """CREATE TABLE IF NOT EXISTS audit (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        at_ms INTEGER NOT NULL,
        user TEXT NOT NULL,
        action TEXT NOT NULL,
        intent_id TEXT NOT NULL,
        detail TEXT NOT NULL,
        address TEXT NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS sessions (
        token_hash BLOB PRIMARY KEY,
        user TEXT NOT NULL,
        csrf TEXT NOT NULL,
        expires_at_ms INTEGER NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS login_failures (
        subject TEXT NOT NULL,
        at_ms INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS login_failures_subject ON login_failures (subject, at_ms)",
    # The export requests this console sent: a snapshot answering one (its request_id, key
    # and snapshot_at_ms) comes from the agent; any other is anyone's (observed.py).
    """CREATE TABLE IF NOT EXISTS export_requests (
        request_id TEXT PRIMARY KEY,
        entity_key BLOB NOT NULL,
        requested_at_ms INTEGER NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS export_requests_at ON export_requests (requested_at_ms)",
    # What the viewer shows, as read from the loop's topics. A snapshot's snapshot_at_ms is
    # the time it is kept by: its export request's, for a trusted one (observed.py).
    """CREATE TABLE IF NOT EXISTS snapshots (
        entity_key BLOB PRIMARY KEY,
        snapshot_at_ms INTEGER NOT NULL,
        snapshot BLOB NOT NULL)""",
    """CREATE TABLE IF NOT EXISTS traces (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        entity_key BLOB NOT NULL,
        trace_id BLOB NOT NULL,
        start_ms INTEGER NOT NULL,
        event BLOB NOT NULL UNIQUE)""",
    "CREATE INDEX IF NOT EXISTS traces_key ON traces (entity_key, trace_id)",
    """CREATE TABLE IF NOT EXISTS dead_letters (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        entity_key BLOB NOT NULL,
        reason TEXT NOT NULL,
        event_time_ms INTEGER NOT NULL,
        record BLOB NOT NULL UNIQUE)""",
    "CREATE INDEX IF NOT EXISTS dead_letters_reason ON dead_letters (reason, id)",
    "CREATE INDEX IF NOT EXISTS dead_letters_key ON dead_letters (entity_key, id)",
    # Each completed activation's output, from the completions topic (keyed by the record's
    # key, timed by its timestamp: a record read twice is one row).
    """CREATE TABLE IF NOT EXISTS completions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        entity_key BLOB NOT NULL,
        at_ms INTEGER NOT NULL,
        output BLOB NOT NULL,
        UNIQUE (entity_key, at_ms, output))""",
    """CREATE TABLE IF NOT EXISTS keys (entity_key BLOB PRIMARY KEY, last_seen_ms INTEGER)""",
)

#: Columns added since a table was first created: (table, column, definition). The default is
#: what a row of an older file means: a snapshot kept before trust was recorded is untrusted,
#: a session opened before its credential was recorded is no session (auth.py), a decision
#: recorded before edits existed approved as asked, a record received before receipt times
#: were recorded is timed by what it claims.
_COLUMNS = (
    ("snapshots", "trusted", "INTEGER NOT NULL DEFAULT 0"),
    ("sessions", "credential", "BLOB NOT NULL DEFAULT x''"),
    # The inbox filters by tool; an older row's is filled in from its intent (inbox.py).
    ("approvals", "tool_name", "TEXT NOT NULL DEFAULT ''"),
    # The arguments an approver changed (an older decision changed none).
    ("decisions", "edits", "TEXT NOT NULL DEFAULT ''"),
    # When this console received a record, on its own clock: the times a record claims are
    # anyone's (observed.py). An older row's is not known (0): its claimed time stands.
    ("traces", "received_at_ms", "INTEGER NOT NULL DEFAULT 0"),
    ("dead_letters", "received_at_ms", "INTEGER NOT NULL DEFAULT 0"),
    ("completions", "received_at_ms", "INTEGER NOT NULL DEFAULT 0"),
)


class Database:
    """One connection to the console's SQLite file, shared by the threads of one process."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        self._lock = threading.RLock()
        # isolation_level=None: transactions are explicit (`transaction`).
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=10000")
        with self.transaction() as db:
            for statement in _SCHEMA:
                db.execute(statement)
            for table, column, definition in _COLUMNS:
                known = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
                if column not in known:
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT, rolled back on any exception."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def read(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def close(self) -> None:
        with self._lock:
            self._db.close()
