"""MemoryBlob v1 -> v2: the same entries, with no entry index.

Version 2 keeps an index of the entries in entry_stamps, key_hashes and key_stamps, and a
reader trusts it without checking it against the entries. A version-1 blob was written by a
binary that did not keep that index: if those fields hold anything (a version-1 binary carries
them along as unknown fields while it changes the entries), it no longer describes the entries.
So the step clears all three, which tells the reader to build the index from the entries.
"""

from beam_agents._protos import MemoryBlob

MESSAGE_TYPE = MemoryBlob
FROM_VERSION = 1
TO_VERSION = 2


def upgrade(old: MemoryBlob) -> MemoryBlob:
    new = MemoryBlob()
    new.CopyFrom(old)
    for index_field in ("entry_stamps", "key_hashes", "key_stamps"):
        new.ClearField(index_field)
    new.state_schema_version = TO_VERSION
    return new
