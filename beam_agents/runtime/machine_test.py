"""KeyMachine's entry points and export (machine): a key with no seq exports none and keeps its
time-based first seq on restore, and state a newer binary wrote wedges the key instead of
being read or wiped. Each test drives KeyMachine through `testing.machine_harness`.
"""

from __future__ import annotations

import pytest

from beam_agents._protos import (
    AgentEnvelope,
    Continuation,
    LlmCacheBlob,
    MemoryBlob,
    StateSnapshot,
)
from beam_agents.runtime.machine import ERRORS
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION, StateSchemaFromFutureError
from beam_agents.testing.machine_harness import (
    KEY,
    T0,
    Harness,
    approve,
    asks,
    echo,
    event,
    pending,
)

# Point 10: future state, seq -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cell", "blob_type"), [(1, MemoryBlob), (2, LlmCacheBlob), (3, Continuation)]
)
@pytest.mark.parametrize(
    "entry",
    [
        lambda h: h.send(event(T0, b"a")),
        lambda h: h.fire_deadline(T0),
        lambda h: h.fire_ttl(T0),
        lambda h: h.restore(StateSnapshot(entity_key=KEY, snapshot_at_ms=T0)),
    ],
    ids=["envelope", "deadline", "ttl", "snapshot"],
)
def test_state_a_newer_binary_wrote_wedges_the_key_instead_of_being_read_or_wiped(
    cell, blob_type, entry
):
    # Each blob on its own, beside current ones: the reader's version check covers all three.
    h = Harness(echo)
    h.states[1].write(MemoryBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION))
    h.states[2].write(LlmCacheBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION))
    future = blob_type(state_schema_version=CURRENT_STATE_SCHEMA_VERSION + 1)
    h.states[cell].write(future)
    with pytest.raises(StateSchemaFromFutureError):
        entry(h)
    assert h.states[cell].value is future


@pytest.mark.parametrize("blob", ["snapshot", "memory", "llm_cache", "continuation"])
def test_a_snapshot_restore_names_the_one_blob_a_newer_binary_wrote(blob):
    snapshot = StateSnapshot(entity_key=KEY, snapshot_at_ms=T0, request_id="r-1")
    newer = CURRENT_STATE_SCHEMA_VERSION + 1
    if blob == "snapshot":
        snapshot.state_schema_version = newer
    else:
        getattr(snapshot, blob).state_schema_version = newer
    h = Harness(echo)
    h.restore(snapshot)
    (letter,) = h.values(ERRORS)
    assert letter.reason == "snapshot_from_future"
    assert f"'r-1': {blob} written at a schema newer than" in letter.detail


def test_a_key_with_no_seq_exports_none_and_its_restore_keeps_the_time_based_first_seq():
    snapshot = StateSnapshot(entity_key=KEY, snapshot_at_ms=T0)
    snapshot.memory.CopyFrom(MemoryBlob(state_schema_version=1))
    h = Harness(echo)
    h.restore(snapshot)
    assert h.states[0].value is None
    h.send(event(T0 + 1, b"a"))
    assert h.states[0].value == (T0 + 1) * 1000


# Issue 37, point 14: an export that releases the key hands it off ------------------------------


def test_an_export_that_releases_the_key_hands_its_state_off_and_leaves_no_timer():
    h = Harness(asks)
    h.send(event(T0, b"1"))
    (question,) = pending(h)
    release = AgentEnvelope(entity_key=KEY, event_time_ms=T0 + 5)
    release.export_request.request_id = "end"
    release.export_request.release = True
    ((_, (_, snapshot)),) = h.send(release).outputs
    assert list(snapshot.continuation.pending_intent_ids) == [question.intent_id]
    # Cleared here but for the seq (no intent id is ever issued twice), timers with it.
    assert [c.value for c in h.states[1:4]] == [None, None, None] and pending(h) == []
    assert h.states[0].value == snapshot.seq and h.timers[0].at_ms is h.timers[1].at_ms is None
    # A late firing of a timer finds nothing to do; the snapshot restores the key elsewhere.
    assert h.fire_deadline(snapshot.continuation.deadline_ms).outputs == []
    elsewhere = Harness(asks)
    elsewhere.restore(snapshot)
    elsewhere.send(approve(T0 + 10, question))
    assert elsewhere.values("completions") == [b"approved"]
