"""An agent's status line (status.py): a person's pending decision first, else the latest of
what the console trusts."""

from __future__ import annotations

from beam_agents._protos import ActivationErrorRecord, StateSnapshot, ToolIntent
from beam_agents.ops.console.inbox import Approval, Decision
from beam_agents.ops.console.status import agent_status

NOW = 10_000_000


def _waiting() -> Approval:
    intent = ToolIntent(
        intent_id="refund-1", kind=ToolIntent.APPROVAL, args_json='{"question":"Refund 42 EUR?"}',
        created_at_ms=NOW - 65_000, expires_at_ms=NOW + 3_600_000,
    )  # fmt: skip
    return Approval(intent, "valid", True, NOW - 65_000)


def _suspended(at: int) -> StateSnapshot:
    snapshot = StateSnapshot(snapshot_at_ms=at)
    snapshot.continuation.pending_intent_ids.append("lookup-1")
    snapshot.continuation.suspended_at_ms = at
    snapshot.continuation.deadline_ms = at + 60_000
    return snapshot


def test_a_decision_a_person_can_make_comes_first():
    status = agent_status(
        now=NOW, waiting=_waiting(), waiting_total=2, completion=(NOW, b"refunded")
    )
    assert status.state == "waiting for a person"
    assert status.summary == (
        "Waiting for a person for 65 s: “Refund 42 EUR?”, 60 min left to decide (and 1 more)."
    )


def test_otherwise_the_latest_of_suspension_completion_and_dead_letter_says_it():
    letter = ActivationErrorRecord(reason="llm_failed", detail="the model\nwas down",
                                   event_time_ms=NOW - 5)  # fmt: skip
    latest_completion = agent_status(now=NOW, completion=(NOW, b'{"outcome": "refunded"}'),
                                     letter=letter, snapshot=_suspended(NOW - 10))  # fmt: skip
    assert latest_completion.state == "completed"
    assert latest_completion.summary.endswith(': {"outcome": "refunded"}')
    failed = agent_status(now=NOW, completion=(NOW - 9, b"x"), letter=letter)
    assert failed.state == "failed" and failed.summary.endswith("llm_failed: the model was down")
    suspended = agent_status(now=NOW, snapshot=_suspended(NOW), completion=(NOW - 9, b"x"))
    assert suspended.state == "suspended" and "waiting for 1 of 1 answer(s)" in suspended.summary


def test_a_decision_since_the_agent_suspended_says_the_agent_will_resume():
    decision = Decision(
        "refund-1", b"c-1", True, "alice", "", NOW - 5, "", b"", b"", False
    )  # fmt: skip
    status = agent_status(now=NOW, snapshot=_suspended(NOW - 60_000), decision=decision)
    assert status.state == "answered"
    assert status.summary.startswith("Approved by alice at ")
    assert "to be sent once the broker answers" in status.summary
    later = agent_status(now=NOW, decision=decision, completion=(NOW, b"refunded"))
    assert later.state == "completed"


def test_an_agent_known_only_by_its_traces_or_not_at_all():
    assert agent_status(now=NOW, last_trace_ms=NOW).state == "active"
    assert agent_status(now=NOW).state == "unknown"
    long = agent_status(now=NOW, completion=(NOW, b"y" * 500)).summary
    assert long.endswith("…") and len(long) < 200
