"""LlmCacheBlob v1 -> v2: the same entries, with no entry index.

As for MemoryBlob (memory_blob_v1_to_v2): version 2 keeps an index of the entries by cache_key
in entry_stamps, key_hashes and key_stamps, trusted as written. A version-1 binary never wrote
it and would have carried stale values along as unknown fields, so the step clears all three
and the reader builds the index from the entries.
"""

from beam_agents._protos import LlmCacheBlob

MESSAGE_TYPE = LlmCacheBlob
FROM_VERSION = 1
TO_VERSION = 2


def upgrade(old: LlmCacheBlob) -> LlmCacheBlob:
    new = LlmCacheBlob()
    new.CopyFrom(old)
    for index_field in ("entry_stamps", "key_hashes", "key_stamps"):
        new.ClearField(index_field)
    new.state_schema_version = TO_VERSION
    return new
