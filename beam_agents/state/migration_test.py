"""migrate_to_current, the registry and the writers' stamp, on real messages and real steps.

Steps here are real modules (ModuleType with the same four names a migrations/ file declares)
registered into registries whose current_version is raised above the real one, so version
chains are exercised without bumping the schema.
"""

from __future__ import annotations

import textwrap
import types

import pytest

from beam_agents._protos import (
    Continuation,
    LlmCacheBlob,
    MemoryBlob,
    StateSnapshot,
    ToolIntent,
)
from beam_agents.errors import (
    BeamAgentsError,
    DuplicateMigrationError,
    InvalidMigrationStepError,
    MigrationStepError,
    MissingMigrationError,
    StateSchemaFromFutureError,
    UnversionedMessageError,
)
from beam_agents.state import migration
from beam_agents.state.memory import Memory
from beam_agents.state.migration import (
    CURRENT_STATE_SCHEMA_VERSION,
    VERSIONED_MESSAGE_TYPES,
    MigrationRegistry,
    default_registry,
    migrate_snapshot,
    migrate_to_current,
    new_state_blob,
)
from beam_agents.testing.samples import sample as samples_blob
from beam_agents.testing.samples import snapshot


def step_module(name: str, source: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(textwrap.dedent(source), module.__dict__)
    return module


def memory_step(from_version: int, body: str = "") -> types.ModuleType:
    """A MemoryBlob step that copies and restamps, then runs `body` on `new`."""
    lines = [
        "from beam_agents._protos import MemoryBlob",
        "MESSAGE_TYPE = MemoryBlob",
        f"FROM_VERSION = {from_version}",
        f"TO_VERSION = {from_version + 1}",
        "def upgrade(old):",
        "    new = MemoryBlob()",
        "    new.CopyFrom(old)",
        "    new.state_schema_version = TO_VERSION",
        *("    " + line for line in body.splitlines()),
        "    return new",
    ]
    return step_module(f"memory_blob_v{from_version}_to_v{from_version + 1}", "\n".join(lines))


def memory(version: int) -> MemoryBlob:
    blob = MemoryBlob(state_schema_version=version)
    blob.entries.add(key="user:name", value=b"Ada", last_access_ms=5)
    blob.entries.add(key="user:tier", value=b"gold", last_access_ms=7)
    return blob


def test_the_versioned_set_is_exactly_the_three_state_blobs():
    assert CURRENT_STATE_SCHEMA_VERSION == 2
    assert set(VERSIONED_MESSAGE_TYPES) == {MemoryBlob, Continuation, LlmCacheBlob}


@pytest.mark.parametrize("cls", VERSIONED_MESSAGE_TYPES, ids=lambda c: c.DESCRIPTOR.name)
def test_writers_stamp_the_current_version(cls):
    """Scenario: Schema version defaults are explicit (the writers' half)."""
    blob = new_state_blob(cls)
    assert blob.state_schema_version == CURRENT_STATE_SCHEMA_VERSION
    decoded = cls.FromString(blob.SerializeToString())
    assert decoded.state_schema_version == CURRENT_STATE_SCHEMA_VERSION
    assert cls().state_schema_version == 0  # what a pre-versioned blob reads as


def test_only_versioned_blobs_can_be_created_stamped():
    with pytest.raises(UnversionedMessageError):
        new_state_blob(StateSnapshot)


@pytest.mark.parametrize("cls", VERSIONED_MESSAGE_TYPES, ids=lambda c: c.DESCRIPTOR.name)
def test_a_current_blob_comes_back_as_the_very_same_object(cls):
    blob = cls.FromString(new_state_blob(cls).SerializeToString())
    assert migrate_to_current(blob) is blob


def test_version_zero_reads_as_one():
    blob = memory(0)
    assert MigrationRegistry(current_version=1).migrate(blob) is blob  # nothing to run
    registry = MigrationRegistry.from_modules([memory_step(1)], current_version=2)
    migrated = registry.migrate(blob)
    assert migrated.state_schema_version == 2
    assert list(migrated.entries) == list(blob.entries)
    assert blob.state_schema_version == 0


def test_a_future_version_is_refused_before_any_step_runs():
    calls = []
    exploding = memory_step(1)
    exploding.upgrade = lambda old: calls.append(old)
    registry = MigrationRegistry.from_modules([exploding], current_version=2)
    with pytest.raises(StateSchemaFromFutureError) as raised:
        registry.migrate(memory(3))
    assert (raised.value.type_name, raised.value.found_version, raised.value.current_version) == (
        "MemoryBlob",
        3,
        2,
    )
    assert "MemoryBlob" in str(raised.value) and "3" in str(raised.value)
    assert calls == []
    with pytest.raises(StateSchemaFromFutureError):
        migrate_to_current(Continuation(state_schema_version=CURRENT_STATE_SCHEMA_VERSION + 1))


def test_steps_compose_one_version_at_a_time_without_touching_the_input():
    registry = MigrationRegistry.from_modules(
        [
            memory_step(1, 'for e in new.entries: e.key = e.key.replace("user:", "u/")'),
            memory_step(2, "new.total_value_bytes = sum(len(e.value) for e in new.entries)"),
        ],
        current_version=3,
    )
    original = memory(1)
    before = original.SerializeToString()
    migrated = registry.migrate(original)
    assert migrated.state_schema_version == 3
    assert [e.key for e in migrated.entries] == ["u/name", "u/tier"]
    assert migrated.total_value_bytes == 7
    assert original.SerializeToString() == before
    assert registry.migrate(memory(1)) == migrated  # pure: a replay sees the same view
    assert registry.migrate(memory(2)).state_schema_version == 3


def test_a_step_that_changes_its_input_in_place_leaves_the_blob_read_as_it_was():
    # Steps are pure by contract. One that is not must still not change the blob read: a
    # portable runner hands that very object back as the key's state, changed or not.
    registry = MigrationRegistry.from_modules(
        [memory_step(1, 'old.entries[0].value = b"changed in place"')], current_version=2
    )
    original = memory(1)
    before = original.SerializeToString()
    migrated = registry.migrate(original)
    assert original.SerializeToString() == before
    assert [e.value for e in migrated.entries] == [b"Ada", b"gold"]


def test_a_gap_raises_missing_migration_naming_type_and_version():
    registry = MigrationRegistry.from_modules([memory_step(1)], current_version=3)
    with pytest.raises(MissingMigrationError) as raised:
        registry.migrate(memory(1))
    assert (raised.value.type_name, raised.value.from_version) == ("MemoryBlob", 2)
    assert str(raised.value) == "no migration registered for (MemoryBlob, 2)"
    assert registry.missing_steps() == [
        ("MemoryBlob", 2),
        ("Continuation", 1),
        ("Continuation", 2),
        ("LlmCacheBlob", 1),
        ("LlmCacheBlob", 2),
    ]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("new.state_schema_version = FROM_VERSION", "stamped 1, expected 2"),
        ("new.state_schema_version = 3", "stamped 3, expected 2"),
        ("return old", "returned its input"),
        (
            "from beam_agents._protos import Continuation\n"
            "return Continuation(state_schema_version=2)",
            "returned Continuation",
        ),
    ],
)
def test_a_step_that_does_not_advance_exactly_one_version_is_an_error(body, reason):
    registry = MigrationRegistry.from_modules([memory_step(1, body)], current_version=2)
    with pytest.raises(MigrationStepError) as raised:
        registry.migrate(memory(1))
    assert reason in str(raised.value)
    assert raised.value.step == "memory_blob_v1_to_v2"


@pytest.mark.parametrize("message", [ToolIntent(), StateSnapshot(state_schema_version=1)])
def test_unversioned_messages_are_refused(message):
    with pytest.raises(UnversionedMessageError) as raised:
        migrate_to_current(message)
    assert raised.value.type_name == message.DESCRIPTOR.name


def test_registering_one_type_and_version_twice_is_an_error():
    first, second = memory_step(1), memory_step(1)
    second.__name__ = "memory_blob_v1_to_v2_again"
    with pytest.raises(DuplicateMigrationError) as raised:
        MigrationRegistry.from_modules([first, second], current_version=2)
    assert "memory_blob_v1_to_v2" in str(raised.value)
    assert "memory_blob_v1_to_v2_again" in str(raised.value)
    assert (raised.value.type_name, raised.value.from_version) == ("MemoryBlob", 1)


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        ("TO_VERSION = 3", "goes from 1 to 3"),
        ("del upgrade", "lacks upgrade"),
        (
            "from beam_agents._protos import ToolIntent\nMESSAGE_TYPE = ToolIntent",
            "not a versioned",
        ),
        ("FROM_VERSION, TO_VERSION = 0, 1", "starts at version 0"),
    ],
)
def test_malformed_step_modules_are_rejected_when_the_registry_is_built(edit, reason):
    module = memory_step(1)
    exec(edit, module.__dict__)
    with pytest.raises(InvalidMigrationStepError, match=reason):
        MigrationRegistry.from_modules([module], current_version=2)


def test_every_error_shares_one_root():
    for error in (
        DuplicateMigrationError,
        InvalidMigrationStepError,
        MigrationStepError,
        MissingMigrationError,
        StateSchemaFromFutureError,
        UnversionedMessageError,
    ):
        assert issubclass(error, BeamAgentsError)


def test_the_default_registry_holds_a_complete_chain():
    registry = default_registry()
    assert registry.current_version == CURRENT_STATE_SCHEMA_VERSION
    assert registry.missing_steps() == []
    assert migration.default_registry() is registry


@pytest.mark.parametrize("cls", [MemoryBlob, LlmCacheBlob], ids=lambda c: c.DESCRIPTOR.name)
def test_a_version_1_blob_loses_its_entry_index_on_the_way_to_2(cls):
    """Only a version-2 writer keeps the index in step with the entries: one in a version-1
    blob (say, carried along as unknown fields by a version-1 binary) may describe other
    entries, so the step empties it and the reader builds its own."""
    old = samples_blob(cls)
    old.state_schema_version = 1
    old.entry_stamps, old.key_hashes, old.key_stamps = b"\x01" * 8, b"\x02" * 8, b"\x03" * 8
    before = old.SerializeToString()
    new = default_registry().migrate(old)
    assert new.state_schema_version == 2
    assert (new.entry_stamps, new.key_hashes, new.key_stamps) == (b"", b"", b"")
    assert list(new.entries) == list(old.entries)
    assert old.SerializeToString() == before


def test_a_step_keeps_the_entry_index_only_of_entries_it_left_as_they_were():
    """A reader trusts the index and total as written; a step need not know of them, so the
    chain clears the index of the blob a step changed the entries of, and only of that one."""
    written = Memory(now_ms=1)
    written.put("user:name", b"Ada")
    written.put("user:tier", b"gold")
    current = written.to_blob()
    before = current.SerializeToString()
    version = CURRENT_STATE_SCHEMA_VERSION
    restamped = MigrationRegistry.from_modules([memory_step(version)], current_version=version + 1)
    assert restamped.migrate(current).key_hashes == current.key_hashes
    renaming = MigrationRegistry.from_modules(
        [memory_step(version, 'for e in new.entries: e.key = e.key.replace("user:", "u/")')],
        current_version=version + 1,
    )
    renamed = renaming.migrate(current)
    assert (renamed.entry_stamps, renamed.key_hashes, renamed.key_stamps) == (b"", b"", b"")
    assert [e.key for e in renamed.entries] == ["u/name", "u/tier"]
    assert current.SerializeToString() == before


def test_a_version_1_continuation_is_only_restamped_on_the_way_to_2():
    old = snapshot().continuation
    old.state_schema_version = 1
    new = default_registry().migrate(old)
    assert new.state_schema_version == 2
    new.state_schema_version = 1
    assert new == old


def test_a_loaded_snapshot_has_its_blobs_migrated_and_its_envelope_stamped_current():
    exported = snapshot()
    exported.state_schema_version = 0
    exported.memory.state_schema_version = 0
    exported.llm_cache.state_schema_version = 1
    before = exported.SerializeToString()
    registry = MigrationRegistry.from_modules([memory_step(1)], current_version=2)
    with pytest.raises(MissingMigrationError, match=r"\(LlmCacheBlob, 1\)"):
        migrate_snapshot(exported, registry)

    loaded = migrate_snapshot(exported)
    assert loaded.state_schema_version == CURRENT_STATE_SCHEMA_VERSION
    assert loaded.memory == migrate_to_current(exported.memory)  # 0 read as 1, then the chain
    assert loaded.memory.state_schema_version == CURRENT_STATE_SCHEMA_VERSION
    assert loaded.llm_cache == migrate_to_current(exported.llm_cache)
    assert loaded.continuation == exported.continuation  # current already
    assert list(loaded.pending) == list(exported.pending)
    assert exported.SerializeToString() == before


def test_a_snapshot_from_a_newer_binary_is_refused():
    exported = snapshot()
    exported.state_schema_version = CURRENT_STATE_SCHEMA_VERSION + 1
    with pytest.raises(StateSchemaFromFutureError) as raised:
        migrate_snapshot(exported)
    assert raised.value.type_name == "StateSnapshot"
