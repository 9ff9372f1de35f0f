"""SqliteExecutionStore on real SQLite files that fail: every failure is an
ExecutionStoreError, raised before the gate decides anything."""

from __future__ import annotations

import sqlite3

import pytest

from beam_agents.errors import BeamAgentsError, ExecutionStoreError
from beam_agents.intents.effector import SqliteExecutionStore
from beam_agents.testing.effectors import effector, signed
from beam_agents.testing.samples import intent


def _not_a_database(tmp_path):
    path = tmp_path / "executions.sqlite"
    path.write_bytes(b"not a database " * 100)
    return path


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_not_a_database, "not a database"),
        (lambda tmp_path: tmp_path / "missing" / "executions.sqlite", "unable to open"),
    ],
    ids=["not a database", "no such directory"],
)
def test_a_store_that_cannot_be_opened_is_an_execution_store_error(tmp_path, make, reason):
    path = make(tmp_path)
    with pytest.raises(ExecutionStoreError, match=reason) as raised:
        effector(store=path)
    assert raised.value.path == str(path)


def test_a_record_that_does_not_decode_is_an_execution_store_error(tmp_path):
    path = tmp_path / "executions.sqlite"
    SqliteExecutionStore(path).close()
    with sqlite3.connect(path) as db:  # another writer, or a torn page, left garbage
        db.execute(
            "INSERT INTO executions VALUES (?, ?, ?)", (intent().intent_id, 2**62, b"\xff\xff")
        )
    gate = effector(store=path)
    with pytest.raises(ExecutionStoreError, match="does not decode") as raised:
        gate(signed())
    assert isinstance(raised.value, BeamAgentsError) and raised.value.path == str(path)
