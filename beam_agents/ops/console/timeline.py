"""An activation's trace as a timeline: one bar per span, placed on a shared time axis, and the
waits for a person as spans of their own.

TraceEvents of one span (ACTIVATION_START and ACTIVATION_END share the activation's span id)
merge into one bar from their earliest start to their latest end. Bars are ordered depth-first
from the roots, so a child sits under its parent, indented by depth; each child records its
parent's row, which the template draws as a connector. Positions are percentages of the
timeline's duration, so the server-rendered SVG needs no script to scale.

The runtime stamps every event of an activation with the activation's event time (replays must
emit the same bytes), so its spans are instants: the template draws an instant as a mark with
its time from the start, not as a bar of "0 ms". What takes time in an agent's life is the wait
between a suspension and its resume, above all the wait for a person. Each APPROVAL the inbox
holds for the trace is a `Wait` (`waits_of`): a span from the moment the agent asked (the
intent's signed created_at_ms) to the decision, or to now while nobody has decided, or to the
intent's expiry once nobody can; drawn under the INTENT_EMITTED span that asked when the trace
has exactly one naming the intent and that span hangs under a root, else at the top level: the
traces topic is anyone's, and no event written to it hides or misplaces the wait for a person.
Spans whose parent ids form a cycle reach no root: each cycle is drawn from its earliest span,
so every span is drawn exactly once. Who decided and why comes from the inbox's own record of
the decision, never from the traces topic (anyone's): the console's decision events read back
from that topic are left out.

Each bar carries its details (`Bar.details`: each event's kind, times and attributes, or the
wait's question and decision), which the page lists under the timeline, each expanding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from beam_agents._protos import TraceEvent
from beam_agents.ops.console.display import moment, question
from beam_agents.ops.console.inbox import Approval

__all__ = ["Bar", "Timeline", "Wait", "span_text", "timeline", "waits_of"]

#: Narrowest bar drawn, in percent, so an instant (start == end) stays visible.
_MIN_WIDTH = 0.6
#: The attribute a console writes on its decision events (inbox._trace).
_SOURCE = "beam_agents.source"


@dataclasses.dataclass(frozen=True)
class Wait:
    """The wait for a person's answer to one APPROVAL intent."""

    intent_id: str
    tool: str
    start_ms: int
    end_ms: int
    #: Nobody has decided yet and a person still can: the span runs on to now.
    open: bool
    label: str
    details: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True)
class Bar:
    row: int
    depth: int
    label: str
    kinds: str
    start_ms: int
    duration_ms: int
    #: Percentages of the timeline's duration.
    left: float
    width: float
    #: The parent's row, or -1 for a root (or a parent outside this trace).
    parent_row: int
    error: bool
    #: Milliseconds from the timeline's start.
    offset_ms: int = 0
    #: A wait for a person (open: still waiting).
    wait: bool = False
    open: bool = False
    #: (name, value) pairs shown when the bar's entry is expanded.
    details: tuple[tuple[str, str], ...] = ()

    @property
    def instant(self) -> bool:
        return self.duration_ms == 0 and not self.wait


@dataclasses.dataclass(frozen=True)
class Timeline:
    start_ms: int
    duration_ms: int
    bars: list[Bar]


def span_text(ms: int) -> str:
    """A span's length for a label: milliseconds below a second, else display.duration's."""
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms // 1000
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def waits_of(approvals: Iterable[Approval], now: int, why_undecidable) -> list[Wait]:
    """The waits of `approvals` (the trace's, as the inbox keeps them): decided ones end at
    the decision, undecided ones run to `now` unless `why_undecidable(approval)` says nobody
    can decide them, then they end at the intent's expiry (or when they were asked)."""
    waits = []
    for a in approvals:
        intent, decision = a.intent, a.decision
        asked = intent.created_at_ms
        details = [("question", question(intent)), ("asked", moment(asked))]
        if decision is not None:
            what = "approved" if decision.approved else "declined"
            label = f"waited for a person: {what} by {decision.approver}"
            end, open_ = decision.decided_at_ms, False
            details += [
                ("decision", what + (" with edited arguments" if decision.edits else "")),
                ("approver", decision.approver),
                ("decided", moment(decision.decided_at_ms)),
                ("comment", decision.comment or "-"),
            ]
            if decision.edits:
                details.append(("edited arguments", decision.edits))
            details.append(("delivered", "yes" if decision.produced else "not yet"))
        elif why := why_undecidable(a):
            expires = intent.expires_at_ms
            end, open_ = (min(expires, now) if expires else asked), False
            label = "waited for a person: nobody decided"
            details.append(("why it cannot be decided", why))
        else:
            end, open_ = now, True
            label = "waiting for a person"
            details.append(("expires", moment(intent.expires_at_ms)))
        waits.append(
            Wait(a.intent_id, intent.tool_name, asked, max(end, asked), open_, label,
                 tuple(details))
        )  # fmt: skip
    return waits


def timeline(events: Sequence[TraceEvent], waits: Sequence[Wait] = ()) -> Timeline:
    # The console's decision events come from the inbox's record (`waits`), not the topic.
    events = [e for e in events if e.attributes.get(_SOURCE) != "console"]
    spans: dict[bytes, list[TraceEvent]] = {}
    for event in events:
        spans.setdefault(event.span_id, []).append(event)
    starts = [e.start_ms for e in events] + [w.start_ms for w in waits]
    ends = [max(e.end_ms, e.start_ms) for e in events] + [w.end_ms for w in waits]
    start, end = min(starts, default=0), max(ends, default=0)
    total = max(end - start, 1)
    parents = {span: _parent(evs) for span, evs in spans.items()}
    children: dict[bytes, list[bytes]] = {}
    roots = []
    for span, parent in parents.items():
        if parent in spans and parent != span:
            children.setdefault(parent, []).append(span)
        else:
            roots.append(span)
    # Which span asked for each intent, by the INTENT_EMITTED events naming it. Anyone can
    # write such an event, so a wait hangs under the span only when exactly one names it;
    # whether that span is reached from a root is known once the tree is drawn.
    named: dict[str, list[bytes]] = {}
    for e in events:
        if e.event_type == TraceEvent.INTENT_EMITTED and "beam_agents.intent_id" in e.attributes:
            asking = named.setdefault(e.attributes["beam_agents.intent_id"], [])
            if e.span_id not in asking:
                asking.append(e.span_id)
    asked_in = {intent_id: spans_[0] for intent_id, spans_ in named.items() if len(spans_) == 1}
    waits_under: dict[bytes, list[Wait]] = {}
    for wait in waits:
        if wait.intent_id in asked_in:
            waits_under.setdefault(asked_in[wait.intent_id], []).append(wait)

    def first(span: bytes) -> tuple[int, bytes]:
        return (min(e.start_ms for e in spans[span]), span)

    bars: list[Bar] = []

    def place(s: int, e_: int, **fields) -> None:
        bars.append(
            Bar(
                row=len(bars), start_ms=s, duration_ms=e_ - s, offset_ms=s - start,
                left=100.0 * (s - start) / total, width=max(100.0 * (e_ - s) / total, _MIN_WIDTH),
                **fields,
            )
        )  # fmt: skip

    def place_wait(wait: Wait, depth: int, parent_row: int) -> None:
        place(
            wait.start_ms, wait.end_ms, depth=depth, label=wait.label, kinds="wait for a person",
            parent_row=parent_row, error=False, wait=True, open=wait.open, details=wait.details,
        )  # fmt: skip

    rows: dict[bytes, int] = {}
    placed_waits: set[str] = set()

    def draw(tops: list[bytes], trusted: bool) -> None:
        """Draws `tops` and the spans under them depth-first, with a stack of its own, not
        recursion: a trace nesting spans deeper than Python's recursion limit (anyone may
        write to the traces topic) is drawn, not a 500. Each span is drawn once; under an
        untrusted top (a cycle's) no wait is hung."""
        stack = [(top, 0, -1) for top in sorted(tops, key=first, reverse=True)]
        while stack:
            span, depth, parent_row = stack.pop()
            if span in rows:
                continue
            evs = spans[span]
            rows[span] = len(bars)
            place(
                min(e.start_ms for e in evs), max(max(e.end_ms, e.start_ms) for e in evs),
                depth=depth, label=_label(evs),
                kinds=", ".join(sorted({_kind(e.event_type) for e in evs})),
                parent_row=parent_row, error=any(e.event_type == TraceEvent.ERROR for e in evs),
                details=_details(evs),
            )  # fmt: skip
            for wait in waits_under.get(span, []) if trusted else []:
                placed_waits.add(wait.intent_id)
                place_wait(wait, depth + 1, rows[span])
            for child in sorted(children.get(span, []), key=first, reverse=True):
                stack.append((child, depth + 1, rows[span]))

    draw(roots, trusted=True)
    # Spans whose parent ids form a cycle (a damaged or forged trace) reach no root: each
    # cycle is drawn from its earliest span as a root, so every span is drawn exactly once.
    while len(rows) < len(spans):
        draw([min((s for s in spans if s not in rows), key=first)], trusted=False)
    # A wait whose asking span is unknown, ambiguous or in a cycle is drawn at the top level:
    # no trace event can hide the wait for a person.
    for wait in waits:
        if wait.intent_id not in placed_waits:
            place_wait(wait, 0, -1)
    return Timeline(start, end - start, bars)


def _details(events: Sequence[TraceEvent]) -> tuple[tuple[str, str], ...]:
    details = []
    for event in events:
        at = moment(event.start_ms)
        if event.end_ms > event.start_ms:
            at += f" to {moment(event.end_ms)}"
        details.append((_kind(event.event_type), f"{at}, seq {event.seq}, step {event.step_index}"))
        details += [(f"  {name}", value) for name, value in sorted(event.attributes.items())]
    return tuple(details)


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
