"""An activation's trace as a timeline: one bar per span, placed on a shared time axis.

TraceEvents of one span (ACTIVATION_START and ACTIVATION_END share the activation's span id)
merge into one bar from their earliest start to their latest end. Bars are ordered depth-first
from the roots, so a child sits under its parent, indented by depth; each child records its
parent's row, which the template draws as a connector. Positions are percentages of the
trace's duration, so the server-rendered SVG needs no script to scale.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from beam_agents._protos import TraceEvent

__all__ = ["Bar", "Timeline", "timeline"]

#: Narrowest bar drawn, in percent, so an instant (start == end) stays visible.
_MIN_WIDTH = 0.6


@dataclasses.dataclass(frozen=True)
class Bar:
    row: int
    depth: int
    label: str
    kinds: str
    start_ms: int
    duration_ms: int
    #: Percentages of the trace's duration.
    left: float
    width: float
    #: The parent's row, or -1 for a root (or a parent outside this trace).
    parent_row: int
    error: bool


@dataclasses.dataclass(frozen=True)
class Timeline:
    start_ms: int
    duration_ms: int
    bars: list[Bar]


def timeline(events: Sequence[TraceEvent]) -> Timeline:
    spans: dict[bytes, list[TraceEvent]] = {}
    for event in events:
        spans.setdefault(event.span_id, []).append(event)
    start = min((e.start_ms for e in events), default=0)
    end = max((max(e.end_ms, e.start_ms) for e in events), default=0)
    total = max(end - start, 1)
    parents = {span: _parent(evs) for span, evs in spans.items()}
    children: dict[bytes, list[bytes]] = {}
    roots = []
    for span, parent in parents.items():
        if parent in spans and parent != span:
            children.setdefault(parent, []).append(span)
        else:
            roots.append(span)

    def first(span: bytes) -> tuple[int, bytes]:
        return (min(e.start_ms for e in spans[span]), span)

    bars: list[Bar] = []
    rows: dict[bytes, int] = {}
    # Depth-first with a stack of its own, not recursion: a trace nesting spans deeper than
    # Python's recursion limit (anyone may write to the traces topic) is drawn, not a 500.
    stack = [(root, 0, -1) for root in sorted(roots, key=first, reverse=True)]
    while stack:
        span, depth, parent_row = stack.pop()
        if span in rows:  # a cycle of parent ids in a damaged trace: draw each span once
            continue
        evs = spans[span]
        s = min(e.start_ms for e in evs)
        e_ = max(max(e.end_ms, e.start_ms) for e in evs)
        rows[span] = len(bars)
        kinds = sorted({_kind(e.event_type) for e in evs})
        bars.append(
            Bar(
                row=len(bars),
                depth=depth,
                label=_label(evs),
                kinds=", ".join(kinds),
                start_ms=s,
                duration_ms=e_ - s,
                left=100.0 * (s - start) / total,
                width=max(100.0 * (e_ - s) / total, _MIN_WIDTH),
                parent_row=parent_row,
                error=any(e.event_type == TraceEvent.ERROR for e in evs),
            )
        )
        for child in sorted(children.get(span, []), key=first, reverse=True):
            stack.append((child, depth + 1, rows[span]))
    return Timeline(start, end - start, bars)


def _parent(events: Sequence[TraceEvent]) -> bytes:
    return next((e.parent_span_id for e in events if e.parent_span_id), b"")


def _label(events: Sequence[TraceEvent]) -> str:
    for event in events:
        attributes = event.attributes
        if event.event_type == TraceEvent.ACTIVATION_START:
            resumed = attributes.get("beam_agents.resume") == "true"
            return f"{'resume' if resumed else 'activation'} seq {event.seq}"
        detail = attributes.get("gen_ai.tool.name") or attributes.get("gen_ai.request.model")
        if detail:
            return f"{_kind(event.event_type)} {detail}"
    return _kind(events[0].event_type)


def _kind(event_type: int) -> str:
    # An open enum: a newer writer's event type (or anyone's on the traces topic) is drawn by
    # its number, not a ValueError that makes the key's pages a 500.
    try:
        return TraceEvent.EventType.Name(event_type).lower()
    except ValueError:
        return f"event type {event_type}"
