"""Memory and ReplayCache: LRU order, budgets, exact totals, blob round trips, and the index
each written blob carries."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import struct
import types

import pytest
from google.protobuf.unknown_fields import UnknownFieldSet
from hypothesis import given, settings
from hypothesis import strategies as st

from beam_agents._protos import LlmCacheBlob, MemoryBlob
from beam_agents.errors import MemoryBudgetError
from beam_agents.state import memory as memory_module
from beam_agents.state.memory import Memory, ReplayCache, with_checked_index
from beam_agents.state.migration import (
    CURRENT_STATE_SCHEMA_VERSION,
    INDEX_FIELDS,
    MigrationRegistry,
    MigrationStep,
    default_registry,
)


def _blake2b_key_hash(key: str) -> int:
    return int.from_bytes(
        hashlib.blake2b(key.encode(), digest_size=8).digest(), "little", signed=True
    )


def assert_index_fits(blob, key_field: str = "key", key_hash=_blake2b_key_hash) -> None:
    """The blob's index is what protos/beam_agents.proto says it is, read with struct and
    hashlib rather than the code under test: one little-endian int64 of each field per entry,
    stamps strictly increasing, hashes ascending, each entry's key hash beside its stamp."""
    count = len(blob.entries)
    stamps, hashes, owners = (
        struct.unpack(f"<{count}q", getattr(blob, field))
        for field in ("entry_stamps", "key_hashes", "key_stamps")
    )
    assert all(a < b for a, b in itertools.pairwise(stamps))
    assert list(hashes) == sorted(hashes)
    expected = sorted(
        (key_hash(getattr(e, key_field)), stamp)
        for e, stamp in zip(blob.entries, stamps, strict=True)
    )
    assert sorted(zip(hashes, owners, strict=True)) == expected


def test_reads_and_writes_make_an_entry_the_most_recent():
    memory = Memory(now_ms=10)
    for key in ("a", "b", "c"):
        memory.put(key, key.encode())
    memory.now_ms = 20
    assert memory.get("a") == b"a"
    assert list(memory.keys()) == ["b", "c", "a"]
    blob = memory.to_blob()
    assert [(e.key, e.last_access_ms) for e in blob.entries] == [("b", 10), ("c", 10), ("a", 20)]
    assert blob.state_schema_version == CURRENT_STATE_SCHEMA_VERSION


def test_the_budget_evicts_the_least_recent_entries():
    memory = Memory(budget_bytes=10)
    memory.put("a", b"1234")
    memory.put("b", b"1234")
    memory.get("a")
    memory.put("c", b"1234")  # 12 bytes: "b", the least recent, goes
    assert list(memory.keys()) == ["a", "c"] and memory.total_value_bytes == 8


def test_a_value_over_the_whole_budget_is_refused_and_changes_nothing():
    memory = Memory(budget_bytes=4)
    memory.put("a", b"12")
    with pytest.raises(MemoryBudgetError) as raised:
        memory.put("b", b"12345")
    assert (raised.value.key, raised.value.size, raised.value.budget) == ("b", 5, 4)
    assert list(memory.keys()) == ["a"] and memory.total_value_bytes == 2


def test_a_value_of_exactly_the_budget_fits():
    memory = Memory(budget_bytes=4)
    memory.put("a", b"1234")
    assert list(memory.keys()) == ["a"] and memory.total_value_bytes == 4


def test_a_missing_key_reads_as_the_default_given():
    memory = Memory()
    memory.put("a", b"1")
    assert memory.get("missing", b"default") == b"default" and memory.get("missing") is None


@pytest.mark.parametrize(("key", "value"), [(b"k", b"v"), ("k", "v"), (1, b"v")])
def test_keys_are_strings_and_values_bytes(key, value):
    with pytest.raises(TypeError):
        Memory().put(key, value)


operations = st.lists(
    st.tuples(
        st.sampled_from(["put", "get", "delete"]),
        st.sampled_from("abcdefgh"),
        st.binary(max_size=12),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(operations, st.one_of(st.none(), st.integers(12, 60)))
def test_the_total_is_always_exact_and_the_blob_round_trips(ops, budget):
    memory = Memory(budget_bytes=budget)
    for now, (op, key, value) in enumerate(ops):
        memory.now_ms = now
        getattr(memory, op)(*((key, value) if op == "put" else (key,)))
        blob = memory.to_blob()
        assert memory.total_value_bytes == sum(len(e.value) for e in blob.entries)
        assert blob.total_value_bytes == memory.total_value_bytes
        assert budget is None or memory.total_value_bytes <= budget
        assert_index_fits(blob)
    again = Memory.from_blob(MemoryBlob.FromString(memory.to_blob().SerializeToString()))
    assert again.to_blob() == memory.to_blob()


class ReferenceLru:
    """The obvious LRU, to check the overlay against."""

    def __init__(self, entries, budget):
        self.entries = {}
        for key, value, at in entries:
            self.entries.pop(key, None)
            self.entries[key] = (value, at)
        self.budget = budget

    def get(self, key, now):
        if key in self.entries:
            value, _ = self.entries.pop(key)
            self.entries[key] = (value, now)

    def put(self, key, value, now):
        if self.budget is not None and len(value) > self.budget:
            return
        self.entries.pop(key, None)
        self.entries[key] = (value, now)
        self.read()

    def read(self):
        """What reading the entries as a blob leaves: over the budget (restored, or written
        under a larger one), evicted down, least recent first."""
        while (
            self.budget is not None and sum(len(v) for v, _ in self.entries.values()) > self.budget
        ):
            del self.entries[next(iter(self.entries))]

    def delete(self, key, now):
        self.entries.pop(key, None)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("abcdefgh"), st.binary(max_size=8), st.integers(0, 9)),
        max_size=12,
    ),
    operations,
    st.one_of(st.none(), st.integers(8, 40)),
)
def test_memory_read_from_a_blob_behaves_as_a_plain_lru(initial, ops, budget):
    blob = MemoryBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION)
    for key, value, at in initial:
        blob.entries.add(key=key, value=value, last_access_ms=at)
    blob.total_value_bytes = sum(len(e.value) for e in blob.entries)
    memory = Memory.from_blob(blob, budget_bytes=budget)
    reference = ReferenceLru(initial, budget)
    reference.read()
    for now, (op, key, value) in enumerate(ops, start=100):
        memory.now_ms = now
        args = (key, value) if op == "put" else (key,)
        with contextlib.suppress(MemoryBudgetError):  # the reference skips it too
            getattr(memory, op)(*args)
        getattr(reference, op)(*args, now)
        assert list(memory.keys()) == list(reference.entries)
    written = memory.to_blob()
    assert memory.total_value_bytes == sum(len(v) for v, _ in reference.entries.values())
    assert len(memory) == len(reference.entries)
    if not memory.changed:
        # Nothing to write but, where a key was looked up in this blob without an index (or
        # its budget was checked: against an index-less blob's entries, or a stored total over
        # it), the index that built; else the blob read is the blob written, untouched.
        if written is not blob:
            over = budget is not None and (
                blob.total_value_bytes > budget or (blob.entries and not blob.entry_stamps)
            )
            assert not blob.entry_stamps and initial and (ops or over)
            assert [(e.key, e.value, e.last_access_ms) for e in written.entries] == [
                (k, v, at) for k, (v, at) in reference.entries.items()
            ]
            assert_index_fits(written)
        return
    assert [(e.key, e.value, e.last_access_ms) for e in written.entries] == [
        (k, v, at) for k, (v, at) in reference.entries.items()
    ]
    assert written.total_value_bytes == sum(len(e.value) for e in written.entries)
    assert memory.total_value_bytes == written.total_value_bytes
    again = Memory.from_blob(written, budget_bytes=budget)
    assert list(again.keys()) == list(reference.entries) and len(again) == len(written.entries)


def test_a_blob_with_a_repeated_key_reads_its_last_entry_with_an_exact_total():
    blob = MemoryBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION, total_value_bytes=999)
    blob.entries.add(key="a", value=b"old")
    blob.entries.add(key="a", value=b"new!")
    memory = Memory.from_blob(blob)
    assert memory.get("a") == b"new!" and memory.total_value_bytes == 4


def test_a_cached_response_replays_and_counts_as_recent():
    cache = ReplayCache(now_ms=5)
    cache.put("k1", b"one")
    cache.put("k2", b"two")
    cache.now_ms = 9
    assert cache.get("k1") == b"one" and cache.get("nope") is None
    blob = cache.to_blob()
    assert [(e.cache_key, e.last_access_ms, e.created_at_ms) for e in blob.entries] == [
        ("k2", 5, 5),
        ("k1", 9, 5),
    ]
    assert blob.entries[1].response_digest == hashlib.sha256(b"one").digest()


def test_a_response_over_the_size_limit_keeps_only_its_digest_and_reads_as_a_miss():
    cache = ReplayCache(max_response_bytes=4)
    cache.put("big", b"12345")
    assert cache.get("big") is None and "big" in cache
    assert cache.digest("big") == hashlib.sha256(b"12345").digest()
    (entry,) = cache.to_blob().entries
    assert entry.digest_only and entry.response == b"" and cache.total_response_bytes == 0


def test_the_cache_keeps_within_its_count_and_byte_caps():
    cache = ReplayCache(max_entries=2, max_bytes=100)
    for key in ("a", "b", "c"):
        cache.put(key, b"x")
    assert list(cache.keys()) == ["b", "c"]
    cache = ReplayCache(max_entries=10, max_bytes=5)
    cache.put("a", b"123")
    cache.put("b", b"123")
    assert list(cache.keys()) == ["b"] and cache.total_response_bytes == 3


def test_a_cache_at_exactly_its_caps_keeps_every_entry_and_whole_responses():
    cache = ReplayCache(max_entries=2, max_bytes=4, max_response_bytes=2)
    cache.put("a", b"12")
    cache.put("b", b"34")
    assert list(cache.keys()) == ["a", "b"] and cache.total_response_bytes == 4
    assert cache.get("a") == b"12" and cache.get("b") == b"34"


def test_a_cache_made_without_limits_has_the_documented_ones():
    """Those docs/concepts.md gives (256 calls, 4 MiB) and RuntimeConfig's defaults repeat
    (a response of up to 1 MiB is replayed whole), for a cache built outside the runtime."""
    cache = ReplayCache()
    assert (cache.max_entries, cache.max_bytes, cache.max_response_bytes) == (256, 4 << 20, 1 << 20)


def test_the_cache_blob_round_trips_in_order():
    cache = ReplayCache(max_response_bytes=3)
    cache.put("a", b"1")
    cache.put("b", b"long")
    again = ReplayCache.from_blob(
        LlmCacheBlob.FromString(cache.to_blob().SerializeToString()), max_response_bytes=3
    )
    assert again.to_blob() == cache.to_blob()
    assert_index_fits(again.to_blob(), "cache_key")


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from("abcdefgh"), st.binary(max_size=8), max_size=8),
    st.lists(operations, min_size=1, max_size=6),
    st.one_of(st.none(), st.integers(8, 40)),
)
def test_memory_behaves_as_a_plain_lru_across_activations(initial, activations, budget):
    """Each activation reads the bytes the previous one wrote, through the index they carry."""
    _across_activations(initial, activations, budget)


_WIDE_KEYS = [f"k{i}" for i in range(48)]


def _wide_activations(min_size: int, max_size: int):
    """Activations of up to 12 operations each over 48 keys."""
    operation = st.tuples(
        st.sampled_from(["put", "get", "delete"]),
        st.sampled_from(_WIDE_KEYS),
        st.binary(max_size=4),
    )
    return st.lists(st.lists(operation, max_size=12), min_size=min_size, max_size=max_size)


@settings(max_examples=60, deadline=None)
@given(
    st.dictionaries(st.sampled_from(_WIDE_KEYS), st.binary(max_size=4), max_size=40),
    _wide_activations(20, 40),
)
def test_a_long_chain_of_blobs_keeps_an_index_that_finds_every_key(initial, activations):
    """Many keys come and go along a chain of blobs: each index is the last one edited, never
    built afresh, so an edit that lost or misplaced a key would show further down."""
    _across_activations(initial, activations, None)


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(st.sampled_from(_WIDE_KEYS), st.binary(max_size=4), max_size=40),
    _wide_activations(1, 20),
)
def test_keys_whose_hashes_collide_are_told_apart_by_their_entries(initial, activations):
    """With a hash that gives 48 keys 2 values, every lookup walks a run of equal hashes: the
    entry's own key decides, and commits edit the right slot of the run (each written index
    is checked against that hash: a deletion that missed its slot would leave a stale one)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(memory_module, "_key_hash", _colliding_key_hash)
        _across_activations(initial, activations, None, key_hash=_colliding_key_hash)


def _colliding_key_hash(key: str) -> int:
    return len(key) % 3 - 1


def _across_activations(initial, activations, budget, *, key_hash=_blake2b_key_hash) -> None:
    blob = MemoryBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION)
    for key, value in initial.items():
        blob.entries.add(key=key, value=value)
    blob.total_value_bytes = sum(map(len, initial.values()))
    reference = ReferenceLru([(k, v, 0) for k, v in initial.items()], budget)
    now = 100
    for ops in activations:
        memory = Memory.from_blob(blob, budget_bytes=budget, now_ms=now).copy()
        reference.read()
        for op, key, value in ops:
            now += 1
            memory.now_ms = now
            args = (key, value) if op == "put" else (key,)
            with contextlib.suppress(MemoryBudgetError):
                getattr(memory, op)(*args)
            getattr(reference, op)(*args, now)
            assert (key in memory) == (key in reference.entries)
        blob = memory.to_blob()
        assert memory.total_value_bytes == sum(len(v) for v, _ in reference.entries.values())
        assert [(e.key, e.value, e.last_access_ms) for e in blob.entries] == [
            (k, v, at) for k, (v, at) in reference.entries.items()
        ]
        assert blob.total_value_bytes == memory.total_value_bytes
        assert list(memory.keys()) == list(reference.entries) and len(memory) == len(blob.entries)
        if blob.entry_stamps:
            assert_index_fits(blob, key_hash=key_hash)
        # The next activation reads bytes, as a runner's state does.
        blob = MemoryBlob.FromString(blob.SerializeToString())


def test_an_untouched_memory_or_cache_writes_the_blob_it_read():
    memory = Memory(now_ms=1)
    memory.put("a", b"1")
    stored = memory.to_blob()
    again = Memory.from_blob(stored, now_ms=2)
    assert again.get("missing") is None and not again.delete("missing") and "a" in again
    assert not again.changed and again.to_blob() is stored
    again.get("a")
    assert again.changed and again.to_blob() is not stored
    cache = ReplayCache(now_ms=1)
    cache.put("k", b"r")
    stored = cache.to_blob()
    again = ReplayCache.from_blob(stored, now_ms=2)
    assert again.digest("k") and "k" in again and again.to_blob() is stored
    assert again.get("k") == b"r" and again.to_blob() is not stored


def test_a_cache_read_over_smaller_limits_is_evicted_at_once():
    cache = ReplayCache(now_ms=1)
    for key in ("a", "b", "c"):
        cache.put(key, b"xy")
    shrunk = ReplayCache.from_blob(cache.to_blob(), max_entries=2)
    assert list(shrunk.keys()) == ["b", "c"] and shrunk.total_response_bytes == 4
    assert [e.cache_key for e in shrunk.to_blob().entries] == ["b", "c"]


def test_a_cache_without_calls_keeps_every_other_field_of_the_blob_it_read():
    recorded = ReplayCache(now_ms=1)
    for key in ("a", "b"):
        recorded.put(key, b"response")
    blob = recorded.to_blob()
    # Every field that is not a recorded call set to a value of its own, so one added to the
    # schema later is covered too.
    calls = {"entries", "total_response_bytes", *INDEX_FIELDS}
    others = [f for f in LlmCacheBlob.DESCRIPTOR.fields if f.name not in calls]
    for value, field in enumerate(others, start=7):
        assert field.type in (field.TYPE_INT64, field.TYPE_UINT32), (
            f"{field.name} is not an integer: check that without_calls carries it"
        )
        setattr(blob, field.name, value)
    read = blob.SerializeToString(deterministic=True)

    cache = ReplayCache.without_calls(blob, now_ms=2)
    assert len(cache) == 0 and cache.get("a") is None and cache.total_response_bytes == 0
    assert not cache.changed
    cache.put("c", b"xyz")
    written = cache.to_blob()
    assert [e.cache_key for e in written.entries] == ["c"] and written.total_response_bytes == 3
    assert_index_fits(written, "cache_key")
    assert {f.name: getattr(written, f.name) for f in others} == {
        f.name: getattr(blob, f.name) for f in others
    } | {"state_schema_version": CURRENT_STATE_SCHEMA_VERSION}
    assert blob.SerializeToString(deterministic=True) == read


def test_a_cache_without_calls_keeps_a_newer_writers_fields():
    """The additive-evolution rule lets a newer binary add a field to LlmCacheBlob without a
    schema bump (the usage fields came that way), and a rollback then
    reads it as an unknown field. Every other writer of the cache (from_blob's commit, the
    machine's _copy) carries unknown fields along; a start's cache must too, or a rollback
    silently zeroes what the newer binary kept there."""
    recorded = ReplayCache(now_ms=1)
    recorded.put("a", b"response")
    # Field 20, varint 5: a counter a newer writer added.
    newer = LlmCacheBlob.FromString(recorded.to_blob().SerializeToString() + b"\xa0\x01\x05")
    assert len(UnknownFieldSet(newer)) == 1

    for read, calls in ((ReplayCache.from_blob, ["a", "b"]), (ReplayCache.without_calls, ["b"])):
        cache = read(newer, now_ms=2)
        cache.put("b", b"xyz")
        written = cache.to_blob()
        assert [(f.field_number, f.data) for f in UnknownFieldSet(written)] == [(20, 5)], read
        assert [e.cache_key for e in written.entries] == calls, read
        assert written.total_response_bytes == sum(len(e.response) for e in written.entries)
        assert_index_fits(written, "cache_key")


def test_a_cache_read_only_touched_writes_back_the_calls_it_answered_or_recorded():
    recorded = ReplayCache(now_ms=1)
    for key in ("a", "b", "c"):
        recorded.put(key, b"r-" + key.encode())
    blob = recorded.to_blob()
    blob.input_tokens = 9
    # Field 20, varint 5: a counter a newer writer added.
    blob = LlmCacheBlob.FromString(blob.SerializeToString() + b"\xa0\x01\x05")
    read = blob.SerializeToString(deterministic=True)

    untouched = ReplayCache.from_blob(blob, only_touched=True, now_ms=2)
    assert untouched.digest("a") and untouched.to_blob() is blob  # a peek changes nothing

    cache = ReplayCache.from_blob(blob, only_touched=True, now_ms=2)
    assert cache.get("b") == b"r-b"
    cache.put("d", b"xyz")
    written = cache.to_blob()
    assert [(e.cache_key, e.last_access_ms) for e in written.entries] == [("b", 2), ("d", 2)]
    assert written.total_response_bytes == 6 and written.input_tokens == 9
    assert [(f.field_number, f.data) for f in UnknownFieldSet(written)] == [(20, 5)]
    assert_index_fits(written, "cache_key")
    assert blob.SerializeToString(deterministic=True) == read


def test_a_written_blob_changed_afterwards_is_read_afresh():
    memory = Memory(now_ms=1)
    memory.put("a", b"1")
    blob = memory.to_blob()
    blob.entries.add(key="b", value=b"22")  # a caller's own change: the kept index is stale
    again = Memory.from_blob(blob)
    assert again.get("b") == b"22" and list(again.keys()) == ["a", "b"]


def _counting_passes(monkeypatch) -> list[int]:
    """Counts the index builds that take a pass over a blob's entries (the real method runs)."""
    passes = []
    real = memory_module._LruOverlay._read_index

    def counted(self):
        passes.append(len(self._base.entries))
        return real(self)

    monkeypatch.setattr(memory_module._LruOverlay, "_read_index", counted)
    return passes


def test_a_written_blob_is_read_through_its_index_without_a_pass_over_its_entries(monkeypatch):
    passes = _counting_passes(monkeypatch)
    memory = Memory(now_ms=1)
    for i in range(500):
        memory.put(f"fact:{i}", b"v")
    cache = ReplayCache(now_ms=1)
    for i in range(50):
        cache.put(f"call:{i}", b"r")
    stored = MemoryBlob.FromString(memory.to_blob().SerializeToString())
    again = Memory.from_blob(stored, now_ms=2)
    assert again.get("fact:7") == b"v" and "fact:499" in again and "fact:500" not in again
    again.put("fact:new", b"w")
    assert again.delete("fact:0") and len(again) == 500
    written = again.to_blob()
    assert_index_fits(written)
    cached = ReplayCache.from_blob(LlmCacheBlob.FromString(cache.to_blob().SerializeToString()))
    assert cached.get("call:3") == b"r" and cached.digest("call:49")
    assert passes == []


def test_a_blob_without_an_index_is_read_by_a_pass_and_written_with_one(monkeypatch):
    """A version-1 binary's blob (or one built by hand) has no index: the first lookup takes a
    pass over its entries, and the next to_blob writes the index even when nothing changed, so
    the pass is paid once, not on every activation; a blob never looked up is left as read."""
    passes = _counting_passes(monkeypatch)
    blob = MemoryBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION, total_value_bytes=3)
    for key in ("a", "b", "c"):
        blob.entries.add(key=key, value=b"1", last_access_ms=5)
    assert Memory.from_blob(blob, now_ms=9).to_blob() is blob
    looked = Memory.from_blob(blob, now_ms=9)
    assert "b" in looked and not looked.changed
    written = looked.to_blob()
    assert written is not blob and passes == [3]
    assert [(e.key, e.value, e.last_access_ms) for e in written.entries] == [
        (e.key, e.value, e.last_access_ms) for e in blob.entries
    ]
    assert_index_fits(written)
    assert "c" in Memory.from_blob(written) and passes == [3]


@pytest.mark.parametrize("field", ["entry_stamps", "key_hashes", "key_stamps"])
def test_an_index_whose_size_does_not_fit_the_entries_is_built_afresh(field):
    memory = Memory(now_ms=1)
    for key in ("a", "b", "c"):
        memory.put(key, key.encode())
    blob = memory.to_blob()
    setattr(blob, field, getattr(blob, field)[:-8])  # a writer that lost one entry's slot
    again = Memory.from_blob(blob, now_ms=2)
    assert again.get("c") == b"c" and "a" in again and again.total_value_bytes == 3
    written = again.to_blob()
    assert [e.key for e in written.entries] == ["a", "b", "c"]
    assert_index_fits(written)


def _edited(blob, edit):
    copy = type(blob)()
    copy.CopyFrom(blob)
    edit(copy)
    return copy


def _rename_first(blob):
    blob.entries[0].key = "renamed"


def _grow_first(blob):
    blob.entries[0].value += b"!"


def _swap_first_two(blob):
    first, second = (type(e)() for e in blob.entries[:2])
    first.CopyFrom(blob.entries[0])
    second.CopyFrom(blob.entries[1])
    blob.entries[0].CopyFrom(second)
    blob.entries[1].CopyFrom(first)


def _duplicate_a_key(blob):
    blob.entries[1].key = blob.entries[0].key


def _one_stamp_short(blob):
    blob.entry_stamps = blob.entry_stamps[:-8]


def _one_stamp_for_two_entries(blob):
    """The first two entries share a stamp and the index is otherwise consistent (key hashes
    as the index stores them: blake2b, 8 bytes, little-endian): bisection would find one
    entry for both keys."""
    count = len(blob.entries)
    stamps = list(struct.unpack(f"<{count}q", blob.entry_stamps))
    stamps[1] = stamps[0]
    hashes = (
        int.from_bytes(
            hashlib.blake2b(e.key.encode(), digest_size=8).digest(), "little", signed=True
        )
        for e in blob.entries
    )
    pairs = sorted(zip(hashes, stamps, strict=True))
    blob.entry_stamps = struct.pack(f"<{count}q", *stamps)
    blob.key_hashes = struct.pack(f"<{count}q", *(h for h, _ in pairs))
    blob.key_stamps = struct.pack(f"<{count}q", *(s for _, s in pairs))


def _swap_first_two_with_their_stamps(blob):
    """Entries and their stamps moved together: every key still has its own stamp, but the
    stamps no longer grow along the entries, so bisection would miss keys."""
    _swap_first_two(blob)
    stamps = blob.entry_stamps
    blob.entry_stamps = stamps[8:16] + stamps[:8] + stamps[16:]


@pytest.mark.parametrize(
    "edit",
    [
        _rename_first,
        _grow_first,
        _swap_first_two,
        _duplicate_a_key,
        _swap_first_two_with_their_stamps,
        _one_stamp_for_two_entries,
        _one_stamp_short,
    ],
)
def test_a_checked_index_is_kept_only_while_it_fits_its_entries(edit):
    """What a restored snapshot goes through: its blobs are kept byte for byte unless someone
    edited their entries, and then lose only the index, which a reader builds afresh."""
    memory = Memory(now_ms=1)
    for key in ("a", "b", "c"):
        memory.put(key, key.encode())
    indexed = memory.to_blob()
    assert with_checked_index(indexed) is indexed
    bare = MemoryBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION)
    bare.entries.add(key="a", value=b"1")
    assert with_checked_index(bare) is bare
    edited = _edited(indexed, edit)
    before = edited.SerializeToString()
    checked = with_checked_index(edited)
    assert edited.SerializeToString() == before and checked.entries == edited.entries
    assert (checked.entry_stamps, checked.key_hashes, checked.key_stamps) == (b"", b"", b"")
    assert set(Memory.from_blob(checked).keys()) == {e.key for e in edited.entries}


def test_a_checked_cache_index_is_kept_only_while_it_fits_its_entries():
    cache = ReplayCache(now_ms=1, max_response_bytes=1)
    for key in ("k1", "k2"):
        cache.put(key, b"r" * len(key))  # over the limit: digest-only, sized 0
    indexed = cache.to_blob()
    assert with_checked_index(indexed) is indexed

    def rename(blob):
        blob.entries[0].cache_key = "k3"

    assert not with_checked_index(_edited(indexed, rename)).key_hashes


def _next_version(message_type, change):
    """A registry at the next version whose step for `message_type` applies `change` to the
    copy, as a step author following migration_test's example writes it: knowing nothing of the
    entry index."""

    def upgrade(old):
        new = message_type()
        new.CopyFrom(old)
        new.state_schema_version = CURRENT_STATE_SCHEMA_VERSION + 1
        change(new)
        return new

    step = types.ModuleType(f"{message_type.DESCRIPTOR.name}_next")
    step.MESSAGE_TYPE, step.upgrade = message_type, upgrade
    step.FROM_VERSION, step.TO_VERSION = (
        CURRENT_STATE_SCHEMA_VERSION,
        CURRENT_STATE_SCHEMA_VERSION + 1,
    )
    return MigrationRegistry(
        [*default_registry().steps, MigrationStep.from_module(step)],
        current_version=CURRENT_STATE_SCHEMA_VERSION + 1,
    )


def test_a_blob_whose_keys_a_migration_step_renamed_finds_them():
    memory = Memory(now_ms=1)
    memory.put("user:name", b"Ada")
    memory.put("user:tier", b"gold")
    stored = MemoryBlob.FromString(memory.to_blob().SerializeToString())

    def rename(blob):
        for entry in blob.entries:
            entry.key = entry.key.replace("user:", "u/")

    migrated = Memory.from_blob(_next_version(MemoryBlob, rename).migrate(stored), now_ms=2)
    assert "u/name" in migrated and migrated.get("u/tier") == b"gold"
    migrated.put("u/name", b"Lovelace")
    assert list(migrated.keys()) == ["u/tier", "u/name"] and len(migrated) == 2


def test_a_cache_whose_responses_a_migration_step_shrank_has_an_exact_total():
    cache = ReplayCache(now_ms=1)
    cache.put("a", b"12345678")

    def shrink(blob):
        blob.entries[0].response = b"1"

    migrated = _next_version(LlmCacheBlob, shrink).migrate(cache.to_blob())
    shrunk = ReplayCache.from_blob(migrated, max_bytes=4)
    assert shrunk.total_response_bytes == 1 and shrunk.get("a") == b"1"


def test_an_untouched_new_memory_or_cache_is_written_stamped():
    for written in (Memory().to_blob(), ReplayCache().to_blob()):
        assert written.state_schema_version == CURRENT_STATE_SCHEMA_VERSION
        assert not written.entries


def test_a_blob_without_its_index_is_evicted_at_read_whatever_total_it_carries():
    # A migration step's output has no index (the reader builds it from the entries), and a
    # step that changed the entries need not have kept the total: the read must not trust
    # that total to say the blob is within the budget.
    blob = MemoryBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION, total_value_bytes=8)
    blob.entries.add(key="old", value=b"x" * 100, last_access_ms=1)
    blob.entries.add(key="new", value=b"y" * 100, last_access_ms=2)
    memory = Memory.from_blob(blob, budget_bytes=150)
    assert list(memory.keys()) == ["new"] and memory.total_value_bytes == 100


def test_a_cache_without_its_index_is_evicted_at_read_whatever_total_it_carries():
    # As for Memory: a migration step's output may carry a total its step did not keep.
    blob = LlmCacheBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION, total_response_bytes=8)
    blob.entries.add(cache_key="old", response=b"x" * 100, last_access_ms=1)
    blob.entries.add(cache_key="new", response=b"y" * 100, last_access_ms=2)
    cache = ReplayCache.from_blob(blob, max_bytes=150)
    assert "old" not in cache and cache.get("new") == b"y" * 100


def test_an_empty_blob_with_a_total_left_over_is_empty_under_any_budget():
    # A snapshot whose entries someone deleted by hand, leaving their total: trusted, that
    # total had the read evict from an empty blob (KeyError out of the key's every activation;
    # review rev48).
    memory_blob = MemoryBlob(
        state_schema_version=CURRENT_STATE_SCHEMA_VERSION, total_value_bytes=600_000
    )
    memory = Memory.from_blob(with_checked_index(memory_blob), budget_bytes=1_000)
    assert memory.total_value_bytes == 0 and not list(memory.keys())
    memory.put("k", b"v")
    fresh = Memory()
    fresh.put("k", b"v")
    assert memory.to_blob().total_value_bytes == fresh.to_blob().total_value_bytes > 0
    cache_blob = LlmCacheBlob(
        state_schema_version=CURRENT_STATE_SCHEMA_VERSION, total_response_bytes=600_000
    )
    cache = ReplayCache.from_blob(with_checked_index(cache_blob), max_bytes=1_000)
    assert cache.total_response_bytes == 0 and cache.get("k") is None
