"""What the agent viewer reads from the loop's topics (observed.py), over real HTTP on 127.0.0.1
with a real SQLite file: the times a record claims are anyone's, so records are ordered by
their claim clamped to when the console received them, and one trace is drawn up to
MAX_TRACE_EVENTS events however many anyone writes into it."""

from __future__ import annotations

import sqlite3

import pytest

from beam_agents._protos import TraceEvent
from beam_agents.ops.console import db as console_db
from beam_agents.ops.console.db import Database
from beam_agents.ops.console.observed import MAX_CLOCK_SKEW_MS, MAX_TRACE_EVENTS, Observations
from beam_agents.ops.rounds import ManualClock
from beam_agents.runtime.dead_letters import error_record, to_envelope
from beam_agents.testing.console import approval_intent, signed_in
from beam_agents.testing.samples import TRACE_ID

NOW = 1_000_000
FAR_FUTURE = 2**62


@pytest.fixture
def console(tmp_path):
    clock = ManualClock(NOW)
    with signed_in(tmp_path / "console.sqlite", clock) as (browser, bus, _):
        yield browser, bus, clock


def _event(trace_id: bytes, span_id: bytes, at: int, **fields) -> bytes:
    return TraceEvent(
        trace_id=trace_id, span_id=span_id, entity_key=b"c-1", start_ms=at, end_ms=at, **fields
    ).SerializeToString()


def _status(page: str) -> str:
    return page.split('id="status-state">', 1)[1].split("<", 1)[0]


def test_a_dead_letter_claiming_a_far_future_time_does_not_pin_the_status_to_failed(console):
    browser, bus, clock = console
    forged = to_envelope(error_record(b"c-1", "bad_output", "agent crashed", FAR_FUTURE))
    bus.observations.add_dead_letter(forged.SerializeToString())
    assert _status(browser.get("/agents/" + b"c-1".hex()).text) == "failed"
    clock.advance(10_000)
    bus.observations.add_completion(b"c-1", b'{"outcome": "refunded"}', clock())
    assert _status(browser.get("/agents/" + b"c-1".hex()).text) == "completed"


def test_a_completion_claiming_a_far_future_time_is_listed_at_its_receipt(console):
    _, bus, clock = console
    bus.observations.add_completion(b"c-1", b"forged", FAR_FUTURE)
    clock.advance(10_000)
    bus.observations.add_completion(b"c-1", b"real", clock())
    (latest, _forged), _ = bus.observations.completions(b"c-1")
    assert latest == (NOW + 10_000, b"real") and _forged == (NOW, b"forged")


def test_traces_claiming_far_future_times_do_not_bury_a_later_activation(console):
    browser, bus, clock = console
    for i in range(5):
        bus.observations.add_trace(
            _event(b"forged%02d" % i, b"f%07d" % i, FAR_FUTURE - i, seq=99,
                   event_type=TraceEvent.ACTIVATION_START)
        )  # fmt: skip
    clock.advance(10_000)
    bus.observations.add_trace(
        _event(TRACE_ID, b"realspan", NOW + 5_000, seq=1, event_type=TraceEvent.ACTIVATION_START)
    )
    (first, *_), total = bus.observations.activations(b"c-1")
    assert first.trace_id == TRACE_ID and total == 6
    assert "activation seq 1" in browser.get("/agents/" + b"c-1".hex()).text


def test_a_trace_is_drawn_up_to_its_first_events_received_and_says_how_many_more(console):
    browser, bus, _ = console
    bus.inbox.receive(approval_intent().SerializeToString(deterministic=True))
    bus.observations.add_trace(
        _event(TRACE_ID, b"realspan", NOW, seq=1, event_type=TraceEvent.ACTIVATION_START)
    )
    # Anyone's, into the real trace: later times, and one claiming to come first.
    for i in range(MAX_TRACE_EVENTS + 300):
        bus.observations.add_trace(
            _event(TRACE_ID, b"s%07d" % i, NOW - 1 if i == 0 else NOW + i,
                   event_type=TraceEvent.TOOL_CALL, attributes={"k": "v" * 50})
        )  # fmt: skip
    trace = bus.observations.activation(b"c-1", TRACE_ID)
    assert len(trace.events) == MAX_TRACE_EVENTS and trace.omitted == 301
    assert b"realspan" in {e.span_id for e in trace.events}
    assert [e.start_ms for e in trace.events] == sorted(e.start_ms for e in trace.events)
    page = browser.get("/fragments/agents/" + b"c-1".hex()).text
    assert len(page) < 400_000
    assert f'id="omitted-{TRACE_ID.hex()}">301 more event(s) of this trace not drawn' in page
    assert page.count('class="span-link"') == MAX_TRACE_EVENTS + 1  # its spans and the wait


def test_a_console_file_from_before_receipt_times_opens_and_times_its_rows_by_their_claims(
    tmp_path,
):
    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    for statement in console_db._SCHEMA:  # the tables as first created: no receipt column
        old.execute(statement)
    old.execute(
        "INSERT INTO traces (entity_key, trace_id, start_ms, event) VALUES (?, ?, ?, ?)",
        (b"c-1", b"old", NOW - 50, _event(b"old", b"oldspan", NOW - 50)),
    )
    old.execute(
        "INSERT INTO completions (entity_key, at_ms, output) VALUES (?, ?, ?)",
        (b"c-1", NOW - 50, b"old output"),
    )
    old.commit()
    old.close()
    observations = Observations(Database(path), clock=ManualClock(NOW))
    observations.add_trace(_event(b"new", b"newspan", NOW - 100))
    observations.add_completion(b"c-1", b"new output", NOW - 100)
    activations, total = observations.activations(b"c-1")
    assert [a.trace_id for a in activations] == [b"old", b"new"] and total == 2
    assert observations.completions(b"c-1")[0] == [
        (NOW - 50, b"old output"),
        (NOW - 100, b"new output"),
    ]


def test_traces_received_with_the_real_one_sort_after_it_when_they_claim_a_far_future_time(
    console,
):
    browser, bus, _ = console
    bus.observations.add_trace(
        _event(TRACE_ID, b"realspan", NOW, seq=1, event_type=TraceEvent.ACTIVATION_START)
    )
    ahead = NOW + MAX_CLOCK_SKEW_MS  # a writer's clock ahead of the console's, not a forgery
    bus.observations.add_trace(_event(b"ahead", b"aheadspn", ahead, seq=2))
    for i in range(5):
        bus.observations.add_trace(_event(b"forged%02d" % i, b"f%07d" % i, FAR_FUTURE - i, seq=9))
    activations, _ = bus.observations.activations(b"c-1", limit=7)
    assert [a.trace_id for a in activations][:2] == [b"ahead", TRACE_ID]
    assert "activation seq 1" in browser.get("/agents/" + b"c-1".hex()).text
