"""An agent's status in one word and one line, for the top of its page.

What a person needs first is whether the agent waits for them. So a key with an approval a
person can decide now is "waiting for a person", whatever else is known (the most urgent one
named, with its question and the time left). Otherwise the latest thing known of the key says
it: the agent's trusted snapshot suspended on answers ("suspended"), a person's decision made
since ("answered": the agent resumes once it reads it), its latest completion ("completed") or
dead letter ("failed"), whichever came last, or only its traces ("active"). "Last" is by times
on the console's clock or clamped to it: a decision's and a trusted snapshot's are the
console's own, a completion's and a dead letter's are what they claim, never later than when
the console received them (observed.py), so a forged dead letter from the far future does not
pin the status to "failed".
A snapshot nobody can vouch for (observed.py) says nothing here: the page shows it marked as
unverified below.
"""

from __future__ import annotations

import dataclasses

from beam_agents._protos import ActivationErrorRecord, StateSnapshot
from beam_agents.ops.console.display import duration, moment, question
from beam_agents.ops.console.inbox import Approval, Decision

__all__ = ["Status", "agent_status"]

#: Longest output or detail quoted in the summary line.
_QUOTE_CHARS = 120


@dataclasses.dataclass(frozen=True)
class Status:
    #: "waiting for a person", "suspended", "answered", "completed", "failed", "active" or
    #: "unknown".
    state: str
    summary: str


def _quote(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _QUOTE_CHARS else line[: _QUOTE_CHARS - 1] + "…"


def agent_status(
    *,
    now: int,
    waiting: Approval | None = None,
    waiting_total: int = 0,
    snapshot: StateSnapshot | None = None,
    completion: tuple[int, bytes] | None = None,
    letter: ActivationErrorRecord | None = None,
    letter_at_ms: int | None = None,
    decision: Decision | None = None,
    last_trace_ms: int = 0,
) -> Status:
    """The status of a key from what the console knows of it: `waiting`, the most urgent of
    the `waiting_total` approvals a person can decide now; `snapshot`, its trusted snapshot;
    `completion` (at_ms, output), `letter` and the inbox's `decision` on it, its latest, the
    completion's at_ms and `letter_at_ms` (None: the letter's event_time_ms) clamped to when
    the console received them (module docstring); `last_trace_ms`, when its latest trace
    started (0: none)."""
    if waiting is not None:
        intent = waiting.intent
        more = f" (and {waiting_total - 1} more)" if waiting_total > 1 else ""
        return Status(
            "waiting for a person",
            f"Waiting for a person for {duration(now - intent.created_at_ms)}: "
            f"“{_quote(question(intent))}”, {duration(intent.expires_at_ms - now)} left to "
            f"decide{more}.",
        )
    latest = []
    if snapshot is not None and snapshot.HasField("continuation"):
        c = snapshot.continuation
        latest.append(
            (
                snapshot.snapshot_at_ms,
                Status(
                    "suspended",
                    f"Suspended since {moment(c.suspended_at_ms)}, waiting for "
                    f"{len(c.pending_intent_ids) - len(c.answers)} of "
                    f"{len(c.pending_intent_ids)} answer(s) until {moment(c.deadline_ms)}.",
                ),
            )
        )
    if completion is not None:
        at, output = completion
        text = _quote(bytes(output).decode("utf-8", "backslashreplace"))
        latest.append((at, Status("completed", f"Completed at {moment(at)}: {text}")))
    if decision is not None:
        what = "Approved" if decision.approved else "Declined"
        sent = "sent to the agent" if decision.produced else "to be sent once the broker answers"
        latest.append(
            (
                decision.decided_at_ms,
                Status(
                    "answered",
                    f"{what} by {decision.approver} at {moment(decision.decided_at_ms)}, "
                    f"{sent}: the agent resumes once it reads the answer.",
                ),
            )
        )
    if letter is not None:
        latest.append(
            (
                letter.event_time_ms if letter_at_ms is None else letter_at_ms,
                Status(
                    "failed",
                    f"Dead-lettered at {moment(letter.event_time_ms)}: {letter.reason}: "
                    f"{_quote(letter.detail)}",
                ),
            )
        )
    if latest:
        return max(latest, key=lambda pair: pair[0])[1]
    if last_trace_ms:
        return Status("active", f"Last activation at {moment(last_trace_ms)}.")
    return Status("unknown", "Nothing is known of this agent yet.")
