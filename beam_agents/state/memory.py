"""An agent's working memory and its LLM replay cache: LRU maps that live in keyed state.

Both are protobuf blobs (MemoryBlob, LlmCacheBlob) between activations, written in
least-recently-used-first order so that LRU order survives a round trip without a map field.
Reading or writing an entry makes it the most recent; when a budget is exceeded the least recent
entries are evicted first, and the byte totals the blobs cache are kept exact.

Both are overlays on the blob they were read from (`_LruOverlay`): its entries stay inside the
protobuf message, and only the entries an activation touches move into an ordered overlay at the
most recent end. So an activation costs what it touches, not what the key holds:

- Reading is free: the key -> position index is built on the first lookup, or not at all when
  the blob came from `to_blob` in this process (the index of what it wrote is derived from the
  one it read, and a small bounded table keyed by the blob object keeps it; a portable SDK
  harness hands the very object back to the next activation of the key).
- Positions come from stamps that only grow along a blob (an entry's stamp is its position when
  the index was first built, or when it was appended), so deleting entries shifts no index.
- `to_blob` of an overlay nothing changed returns the blob it was read from, so the runtime
  writes no bytes for it; otherwise it copies the blob in C, deletes the touched positions and
  appends the overlay.

`ReplayCache` is what makes a resumed or replayed activation cheap and deterministic: an LLM
call whose key was answered before returns the recorded response without calling the model.
A response larger than `max_response_bytes` is kept as a digest only, so the cache can tell a
replay that diverged, but it reads as a miss.
"""

from __future__ import annotations

import array
import bisect
import collections
import dataclasses
import hashlib
import math
import threading
from collections.abc import Callable, Iterator

from beam_agents._protos import LlmCacheBlob, MemoryBlob
from beam_agents.errors import MemoryBudgetError
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION

__all__ = ["Memory", "ReplayCache", "share_index"]


@dataclasses.dataclass(frozen=True)
class _Index:
    """Where each live key of a blob sits. Shared by every overlay on the blob: never changed.

    A key's stamp is in `recent` (-1: no longer live), else in `keys`; `keys` is shared along a
    key's blobs and `recent` holds what changed since it was built, folded into a new `keys`
    once it outgrows about the square root of it, so a commit copies O(sqrt(n)) of the index,
    not all of it. `stamps[position]` grows with the position, so a key's position is the
    bisection of its stamp; `dead` holds positions a later entry of the same key shadows (only
    in blobs that `to_blob` did not write); `live` counts the live keys."""

    keys: dict[str, int]
    recent: dict[str, int]
    live: int
    stamps: array.array  # of int64: 8 bytes a stamp, no int object each
    dead: frozenset[int]
    total: int
    next_stamp: int

    def stamp(self, key: str) -> int | None:
        stamp = self.recent.get(key)
        if stamp is None:
            return self.keys.get(key)
        return stamp if stamp >= 0 else None


class _Indexes:
    """Indexes of recently written blobs by object identity, bounded by the bytes they hold:
    the index (about 106 bytes an entry) and the blob itself, values and event marks
    included. It holds each blob strongly, so an identity is never reused while its index is
    here (protobuf messages take no weak references).

    A blob written in place of another (`put(..., replacing=old)`) drops the old one's index:
    the key's state moved on, so the table holds about one blob per recently active key rather
    than every version each key ever wrote (which held their bytes, event marks included, until
    the bound pushed them out). Should state go back to the old blob (a failed bundle), its
    index is built again on its first lookup."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._held = 0
        self._lock = threading.Lock()
        self._table: collections.OrderedDict[int, tuple[object, _Index, int]] = (
            collections.OrderedDict()
        )

    def get(self, blob) -> _Index | None:
        with self._lock:
            found = self._table.get(id(blob))
            if found is None or found[0] is not blob:
                return None
            self._table.move_to_end(id(blob))
        index = found[1]
        # A blob changed after it was written (entries added or removed) is read afresh.
        return index if len(index.stamps) == len(blob.entries) else None

    def put(self, blob, index: _Index, replacing=None) -> None:
        # Kept with the blob, so eviction takes back exactly what the put counted (the
        # activation's event marks, added after the put, are not counted: one activation's).
        size = _ENTRY_BYTES * (len(index.stamps) + 1) + index.total
        size += len(getattr(blob, "event_marks", b""))
        with self._lock:
            if replacing is not None and replacing is not blob:
                self._pop(replacing)
            if size > self._max:
                return
            self._pop(blob)
            self._table[id(blob)] = (blob, index, size)
            self._held += size
            while self._held > self._max:
                _, (_, _, evicted) = self._table.popitem(last=False)
                self._held -= evicted

    def _pop(self, blob) -> None:
        found = self._table.get(id(blob))
        if found is not None and found[0] is blob:
            del self._table[id(blob)]
            self._held -= found[2]


#: What an index costs a memory entry (measured: 106 bytes).
_ENTRY_BYTES = 106
# 128 MB of indexes and the blobs they hold, about what a portable harness's state cache holds
# by default (100 MB), so that a key whose blob the harness hands back still finds its index.
# Where reads decode their bytes (the DirectRunner, RocksDB, a harness cache miss) each
# version is a new blob, and this bound is what keeps them from filling the worker. A key
# past it rebuilds its index on its first lookup: a pass over its entries that costs some ten
# encodings of the blob.
_INDEXES = _Indexes(128 << 20)


def share_index(copy, source) -> None:
    """Gives `copy`, a blob written in place of `source` with `source`'s entries unchanged (a
    CopyFrom that changed only other fields), `source`'s index."""
    index = _INDEXES.get(source)
    if index is not None:
        _INDEXES.put(copy, index, replacing=source)


class _LruOverlay:
    """The LRU logic Memory and ReplayCache share: entries of type `_ENTRY` in a blob's
    repeated `entries`, keyed by the `_KEY` field, sized by `_size`."""

    _ENTRY: type
    _KEY: str
    _size: Callable[[object], int]

    def __init__(self, base, now_ms: int) -> None:
        self._base = base
        self._index: _Index | None = None
        #: Base positions no longer live (touched, replaced, deleted or evicted) and their keys.
        self._gone: set[int] = set()
        self._dropped: set[str] = set()
        #: Where eviction looks next for the least recent live base entry.
        self._front = 0
        self._overlay: collections.OrderedDict[str, object] = collections.OrderedDict()
        #: The total minus the base's live total when read.
        self._delta = 0
        #: Whether anything (order, times, entries) differs from the base.
        self.changed = False
        self.now_ms = now_ms

    def _built(self) -> _Index:
        index = self._index
        if index is None:
            index = _INDEXES.get(self._base)
            if index is None:
                index = self._read_index()
                _INDEXES.put(self._base, index)
            self._index = index
        return index

    def _read_index(self) -> _Index:
        keys: dict[str, int] = {}
        dead: set[int] = set()
        total = 0
        size, field = type(self)._size, self._KEY
        entries = self._base.entries
        for position, entry in enumerate(entries):
            key = getattr(entry, field)
            earlier = keys.get(key)
            if earlier is not None:  # a blob never written by to_blob: the last one wins
                dead.add(earlier)
                total -= size(entries[earlier])
            keys[key] = position
            total += size(entry)
        positions = array.array("q", range(len(entries)))
        return _Index(keys, {}, len(keys), positions, frozenset(dead), total, len(entries))

    def _position(self, key: str) -> int | None:
        """The live base position of `key`, if it has one."""
        if key in self._dropped:
            return None
        index = self._built()
        stamp = index.stamp(key)
        return None if stamp is None else bisect.bisect_left(index.stamps, stamp)

    def _drop(self, key: str, position: int):
        """Takes a live base entry out of the base; returns it."""
        self._dropped.add(key)
        self._gone.add(position)
        self.changed = True
        return self._base.entries[position]

    def _touch(self, key: str):
        """The entry of `key` as the most recent one (lifted from the base), or None."""
        entry = self._overlay.get(key)
        if entry is None:
            position = self._position(key)
            if position is None:
                return None
            entry = self._overlay[key] = self._ENTRY()
            entry.CopyFrom(self._drop(key, position))
        else:
            self._overlay.move_to_end(key)
        self.changed = True
        return entry

    def _peek(self, key: str):
        """The entry of `key` without touching its order, or None."""
        entry = self._overlay.get(key)
        if entry is None:
            position = self._position(key)
            if position is not None:
                entry = self._base.entries[position]
        return entry

    def _remove(self, key: str) -> bool:
        entry = self._overlay.pop(key, None)
        if entry is None:
            position = self._position(key)
            if position is None:
                return False
            entry = self._drop(key, position)
        self._delta -= type(self)._size(entry)
        self.changed = True
        return True

    def _store(self, key: str, entry) -> None:
        self._remove(key)
        self._overlay[key] = entry
        self._delta += type(self)._size(entry)
        self.changed = True

    def _evict_least_recent(self) -> None:
        index, base = self._built(), self._base.entries
        while self._front < len(base):
            position = self._front
            self._front += 1
            if position not in self._gone and position not in index.dead:
                entry = self._drop(getattr(base[position], self._KEY), position)
                self._delta -= type(self)._size(entry)
                return
        _, evicted = self._overlay.popitem(last=False)
        self._delta -= type(self)._size(evicted)
        self.changed = True

    def _total(self) -> int:
        return self._built().total + self._delta

    def _write(self, total_field: str):
        """The blob to store: the base itself when nothing changed, else a new one."""
        base = self._base
        if not self.changed and base.state_schema_version == CURRENT_STATE_SCHEMA_VERSION:
            return base
        index = self._built()
        blob = type(base)()
        blob.CopyFrom(base)
        removed = sorted(self._gone | index.dead, reverse=True)
        stamps = index.stamps
        if removed:
            stamps = array.array("q", stamps)
            for position in removed:
                del blob.entries[position]
                del stamps[position]
        blob.entries.extend(self._overlay.values())
        blob.state_schema_version = CURRENT_STATE_SCHEMA_VERSION
        total = index.total + self._delta
        # Set, not merged: MergeFrom skips proto3 zeros, so a total that dropped to 0 would
        # keep its old value.
        setattr(blob, total_field, total)
        keys, recent = index.keys, dict(index.recent)
        for key in self._dropped:
            recent[key] = -1
        stamp = index.next_stamp
        if self._overlay:
            stamps = stamps if removed else array.array("q", stamps)
            for key in self._overlay:
                recent[key] = stamp
                stamps.append(stamp)
                stamp += 1
        if len(recent) > 16 + math.isqrt(len(keys)):
            keys = dict(keys)
            for key, at in recent.items():
                if at < 0:
                    keys.pop(key, None)
                else:
                    keys[key] = at
            recent = {}
        live = index.live - len(self._dropped) + len(self._overlay)
        _INDEXES.put(
            blob, _Index(keys, recent, live, stamps, frozenset(), total, stamp), replacing=base
        )
        return blob

    def __contains__(self, key: object) -> bool:
        return key in self._overlay or self._position(key) is not None

    def __len__(self) -> int:
        return self._built().live - len(self._dropped) + len(self._overlay)

    def keys(self) -> Iterator[str]:
        """Keys, least recent first (does not touch their order)."""
        skip = self._gone | self._built().dead
        field = self._KEY
        live = [
            getattr(entry, field)
            for position, entry in enumerate(self._base.entries)
            if position not in skip
        ]
        return iter(live + list(self._overlay))


class Memory(_LruOverlay):
    """String keys to bytes values in LRU order, within `budget_bytes` of values.

    `now_ms` is the activation's event time: what `last_access_ms` records. A Memory read
    from a blob is an overlay on it (see the module docstring)."""

    _ENTRY = MemoryBlob.MemoryEntry
    _KEY = "key"

    @staticmethod
    def _size(entry) -> int:
        return len(entry.value)

    def __init__(self, *, budget_bytes: int | None = None, now_ms: int = 0) -> None:
        super().__init__(MemoryBlob(), now_ms)
        self.budget_bytes = budget_bytes

    @classmethod
    def from_blob(
        cls, blob: MemoryBlob, *, budget_bytes: int | None = None, now_ms: int = 0
    ) -> Memory:
        """The memory a (current-version) MemoryBlob holds, in its order. `blob` is not
        copied and must not change while the Memory is in use."""
        memory = cls(budget_bytes=budget_bytes, now_ms=now_ms)
        memory._base = blob
        return memory

    def to_blob(self) -> MemoryBlob:
        """A MemoryBlob stamped with the current state schema version, least recent first:
        the blob read itself when nothing changed (`changed`)."""
        return self._write("total_value_bytes")

    @property
    def total_value_bytes(self) -> int:
        return self._total()

    def copy(self) -> Memory:
        """An independent Memory with the same entries, order, budget and time."""
        return Memory.from_blob(self.to_blob(), budget_bytes=self.budget_bytes, now_ms=self.now_ms)

    def get(self, key: str, default: bytes | None = None) -> bytes | None:
        entry = self._touch(key)
        if entry is None:
            return default
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
        self._store(key, self._ENTRY(key=key, value=value, last_access_ms=self.now_ms))
        if self.budget_bytes is not None:
            while self._total() > self.budget_bytes:
                self._evict_least_recent()

    def delete(self, key: str) -> bool:
        return self._remove(key)


class ReplayCache(_LruOverlay):
    """Recorded LLM responses by cache key, LRU, within `max_entries` and `max_bytes` of
    stored responses; a response over `max_response_bytes` keeps only its SHA-256."""

    _ENTRY = LlmCacheBlob.LlmCacheEntry
    _KEY = "cache_key"

    @staticmethod
    def _size(entry) -> int:
        return len(entry.response)

    def __init__(
        self,
        *,
        max_entries: int = 256,
        max_bytes: int = 4 * 1024 * 1024,
        max_response_bytes: int = 256 * 1024,
        now_ms: int = 0,
    ) -> None:
        super().__init__(LlmCacheBlob(), now_ms)
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_response_bytes = max_response_bytes

    @classmethod
    def from_blob(cls, blob: LlmCacheBlob, **limits) -> ReplayCache:
        """The cache a (current-version) LlmCacheBlob holds, within `limits` (a blob over
        them is evicted down at once). `blob` is not copied and must not change while the
        cache is in use."""
        cache = cls(**limits)
        cache._base = blob
        # The stored total decides only whether to look closer; the check itself is exact.
        if len(blob.entries) > cache.max_entries or blob.total_response_bytes > cache.max_bytes:
            cache._evict()
        return cache

    def to_blob(self) -> LlmCacheBlob:
        """An LlmCacheBlob stamped with the current state schema version, least recent first:
        the blob read itself when nothing changed (`changed`)."""
        return self._write("total_response_bytes")

    @property
    def total_response_bytes(self) -> int:
        return self._total()

    def get(self, key: str) -> bytes | None:
        """The recorded response, or None (a miss, or a digest-only entry)."""
        entry = self._touch(key)
        if entry is None:
            return None
        entry.last_access_ms = self.now_ms
        return None if entry.digest_only else entry.response

    def digest(self, key: str) -> bytes | None:
        """The SHA-256 of the recorded response, digest-only entries included."""
        entry = self._peek(key)
        return None if entry is None else entry.response_digest

    def put(self, key: str, response: bytes) -> None:
        digest_only = len(response) > self.max_response_bytes
        self._store(
            key,
            self._ENTRY(
                cache_key=key,
                response=b"" if digest_only else response,
                response_digest=hashlib.sha256(response).digest(),
                created_at_ms=self.now_ms,
                last_access_ms=self.now_ms,
                digest_only=digest_only,
            ),
        )
        self._evict()

    def _evict(self) -> None:
        while len(self) > self.max_entries or self._total() > self.max_bytes:
            self._evict_least_recent()
