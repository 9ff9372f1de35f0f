"""An agent's working memory and its LLM replay cache: LRU maps that live in keyed state.

Both are protobuf blobs (MemoryBlob, LlmCacheBlob) between activations, written in
least-recently-used-first order so that LRU order survives a round trip without a map field.
Reading or writing an entry makes it the most recent; when a budget is exceeded the least recent
entries are evicted first, and the byte totals the blobs cache are kept exact.

Both are overlays on the blob they were read from (`_LruOverlay`): its entries stay inside the
protobuf message, and only the entries an activation touches move into an ordered overlay at the
most recent end. So an activation costs what it touches, not what the key holds:

- Finding a key costs a hash and two bisections, not a pass over the entries: every blob
  `to_blob` writes carries its index (state schema 2: `entry_stamps`, `key_hashes`,
  `key_stamps`), packed int64s that a reader takes as arrays with one copy each. A key's
  entry is found by bisecting the sorted key hashes for its stamp, then the stamps for its
  position, and is confirmed by its key, so a hash shared by two keys costs a second look.
  Only a blob without an index (one a version-1 binary wrote, or one built by hand) is read
  by a pass over its entries, once per activation, and the next `to_blob` writes its index.
- Stamps only grow along a blob (an entry's stamp is its position when the index was first
  built, or a new one when it was appended), so deleting entries renumbers nothing.
- `to_blob` of an overlay nothing changed returns the blob it was read from, so the runtime
  writes no bytes for it; otherwise it copies the blob in C, deletes the touched positions,
  appends the overlay and writes the index with the entries.

Why the index is kept in state rather than in the process: a worker's state is larger than its
memory at scale (100,000 keys of 64 KiB is 6 GB), and a key whose index was built by a pass
over a 1 MiB memory paid about ten encodings of the blob for it on every activation.

`ReplayCache` is what makes a resumed or replayed activation cheap and deterministic: an LLM
call whose key was answered before returns the recorded response without calling the model.
A response larger than `max_response_bytes` is kept as a digest only (`digest`, which says
what it was) and reads as a miss, so an activation that makes the call again pays again:
RuntimeConfig's default is the model clients' own limit, so every answer they accept replays. A
call's cache key holds its activation's seq, so
only the activation that recorded a call (its start and resumes, and a retry of its seq) can
replay it: a start, and the resume of an agent that runs again from the top, read the cache
`only_touched`, and write back the calls they made again and their new ones, with every other
field of the blob (the key's usage, its budget grants).
"""

from __future__ import annotations

import array
import bisect
import collections
import hashlib
import itertools
import sys
from collections.abc import Callable, Iterator
from typing import NamedTuple

from google.protobuf.unknown_fields import UnknownFieldSet

from beam_agents._protos import LlmCacheBlob, MemoryBlob
from beam_agents.errors import MemoryBudgetError
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION, INDEX_FIELDS

__all__ = ["Memory", "ReplayCache", "calls_dropped", "with_checked_index"]

_BIG_ENDIAN = sys.byteorder == "big"


def _key_hash(key: str) -> int:
    """The key's hash as the index stores it (see MemoryBlob.key_hashes)."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


def _unpacked(raw: bytes) -> array.array:
    values = array.array("q")
    values.frombytes(raw)
    if _BIG_ENDIAN:
        values.byteswap()
    return values


def _packed(values: array.array) -> bytes:
    if _BIG_ENDIAN:
        values = array.array("q", values)
        values.byteswap()
    return values.tobytes()


class _Index(NamedTuple):
    """Where each live key of a blob sits; never changed once built (a tuple, which is also
    cheaper to build than a frozen dataclass: an activation builds one for each blob it reads).

    `stamps[position]` grows with the position; `hashes` are the live keys' hashes, ascending,
    and `owners[i]` the stamp of the entry `hashes[i]` belongs to. `dead` holds positions a
    later entry of the same key shadows (only in blobs without an index, which `to_blob` did
    not write); `live` counts the live keys and `total` their sizes; `kept` is whether the
    blob carried it (else it was built by a pass over the entries)."""

    stamps: array.array
    hashes: array.array
    owners: array.array
    dead: frozenset[int]
    total: int
    live: int
    kept: bool

    @property
    def next_stamp(self) -> int:
        return self.stamps[-1] + 1 if self.stamps else 0


class _LruOverlay:
    """The LRU logic Memory and ReplayCache share: entries of type `_ENTRY` in a blob's
    repeated `entries`, keyed by the `_KEY` field, sized by `_size`, their sizes' sum kept in
    the `_TOTAL` field."""

    _ENTRY: type
    _KEY: str
    _TOTAL: str
    _size: Callable[[object], int]

    def __init__(self, base, now_ms: int) -> None:
        self._base = base
        self._index: _Index | None = None
        #: Base positions no longer live (touched, replaced, deleted or evicted): their keys.
        self._gone: dict[int, str] = {}
        self._dropped: set[str] = set()
        #: Where eviction looks next for the least recent live base entry.
        self._front = 0
        self._overlay: collections.OrderedDict[str, object] = collections.OrderedDict()
        #: The total minus the base's live total when read.
        self._delta = 0
        #: Key hashes this overlay computed: a touched key's is needed again at the commit.
        self._hashes: dict[str, int] = {}
        #: Whether anything (order, times, entries) differs from the base.
        self.changed = False
        self.now_ms = now_ms

    def _built(self) -> _Index:
        index = self._index
        if index is None:
            index = self._index = self._kept_index() or self._read_index()
        return index

    def _kept_index(self) -> _Index | None:
        """The index the blob carries, or None when it carries none that fits its entries.
        Only its sizes are checked: its order is the writer's, and a key found through it is
        confirmed by the entry's own key."""
        base = self._base
        count = len(base.entries)
        stamps, hashes, owners = base.entry_stamps, base.key_hashes, base.key_stamps
        if not len(stamps) == len(hashes) == len(owners) == 8 * count:
            return None
        return _Index(
            _unpacked(stamps),
            _unpacked(hashes),
            _unpacked(owners),
            frozenset(),
            # An empty blob holds nothing, whatever total it carries (a snapshot whose entries
            # were deleted by hand, their total left): trusted, that total would have eviction
            # run on nothing left to evict.
            getattr(base, self._TOTAL) if count else 0,
            count,
            kept=True,
        )

    def _read_index(self) -> _Index:
        """The index of a blob that carries none: a pass over its entries. A key written twice
        (no writer of ours does that) is its last entry, as a plain LRU replaying the blob
        would have it."""
        last: dict[str, int] = {}
        dead: set[int] = set()
        total = 0
        size, field = type(self)._size, self._KEY
        entries = self._base.entries
        for position, entry in enumerate(entries):
            key = getattr(entry, field)
            earlier = last.get(key)
            if earlier is not None:
                dead.add(earlier)
                total -= size(entries[earlier])
            last[key] = position
            total += size(entry)
        slots = sorted((_key_hash(key), position) for key, position in last.items())
        return _Index(
            array.array("q", range(len(entries))),
            array.array("q", [hashed for hashed, _ in slots]),
            array.array("q", [position for _, position in slots]),
            frozenset(dead),
            total,
            len(last),
            kept=False,
        )

    @classmethod
    def _fits(cls, blob) -> bool:
        """Whether `blob`'s index is exactly the one `to_blob` writes for its entries, and its
        total their sizes' sum."""
        entries = blob.entries
        keys = [getattr(entry, cls._KEY) for entry in entries]
        count = len(keys)
        stamps, hashes, owners = (getattr(blob, field) for field in INDEX_FIELDS)
        if not len(stamps) == len(hashes) == len(owners) == 8 * count:
            return False
        stamps = _unpacked(stamps)
        # Two entries of one key would need two slots of one hash, which the pairs compared
        # below never hold for distinct keys, so no separate check for them.
        return (
            all(a < b for a, b in itertools.pairwise(stamps))
            and list(zip(_unpacked(hashes), _unpacked(owners), strict=True))
            == sorted(zip(map(_key_hash, keys), stamps, strict=True))
            and getattr(blob, cls._TOTAL) == sum(map(cls._size, entries))
        )

    def _position(self, key: str) -> int | None:
        """The live base position of `key`, if it has one."""
        if key in self._dropped:
            return None
        index = self._built()
        hashes = index.hashes
        hashed = self._hash(key)
        slot = bisect.bisect_left(hashes, hashed)
        while slot < len(hashes) and hashes[slot] == hashed:
            stamps, stamp = index.stamps, index.owners[slot]
            position = bisect.bisect_left(stamps, stamp)
            if (
                position < len(stamps)
                and stamps[position] == stamp
                and getattr(self._base.entries[position], self._KEY) == key
            ):
                return position
            slot += 1
        return None

    def _hash(self, key: str) -> int:
        hashed = self._hashes.get(key)
        if hashed is None:
            hashed = self._hashes[key] = _key_hash(key)
        return hashed

    def _drop(self, key: str, position: int):
        """Takes a live base entry out of the base; returns it."""
        self._dropped.add(key)
        self._gone[position] = key
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

    def _write(self):
        """The blob to store: the base itself when nothing changed and it needs no index of
        its own, else a new one with its index."""
        base = self._base
        index = self._index
        if (
            not self.changed
            and base.state_schema_version == CURRENT_STATE_SCHEMA_VERSION
            and (index is None or index.kept)
        ):
            return base
        index = self._built()
        blob = type(base)()
        blob.CopyFrom(base)
        # One container for every edit: each attribute access builds a new one in upb.
        entries = blob.entries
        stamps = array.array("q", index.stamps)
        gone = self._gone
        for position in sorted(gone.keys() | index.dead if index.dead else gone, reverse=True):
            del entries[position]
            del stamps[position]
        hashes, owners = array.array("q", index.hashes), array.array("q", index.owners)
        for position, key in gone.items():
            hashed, owner = self._hash(key), index.stamps[position]
            slot = bisect.bisect_left(hashes, hashed)
            while slot < len(hashes) and hashes[slot] == hashed:
                if owners[slot] == owner:
                    del hashes[slot]
                    del owners[slot]
                    break
                slot += 1
            # Not found only in an index that does not fit its entries: what stays then makes
            # the index's size differ from the entries', and the next read builds it afresh.
        stamp = index.next_stamp
        for key in self._overlay:
            hashed = self._hash(key)
            slot = bisect.bisect_right(hashes, hashed)
            hashes.insert(slot, hashed)
            owners.insert(slot, stamp)
            stamps.append(stamp)
            stamp += 1
        entries.extend(self._overlay.values())
        blob.state_schema_version = CURRENT_STATE_SCHEMA_VERSION
        # Set, not merged: MergeFrom skips proto3 zeros, so a total that dropped to 0 would
        # keep its old value.
        setattr(blob, self._TOTAL, index.total + self._delta)
        blob.entry_stamps = _packed(stamps)
        blob.key_hashes = _packed(hashes)
        blob.key_stamps = _packed(owners)
        return blob

    def __contains__(self, key: object) -> bool:
        return key in self._overlay or self._position(key) is not None

    def __len__(self) -> int:
        return self._built().live - len(self._dropped) + len(self._overlay)

    def keys(self) -> Iterator[str]:
        """Keys, least recent first (does not touch their order)."""
        skip = self._gone.keys() | self._built().dead
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
    _TOTAL = "total_value_bytes"

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
        """The memory a (current-version) MemoryBlob holds, in its order, within `budget_bytes`
        (a blob over it, restored from a snapshot or written under a larger budget, is evicted
        down at once, least recent first, as ReplayCache does). `blob` is not copied and must
        not change while the Memory is in use."""
        memory = cls(budget_bytes=budget_bytes, now_ms=now_ms)
        memory._base = blob
        # The stored total decides only whether to look closer, and only in a blob with its
        # index: one without (a migration step's output) may carry a total its step did not
        # keep. The check itself is exact.
        if budget_bytes is not None and (
            blob.total_value_bytes > budget_bytes or (blob.entries and not blob.entry_stamps)
        ):
            while memory._total() > budget_bytes:
                memory._evict_least_recent()
        return memory

    def to_blob(self) -> MemoryBlob:
        """A MemoryBlob stamped with the current state schema version, least recent first:
        the blob read itself when nothing changed (`changed`)."""
        return self._write()

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


#: The fields of an LlmCacheBlob that hold its recorded calls.
_CALL_FIELDS = frozenset({"entries", "total_response_bytes", *INDEX_FIELDS})


class ReplayCache(_LruOverlay):
    """Recorded LLM responses by cache key, LRU, within `max_entries` and `max_bytes` of
    stored responses; a response over `max_response_bytes` keeps only its SHA-256."""

    _ENTRY = LlmCacheBlob.LlmCacheEntry
    _KEY = "cache_key"
    _TOTAL = "total_response_bytes"

    @staticmethod
    def _size(entry) -> int:
        return len(entry.response)

    def __init__(
        self,
        *,
        max_entries: int = 256,
        max_bytes: int = 4 * 1024 * 1024,
        max_response_bytes: int = 1024 * 1024,
        now_ms: int = 0,
    ) -> None:
        super().__init__(LlmCacheBlob(), now_ms)
        self._only_touched = False
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_response_bytes = max_response_bytes

    @classmethod
    def from_blob(cls, blob: LlmCacheBlob, *, only_touched: bool = False, **limits) -> ReplayCache:
        """The cache a (current-version) LlmCacheBlob holds, within `limits` (a blob over
        them is evicted down at once). `blob` is not copied and must not change while the
        cache is in use. With `only_touched`, a changed cache writes back only the calls it
        answered or recorded (for an activation that makes again every call it can need)."""
        cache = cls(**limits)
        cache._base = blob
        cache._only_touched = only_touched
        # The stored total decides only whether to look closer, and only in a blob with its
        # index, as in Memory.from_blob. The check itself is exact.
        if (
            len(blob.entries) > cache.max_entries
            or blob.total_response_bytes > cache.max_bytes
            or (blob.entries and not blob.entry_stamps)
        ):
            cache._evict()
        return cache

    def to_blob(self) -> LlmCacheBlob:
        """An LlmCacheBlob stamped with the current state schema version, least recent first:
        the blob read itself when nothing changed (`changed`)."""
        if not (self._only_touched and self.changed):
            return self._write()
        kept = ReplayCache.without_calls(
            self._base,
            max_entries=self.max_entries,
            max_bytes=self.max_bytes,
            max_response_bytes=self.max_response_bytes,
            now_ms=self.now_ms,
        )
        for key, entry in self._overlay.items():
            kept._store(key, entry)
        return kept._write()

    @classmethod
    def without_calls(cls, blob: LlmCacheBlob, **limits) -> ReplayCache:
        """A cache over every field of `blob` but its recorded calls (and their total and
        index): the key's usage and budget grants, which outlive the activations they count.
        What an `only_touched` cache writes its calls onto: the calls it left untouched are
        earlier activations', whose keys hold another seq, and keeping them would only make
        each commit of the cache copy and encode them. `blob` is read, never changed.

        Fields a newer binary added are kept (`calls_dropped`)."""
        return cls.from_blob(calls_dropped(blob), **limits)

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


def calls_dropped(blob: LlmCacheBlob) -> LlmCacheBlob:
    """A new LlmCacheBlob with every field of `blob` but its recorded calls (and their total and
    index). Fields a newer binary added (unknown here) are kept, as every other writer of the
    blob keeps them: a roll-back must not zero what the newer binary counts there. Only then is
    the blob copied whole, its calls with it, and those cleared."""
    kept = LlmCacheBlob()
    if UnknownFieldSet(blob):
        kept.CopyFrom(blob)
        for name in _CALL_FIELDS:
            kept.ClearField(name)
    else:
        for field, value in blob.ListFields():
            if field.name not in _CALL_FIELDS:
                setattr(kept, field.name, value)
    return kept


def with_checked_index(blob):
    """`blob` (a MemoryBlob or LlmCacheBlob) itself when it has no entry index or one that
    describes its entries exactly, else a copy without the index. For blobs from outside the
    runtime, such as a restored snapshot, which people may have edited since the index was
    written: readers check only the index's size, and an index that no longer fits its
    entries would hide keys. The check is a pass over the entries, once per restore; a copy
    without the index is read by a pass at its first lookup, and its next commit writes one."""
    overlay = Memory if isinstance(blob, MemoryBlob) else ReplayCache
    if not any(getattr(blob, field) for field in INDEX_FIELDS) or overlay._fits(blob):
        return blob
    copy = type(blob)()
    copy.CopyFrom(blob)
    for field in INDEX_FIELDS:
        copy.ClearField(field)
    return copy
