"""A key's state and its commit (machine_state): nothing read is changed in place, the TTL only
moves forward, and an activation writes only the blobs it changed. Each test drives KeyMachine
through `testing.machine_harness`.
"""

from __future__ import annotations

import pytest

from beam_agents._protos import StateSnapshot
from beam_agents.runtime import AtDeadline, DeadlinePolicy, RuntimeConfig, agent
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION
from beam_agents.testing.machine_harness import (
    KEY,
    SEQ,
    T0,
    Harness,
    answer,
    echo,
    event,
    parallel,
    pending,
    refund,
    summarise,
)

# Point 2: never mutate what was read --------------------------------------------------------


def test_refused_and_failing_inputs_leave_the_stored_objects_untouched():
    """The Harness checks every step; here the steps that used to change state in place: an
    answer recorded, a deadline expiring, a failing resume, an escalation."""
    policy = DeadlinePolicy(AtDeadline.ESCALATE, max_escalations=1, extension_ms=50)
    h = Harness(
        parallel,
        llm=None,
        config=RuntimeConfig(deadline_policy=policy, suspend_deadline_ms=10, intent_ttl_ms=10),
    )
    h.send(event(T0, b"go"))
    first = pending(h)[0]
    stored = h.continuation
    h.send(answer(T0 + 1, first))
    assert list(stored.answers) == [] and h.continuation is not stored
    h.fire_deadline()  # escalates
    h.fire_deadline()  # expires the rest and resumes
    (done,) = h.values("completions")
    assert done == b"ok,,"


# Point 8: the TTL only moves forward ------------------------------------------------------------


def test_an_event_stamped_zero_never_wipes_the_memory_it_just_wrote():
    ttl = 1000
    h = Harness(echo, config=RuntimeConfig(ttl_ms=ttl))
    h.send(event(T0, b"a"), arrival_ms=T0)
    assert h.timers[1].at_ms == T0 + ttl
    h.send(event(0, b"late"), arrival_ms=T0 + 5)
    assert h.timers[1].at_ms == T0 + 5 + ttl and h.memory.last_activity_ms == T0 + 5
    h.send(event(0, b"later"))  # no arrival time either (a bounded source)
    assert h.timers[1].at_ms == T0 + 5 + ttl and h.memory.last_activity_ms == T0 + 5
    h.fire_ttl(T0 + ttl)  # a stale firing of the earlier TTL
    assert h.memory is not None
    assert [(e.key, e.value) for e in h.memory.entries] == [("last", b"later")]
    h.fire_ttl()
    assert h.memory is None and h.states[0].value == SEQ + 2


def test_a_new_key_whose_first_event_is_stamped_zero_counts_its_ttl_from_arrival():
    h = Harness(echo, config=RuntimeConfig(ttl_ms=1000))
    h.send(event(0, b"a"), arrival_ms=T0)
    assert h.timers[1].at_ms == T0 + 1000 and h.states[0].value == 1  # seq 0 means "none"


# Issue 18: an activation writes only what it changed ---------------------------------------------


@agent(name="tests.lookup/v1")
def lookup(ctx, event: bytes) -> bytes:
    return ctx.call_tool("crm.lookup", {"id": event.decode()}).payload


def test_a_resume_that_touches_no_memory_and_no_cache_writes_neither_nor_its_seq():
    h = Harness(lookup, config=RuntimeConfig(ttl_ms=1000))
    h.send(event(T0 + 5, b"7"))
    memory, seq_writes = h.memory, h.states[0].writes
    (intent,) = pending(h)
    # An answer stamped before the start's activity: nothing moves the TTL's anchor either.
    h.send(answer(T0 + 4, intent, b"profile"))
    assert h.values("completions") == [b"profile"]
    assert h.memory is memory and h.states[2].value is None  # not rewritten, no cache made
    # The resume runs under the seq its start took: an equal number is no write either.
    assert h.states[0].writes == seq_writes
    assert h.timers[1].at_ms == T0 + 5 + 1000


def test_only_a_suspended_key_reads_its_pending_intents():
    h = Harness(lookup)
    h.send(event(T0, b"7"))  # a new key: not suspended, so no pending intents to read
    assert h.states[4].reads == 0
    (intent,) = pending(h)
    h.send(answer(T0 + 1, intent, b"profile"))  # suspended: the answer needs its intent
    assert h.values("completions") == [b"profile"] and h.states[4].reads == 1


def test_a_restored_snapshot_keeps_pending_intents_only_with_their_suspension():
    source = Harness(lookup)
    source.send(event(T0, b"7"))
    snapshot = source.export()
    assert snapshot.pending and snapshot.HasField("continuation")
    snapshot.ClearField("continuation")
    h = Harness(lookup)
    h.restore(snapshot)
    assert h.states[4].value == [] and h.continuation is None
    h.send(event(T0 + 1, b"8"))  # not suspended: the event starts an activation at once
    assert len(pending(h)) == 1


def test_a_restored_snapshot_whose_memory_was_edited_finds_the_edited_keys():
    """A snapshot is a file people may edit. Its memory's entry index was written for the
    entries as exported: restored as it is, the index would not know an entry renamed since,
    so the agent would count from 0 and add a second "visits" entry beside the edited one."""
    source = Harness(echo)
    source.send(event(T0, b"hello"))
    snapshot = source.export()
    (entry,) = snapshot.memory.entries
    assert snapshot.memory.entry_stamps  # exported with its index
    entry.key, entry.value = "visits", b"41"  # seeding the counter by hand
    h = Harness(refund, llm=summarise(""))
    h.restore(snapshot)
    h.send(event(T0 + 1, b"5"))
    h.send(answer(T0 + 2, pending(h)[0], b"paid"))
    (done,) = h.values("completions")
    assert done.endswith(b"after 42 visit(s)")
    assert [(e.key, e.value) for e in h.memory.entries] == [("visits", b"42")]


def test_intents_an_older_restore_left_without_a_suspension_never_surface_and_are_cleared():
    """Restores before this rule kept a snapshot's pending intents with no continuation: the
    bag is not read while the key is not suspended, and is set outright when it suspends or
    is wiped."""
    stale = Harness(lookup)
    stale.send(event(T0, b"1"))
    (left,) = pending(stale)
    h = Harness(lookup, config=RuntimeConfig(ttl_ms=1000))
    h.states[4].value = [left]  # what such a restore wrote
    h.send(event(T0 + 1, b"2"))
    assert [i.intent_id for i in pending(h)] != [left.intent_id] and len(pending(h)) == 1
    h.send(answer(T0 + 2, pending(h)[0], b"profile"))
    assert h.values("completions") == [b"profile"] and pending(h) == []
    h.states[4].value = [left]
    h.fire_ttl(h.timers[1].at_ms)
    assert h.memory is None and pending(h) == []


def test_a_later_answer_moves_the_ttl_anchor_forward_in_a_copy_of_the_memory():
    h = Harness(lookup, config=RuntimeConfig(ttl_ms=1000))
    h.send(event(T0, b"7"))
    memory = h.memory
    (intent,) = pending(h)
    h.send(answer(T0 + 9, intent, b"profile"))
    assert h.memory is not memory and h.memory.last_activity_ms == T0 + 9
    assert h.memory.entries == memory.entries and h.states[2].value is None
    h.fire_ttl(T0 + 1000)  # the TTL the start set has moved: the key stays
    assert h.memory is not None and h.timers[1].at_ms == T0 + 9 + 1000


def test_a_resume_that_replays_no_llm_call_keeps_the_cache_it_read():
    h = Harness(refund, llm=summarise("a summary"))
    h.send(event(T0, b"10"))
    (paid,) = pending(h)
    h.send(answer(T0 + 1, paid, b"paid"))  # one LLM call: the cache is written
    cache = h.states[2].value
    assert cache is not None and len(cache.entries) == 0  # the completion dropped the call
    h.send(event(T0 + 2, b"20"))  # suspends before any LLM call: the cache is untouched
    assert h.states[2].value is cache


def test_a_restored_memory_over_the_budget_is_evicted_down_before_the_agent_reads_it():
    """A snapshot exported under a larger memory budget (or edited by hand) holds more than
    this job's budget: the agent must see, and the key keep, only the most recent entries
    within it, as a replay cache over its caps is evicted down at once."""

    @agent(name="tests.reads_memory/v1")
    def reads_memory(ctx, event: bytes) -> bytes:
        return b",".join(key.encode() for key in ctx.memory.keys())  # noqa: SIM118 (no __iter__)

    snapshot = StateSnapshot(entity_key=KEY, snapshot_at_ms=T0)
    snapshot.memory.state_schema_version = CURRENT_STATE_SCHEMA_VERSION
    for key in ("a", "b", "c"):
        snapshot.memory.entries.add(key=key, value=key.encode() * 8, last_access_ms=T0)
    snapshot.memory.total_value_bytes = 24
    h = Harness(reads_memory, config=RuntimeConfig(memory_budget_bytes=16))
    h.restore(snapshot)
    h.send(event(T0 + 10, b"go"))
    (seen,) = h.values("completions")
    assert seen == b"b,c"
    assert [e.key for e in h.memory.entries] == ["b", "c"] and h.memory.total_value_bytes == 16


def test_a_snapshot_with_a_negative_seq_is_refused_before_it_wedges_the_key():
    h = Harness(echo)
    h.restore(StateSnapshot(entity_key=KEY, seq=-5, snapshot_at_ms=T0))
    assert [record.reason for record in h.values("errors")] == ["invalid_snapshot"]
    assert [state.writes for state in h.states] == [0] * 5
    h.send(event(T0 + 1, b"a"))
    assert h.values("completions") == [b"echo a"] and h.states[0].value == SEQ + 1000


@pytest.mark.parametrize(("seq", "ran"), [(2**63 - 1, False), (2**63 - 1000, True)])
def test_a_snapshot_at_the_top_of_int64_is_restored_and_its_key_ends_with_a_dead_letter(seq, ran):
    """Restored, a seq at the top of int64 made every later input of the key raise
    ValueError (its next seq out of range) inside the DoFn: a bundle failing for good. A key
    can reach such a seq and export it (a first seq at the end of time, then more), so the
    snapshot is restored, and the start past int64's last seq is a `seq_exhausted` letter."""
    h = Harness(echo)
    h.restore(StateSnapshot(entity_key=KEY, seq=seq, snapshot_at_ms=T0))
    assert h.values("errors") == [] and h.states[0].value == seq
    h.send(event(T0 + 1, b"a"))
    assert h.values("completions") == ([b"echo a"] if ran else [])
    assert [record.reason for record in h.values("errors")] == ([] if ran else ["seq_exhausted"])
    assert h.states[0].value == (seq + 1 if ran else seq)
