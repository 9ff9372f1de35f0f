"""An agent's working memory and its LLM replay cache: LRU maps that live in keyed state.

Both are plain ordered maps while an activation runs and protobuf blobs (MemoryBlob,
LlmCacheBlob) between activations, written in least-recently-used-first order so that LRU order
survives a round trip without a map field. Reading or writing an entry makes it the most recent;
when a budget is exceeded the least recent entries are evicted first. Every operation costs the
same however many entries there are (an OrderedDict moves and pops in constant time), and the
byte totals the blobs cache are kept exact by every mutation rather than recomputed.

`ReplayCache` is what makes a resumed or replayed activation cheap and deterministic: an LLM
call whose key was answered before returns the recorded response without calling the model.
A response larger than `max_response_bytes` is kept as a digest only, so the cache can tell a
replay that diverged, but it reads as a miss.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
from collections.abc import Iterator

from beam_agents._protos import LlmCacheBlob, MemoryBlob
from beam_agents.core.migration import CURRENT_STATE_SCHEMA_VERSION, new_state_blob
from beam_agents.errors import MemoryBudgetError

__all__ = ["Memory", "ReplayCache"]


@dataclasses.dataclass
class _Entry:
    value: bytes
    last_access_ms: int


class Memory:
    """String keys to bytes values in LRU order, within `budget_bytes` of values.

    `now_ms` is the activation's event time: what `last_access_ms` records.

    A Memory read from a blob is an overlay on it: the blob's entries stay inside the protobuf
    message, found through a key -> position index, and only the entries an activation touches
    move into the overlay (the most recent end). `to_blob` copies the blob in C, deletes the
    touched positions and appends the overlay, so reading and committing a large memory costs
    about one pass over its keys, not a Python object per entry.
    """

    def __init__(self, *, budget_bytes: int | None = None, now_ms: int = 0) -> None:
        self._base = MemoryBlob()
        #: key -> (position in _base, value size), for the base entries still live.
        self._index: dict[str, tuple[int, int]] = {}
        #: Base positions no longer live (touched, replaced, deleted or evicted).
        self._gone: set[int] = set()
        #: Where eviction looks next for the least recent live base entry.
        self._front = 0
        self._overlay: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._total = 0
        self.budget_bytes = budget_bytes
        self.now_ms = now_ms

    @classmethod
    def from_blob(
        cls, blob: MemoryBlob, *, budget_bytes: int | None = None, now_ms: int = 0
    ) -> Memory:
        """The memory a (current-version) MemoryBlob holds, in its order. `blob` is not
        copied and must not change while the Memory is in use."""
        memory = cls(budget_bytes=budget_bytes, now_ms=now_ms)
        memory._base = blob
        index = memory._index
        total = 0
        for position, entry in enumerate(blob.entries):
            size = len(entry.value)
            earlier = index.get(entry.key)
            if earlier is not None:  # a blob never written by to_blob: the last one wins
                memory._gone.add(earlier[0])
                total -= earlier[1]
            index[entry.key] = (position, size)
            total += size
        memory._total = total
        return memory

    def to_blob(self) -> MemoryBlob:
        """A MemoryBlob stamped with the current state schema version, least recent first."""
        blob = MemoryBlob()
        blob.CopyFrom(self._base)
        for position in sorted(self._gone, reverse=True):
            del blob.entries[position]
        for key, entry in self._overlay.items():
            blob.entries.add(key=key, value=entry.value, last_access_ms=entry.last_access_ms)
        # Set, not merged: MergeFrom skips proto3 zeros, so a total that dropped to 0 would
        # keep its old value.
        blob.state_schema_version = CURRENT_STATE_SCHEMA_VERSION
        blob.total_value_bytes = self._total
        return blob

    @property
    def total_value_bytes(self) -> int:
        return self._total

    def copy(self) -> Memory:
        """An independent Memory with the same entries, order, budget and time."""
        return Memory.from_blob(self.to_blob(), budget_bytes=self.budget_bytes, now_ms=self.now_ms)

    def get(self, key: str, default: bytes | None = None) -> bytes | None:
        entry = self._overlay.get(key)
        if entry is None:
            entry = self._lift(key)
            if entry is None:
                return default
        self._overlay.move_to_end(key)
        entry.last_access_ms = self.now_ms
        return entry.value

    def _lift(self, key: str) -> _Entry | None:
        """Moves a live base entry into the overlay (at the recent end)."""
        found = self._index.pop(key, None)
        if found is None:
            return None
        position, _ = found
        self._gone.add(position)
        base = self._base.entries[position]
        entry = self._overlay[key] = _Entry(base.value, base.last_access_ms)
        return entry

    def put(self, key: str, value: bytes) -> None:
        """Stores `value` as the most recent entry, evicting the least recent ones past the
        budget. Raises MemoryBudgetError, changing nothing, when `value` alone exceeds it."""
        if not isinstance(key, str):
            raise TypeError(f"memory keys are str, not {type(key).__name__}")
        if not isinstance(value, bytes):
            raise TypeError(f"memory values are bytes, not {type(value).__name__}")
        if self.budget_bytes is not None and len(value) > self.budget_bytes:
            raise MemoryBudgetError(key=key, size=len(value), budget=self.budget_bytes)
        self.delete(key)
        self._overlay[key] = _Entry(value, self.now_ms)
        self._total += len(value)
        if self.budget_bytes is not None:
            while self._total > self.budget_bytes:
                self._evict_least_recent()

    def _evict_least_recent(self) -> None:
        base = self._base.entries
        while self._front < len(base):
            position = self._front
            self._front += 1
            if position not in self._gone:
                key = base[position].key
                if self._index.get(key, (None,))[0] == position:
                    self._total -= self._index.pop(key)[1]
                    self._gone.add(position)
                    return
        _, evicted = self._overlay.popitem(last=False)
        self._total -= len(evicted.value)

    def delete(self, key: str) -> bool:
        entry = self._overlay.pop(key, None)
        if entry is not None:
            self._total -= len(entry.value)
            return True
        found = self._index.pop(key, None)
        if found is None:
            return False
        self._gone.add(found[0])
        self._total -= found[1]
        return True

    def __contains__(self, key: object) -> bool:
        return key in self._overlay or key in self._index

    def __len__(self) -> int:
        return len(self._overlay) + len(self._index)

    def keys(self) -> Iterator[str]:
        """Keys, least recent first (does not touch their order)."""
        live = sorted((position, key) for key, (position, _) in self._index.items())
        return iter([key for _, key in live] + list(self._overlay))


@dataclasses.dataclass
class _CacheEntry:
    response: bytes
    digest: bytes
    created_at_ms: int
    last_access_ms: int
    digest_only: bool


class ReplayCache:
    """Recorded LLM responses by cache key, LRU, within `max_entries` and `max_bytes` of
    stored responses; a response over `max_response_bytes` keeps only its SHA-256."""

    def __init__(
        self,
        *,
        max_entries: int = 256,
        max_bytes: int = 4 * 1024 * 1024,
        max_response_bytes: int = 256 * 1024,
        now_ms: int = 0,
    ) -> None:
        self._entries: collections.OrderedDict[str, _CacheEntry] = collections.OrderedDict()
        self._total = 0
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_response_bytes = max_response_bytes
        self.now_ms = now_ms

    @classmethod
    def from_blob(cls, blob: LlmCacheBlob, **limits) -> ReplayCache:
        cache = cls(**limits)
        for entry in blob.entries:
            cache._store(
                entry.cache_key,
                _CacheEntry(
                    entry.response,
                    entry.response_digest,
                    entry.created_at_ms,
                    entry.last_access_ms,
                    entry.digest_only,
                ),
            )
        cache._evict()
        return cache

    def to_blob(self) -> LlmCacheBlob:
        blob = new_state_blob(LlmCacheBlob, total_response_bytes=self._total)
        blob.entries.extend(
            LlmCacheBlob.LlmCacheEntry(
                cache_key=key,
                response=entry.response,
                response_digest=entry.digest,
                created_at_ms=entry.created_at_ms,
                last_access_ms=entry.last_access_ms,
                digest_only=entry.digest_only,
            )
            for key, entry in self._entries.items()
        )
        return blob

    @property
    def total_response_bytes(self) -> int:
        return self._total

    def get(self, key: str) -> bytes | None:
        """The recorded response, or None (a miss, or a digest-only entry)."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        entry.last_access_ms = self.now_ms
        return None if entry.digest_only else entry.response

    def digest(self, key: str) -> bytes | None:
        """The SHA-256 of the recorded response, digest-only entries included."""
        entry = self._entries.get(key)
        return None if entry is None else entry.digest

    def put(self, key: str, response: bytes) -> None:
        digest = hashlib.sha256(response).digest()
        digest_only = len(response) > self.max_response_bytes
        self._store(
            key,
            _CacheEntry(
                b"" if digest_only else response, digest, self.now_ms, self.now_ms, digest_only
            ),
        )
        self._evict()

    def _store(self, key: str, entry: _CacheEntry) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._total -= len(old.response)
        self._entries[key] = entry
        self._total += len(entry.response)

    def _evict(self) -> None:
        while len(self._entries) > self.max_entries or self._total > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._total -= len(evicted.response)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> Iterator[str]:
        return iter(list(self._entries))
