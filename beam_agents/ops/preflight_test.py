"""Pre-deploy verdicts on real blobs and snapshots, against real registries."""

from __future__ import annotations

import types

import pytest

from beam_agents._protos import Continuation, LlmCacheBlob, MemoryBlob, ToolIntent
from beam_agents.ops.preflight import Outcome, dry_run, report
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION, MigrationRegistry
from beam_agents.testing.samples import snapshot

FUTURE = CURRENT_STATE_SCHEMA_VERSION + 1


def restamp_step(message_type, from_version, *, stamp=None) -> types.ModuleType:
    module = types.ModuleType(f"{message_type.DESCRIPTOR.name.lower()}_v{from_version}")
    module.MESSAGE_TYPE = message_type
    module.FROM_VERSION, module.TO_VERSION = from_version, from_version + 1

    def upgrade(old):
        new = message_type()
        new.CopyFrom(old)
        new.state_schema_version = stamp if stamp is not None else from_version + 1
        return new

    module.upgrade = upgrade
    return module


def test_a_current_blob_reads_as_is():
    (verdict,) = report(MemoryBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION))
    assert verdict.outcome is Outcome.CURRENT and verdict.outcome.readable
    assert verdict.where == "" and verdict.type_name == "MemoryBlob"


def test_an_older_blob_migrates_through_the_registry():
    registry = MigrationRegistry.from_modules(
        [restamp_step(t, 1) for t in (MemoryBlob, Continuation, LlmCacheBlob)], current_version=2
    )
    (verdict,) = report(Continuation(state_schema_version=1, seq=9), registry)
    assert verdict.outcome is Outcome.MIGRATES
    assert verdict.detail == "migrates 1 -> 2 through 1 step(s)"
    assert verdict.migrated.state_schema_version == 2 and verdict.migrated.seq == 9


@pytest.mark.parametrize(
    ("registry", "outcome", "detail"),
    [
        (MigrationRegistry(current_version=2), Outcome.MISSING_STEP, "(LlmCacheBlob, 1)"),
        (
            MigrationRegistry.from_modules(
                [restamp_step(LlmCacheBlob, 1, stamp=1)], current_version=2
            ),
            Outcome.STEP_FAILED,
            "stamped 1, expected 2",
        ),
    ],
)
def test_blobs_that_would_not_read_say_why(registry, outcome, detail):
    (verdict,) = report(LlmCacheBlob(state_schema_version=1), registry)
    assert verdict.outcome is outcome and not verdict.outcome.readable
    assert detail in verdict.detail and verdict.migrated is None


def test_a_snapshot_reports_its_envelope_and_each_blob_where_it_is():
    exported = snapshot()
    exported.llm_cache.state_schema_version = FUTURE
    verdicts = {v.where: v for v in report(exported)}
    assert list(verdicts) == ["envelope", "memory", "llm_cache", "continuation"]
    assert verdicts["llm_cache"].outcome is Outcome.FROM_THE_FUTURE
    assert "roll the newer binary forward" in verdicts["llm_cache"].detail
    assert all(
        verdicts[w].outcome is Outcome.CURRENT for w in ("envelope", "memory", "continuation")
    )


def test_unversioned_messages_have_no_verdict():
    assert report(ToolIntent(intent_id="i")) == []


def test_dry_run_reads_every_file_and_rejects_what_is_no_snapshot(tmp_path):
    good, future = snapshot(), snapshot()
    future.state_schema_version = FUTURE
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "good.binpb").write_bytes(good.SerializeToString(deterministic=True))
    (tmp_path / "keys" / "future.binpb").write_bytes(future.SerializeToString())
    (tmp_path / "empty.binpb").write_bytes(b"")
    (tmp_path / "garbage.binpb").write_bytes(b"\xff\xff\xff")
    reports = {r.name.rsplit("/", 1)[-1]: r for r in dry_run(tmp_path)}
    assert reports["good.binpb"].ready
    assert not reports["future.binpb"].ready
    assert reports["future.binpb"].blobs[0].outcome is Outcome.FROM_THE_FUTURE
    assert "empty file" in reports["empty.binpb"].error
    assert "not a StateSnapshot" in reports["garbage.binpb"].error
