"""RunAgent migrates state on read, in the element path and both timers: golden v1 blobs, read by
the next binary (beam_agents.testing.synthetic_next) through every step, reach state only
through a commit, a restored suspension still refuses an answer its pending intents
do not hold, and a snapshot from a newer binary is refused before anything is written."""

from __future__ import annotations

import json

import pytest

from beam_agents._protos import (
    StateSnapshot,
    ToolIntent,
    ToolResult,
)
from beam_agents.ops.rounds import Advance, run_round
from beam_agents.runtime import (
    RuntimeConfig,
)
from beam_agents.state.migration import MigrationRegistry
from beam_agents.testing.probe import (
    DAY,
    FAR,
    KEY,
    T0,
    Probe,
    command,
    export,
    memory_blob,
    probe,
    result,
)
from beam_agents.testing.synthetic_next import NEXT_STATE_SCHEMA_VERSION as NEXT
from beam_agents.testing.synthetic_next import registry_next
from beam_agents.wire.decoding import message_type
from tools import golden
from tools.workspace import data_root


def _golden(name: str):
    (fixture,) = [f for f in golden.read_fixtures(data_root() / "golden" / "v1") if f.name == name]
    return message_type(fixture.type_name).FromString(fixture.data)


@pytest.mark.parametrize("memory_fixture", ["memory_blob", "memory_blob_unversioned"])
def test_golden_blobs_migrate_on_first_read_and_reach_state_only_through_a_commit(
    tmp_path, memory_fixture
):
    snapshot = StateSnapshot(entity_key=KEY, seq=7, snapshot_at_ms=T0)
    snapshot.memory.CopyFrom(_golden(memory_fixture))
    snapshot.llm_cache.CopyFrom(_golden("llm_cache_blob"))
    outputs = run_round(
        probe(registry=registry_next()),
        [
            snapshot,
            Advance(T0 + 1),
            command(T0 + 2, raise_at="start"),
            Advance(T0 + 3),
            export(T0 + 4, "failed"),
            command(T0 + 5, put={"new": "1"}),
            Advance(T0 + 6),
            export(T0 + 7, "committed"),
        ],
        tmp_path,
    ).before(T0 + 8)
    failed, committed = outputs.values("snapshots")
    # A failed activation rewrites nothing: the golden bytes are still there, verbatim.
    assert failed.memory == snapshot.memory and failed.llm_cache == snapshot.llm_cache
    assert failed.state_schema_version == NEXT  # the exporting binary's version
    # The committed memory is the migrated view plus the activation's work, stamped NEXT; the
    # activation made no LLM call, so the cache it did not touch is still the golden bytes.
    assert committed.memory.state_schema_version == NEXT
    assert committed.llm_cache == snapshot.llm_cache
    keys = [e.key for e in committed.memory.entries]
    assert "migrated" in keys and keys[-1] == "new"
    assert [e.key for e in snapshot.memory.entries] == keys[: len(snapshot.memory.entries)]


def _suspended_snapshot(deadline_ms: int, memory="memory_blob", **command_fields):
    snapshot = StateSnapshot(entity_key=KEY, seq=7, snapshot_at_ms=T0)
    snapshot.memory.CopyFrom(_golden(memory))
    pending = ToolIntent(
        intent_id="i-0", entity_key=KEY, seq=7, tool_name="a.tool", kind=ToolIntent.TOOL
    )
    snapshot.pending.append(pending)
    golden_continuation = _golden("continuation")  # v1, from the frozen corpus
    snapshot.continuation.CopyFrom(golden_continuation)
    snapshot.continuation.adapter = Probe.adapter
    snapshot.continuation.snapshot = json.dumps(command_fields).encode()
    snapshot.continuation.seq = 7
    snapshot.continuation.pending_intent_ids[:] = ["i-0"]
    snapshot.continuation.deadline_ms = deadline_ms
    return snapshot


@pytest.mark.parametrize("memory", ["memory_blob", "memory_blob_unversioned"])
@pytest.mark.parametrize("resume_fails", [False, True])
def test_the_deadline_timer_reads_golden_blobs_through_migration(tmp_path, resume_fails, memory):
    fails = {"raise_at": "resume"} if resume_fails else {}
    snapshot = _suspended_snapshot(T0 + 50, memory, **fails)
    outputs = run_round(
        probe(registry=registry_next()),
        [
            snapshot,
            Advance(T0 + 60),
            export(T0 + 61, "after the deadline"),
        ],
        tmp_path,
    ).before(T0 + 62)
    (after,) = outputs.values("snapshots")
    if resume_fails:
        assert [e.reason for e in outputs.values("errors")] == ["agent_raised"]
        # Memory untouched; the continuation, read through migration, now holds the expiry
        # the resume was given, for its retry.
        assert after.memory == snapshot.memory
        assert after.continuation.state_schema_version == NEXT
        assert after.continuation.resume_failures == 1
        assert [a.tool_result.status for a in after.continuation.answers] == [ToolResult.EXPIRED]
    else:
        (done,) = outputs.values("completions")
        # 0 in the golden v1 continuation, 10 after the synthetic step; expiring is no
        # escalation.
        assert json.loads(done) == [["a.tool", "EXPIRED"], ["escalations", 10]]
        assert after.memory.state_schema_version == NEXT
        assert "migrated" in [e.key for e in after.memory.entries]
        assert not after.HasField("continuation")


def test_an_answer_reads_a_golden_continuation_through_migration(tmp_path):
    outputs = run_round(
        probe(registry=registry_next()),
        [
            _suspended_snapshot(FAR),
            Advance(T0 + 1),
            result(T0 + 2, "i-0"),
            Advance(T0 + 3),
        ],
        tmp_path,
    ).before(T0 + 3)
    (done,) = outputs.values("completions")
    assert json.loads(done) == [["a.tool", "OK"], ["escalations", 10]]


@pytest.mark.parametrize("memory", ["memory_blob", "memory_blob_unversioned"])
def test_the_ttl_timer_reads_through_migration_before_it_wipes(tmp_path, memory):
    # A registry without the step cannot read the v1 (or v0) blob: the TTL's read must fail
    # rather than wipe what it cannot read.
    snapshot = StateSnapshot(entity_key=KEY, seq=7, snapshot_at_ms=T0)
    snapshot.memory.CopyFrom(_golden(memory))
    config = RuntimeConfig(ttl_ms=DAY)
    wiped = run_round(
        probe(config, registry=registry_next()),
        [
            snapshot,
            Advance(T0 + 2 * DAY),
            export(T0 + 2 * DAY + 1, "wiped"),
        ],
        tmp_path,
    ).before(T0 + 2 * DAY + 2)
    (after,) = wiped.values("snapshots")
    assert not after.HasField("memory") and after.seq == 7
    with pytest.raises(Exception, match=r"no migration registered for \(MemoryBlob, 1\)"):
        run_round(
            probe(config, registry=MigrationRegistry(current_version=NEXT)),
            [snapshot, Advance(T0 + 2 * DAY)],
            tmp_path,
        )


def test_an_answer_whose_pending_intent_is_missing_from_state_is_refused(tmp_path):
    snapshot = _suspended_snapshot(FAR)
    del snapshot.pending[:]  # a snapshot whose pending intents were not all exported
    outputs = run_round(
        probe(), [snapshot, Advance(T0 + 1), result(T0 + 2, "i-0"), Advance(T0 + 3)], tmp_path
    ).before(T0 + 3)
    (error,) = outputs.values("errors")
    assert error.reason == "unknown_intent" and "missing" in error.detail


def test_a_snapshot_from_a_newer_binary_is_refused_before_anything_is_written(tmp_path):
    """Restored verbatim, its memory would wedge the key at the first read; it is refused at
    restore instead, and the binary that wrote it restores it. (State a newer binary wrote in
    place wedges the key: machine_test proves that on the DoFn, flink_upgrade_test on Flink.)"""
    future = StateSnapshot(entity_key=KEY, seq=7, snapshot_at_ms=T0, request_id="r-9")
    future.memory.CopyFrom(memory_blob(NEXT))
    inputs = [
        future,
        Advance(T0 + 1),
        command(T0 + 2, put={"new": "1"}),
        Advance(T0 + 3),
        export(T0 + 4, "after"),
    ]
    refused = run_round(probe(), inputs, tmp_path / "refused")
    (error,) = refused.values("errors")
    assert error.reason == "snapshot_from_future"
    # It names the blob that is too new, and only that one.
    assert f"'r-9': memory written at a schema newer than {NEXT - 1}" in error.detail
    (after,) = refused.values("snapshots")
    assert [e.key for e in after.memory.entries] == ["new"] and after.seq != 7
    rolled_forward = run_round(probe(registry=registry_next()), inputs, tmp_path / "forward")
    (done,) = rolled_forward.values("completions")
    assert done == b"done"
    (after,) = rolled_forward.values("snapshots")
    assert [e.key for e in after.memory.entries] == ["restored", "new"]
