"""The central registry of state-schema migration steps.

One module per (message type, from_version) step, e.g. memory_blob_v1_to_v2.py, declaring

    MESSAGE_TYPE = MemoryBlob   # one of beam_agents.state.migration.VERSIONED_MESSAGE_TYPES
    FROM_VERSION = 1
    TO_VERSION = 2              # always FROM_VERSION + 1
    def upgrade(old: MemoryBlob) -> MemoryBlob: ...   # pure; returns a new, restamped message

Each step is also a py_library of its own in migrations/BUILD.bazel and a dependency of
:migrations. List every step below; beam_agents.state.migration.default_registry builds the
registry from this tuple and rejects duplicates and malformed steps. Steps are never removed:
a key untouched since any past version may still be read.
"""

from . import (
    continuation_v1_to_v2,
    llm_cache_blob_v1_to_v2,
    memory_blob_v1_to_v2,
)

STEP_MODULES = (
    # 1 -> 2: MemoryBlob and LlmCacheBlob gain the entry index (cleared for version-1 blobs).
    memory_blob_v1_to_v2,
    continuation_v1_to_v2,
    llm_cache_blob_v1_to_v2,
)
