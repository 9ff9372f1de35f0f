"""A synthetic next state schema version, CURRENT_STATE_SCHEMA_VERSION + 1: the "next binary"
of migration and upgrade tests.

Its registry holds every real step, so a blob of any past version reaches the current one, and
one synthetic step per versioned blob from the current version to the next. Those copy the blob
and stamp it NEXT_STATE_SCHEMA_VERSION, with a change a test can see in the output: the memory
gains an entry "migrated" (value b"next") and the continuation ten escalations. A blob that shows
them went through the step; one that does not was never read by the next binary. Being defined
from the current version, it needs no edit when the schema is bumped.
"""

from __future__ import annotations

import types

from beam_agents._protos import Continuation, LlmCacheBlob, MemoryBlob
from beam_agents.state.migration import (
    CURRENT_STATE_SCHEMA_VERSION,
    MigrationRegistry,
    MigrationStep,
    default_registry,
)

__all__ = ["MIGRATED_KEY", "NEXT_STATE_SCHEMA_VERSION", "registry_next", "step"]

#: The version the synthetic steps stamp: a version from the future for this binary.
NEXT_STATE_SCHEMA_VERSION = CURRENT_STATE_SCHEMA_VERSION + 1

#: The memory entry the synthetic MemoryBlob step adds.
MIGRATED_KEY = "migrated"


def step(message_type, change=None) -> types.ModuleType:
    """A current -> next step module for `message_type`, applying `change` to the copy."""
    module = types.ModuleType(
        f"synthetic_{message_type.DESCRIPTOR.name.lower()}"
        f"_v{CURRENT_STATE_SCHEMA_VERSION}_to_v{NEXT_STATE_SCHEMA_VERSION}"
    )
    module.MESSAGE_TYPE = message_type
    module.FROM_VERSION, module.TO_VERSION = CURRENT_STATE_SCHEMA_VERSION, NEXT_STATE_SCHEMA_VERSION

    def upgrade(old):
        new = message_type()
        new.CopyFrom(old)
        new.state_schema_version = NEXT_STATE_SCHEMA_VERSION
        if change is not None:
            change(new)
        return new

    module.upgrade = upgrade
    return module


def _mark_migrated(blob: MemoryBlob) -> None:
    blob.entries.add(key=MIGRATED_KEY, value=b"next", last_access_ms=0)
    blob.total_value_bytes += 4


def _count_ten_escalations(blob: Continuation) -> None:
    blob.escalations += 10


def registry_next() -> MigrationRegistry:
    """The registry of a binary at NEXT_STATE_SCHEMA_VERSION: the real steps and the three
    synthetic ones."""
    synthetic = [
        step(MemoryBlob, _mark_migrated),
        step(Continuation, _count_ten_escalations),
        step(LlmCacheBlob),
    ]
    return MigrationRegistry(
        [*default_registry().steps, *map(MigrationStep.from_module, synthetic)],
        current_version=NEXT_STATE_SCHEMA_VERSION,
    )
