"""The timeline (timeline.py): an activation's instants as marks, the wait for a person as a
span from the question to the decision (or to now), placed under the span that asked, with
the approver and the comment from the inbox's record, never from the traces topic."""

from __future__ import annotations

from beam_agents._protos import ToolIntent, TraceEvent
from beam_agents.ops.console.inbox import Approval, Decision
from beam_agents.ops.console.timeline import span_text, timeline, waits_of

T0 = 1_000_000
ROOT, ASKED = b"\x01" * 8, b"\x02" * 8


def _events(intent_id: str = "refund-1") -> list[TraceEvent]:
    def event(span, parent, kind, at, **attributes):
        return TraceEvent(
            trace_id=b"t" * 16, span_id=span, parent_span_id=parent, entity_key=b"c-1", seq=3,
            event_type=kind, attributes=attributes, start_ms=at, end_ms=at,
        )  # fmt: skip

    return [
        event(ROOT, b"", TraceEvent.ACTIVATION_START, T0),
        event(ASKED, ROOT, TraceEvent.INTENT_EMITTED, T0, **{"beam_agents.intent_id": intent_id}),
        # What anyone can write to the traces topic as a console's decision.
        event(
            b"\x09" * 8,
            b"",
            TraceEvent.TOOL_CALL,
            T0 + 5,
            **{
                "beam_agents.source": "console",
                "beam_agents.approval.approver": "mallory",
            },
        ),
    ]


def _approval(decision: Decision | None = None, expires: int = T0 + 3_600_000) -> Approval:
    intent = ToolIntent(
        intent_id="refund-1", entity_key=b"c-1", kind=ToolIntent.APPROVAL,
        args_json='{"question":"Refund 42 EUR?"}', created_at_ms=T0, expires_at_ms=expires,
    )  # fmt: skip
    return Approval(intent, "valid", True, T0, decision)


def _decision(**fields) -> Decision:
    return Decision(
        "refund-1", b"c-1", True, "alice", "double charge", T0 + 65_000, "10.0.0.7", b"", b"",
        True, **fields,
    )  # fmt: skip


def test_the_wait_for_a_person_is_a_span_to_the_decision_under_the_span_that_asked():
    # Issue 38 item 15: every bar read "0 ms", the wait for a person was not drawn at all.
    waits = waits_of([_approval(_decision(edits='{"amount":30}'))], T0 + 99_000, lambda a: "")
    tl = timeline(_events(), waits)
    root, asked, wait = tl.bars
    assert root.instant and asked.instant and asked.parent_row == root.row
    assert wait.wait and not wait.instant and wait.parent_row == asked.row
    assert (wait.start_ms, wait.duration_ms) == (T0, 65_000) and not wait.open
    assert wait.label == "waited for a person: approved by alice"
    details = dict(wait.details)
    assert details["approver"] == "alice" and details["comment"] == "double charge"
    assert details["edited arguments"] == '{"amount":30}'
    assert details["question"] == "Refund 42 EUR?"
    # The console's decision events from the topic (anyone's) are not drawn: no "mallory".
    assert all("mallory" not in str(bar) for bar in tl.bars)
    assert tl.duration_ms == 65_000


def test_an_undecided_wait_runs_to_now_and_one_nobody_can_decide_ends_at_its_expiry():
    (open_,) = waits_of([_approval()], T0 + 30_000, lambda a: "")
    assert open_.open and open_.end_ms == T0 + 30_000 and open_.label == "waiting for a person"
    (closed,) = waits_of([_approval(expires=T0 + 10_000)], T0 + 30_000, lambda a: "expired")
    assert not closed.open and closed.end_ms == T0 + 10_000
    assert dict(closed.details)["why it cannot be decided"] == "expired"


def test_a_wait_whose_question_the_trace_lacks_is_drawn_at_the_top_level():
    (bar,) = timeline([], waits_of([_approval()], T0 + 1_000, lambda a: "")).bars
    assert bar.wait and bar.parent_row == -1 and bar.open


def test_an_events_details_list_its_times_and_attributes():
    _root, asked, _ = timeline(_events(), waits_of([_approval()], T0 + 1, lambda a: "")).bars
    assert ("  beam_agents.intent_id", "refund-1") in asked.details
    assert asked.details[0][0] == "intent_emitted"


def test_span_text_reads_milliseconds_seconds_minutes_and_hours():
    assert [span_text(ms) for ms in (0, 320, 65_000, 185_000, 7_500_000)] == [
        "0 ms", "320 ms", "65 s", "3 min 5 s", "2 h 5 min",
    ]  # fmt: skip


def _cycle(intent_id: str = "refund-1") -> list[TraceEvent]:
    """Anyone's events in the trace: two spans whose parents are each other, one naming the
    approval as the intent it emitted, and one under the cycle."""

    def event(span, parent, kind, **attributes):
        return TraceEvent(
            trace_id=b"t" * 16, span_id=span, parent_span_id=parent, entity_key=b"c-1",
            event_type=kind, attributes=attributes, start_ms=T0, end_ms=T0,
        )  # fmt: skip

    return [
        event(b"cyc00001", b"cyc00002", TraceEvent.INTENT_EMITTED,
              **{"beam_agents.intent_id": intent_id}),
        event(b"cyc00002", b"cyc00001", TraceEvent.ERROR),
        event(b"under001", b"cyc00002", TraceEvent.TOOL_CALL),
    ]  # fmt: skip


def test_spans_whose_parents_form_a_cycle_are_each_drawn_once_and_the_wait_still_shows():
    tl = timeline(_events() + _cycle(), waits_of([_approval()], T0 + 1_000, lambda a: ""))
    spans = [bar for bar in tl.bars if not bar.wait]
    assert len(spans) == 5  # the activation, the real ask, the cycle's two and the one under
    assert len({(bar.label, bar.kinds, bar.details) for bar in spans}) == 5
    (wait,) = [bar for bar in tl.bars if bar.wait]
    # Two spans name the intent (the real one and the cycle's): the wait hangs under neither.
    assert wait.parent_row == -1 and wait.depth == 0 and wait.label == "waiting for a person"
    cycle_top = next(bar for bar in spans if bar.depth == 0 and bar.parent_row == -1
                     and "intent_emitted" in bar.kinds)  # fmt: skip
    assert cycle_top.row > tl.bars[0].row  # drawn after the trace's true root


def test_a_wait_is_not_hung_under_a_span_in_a_cycle():
    tl = timeline(_cycle(), waits_of([_approval()], T0 + 1_000, lambda a: ""))
    (wait,) = [bar for bar in tl.bars if bar.wait]
    assert wait.parent_row == -1 and len(tl.bars) == 4


def test_a_trace_nesting_spans_past_pythons_recursion_limit_is_drawn_whole():
    depth = 1200  # the page reads fewer (observed.MAX_TRACE_EVENTS); the timeline draws any
    events = []
    for n in range(depth):
        events.append(TraceEvent(
            trace_id=b"t" * 16, span_id=n.to_bytes(8, "big"), entity_key=b"c-1",
            parent_span_id=(n - 1).to_bytes(8, "big") if n else b"",
            event_type=TraceEvent.TOOL_CALL, start_ms=T0 + n, end_ms=T0 + n + 1,
        ))  # fmt: skip
    bars = timeline(events).bars
    assert [bar.depth for bar in bars] == list(range(depth))
    assert [bar.parent_row for bar in bars] == list(range(-1, depth - 1))
