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
from beam_agents.core.migration import new_state_blob
from beam_agents.errors import MemoryBudgetError

__all__ = ["Memory", "ReplayCache"]


@dataclasses.dataclass
class _Entry:
    value: bytes
    last_access_ms: int


class Memory:
    """String keys to bytes values in LRU order, within `budget_bytes` of values.

    `now_ms` is the activation's event time: what `last_access_ms` records.
    """

    def __init__(self, *, budget_bytes: int | None = None, now_ms: int = 0) -> None:
        self._entries: collections.OrderedDict[str, _Entry] = collections.OrderedDict()
        self._total = 0
        self.budget_bytes = budget_bytes
        self.now_ms = now_ms

    @classmethod
    def from_blob(
        cls, blob: MemoryBlob, *, budget_bytes: int | None = None, now_ms: int = 0
    ) -> Memory:
        """The memory a (current-version) MemoryBlob holds, in its order."""
        memory = cls(budget_bytes=budget_bytes, now_ms=now_ms)
        for entry in blob.entries:
            if entry.key in memory._entries:  # a blob never written by to_blob: last one wins
                memory._total -= len(memory._entries.pop(entry.key).value)
            memory._entries[entry.key] = _Entry(entry.value, entry.last_access_ms)
            memory._total += len(entry.value)
        return memory

    def to_blob(self) -> MemoryBlob:
        """A MemoryBlob stamped with the current state schema version, least recent first."""
        blob = new_state_blob(MemoryBlob, total_value_bytes=self._total)
        blob.entries.extend(
            MemoryBlob.MemoryEntry(key=key, value=entry.value, last_access_ms=entry.last_access_ms)
            for key, entry in self._entries.items()
        )
        return blob

    @property
    def total_value_bytes(self) -> int:
        return self._total

    def get(self, key: str, default: bytes | None = None) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return default
        self._entries.move_to_end(key)
        entry.last_access_ms = self.now_ms
        return entry.value

    def put(self, key: str, value: bytes) -> None:
        """Stores `value` as the most recent entry, evicting the least recent ones past the
        budget. Raises MemoryBudgetError, changing nothing, when `value` alone exceeds it."""
        if not isinstance(key, str):
            raise TypeError(f"memory keys are str, not {type(key).__name__}")
        if not isinstance(value, bytes):
            raise TypeError(f"memory values are bytes, not {type(value).__name__}")
        if self.budget_bytes is not None and len(value) > self.budget_bytes:
            raise MemoryBudgetError(key=key, size=len(value), budget=self.budget_bytes)
        old = self._entries.pop(key, None)
        if old is not None:
            self._total -= len(old.value)
        self._entries[key] = _Entry(value, self.now_ms)
        self._total += len(value)
        if self.budget_bytes is not None:
            while self._total > self.budget_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._total -= len(evicted.value)

    def delete(self, key: str) -> bool:
        entry = self._entries.pop(key, None)
        if entry is None:
            return False
        self._total -= len(entry.value)
        return True

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> Iterator[str]:
        """Keys, least recent first (does not touch their order)."""
        return iter(list(self._entries))


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
