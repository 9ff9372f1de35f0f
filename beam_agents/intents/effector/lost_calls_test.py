"""Calls an effector may have lost: an effector killed between deliveries or inside a tool (real
processes on one SQLite store), claims whose lease is live or expired, claims written before
leases, and the outcome of a lost call settled by its ToolSpec or by a person's signed answer.
(leases_test: leases across PID namespaces, their renewal and its races.)"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading

import pytest

from beam_agents._protos import AgentEnvelope, ExecutionRecord, ToolIntent, ToolResult
from beam_agents.errors import ExecutionStoreError
from beam_agents.intents.effector import (
    DEFAULT_LEASE_MS,
    INQUIRY_SUFFIX,
    INQUIRY_TOOL,
    Effector,
    Route,
    SqliteExecutionStore,
    ToolSpec,
    VerifyMode,
    content_digest,
)
from beam_agents.intents.identity import canonical_args_json
from beam_agents.intents.signing import Keyring, Verification, sign, verify
from beam_agents.ops.rounds import ManualClock
from beam_agents.testing.effectors import (
    INT64_MAX,
    NOW,
    RING,
    Recording,
    deliver,
    effector,
    effector_process,
    signed,
)
from beam_agents.testing.samples import intent

LEASE_MS = 1_000


def _service(tmp_path, *, die_in_tool=False, now=NOW):
    return effector_process(
        tmp_path / "executions.sqlite",
        tmp_path / "tool.log",
        now=now,
        lease_ms=LEASE_MS,
        then="die" if die_in_tool else "return",
    )


def _tool_log(tmp_path) -> list[str]:
    return (tmp_path / "tool.log").read_text().splitlines()


def test_an_effector_killed_between_two_deliveries_does_not_run_the_tool_again(tmp_path):
    data = signed().SerializeToString()
    first_process = _service(tmp_path)
    first = deliver(first_process, data)
    first_process.kill()
    first_process.wait()
    restarted = _service(tmp_path)
    try:
        again = deliver(restarted, data)
    finally:
        restarted.stdin.close()
        restarted.wait()
    assert first["route"] == "result" and first["payload"] == "looked up 42"
    assert again == {**first, "route": "duplicate"}
    assert _tool_log(tmp_path) == [intent().intent_id]


def test_an_effector_killed_inside_a_plain_tool_asks_a_person_and_never_reruns(tmp_path):
    data = signed().SerializeToString()
    dying = _service(tmp_path, die_in_tool=True)
    assert deliver(dying, data) is None  # killed mid-call: no answer
    assert dying.wait() == -signal.SIGKILL
    # Restarted before the dead call's lease expired, it is in flight; after, a lost call.
    early = _service(tmp_path, now=NOW + LEASE_MS - 1)
    try:
        assert deliver(early, data)["route"] == "in flight"
    finally:
        early.stdin.close()
        early.wait()
    restarted = _service(tmp_path, now=NOW + LEASE_MS)
    try:
        after, again = deliver(restarted, data), deliver(restarted, data)
    finally:
        restarted.stdin.close()
        restarted.wait()
    # No result for the agent (it would be a guess): an inquiry for a person, sent again to
    # a copy.
    assert after["route"] == "approval" and after["status"] is None
    assert after["asks"] == intent().intent_id + INQUIRY_SUFFIX
    assert again == {**after, "route": "duplicate"}
    assert _tool_log(tmp_path) == [intent().intent_id]


def _running_claim(claimed_by, lease_expires_at_ms=None):
    """A RUNNING ledger row for the test intent, as if `claimed_by` had claimed it: with a lease
    of its own expiring at `lease_expires_at_ms`, or none, as claims were written before
    leases."""
    claim = ExecutionRecord(
        intent_id=intent().intent_id,
        entity_key=intent().entity_key,
        content_digest=content_digest(signed().SerializeToString()),
        outcome=ExecutionRecord.OUTCOME_RUNNING,
        latest_expires_at_ms=intent().expires_at_ms,
        claimed_by=claimed_by,
    )
    if lease_expires_at_ms is not None:
        claim.lease_owner = claimed_by
        claim.lease_expires_at_ms = lease_expires_at_ms
    return claim


def test_a_claim_is_in_flight_until_its_lease_expires_and_a_lost_call_from_then(tmp_path):
    tool, clock = Recording(), ManualClock(NOW)
    gate = effector(store=tmp_path / "shared.sqlite", clock=clock, **{"crm.lookup": tool})
    gate.store.claim(_running_claim("another effector", lease_expires_at_ms=NOW + 1), INT64_MAX)
    assert gate(signed()).route is Route.IN_FLIGHT
    clock.now_ms = NOW + 1
    lost = gate(signed())
    assert lost.route is Route.APPROVAL and lost.approval.tool_name == INQUIRY_TOOL
    assert tool.calls == []


# Claims as the binary before leases wrote them: "<pid>:<start time>:<random>", no lease. The
# pid is never read: a live claimant in another PID namespace looks like a dead one here.
LEGACY_CLAIMS = ["4242:1234567:0123abcd", f"{os.getpid()}:1:0123abcd", "not-a-pid"]


# Ids without the pid: every process that collects the suite (parallel workers, the mutation
# tool's children) must see the same test names.
@pytest.mark.parametrize(
    "claimed_by", LEGACY_CLAIMS, ids=["other-host", "this-process", "not-a-pid"]
)
def test_a_claim_written_before_leases_is_in_flight_for_one_lease_then_a_lost_call(
    tmp_path, claimed_by
):
    tool, clock = Recording(), ManualClock(NOW)
    gate = effector(store=tmp_path / "shared.sqlite", clock=clock, **{"crm.lookup": tool})
    gate.store.claim(_running_claim(claimed_by), INT64_MAX)
    assert gate(signed()).route is Route.IN_FLIGHT
    # Migrated on that read: a lease for its claimant, one lease from then, which every
    # effector sharing the store now reads alike, and no renewal moves.
    stamped = gate.store.get(intent().intent_id)
    assert (stamped.claimed_by, stamped.lease_owner) == (claimed_by, claimed_by)
    assert stamped.lease_expires_at_ms == NOW + DEFAULT_LEASE_MS
    clock.now_ms = NOW + DEFAULT_LEASE_MS - 1
    assert gate(signed()).route is Route.IN_FLIGHT
    assert gate.store.get(intent().intent_id) == stamped
    clock.now_ms = NOW + DEFAULT_LEASE_MS
    assert gate(signed()).route is Route.APPROVAL and tool.calls == []


def test_a_lease_that_is_not_its_claimants_is_read_as_a_legacy_claim(tmp_path):
    # A binary before leases that took a claim over copied the record, the former claimant's
    # lease (a field it does not know) with it: that lease says nothing of the new claimant.
    clock = ManualClock(NOW)
    gate = effector(store=tmp_path / "shared.sqlite", clock=clock)
    claim = _running_claim("1:2:older binary", lease_expires_at_ms=NOW - 1)
    claim.lease_owner = "a dead effector"
    gate.store.claim(claim, INT64_MAX)
    assert gate(signed()).route is Route.IN_FLIGHT
    assert gate.store.get(intent().intent_id).lease_owner == "1:2:older binary"


def test_a_call_in_flight_in_another_thread_of_this_process_is_in_flight(tmp_path):
    gate = effector(store=tmp_path / "shared.sqlite")
    started, release, calls = threading.Event(), threading.Event(), []

    def slow(args, tool_intent):
        calls.append(tool_intent.intent_id)
        started.set()
        release.wait(10)
        return "done"

    busy = effector(store=tmp_path / "shared.sqlite", **{"crm.lookup": slow})
    first = []
    worker = threading.Thread(target=lambda: first.append(busy(signed())))
    worker.start()
    try:
        assert started.wait(10)
        assert gate(signed()).route is Route.IN_FLIGHT
        assert busy(signed()).route is Route.IN_FLIGHT  # its own instance, another thread
    finally:
        release.set()
        worker.join()
    assert first[0].route is Route.RESULT and calls == [intent().intent_id]


class _Interleaved(SqliteExecutionStore):
    """A real SQLite store that holds a copy's read (another thread's) of the first call's claim
    until that call has stored its result, and then holds that call until the copy is decided: the
    interleaving of a retry that arrives while the tool runs."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.copy_read, self.result_put, self.copy_done = (threading.Event() for _ in range(3))

    def get(self, intent_id):
        held = super().get(intent_id)
        copying = threading.current_thread() is not threading.main_thread()
        if copying and held is not None and held.outcome == ExecutionRecord.OUTCOME_RUNNING:
            self.copy_read.set()
            self.result_put.wait(10)
        return held

    def replace(self, record, expected, keep_until_ms):
        written = super().replace(record, expected, keep_until_ms)
        if record.outcome == ExecutionRecord.OUTCOME_RESULT and not self.result_put.is_set():
            self.result_put.set()
            self.copy_done.wait(10)
        return written


def test_a_retry_with_a_later_expiry_during_the_call_never_loses_its_result(tmp_path):
    store, copies = _Interleaved(tmp_path / "shared.sqlite"), []

    def retry():
        copies.append(gate(signed(attempt=3, expires_at_ms=intent().expires_at_ms + 60_000)))
        store.copy_done.set()

    retrying = threading.Thread(target=retry)

    def tool(args, tool_intent):
        retrying.start()  # the retry arrives while the tool runs
        store.copy_read.wait(10)
        return "done"

    gate = effector(store=store, **{"crm.lookup": tool})
    first = gate(signed())
    retrying.join()
    assert first.result.tool_result.payload == b"done"
    assert copies[0].route is Route.DUPLICATE and copies[0].result == first.result
    again = gate(signed(attempt=4))
    assert again.route is Route.DUPLICATE and again.result == first.result


class _DiskFullOnce(SqliteExecutionStore):
    """A real SQLite store whose first write of a result fails, as a full disk fails it."""

    failed = False

    def replace(self, record, expected, keep_until_ms):
        if not self.failed and record.outcome == ExecutionRecord.OUTCOME_RESULT:
            self.failed = True
            raise ExecutionStoreError("database or disk is full", path=self.path)
        return super().replace(record, expected, keep_until_ms)


def _cancelled(args, tool_intent):
    raise asyncio.CancelledError  # a BaseException: not the tool's result, it propagates


@pytest.mark.parametrize(
    ("store", "tool", "raised"),
    [
        (_DiskFullOnce, lambda args, tool_intent: "done", ExecutionStoreError),
        (SqliteExecutionStore, _cancelled, asyncio.CancelledError),
    ],
    ids=["store fails to record the result", "tool raises a BaseException"],
)
def test_a_claim_left_by_a_call_that_raised_is_a_lost_call_not_in_flight_for_ever(
    tmp_path, store, tool, raised
):
    calls = []

    def recorded(args, tool_intent):
        calls.append(tool_intent.intent_id)
        return tool(args, tool_intent)

    gate = effector(store=store(tmp_path / "shared.sqlite"), **{"crm.lookup": recorded})
    with pytest.raises(raised):
        gate(signed())
    # The process lives on, but nothing runs the call any more: its outcome is unknown and a
    # person is asked, instead of every copy being told to come back later.
    again = gate(signed())
    assert again.route is Route.APPROVAL and again.approval.tool_name == INQUIRY_TOOL
    assert calls == [intent().intent_id]


def _lost_call(tmp_path, tool, clock=None, **options) -> Effector:
    """An effector whose store holds the claim of an effector killed inside `tool`, its lease
    expired; `options` go to Effector."""
    gate = Effector(
        {"crm.lookup": tool},
        mode=VerifyMode.REQUIRE,
        store=tmp_path / "shared.sqlite",
        keyring=RING,
        result_keyring=RESULTS_RING,
        approval_keyring=APPROVER_RING,
        clock=clock or ManualClock(NOW),
        **options,
    )
    gate.store.claim(_running_claim("a dead effector", lease_expires_at_ms=NOW), INT64_MAX)
    return gate


RESULTS_RING = Keyring({"fx": bytes(range(1, 33))}, active="fx")
APPROVER_RING = Keyring({"ap": bytes(range(2, 34))}, active="ap")


def test_an_idempotent_tool_whose_outcome_is_unknown_runs_again_with_the_same_key(tmp_path):
    tool = Recording()
    gate = _lost_call(tmp_path, ToolSpec(tool, idempotent=True))
    output = gate(signed())
    assert output.route is Route.RESULT and output.ran_tool
    assert output.result.tool_result.status == ToolResult.OK
    assert tool.calls == [intent().intent_id]  # the idempotency key the system dedupes by
    assert gate(signed()).route is Route.DUPLICATE and tool.calls == [intent().intent_id]


def test_a_reconciler_that_finds_the_effect_gives_its_payload_without_running(tmp_path):
    tool, asked = Recording(), []

    def check(tool_intent):
        asked.append(tool_intent.intent_id)
        return "refund r-7 exists"

    gate = _lost_call(tmp_path, ToolSpec(tool, reconcile=check))
    output = gate(signed())
    assert output.route is Route.RESULT and not output.ran_tool
    result = output.result.tool_result
    assert (result.status, result.payload) == (ToolResult.OK, b"refund r-7 exists")
    assert asked == [intent().intent_id] and tool.calls == []
    assert verify(result, RESULTS_RING) is Verification.VALID


def test_a_reconciled_payload_over_the_limit_is_dropped_and_the_result_stays_ok(tmp_path):
    tool = Recording()
    gate = _lost_call(
        tmp_path, ToolSpec(tool, reconcile=lambda _: "refund r-7 exists"), max_result_bytes=16
    )
    result = gate(signed()).result.tool_result
    assert (result.status, result.payload) == (ToolResult.OK, b"")
    assert "17 bytes" in result.error_message and tool.calls == []


def test_a_reconciler_that_finds_no_effect_lets_the_tool_run_once(tmp_path):
    tool = Recording()
    gate = _lost_call(tmp_path, ToolSpec(tool, reconcile=lambda _: None))
    output = gate(signed())
    assert output.ran_tool and output.result.tool_result.payload == b"done"
    assert gate(signed()).route is Route.DUPLICATE
    assert tool.calls == [intent().intent_id]


def test_a_failing_reconciler_leaves_the_question_to_a_person(tmp_path):
    def check(_):
        raise ConnectionError("payments API down")

    tool = Recording()
    output = _lost_call(tmp_path, ToolSpec(tool, reconcile=check))(signed())
    assert output.route is Route.APPROVAL and tool.calls == []


def _answer(inquiry: ToolIntent, approved: bool, ring=APPROVER_RING, digest=None) -> AgentEnvelope:
    envelope = AgentEnvelope(entity_key=inquiry.entity_key, event_time_ms=NOW)
    envelope.approval.intent_id = inquiry.intent_id
    envelope.approval.approved = approved
    envelope.approval.approver = "ops@example.com"
    envelope.approval.intent_digest = digest or content_digest(
        inquiry.SerializeToString(deterministic=True)
    )
    envelope.approval.CopyFrom(sign(envelope.approval, ring))
    return envelope


def test_an_unknown_outcome_without_a_reconciler_is_answered_by_a_person(tmp_path):
    tool = Recording()
    gate = _lost_call(tmp_path, tool)
    asked = gate(signed())
    inquiry = asked.approval
    assert asked.route is Route.APPROVAL and asked.result is None
    assert inquiry.kind == ToolIntent.APPROVAL and inquiry.entity_key == intent().entity_key
    assert json.loads(inquiry.args_json)["intent_id"] == intent().intent_id
    assert verify(inquiry, RESULTS_RING) is Verification.VALID  # the console can check it
    # Until the person answers, every copy re-sends the same inquiry and tells the agent
    # nothing.
    again = gate(signed())
    assert again.route is Route.DUPLICATE and again.approval == inquiry and again.result is None
    answered = gate.resolve(_answer(inquiry, approved=True))
    result = answered.result.tool_result
    assert answered.route is Route.RESULT and result.status == ToolResult.OK
    assert result.intent_id == intent().intent_id
    assert result.intent_digest == content_digest(signed().SerializeToString())
    # The person knows that it acted, not what it answered: no payload passes for the tool's.
    assert result.payload == b"" and "ops@example.com confirmed" in result.error_message
    assert verify(result, RESULTS_RING) is Verification.VALID
    # The answer again, or the intent again: the same result, and the tool never ran.
    assert gate.resolve(_answer(inquiry, approved=True)).route is Route.DUPLICATE
    assert gate(signed()).result.tool_result == result
    assert tool.calls == []


INQUIRY_RING = Keyring({"iq": bytes(range(3, 35))}, active="iq")


def test_an_inquiry_after_the_calls_expiry_is_answerable_and_signed_with_the_inquiry_ring(
    tmp_path,
):
    # The copy that finds the claim dead comes after the call expired: the inquiry inherited
    # that expiry, and a console refused every answer to it.
    clock = ManualClock(intent().expires_at_ms + 60_000)
    gate = _lost_call(tmp_path, Recording(), clock=clock, inquiry_keyring=INQUIRY_RING)
    inquiry = gate(signed()).approval
    assert inquiry.created_at_ms == clock.now_ms and inquiry.expires_at_ms > clock.now_ms
    clock.now_ms += 30 * 24 * 60 * 60 * 1000  # a month on, still answerable
    assert inquiry.expires_at_ms > clock.now_ms
    # Signed with a ring of its own, which is all a console verifying it needs to hold.
    assert verify(inquiry, INQUIRY_RING) is Verification.VALID
    assert verify(inquiry, RESULTS_RING) is Verification.UNKNOWN_KEY
    result = gate.resolve(_answer(inquiry, approved=True)).result.tool_result
    assert verify(result, RESULTS_RING) is Verification.VALID


def test_an_inquiry_waits_for_its_answer_past_the_retention(tmp_path):
    # Nobody answers for days: a copy meanwhile must not be decided EXPIRED (the call may have
    # acted), and the answer when it comes must still find the inquiry.
    clock = ManualClock(NOW)
    gate = _lost_call(tmp_path, Recording(), clock=clock)
    inquiry = gate(signed()).approval
    clock.now_ms = intent().expires_at_ms + 3 * 24 * 60 * 60 * 1000  # a prune runs
    again = gate(signed(attempt=3))
    assert again.route is Route.DUPLICATE and again.approval == inquiry
    answered = gate.resolve(_answer(inquiry, approved=True))
    assert answered is not None and answered.result.tool_result.status == ToolResult.OK


class _AnswerDuringCopy(SqliteExecutionStore):
    """A real SQLite store that holds another thread's read of an unanswered inquiry (a copy
    of the intent's, or another answer's) until the main thread's answer has been recorded."""

    def __init__(self, path) -> None:
        super().__init__(path)
        self.copy_read, self.answered = threading.Event(), threading.Event()

    def get(self, intent_id):
        held = super().get(intent_id)
        copying = threading.current_thread() is not threading.main_thread()
        if copying and held is not None and held.outcome == ExecutionRecord.OUTCOME_APPROVAL:
            self.copy_read.set()
            self.answered.wait(10)
        return held


def test_a_copy_arriving_with_the_answer_never_undoes_it(tmp_path):
    gate = _lost_call(tmp_path, Recording())
    store = _AnswerDuringCopy(tmp_path / "shared.sqlite")
    gate.store = store
    inquiry = gate(signed()).approval
    copy = threading.Thread(
        target=gate, args=(signed(attempt=3, expires_at_ms=intent().expires_at_ms + 60_000),)
    )
    copy.start()
    assert store.copy_read.wait(10)
    answered = gate.resolve(_answer(inquiry, approved=True))
    store.answered.set()
    copy.join()
    again = gate(signed(attempt=4))
    assert again.route is Route.DUPLICATE and again.result == answered.result


def test_two_answers_at_once_give_the_call_one_result(tmp_path):
    # Two people answer, or two effectors read one answer twice: the later write must not
    # replace the first, or the agent gets two results for one call, here contradicting.
    gate = _lost_call(tmp_path, Recording())
    store = _AnswerDuringCopy(tmp_path / "shared.sqlite")
    gate.store = store
    inquiry = gate(signed()).approval
    outputs = []
    first = threading.Thread(
        target=lambda: outputs.append(gate.resolve(_answer(inquiry, approved=True)))
    )
    first.start()
    assert store.copy_read.wait(10)
    second = gate.resolve(_answer(inquiry, approved=False))
    store.answered.set()
    first.join()
    (late,) = outputs
    assert second.route is Route.RESULT
    assert second.result.tool_result.status == ToolResult.ERROR
    assert late.route is Route.DUPLICATE and late.result == second.result
    assert gate(signed(attempt=4)).result == second.result


def test_a_person_who_says_the_call_did_not_happen_gets_the_agent_a_not_done_error(tmp_path):
    tool = Recording()
    gate = _lost_call(tmp_path, tool)
    inquiry = gate(signed()).approval
    result = gate.resolve(_answer(inquiry, approved=False)).result.tool_result
    assert result.status == ToolResult.ERROR and result.error_message.startswith("not done: ")
    # The question told the person what a denial does, and it did just that.
    assert "it is not run again" in json.loads(inquiry.args_json)["question"]
    assert tool.calls == []


@pytest.mark.parametrize(
    ("forge", "reason"),
    [
        (dict(ring=RESULTS_RING), "answer_signature_unknown_key"),
        (dict(digest=b"\x00" * 32), "answer_for_other_content"),
    ],
)
def test_an_answer_to_an_inquiry_that_does_not_hold_is_a_dead_letter(tmp_path, forge, reason):
    gate = _lost_call(tmp_path, Recording())
    inquiry = gate(signed()).approval
    refused = gate.resolve(_answer(inquiry, approved=True, **forge))
    assert refused.route is Route.DEAD_LETTER and refused.dead_letter.reason == reason
    assert gate(signed()).route is Route.DUPLICATE  # still waiting for a genuine answer


def test_an_answer_to_anything_but_an_inquiry_is_not_the_effectors():
    gate = effector()
    assert gate.resolve(_answer(intent(intent_id="x" + INQUIRY_SUFFIX), True)) is None
    assert gate.resolve(AgentEnvelope(entity_key=b"k", external_event=b"hi")) is None


def test_an_inquiry_about_a_call_whose_intent_fit_the_bus_fits_it_too(tmp_path):
    # The question quotes the call's args_json inside a JSON string, which escapes every quote
    # and backslash again: a 700 KB intent (within Kafka's 1 MB record limit, as it was read
    # from the bus) made a 1.4 MB inquiry that the approvals topic can never take, and every
    # copy of the intent re-sends it (the effector service stops on MSG_SIZE_TOO_LARGE).
    args_json = canonical_args_json({"note": '"' * 350_000})
    data = signed(args_json=args_json).SerializeToString()
    assert len(data) < 1_000_000
    gate = _lost_call(tmp_path, Recording())
    claim = gate.store.get(intent().intent_id)
    claim.content_digest = content_digest(data)
    gate.store.put(claim, INT64_MAX)
    asked = gate(data)
    assert asked.route is Route.APPROVAL
    assert len(asked.approval.SerializeToString()) < 1_000_000
    assert intent().intent_id in json.loads(asked.approval.args_json)["question"]
