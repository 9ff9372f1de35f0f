"""External events (machine_events): duplicates within the dedupe window do nothing, by their
bytes or a transport's idempotency key, within the marks' count and window; a suspended key's
events wait in its mailbox, bounded, and run in event-time order; a start whose model stays
busy waits on a timer and keeps its place. Each test drives KeyMachine through
`testing.machine_harness`.
"""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_agents._protos import MemoryBlob, TraceEvent
from beam_agents.errors import RuntimeConfigError
from beam_agents.runtime import AtDeadline, DeadlinePolicy, RuntimeConfig, agent
from beam_agents.runtime.machine import ERRORS
from beam_agents.runtime.machine_events import event_digests, marks_problem
from beam_agents.runtime.machine_state import INT64_MAX, due_at, timer_ms
from beam_agents.testing.machine_harness import (
    SEQ,
    T0,
    DownOnce,
    Harness,
    approve,
    asks,
    echo,
    event,
    pending,
    summarise_event,
)

# Point 6: duplicates of external events ---------------------------------------------------------


def test_the_same_event_twice_runs_once_within_the_dedupe_window():
    h = Harness(echo, config=RuntimeConfig(dedupe_window_ms=1000))
    h.send(event(T0, b"a"))
    h.send(event(T0, b"a"))  # back to back
    h.send(event(T0 + 10, b"b"))
    h.send(event(T0, b"a"))  # after completion, late
    assert h.values("completions") == [b"echo a", b"echo b"]
    h.send(event(T0 + 5000, b"c"))  # the window moved past the first event
    h.send(event(T0, b"a"))
    assert h.values("completions") == [b"echo a", b"echo b", b"echo c", b"echo a"]


def test_dedupe_marks_stay_within_their_count_and_window():
    h = Harness(echo, config=RuntimeConfig(dedupe_window_ms=1000, dedupe_max_events=3))
    for n in range(5):
        h.send(event(T0 + n, b"e%d" % n))
    assert len(h.memory.event_marks) == 3 * 24  # the three latest
    h.send(event(T0 + 1, b"e1"))  # forgotten by count: runs again
    h.send(event(T0 + 4, b"e4"))  # remembered
    assert h.values("completions")[-1] == b"echo e1" and len(h.values("completions")) == 6
    h.send(event(T0 + 5000, b"later"))
    assert len(h.memory.event_marks) == 24  # the window dropped the rest


def test_a_transport_idempotency_key_dedupes_copies_whose_bytes_differ():
    h = Harness(echo)
    h.send(event(T0, b"a"), idempotency_key=b"kafka:events/0@17")
    h.send(event(T0 + 1, b"a, re-stamped"), idempotency_key=b"kafka:events/0@17")
    h.send(event(T0 + 2, b"b"), idempotency_key=b"kafka:events/0@18")
    assert h.values("completions") == [b"echo a", b"echo b"]


def test_a_duplicate_of_a_queued_event_is_recognised_while_suspended():
    h = Harness(asks)
    h.send(event(T0, b"1"))
    h.send(event(T0 + 1, b"2"))
    h.send(event(T0 + 1, b"2"))
    assert [e.external_event for e in h.continuation.mailbox] == [b"2"]


def test_an_event_with_an_idempotency_key_leaves_two_of_the_dedupe_marks():
    """dedupe_max_events bounds marks (RuntimeConfig says so): a keyed event leaves two."""
    h = Harness(echo, config=RuntimeConfig(dedupe_max_events=4))
    h.send(event(T0, b"a"), idempotency_key=b"kafka:events/0@1")
    h.send(event(T0 + 1, b"b"), idempotency_key=b"kafka:events/0@2")
    assert len(h.memory.event_marks) == 4 * 24
    h.send(event(T0, b"a"), idempotency_key=b"kafka:events/0@1")  # one of the last two
    assert h.values("completions") == [b"echo a", b"echo b"]
    h.send(event(T0 + 2, b"c"), idempotency_key=b"kafka:events/0@3")
    h.send(event(T0, b"a"), idempotency_key=b"kafka:events/0@1")  # forgotten: runs again
    assert h.values("completions") == [b"echo a", b"echo b", b"echo c", b"echo a"]


def test_a_cap_of_one_mark_keeps_the_latest_events_idempotency_mark():
    # A keyed event leaves its content mark, then its idempotency key's: a cap below the two
    # keeps the latest, the key's, in place of the marks before it.
    h = Harness(echo, config=RuntimeConfig(dedupe_max_events=1))
    h.send(event(T0, b"a"), idempotency_key=b"kafka:events/0@1")
    h.send(event(T0 + 1, b"b"), idempotency_key=b"kafka:events/0@2")
    assert len(h.memory.event_marks) == 24
    h.send(event(T0 + 2, b"b, re-stamped"), idempotency_key=b"kafka:events/0@2")
    assert h.values("completions") == [b"echo a", b"echo b"]


# Point 7: the mailbox -------------------------------------------------------------------------


def test_events_for_a_suspended_key_queue_and_run_in_event_time_order_after_it_resumes():
    h = Harness(asks)
    h.send(event(T0, b"1"))
    (question,) = pending(h)
    h.send(event(T0 + 30, b"3"))
    h.send(event(T0 + 20, b"2"))
    snapshot = h.export(T0 + 40)
    assert [e.external_event for e in snapshot.continuation.mailbox] == [b"3", b"2"]
    restored = Harness(asks)
    restored.restore(snapshot)
    restored.send(approve(T0 + 50, question))
    # The queued "2" runs first and suspends again; "3" waits in the new mailbox.
    assert restored.values("completions") == [b"approved"]
    (asked,) = pending(restored)
    assert json.loads(asked.args_json)["amount"] == 2
    assert [e.external_event for e in restored.continuation.mailbox] == [b"3"]
    restored.send(approve(T0 + 60, asked, approved=False))
    (last,) = pending(restored)
    assert json.loads(last.args_json)["amount"] == 3
    assert restored.values("completions") == [b"approved", b"declined"]


def test_a_full_mailbox_dead_letters_the_event_with_the_event_inside():
    h = Harness(asks, config=RuntimeConfig(mailbox_max_events=1))
    h.send(event(T0, b"1"))
    h.send(event(T0 + 1, b"2"))
    h.send(event(T0 + 2, b"3"))
    (full,) = h.values(ERRORS)
    assert full.reason == "mailbox_full" and full.input.external_event == b"3"


def test_a_mailbox_over_its_byte_bound_dead_letters_the_event_that_would_overflow_it():
    h = Harness(asks, config=RuntimeConfig(mailbox_max_bytes=3))
    h.send(event(T0, b"1"))
    h.send(event(T0 + 1, b"22"))
    h.send(event(T0 + 2, b"33"))  # 2 + 2 bytes > 3
    (full,) = h.values(ERRORS)
    assert full.reason == "mailbox_full" and full.input.external_event == b"33"
    assert [e.external_event for e in h.continuation.mailbox] == [b"22"]


def test_a_mailbox_holds_events_up_to_exactly_its_byte_bound():
    h = Harness(asks, config=RuntimeConfig(mailbox_max_bytes=3))
    h.send(event(T0, b"1"))
    h.send(event(T0 + 1, b"22"))
    h.send(event(T0 + 2, b"3"))  # 2 + 1 bytes: the bound, not past it
    h.send(event(T0 + 3, b"4"))
    (full,) = h.values(ERRORS)
    assert full.input.external_event == b"4"
    assert [e.external_event for e in h.continuation.mailbox] == [b"22", b"3"]


@agent(name="tests.fragile/v1")
def fragile(ctx, event: bytes) -> bytes:
    if event == b"boom":
        raise RuntimeError("the agent cannot handle this event")
    decided = ctx.request_approval("go on?", event=event.decode())
    return b"approved" if decided.ok else b"declined"


def test_a_queued_event_whose_activation_fails_is_in_its_dead_letter():
    """A queued event was marked as seen when it was queued, so its redelivery does nothing:
    when its activation fails after the mailbox drains, the dead letter is all that holds it."""
    h = Harness(fragile)
    h.send(event(T0, b"first"))
    (question,) = pending(h)
    h.send(event(T0 + 1, b"boom"))
    h.send(approve(T0 + 2, question, ring=None))
    (failed,) = h.values(ERRORS)
    assert failed.reason == "agent_raised" and failed.input.external_event == b"boom"


def test_event_digests_are_those_marks_written_by_earlier_binaries_hold():
    """Marks outlive the binary: a restarted or upgraded job must still recognise the events
    an earlier one marked, so the digests' bytes are pinned, each under its domain prefix."""
    sent = event(T0, b"a")
    by_time = hashlib.sha256(b"event|%d|a" % T0).digest()[:16]
    assert event_digests(sent) == [by_time]  # no transport key: one mark
    by_key = hashlib.sha256(b"idempotency|kafka:events/0@17").digest()[:16]
    assert event_digests(sent, b"kafka:events/0@17") == [by_time, by_key]


def test_marks_of_one_time_are_in_time_order_whatever_their_digests():
    """Two events stamped alike leave two marks with one time: only the times are ordered."""
    at = struct.pack(">q", T0)
    assert marks_problem(at + b"\xff" * 16 + at + b"\x00" * 16) == ""
    assert marks_problem(struct.pack(">q", T0 + 1) + b"\x00" * 16 + at + b"\xff" * 16) != ""


def test_a_digest_matches_only_where_a_mark_holds_one():
    from beam_agents.runtime.machine_events import _seen

    digest = bytes(range(16))
    straddling = b"\x00" * 12 + digest + b"\x00" * 20  # across two marks' digests
    assert not _seen(straddling, digest)
    assert _seen(straddling + b"\x00" * 8 + digest, digest)  # the third mark's


# Issue 19 point 5: a busy model is not a failure ------------------------------------------------


def test_a_start_whose_model_stays_busy_waits_on_a_timer_and_keeps_its_place():
    config = RuntimeConfig(resume_backoff_ms=100, resume_backoff_max_ms=100)
    h = Harness(summarise_event, llm=DownOnce(2), config=config)
    h.send(event(T0, b"first"), arrival_ms=T0)
    assert h.values(ERRORS) == [] and h.values("completions") == []
    assert h.timers[0].at_ms == T0 + 100
    h.send(event(T0 + 10, b"second"))  # waits behind the deferred one
    h.send(event(T0, b"first"))  # a copy of the deferred event: dropped
    assert [e.external_event for e in h.continuation.mailbox] == [b"first", b"second"]
    h.fire_deadline()  # busy again: a second deferral
    assert h.values("completions") == [] and h.continuation.resume_failures == 2
    h.fire_deadline()
    assert h.values("completions") == [b"summary of first", b"summary of second"]
    assert h.continuation is None and h.values(ERRORS) == []


def test_a_model_busy_past_the_retries_is_a_dead_letter_then_the_queue_runs():
    config = RuntimeConfig(retryable_resume_retries=1, resume_backoff_ms=10)
    h = Harness(summarise_event, llm=DownOnce(2), config=config)
    h.send(event(T0, b"first"))
    h.send(event(T0 + 1, b"second"))
    h.fire_deadline()
    assert [e.reason for e in h.values(ERRORS)] == ["llm_failed"]
    assert h.values("completions") == [b"summary of second"] and h.continuation is None


# Issue 37 point 1: one event stamped far ahead ---------------------------------------------------

YEAR = 365 * 24 * 60 * 60 * 1000


def test_an_event_stamped_far_ahead_keeps_the_marks_of_the_events_inside_the_window():
    """Its copy would otherwise run again under a new seq: the window was cut at its time."""
    h = Harness(echo)
    events = [
        event(T0, b"a"),
        event(T0 + 60 * 60 * 1000, b"an hour later"),
        event(T0 + 10 * YEAR, b"far ahead"),
        event(0, b"at zero"),
        event(T0 - YEAR, b"far behind"),
    ]
    for sent in events + events:  # each, then a copy of each
        h.send(sent)
    assert h.values("completions") == [
        b"echo a",
        b"echo an hour later",
        b"echo far ahead",
        b"echo at zero",
        b"echo far behind",
    ]
    assert h.values(ERRORS) == []


def test_a_key_first_seen_at_the_end_of_time_starts_its_seqs_with_room_to_count():
    """A first seq is the event's time in microsecond steps, clamped one step short of the
    largest int64: the key can still count up, and its snapshot restores."""
    h = Harness(echo)
    h.send(event(INT64_MAX, b"last"))
    snapshot = h.export()
    assert INT64_MAX - 2 * 1000 < snapshot.seq <= INT64_MAX - 1000
    again = Harness(echo)
    again.restore(snapshot)
    again.send(event(INT64_MAX, b"after"))
    assert again.values("completions") == [b"echo after"]
    assert again.values(ERRORS) == [] and again.export().seq > snapshot.seq


def _mark_times(h: Harness) -> list[int]:
    marks = h.memory.event_marks
    return [struct.unpack_from(">q", marks, at)[0] for at in range(0, len(marks), 24)]


def test_one_event_moves_the_dedupe_clock_by_at_most_max_clock_skew_ms():
    config = RuntimeConfig(dedupe_window_ms=1000, max_clock_skew_ms=100)
    h = Harness(echo, config=config)
    h.send(event(T0, b"a"))
    h.send(event(T0 + 10**9, b"ahead"))  # stamped T0 + 100: "a" is still inside the window
    h.send(event(T0, b"a"))
    assert h.values("completions") == [b"echo a", b"echo ahead"]
    assert _mark_times(h) == [T0 + 100, T0 + 100]
    # Ten more inputs that far ahead move the clock ten steps, and take every mark as made at
    # the clock: the key cannot tell whether they or "a" had the wrong clock.
    for n in range(10):
        h.send(event(T0 + 10**9 + n + 1, b"%d" % n))
    h.send(event(T0, b"a"))
    assert h.values("completions")[-1] == b"echo 9" and _mark_times(h)[0] == T0 + 1100
    # Inputs within a step of the clock move it as they say: past the window, "a" is cut.
    for n in range(1, 12):
        h.send(event(T0 + 1100 + 100 * n, b"on time %d" % n))
    h.send(event(T0, b"a"))
    assert h.values("completions")[-1] == b"echo a"


@pytest.mark.parametrize("first", [0, T0 - YEAR], ids=["stamped_zero", "far_behind"])
def test_a_copy_of_a_first_event_stamped_behind_does_not_run_again_after_later_events(first):
    """Found by the harness (run_agent_fuzz_test, seed 38): the first event's mark was made at
    its own time, so every later event moved the clock a full step from there, and after
    dedupe_window_ms / max_clock_skew_ms of them (here less than one) its mark was cut and its
    copy ran again under a new seq: a tool effect twice."""
    config = RuntimeConfig(dedupe_window_ms=1000, max_clock_skew_ms=300)
    h = Harness(echo, config=config)
    h.send(event(first, b"first"), idempotency_key=b"transport-1")
    for n in range(10):
        h.send(event(T0 + n, b"%d" % n))
        h.send(event(first, b"first"), idempotency_key=b"transport-1")
        h.send(event(first, b"first"))
    assert h.values("completions") == [b"echo first"] + [b"echo %d" % n for n in range(10)]
    assert h.values(ERRORS) == []


def test_an_event_far_ahead_cuts_no_mark_and_keeps_its_own_until_the_clock_passes_it():
    """It was marked a step ahead and cut the marks that step took out of the window: events
    inside the window by their own times ran again."""
    config = RuntimeConfig(dedupe_window_ms=1000, max_clock_skew_ms=300)
    h = Harness(echo, config=config)
    on_time = [event(T0 + 250 * n, b"%d" % n) for n in range(4)]
    far = event(T0 + 10 * YEAR, b"far ahead")  # marked at T0 + 1050
    for sent in [*on_time, far, *on_time, far]:
        h.send(sent)
    assert h.values("completions") == [b"echo %d" % n for n in range(4)] + [b"echo far ahead"]
    for n in range(1, 5):  # on time: the clock passes the window after its mark
        h.send(event(T0 + 1050 + 300 * n, b"later %d" % n))
    h.send(far)
    assert h.values("completions")[-1] == b"echo far ahead"


def test_an_event_stamped_far_ahead_does_not_pin_the_ttl():
    """A key's activity moves by at most ttl_ms per input: a key idle that long is wiped, so
    no genuine event is further ahead of a key that still has state."""
    config = RuntimeConfig(ttl_ms=1000)
    h = Harness(echo, config=config)
    h.send(event(T0, b"a"))
    h.send(event(T0 + 10 * YEAR, b"far ahead"))
    assert h.memory.last_activity_ms == T0 + 1000
    assert h.timers[1].at_ms == T0 + 2000
    h.fire_ttl()
    assert h.memory is None


# Issue 37 point 2: dedupe marks restored malformed -----------------------------------------------


def _restored_with_marks(marks: bytes) -> Harness:
    source = Harness(echo)
    source.send(event(T0, b"a"))
    snapshot = source.export(T0 + 1)
    snapshot.memory.event_marks = marks
    h = Harness(echo)
    h.restore(snapshot)
    return h


def test_a_snapshot_whose_dedupe_marks_are_not_whole_marks_is_refused():
    """Marks appended after a torn one sit where no digest is looked for: dedupe off for
    good, silently. Refused instead, and nothing restored."""
    for marks in (b"\x00" * 23, b"\x00" * 24 + b"\x01", b"\x00" * 25):
        h = _restored_with_marks(marks)
        (refused,) = h.values(ERRORS)
        assert refused.reason == "invalid_snapshot" and "event_marks" in refused.detail
        assert h.memory is None and h.states[0].value is None


def test_a_snapshot_whose_dedupe_marks_are_out_of_time_order_is_refused():
    later, earlier = (struct.pack(">q", at) + bytes(16) for at in (T0 + 1, T0))
    h = _restored_with_marks(later + earlier)
    (refused,) = h.values(ERRORS)
    assert refused.reason == "invalid_snapshot" and h.memory is None


def test_torn_marks_already_in_state_are_made_whole_once_with_a_dead_letter():
    """Left in state by a restore of a binary that did not check them: every mark added after
    the torn one would sit where no digest is looked for, and each copy would run again."""
    h = Harness(echo)
    h.send(event(T0, b"a"))
    torn = MemoryBlob()
    torn.CopyFrom(h.memory)
    torn.event_marks += b"\x01"
    h.states[1].value = torn
    h.send(event(T0 + 1, b"b"))
    h.send(event(T0 + 1, b"b"))
    h.send(event(T0, b"a"))
    assert h.values("completions") == [b"echo a", b"echo b"]
    (repaired,) = h.values(ERRORS)
    assert (
        repaired.reason == "invalid_state" and "dropped the 1 bytes after them" in repaired.detail
    )
    assert len(h.memory.event_marks) == 2 * 24


def test_a_snapshot_with_whole_marks_in_time_order_still_dedupes_its_events():
    source = Harness(echo)
    source.send(event(T0, b"a"))
    h = Harness(echo)
    h.restore(source.export(T0 + 1))
    h.send(event(T0, b"a"))
    assert h.values(ERRORS) == [] and h.values("completions") == []


# Issue 37 point 9: an event queued behind a suspension -----------------------------------------


def test_a_queued_event_runs_at_the_time_its_mailbox_drains_not_at_its_own():
    """Queued for longer than an intent's TTL, at its own time its intents would be born
    expired, and never run."""
    config = RuntimeConfig(intent_ttl_ms=60 * 60 * 1000)
    h = Harness(asks, config=config)
    h.send(event(T0, b"1"))
    (question,) = pending(h)
    h.send(event(T0 + 1, b"2"))
    drained_at = T0 + 2 * 60 * 60 * 1000
    h.send(approve(drained_at, question, ring=None))
    (asked,) = pending(h)
    assert json.loads(asked.args_json)["amount"] == 2
    assert asked.created_at_ms == drained_at
    assert asked.expires_at_ms == drained_at + config.intent_ttl_ms
    # Its own time still names it: its seq (a key's first from its first event), its
    # activation's trace and its mark.
    assert asked.seq == SEQ + 1
    (started,) = [
        t
        for t in h.values("traces")
        if t.event_type == TraceEvent.ACTIVATION_START and t.seq == SEQ + 1
    ]
    assert started.attributes["beam_agents.event_time_ms"] == str(T0 + 1)
    h.send(event(T0 + 1, b"2"))
    assert h.values("completions") == [b"approved"]


@agent(name="tests.looks_then_pays/v1")
def looks_then_pays(ctx, event: bytes) -> bytes:
    looked = ctx.llm([{"role": "user", "content": event.decode()}], model="m")
    paid = ctx.call_tool("payments.refund", {"why": looked.text})
    return paid.payload


def test_a_deferred_start_retried_past_an_intent_ttl_runs_at_its_retry():
    hours = 60 * 60 * 1000
    config = RuntimeConfig(
        intent_ttl_ms=hours, resume_backoff_ms=2 * hours, resume_backoff_max_ms=2 * hours
    )
    h = Harness(looks_then_pays, llm=DownOnce(1), config=config)
    h.send(event(T0, b"refund me"))
    assert h.timers[0].at_ms == T0 + 2 * hours  # the model was busy: deferred
    h.fire_deadline()
    (refund,) = pending(h)
    assert refund.created_at_ms == T0 + 2 * hours
    assert refund.expires_at_ms == T0 + 3 * hours
    assert refund.seq == SEQ  # the retry runs the same seq


def _held_then_due(agent_, *, ttl_first: bool) -> tuple[Harness, int]:
    """A key holding a start (deferred, its model busy) or suspended on a question, an event
    queued behind it; then its due time and its TTL both pass (a watermark jump), and the
    runner fires the TTL's timer first or the deadline's."""
    hours = 60 * 60 * 1000
    config = RuntimeConfig(intent_ttl_ms=hours, ttl_ms=30 * 24 * hours)
    h = Harness(agent_, llm=DownOnce(1) if agent_ is looks_then_pays else None, config=config)
    h.send(event(T0, b"1"))
    h.send(event(T0 + 1, b"2"))  # queued
    due, ttl = h.timers[0].at_ms, h.timers[1].at_ms
    assert ttl > due + config.intent_ttl_ms
    emitted = len(h.outputs)
    if ttl_first:
        h.fire_ttl()
        # Left to its own timer, due too: nothing ran, both timers stand.
        assert len(h.outputs) == emitted and (h.timers[0].at_ms, h.timers[1].at_ms) == (due, ttl)
    h.fire_deadline()
    return h, due


@pytest.mark.parametrize(
    "agent_",
    [looks_then_pays, asks],
    ids=["deferred start retried", "deadline passed, mailbox drained"],
)
def test_a_due_suspension_runs_at_its_own_timer_whichever_timer_fires_first(agent_):
    """Timers of two families need not fire in time order: on a watermark jump (a backlog, a
    bounded run's end) the TTL's may come first. Run there, the retried start and the drained
    event emitted intents created at the due time but stamped with the TTL's firing, a TTL
    later: born expired, no effector runs them (the generative harness found it: fuzz
    born_expired), and the outputs depended on the order the runner fired the timers in."""
    (in_order, _), (ttl_first, due) = (_held_then_due(agent_, ttl_first=f) for f in (False, True))
    assert ttl_first.outputs == in_order.outputs
    # Emitted at the deadline's firing, stamped with it: alive there.
    (intent,) = [i for i in ttl_first.values("intents") if i.created_at_ms > T0]
    assert intent.created_at_ms == due < intent.expires_at_ms


def test_a_ttl_timer_fired_on_a_due_suspension_sets_a_lost_deadline_timer_again():
    # Left to its own timer, the due suspension must still have one: a TTL firing on it
    # commits the state unchanged, which sets both timers again, and counts the stale firing.
    h = Harness(asks)
    h.send(event(T0, b"1"))
    suspended = h.continuation
    due, ttl = h.timers[0].at_ms, h.timers[1].at_ms
    emitted = len(h.outputs)
    h.timers[0].clear()  # lost
    effects = h.fire_ttl()
    assert effects.counters == ["stale_ttl_timers"] and len(h.outputs) == emitted
    assert (h.timers[0].at_ms, h.timers[1].at_ms) == (due, ttl)
    assert h.continuation is suspended


def test_a_ttl_timer_fired_after_the_ttl_moved_forward_is_counted_stale_and_wipes_nothing():
    # A runner may fire the timer an earlier activation set after a later one reset it: the
    # key was active since, so the firing is stale, counted, and the memory stays.
    h = Harness(echo)
    h.send(event(T0, b"1"))
    first_ttl = h.timers[1].at_ms
    h.send(event(T0 + 1000, b"2"))
    assert h.timers[1].at_ms > first_ttl
    memory = h.states[0].value
    effects = h.fire_ttl(first_ttl)
    assert effects.counters == ["stale_ttl_timers"] and effects.outputs == []
    assert h.states[0].value is memory


def test_a_suspension_longer_than_the_ttl_drains_its_mailbox_at_the_answer():
    """A suspended key is not idle until its deadline: an answer on time, after more than a
    TTL, is no wrong clock, and the events queued behind it run at its time."""
    day = 24 * 60 * 60 * 1000
    config = RuntimeConfig(ttl_ms=30 * day, suspend_deadline_ms=60 * day)
    h = Harness(asks, config=config)
    h.send(event(T0, b"1"))
    (question,) = pending(h)
    h.send(event(T0 + 1, b"2"))
    answered_at = T0 + 45 * day
    h.send(approve(answered_at, question, ring=None))
    (asked,) = pending(h)
    assert asked.created_at_ms == answered_at
    assert h.memory.last_activity_ms == answered_at


@agent(name="tests.raises_on_boom/v1")
def raises_on_boom(ctx, event: bytes) -> bytes:
    if event == b"boom":
        raise ValueError("the agent's own defect")
    return b"echo " + event


def test_a_start_that_raised_before_any_model_call_still_moves_the_key_past_its_seq():
    # Nothing was paid, so nothing else is committed: the seq alone must move, or the next
    # start reuses the failed one's seq (its ids, its replay-cache slots).
    h = Harness(raises_on_boom)
    h.send(event(T0, b"boom"))
    assert [e.reason for e in h.values(ERRORS)] == ["agent_raised"]
    assert h.export().seq == SEQ
    h.send(event(T0, b"next"))
    assert h.values("completions") == [b"echo next"] and h.export().seq == SEQ + 1


# Review of the TTL's wipe of a suspended key (gone as unreachable) ------------------------------

DAY = 24 * 60 * 60 * 1000
#: The first and last millisecond a global-window timer holds (`timer_ms` clamps into them).
_FIRST_MS, _LAST_MS = timer_ms(-INT64_MAX - 1), timer_ms(INT64_MAX)
_TIMES = st.one_of(
    st.sampled_from(
        [
            0,
            -1,
            -(10**12),
            T0,
            T0 + DAY,
            T0 + 10**12,
            _FIRST_MS,
            _LAST_MS,
            INT64_MAX,
            -INT64_MAX - 1,
        ]
    ),
    st.integers(T0 - 10**4, T0 + 3 * DAY),
)
#: A firing: the timer's own (None), one by the suspension's due time (a TTL set earlier, in
#: flight), or any time a timer holds.
_FIRINGS = st.one_of(
    st.none(),
    st.sampled_from([("due", -1000), ("due", -1), ("due", 0), ("due", 1)]),
    st.sampled_from([_FIRST_MS, _LAST_MS, T0]),
    st.integers(T0 - 10**4, T0 + 3 * DAY),
)
_STEPS = st.one_of(
    st.tuples(st.just("event"), _TIMES, st.sampled_from([b"1", b"2"])),
    st.tuples(st.just("answer"), _TIMES, st.booleans()),
    st.tuples(st.just("ttl"), _FIRINGS),
    st.tuples(st.just("deadline"), _FIRINGS),
    st.tuples(st.just("release"), _TIMES),
)


def _fire(h: Harness, which: str, at) -> None:
    """Fires a timer as a runner does: its own (`at` None) is consumed unless the step sets it
    again. A TTL firing on a suspended key keeps the suspension, or dead-letters it."""
    timer = h.timers[0 if which == "deadline" else 1]
    suspended = h.continuation
    if at is None:
        if timer.at_ms is None:
            return
        at = timer.at_ms
        timer.clear()
    elif isinstance(at, tuple):
        if suspended is None:
            return
        at = max(_FIRST_MS, min(timer_ms(due_at(suspended)) + at[1], _LAST_MS))
    emitted = len(h.outputs)
    (h.fire_deadline if which == "deadline" else h.fire_ttl)(at)
    if which == "ttl" and suspended is not None:
        assert h.continuation is not None or h.values(ERRORS)[emitted:], (
            f"a TTL at {at} dropped a suspension due {due_at(suspended)} (intents "
            f"{list(suspended.pending_intent_ids)}, mailbox {len(suspended.mailbox)}) silently"
        )


@settings(
    max_examples=200, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck)
)
@given(
    ttl=st.sampled_from([1, 1000, DAY, 10**9, INT64_MAX // 2, INT64_MAX]),
    intent_ttl=st.sampled_from([0, 1000, 60 * 60 * 1000]),
    longer=st.sampled_from([0, 500, DAY, 10**13]),
    action=st.sampled_from(list(AtDeadline)),
    escalations=st.integers(0, 2),
    extension=st.sampled_from([0, 1000, 10**13]),
    model_down=st.one_of(st.none(), st.integers(1, 3)),
    restored=st.one_of(st.none(), st.tuples(_TIMES, st.one_of(st.just(0), _TIMES), _TIMES)),
    steps=st.lists(_STEPS, max_size=8),
)
def test_no_ttl_firing_drops_a_suspension_silently_and_every_suspension_ends_by_its_deadline(
    ttl, intent_ttl, longer, action, escalations, extension, model_down, restored, steps
):
    """a401499's argument, checked: a TTL firing at any time a timer holds finds a suspended
    key either due (left to its deadline timer) or not past its TTL, so it never wipes one;
    and once the watermark runs on, every suspension ends at its due time and the key is
    wiped. Suspensions on an approval or on a busy model (retry_at_ms), stored or restored with
    any deadline, retry and activity mark; timers fired twice, early, late, out of order."""
    config = RuntimeConfig(
        ttl_ms=ttl,
        intent_ttl_ms=intent_ttl,
        suspend_deadline_ms=intent_ttl + longer,
        deadline_policy=DeadlinePolicy(action, escalations, extension),
        resume_retries=1,
        retryable_resume_retries=2,
        resume_backoff_ms=1000,
        resume_backoff_max_ms=4000,
    )

    def harness() -> Harness:
        if model_down is None:
            return Harness(asks, config=config)
        return Harness(summarise_event, llm=DownOnce(model_down), config=config)

    h = harness()
    if restored is None:
        h.send(event(T0, b"5"))
        h.send(event(T0 + 1, b"6"))  # queued behind the suspension
    else:
        source = harness()
        source.send(event(T0, b"5"))
        source.send(event(T0 + 1, b"6"))
        snapshot = source.export(T0 + 2)
        snapshot.continuation.deadline_ms, snapshot.continuation.retry_at_ms = restored[:2]
        snapshot.memory.last_activity_ms = restored[2]
        h.restore(snapshot)
    for kind, at, *more in steps:
        if kind == "event":
            h.send(event(at, *more))
        elif kind == "answer" and h.continuation is not None and pending(h):
            h.send(approve(at, pending(h)[0], *more, ring=None))
        elif kind == "release" and h.continuation is None:
            h.export(at)  # no hand-off of a suspension: its snapshot would carry it away
        elif kind in ("ttl", "deadline"):
            _fire(h, kind, at)
        if h.continuation is not None:
            assert h.timers[0].at_ms == timer_ms(due_at(h.continuation))
    # The watermark runs to the end of time: timers fire in time order, on a tie the TTL's
    # first, then the one that did not fire last.
    last = 0
    for _ in range(200):
        timers = [(t.at_ms, i) for i, t in enumerate(h.timers) if t.at_ms is not None]
        if not timers:
            break
        _, last = min(timers, key=lambda timer: (timer[0], timer[1] == last))
        _fire(h, ("deadline", "ttl")[last], None)
    else:
        raise AssertionError("the key's timers never ran out")
    assert h.continuation is None, "a suspension outlived its deadline"
    if h.machine._ttl_at(h.memory, None, 0) <= _LAST_MS:  # else idle past the end of time
        assert h.memory is None and not pending(h), "an idle key was never wiped"


def test_a_negative_ttl_is_refused_rather_than_wiping_a_suspended_key_silently():
    # a401499's argument needs ttl_ms >= 0: the TTL of a suspension counts from its due time.
    try:
        config = RuntimeConfig(ttl_ms=-1)
    except RuntimeConfigError as refused:
        assert refused.field == "ttl_ms"
        return
    h = Harness(asks, config=config)
    h.send(event(T0, b"5"))
    h.send(event(T0 + 1, b"6"))  # queued behind the suspension
    assert h.timers[1].at_ms == h.timers[0].at_ms - 1  # the TTL, before the deadline
    h.fire_ttl()
    assert h.continuation is not None or h.values(ERRORS), "the suspension went silently"


def test_a_ttl_firing_at_the_windows_end_on_a_suspension_due_past_it_does_not_set_itself_again():
    # Both timers clamp to the window's last millisecond: set again there, the TTL would tie
    # with the deadline timer once more, and a runner firing the TTL first would loop.
    config = RuntimeConfig(suspend_deadline_ms=INT64_MAX // 2)
    h = Harness(asks, config=config)
    h.send(event(T0, b"1"))
    assert h.timers[0].at_ms == h.timers[1].at_ms == _LAST_MS
    h.timers[1].clear()  # consumed by its firing
    effects = h.fire_ttl(_LAST_MS)
    assert effects.counters == ["stale_ttl_timers"] and h.continuation is not None
    assert (h.timers[0].at_ms, h.timers[1].at_ms) == (_LAST_MS, None)
    h.fire_deadline()  # the suspension ends at its own timer, which sets the TTL again
    assert h.continuation is None and h.timers[1].at_ms == _LAST_MS
