"""Continuation v1 -> v2: unchanged but for the stamp.

Version 2 changed only MemoryBlob and LlmCacheBlob (their entry index), but every versioned
blob needs a step per version so that the chain from any stored version is complete.
"""

from beam_agents._protos import Continuation

MESSAGE_TYPE = Continuation
FROM_VERSION = 1
TO_VERSION = 2


def upgrade(old: Continuation) -> Continuation:
    new = Continuation()
    new.CopyFrom(old)
    new.state_schema_version = TO_VERSION
    return new
