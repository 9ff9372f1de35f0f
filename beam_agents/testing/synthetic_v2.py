"""A synthetic state schema version 2: the "next binary" of migration and upgrade tests.

Its steps copy each v1 blob and stamp it 2, with a change a test can see in the output: the
memory gains an entry "migrated" (value b"v2") and the continuation ten escalations. A blob
that shows them went through the step; one that does not was never read by a v2 binary.
"""

from __future__ import annotations

import types

from beam_agents._protos import Continuation, LlmCacheBlob, MemoryBlob
from beam_agents.state.migration import MigrationRegistry

__all__ = ["MIGRATED_KEY", "registry_v2", "step"]

#: The memory entry the synthetic MemoryBlob step adds.
MIGRATED_KEY = "migrated"


def step(message_type, change=None) -> types.ModuleType:
    """A v1 -> v2 step module for `message_type`, applying `change` to the copy."""
    module = types.ModuleType(f"synthetic_{message_type.DESCRIPTOR.name.lower()}_v1_to_v2")
    module.MESSAGE_TYPE, module.FROM_VERSION, module.TO_VERSION = message_type, 1, 2

    def upgrade(old):
        new = message_type()
        new.CopyFrom(old)
        new.state_schema_version = 2
        if change is not None:
            change(new)
        return new

    module.upgrade = upgrade
    return module


def _mark_migrated(blob: MemoryBlob) -> None:
    blob.entries.add(key=MIGRATED_KEY, value=b"v2", last_access_ms=0)
    blob.total_value_bytes += 2


def _count_ten_escalations(blob: Continuation) -> None:
    blob.escalations += 10


def registry_v2() -> MigrationRegistry:
    """The registry of a binary at state schema version 2 with the three synthetic steps."""
    return MigrationRegistry.from_modules(
        [
            step(MemoryBlob, _mark_migrated),
            step(Continuation, _count_ten_escalations),
            step(LlmCacheBlob),
        ],
        current_version=2,
    )
