"""Where the effector remembers its decisions, by intent_id: the `ExecutionStore` interface and
`SqliteExecutionStore`, the durable store of an `Effector` run as a service. (`ExecuteIntents`
keeps its records in Beam keyed state instead: `transform`.)
"""

from __future__ import annotations

import abc
import contextlib
import os
import sqlite3
import threading

from google.protobuf.message import DecodeError

from beam_agents._protos import ExecutionRecord
from beam_agents.errors import ExecutionStoreError

__all__ = ["ExecutionStore", "SqliteExecutionStore"]


class ExecutionStore(abc.ABC):
    """Where the gate remembers decisions, by intent_id. Each method is atomic; `claim` and
    `replace` are the ones that must be atomic across processes sharing the store."""

    @abc.abstractmethod
    def get(self, intent_id: str) -> ExecutionRecord | None:
        """The record of intent_id, or None."""

    @abc.abstractmethod
    def claim(self, record: ExecutionRecord, keep_until_ms: int) -> ExecutionRecord | None:
        """Stores `record` unless intent_id has one already; returns that one, or None when
        `record` was stored. Durable on return."""

    @abc.abstractmethod
    def put(self, record: ExecutionRecord, keep_until_ms: int) -> None:
        """Stores `record`, replacing intent_id's record. Durable on return."""

    @abc.abstractmethod
    def replace(
        self, record: ExecutionRecord, expected: ExecutionRecord, keep_until_ms: int
    ) -> bool:
        """Stores `record` if intent_id's record is still `expected` (equal as a message);
        False when another caller changed it first. Durable on return. A change to a record
        others may change at once (a person's answer to an inquiry, a copy's later expiry, a
        claim's lease renewed, or taken over once it expired) goes through this, so none undoes
        another."""


class SqliteExecutionStore(ExecutionStore):
    """An ExecutionStore in one SQLite file (WAL, synchronous=FULL), safe to share between
    threads and between processes on one machine. Records past their keep-until time are
    deleted at most once a minute of the effector's clock. Every failure of SQLite, and a record
    that does not decode, is an ExecutionStoreError."""

    _PRUNE_EVERY_MS = 60_000

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        self._next_prune_ms: int | None = None
        with self._failures():
            # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE in claim).
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA busy_timeout=10000")
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS executions ("
                " intent_id TEXT PRIMARY KEY,"
                " keep_until_ms INTEGER NOT NULL,"
                " record BLOB NOT NULL"
                ") WITHOUT ROWID"
            )
            self._db.execute(
                "CREATE INDEX IF NOT EXISTS executions_keep_until ON executions (keep_until_ms)"
            )

    @contextlib.contextmanager
    def _failures(self):
        try:
            yield
        except sqlite3.Error as e:
            raise ExecutionStoreError(f"{type(e).__name__}: {e}", path=self.path) from e
        except DecodeError as e:
            raise ExecutionStoreError(f"a record does not decode: {e}", path=self.path) from e

    def get(self, intent_id: str) -> ExecutionRecord | None:
        with self._failures(), self._lock:
            row = self._db.execute(
                "SELECT record FROM executions WHERE intent_id = ?", (intent_id,)
            ).fetchone()
            return None if row is None else ExecutionRecord.FromString(row[0])

    def claim(self, record: ExecutionRecord, keep_until_ms: int) -> ExecutionRecord | None:
        held, _ = self._swap(record, keep_until_ms, lambda held: held is None)
        return held

    def put(self, record: ExecutionRecord, keep_until_ms: int) -> None:
        with self._failures(), self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO executions VALUES (?, ?, ?)",
                (record.intent_id, keep_until_ms, _serialize(record)),
            )

    def replace(
        self, record: ExecutionRecord, expected: ExecutionRecord, keep_until_ms: int
    ) -> bool:
        _, replaced = self._swap(record, keep_until_ms, lambda held: held == expected)
        return replaced

    def _swap(self, record: ExecutionRecord, keep_until_ms: int, replaces) -> tuple:
        """In one immediate transaction: reads the record held for `record.intent_id` and
        writes `record` when `replaces(held)`; returns (held, written)."""
        with self._failures(), self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT record FROM executions WHERE intent_id = ?", (record.intent_id,)
                ).fetchone()
                held = None if row is None else ExecutionRecord.FromString(row[0])
                written = replaces(held)
                if written:
                    self._db.execute(
                        "INSERT OR REPLACE INTO executions VALUES (?, ?, ?)",
                        (record.intent_id, keep_until_ms, _serialize(record)),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:  # a failed COMMIT may have rolled back already
                    self._db.execute("ROLLBACK")
                raise
        return held, written

    def prune(self, now_ms: int) -> int:
        """Deletes the records kept until before now_ms (at most once a minute); returns how
        many."""
        if self._next_prune_ms is not None and now_ms < self._next_prune_ms:
            return 0
        self._next_prune_ms = now_ms + self._PRUNE_EVERY_MS
        with self._failures(), self._lock:
            cursor = self._db.execute("DELETE FROM executions WHERE keep_until_ms < ?", (now_ms,))
        return cursor.rowcount

    def __len__(self) -> int:
        with self._failures(), self._lock:
            return self._db.execute("SELECT count(*) FROM executions").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _serialize(record: ExecutionRecord) -> bytes:
    return record.SerializeToString(deterministic=True)
