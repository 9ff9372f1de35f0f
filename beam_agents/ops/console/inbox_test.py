"""The inbox decides each approval once, signed, recorded before it is produced: a second
click, a second console process, a broker failure or a crash never make a second or a lost
decision, and only an intent verified as the effector verifies it can be decided."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
import tracemalloc

import pytest

from beam_agents._protos import AgentEnvelope, StateSnapshot, ToolIntent, TraceEvent
from beam_agents.bus import KafkaBusError
from beam_agents.intents.effector import INQUIRY_SUFFIX, INQUIRY_TOOL, VerifyMode
from beam_agents.intents.identity import content_digest
from beam_agents.intents.signing import Keyring, Verification, sign, verify
from beam_agents.ops.console.db import Database
from beam_agents.ops.console.inbox import REFUSED_KEEP_MS, DecisionRefused, Inbox
from beam_agents.ops.rounds import ManualClock
from beam_agents.testing.console import (
    APPROVALS_RING,
    INTENT_RING,
    Recorder,
    approval_intent,
    export_answer,
    make_bus,
)

NOW = 5_000


@pytest.fixture
def clock():
    return ManualClock(NOW)


def _received(bus, intent: ToolIntent):
    approval, _ = bus.inbox.receive(intent.SerializeToString(deterministic=True))
    return approval


def _decide(bus, intent_id="a-1", approved=True, user="alice"):
    return bus.decide(intent_id, approved=approved, user=user, comment="ok", address="10.0.0.7")


def test_a_decision_is_one_signed_approval_bound_to_the_intents_content(tmp_path, clock):
    recorder = Recorder()
    bus, _ = make_bus(tmp_path / "c.sqlite", recorder, clock)
    intent = approval_intent()
    _received(bus, intent)
    decision, made = _decide(bus)
    assert made and decision.produced is False  # the returned copy is the recorded one
    assert recorder.records == []  # recorded only: the sender produces it
    assert bus.produce_recorded() == 1
    (data,) = recorder.on(bus.topics.events)[-1:]
    envelope = AgentEnvelope.FromString(data)
    approval = envelope.approval
    assert envelope.entity_key == b"c-1" and envelope.event_time_ms == NOW
    assert (approval.intent_id, approval.approved, approval.approver) == ("a-1", True, "alice")
    assert approval.decided_at_ms == NOW
    # What RunAgent checks (machine_answers): the approvals ring's signature, and the digest
    # of the pending intent's content.
    assert verify(approval, APPROVALS_RING) is Verification.VALID
    assert approval.intent_digest == content_digest(intent.SerializeToString(deterministic=True))
    assert bus.inbox.decision("a-1").produced
    (trace,) = [TraceEvent.FromString(v) for v in recorder.on(bus.topics.traces)]
    assert trace.attributes["beam_agents.approval.approver"] == "alice"
    assert trace.attributes["beam_agents.approval.address"] == "10.0.0.7"
    assert trace.trace_id == intent.trace_id
    (audit,), total = bus.inbox.audit()
    assert total == 1 and audit[:4] == (NOW, "alice", "approve", "a-1")
    assert audit[5] == "10.0.0.7"


def test_a_new_approval_asks_its_agent_for_a_snapshot_once(tmp_path, clock):
    recorder = Recorder()
    bus, _ = make_bus(tmp_path / "c.sqlite", recorder, clock)
    data = approval_intent().SerializeToString(deterministic=True)
    bus.handle(bus.topics.approvals, data)
    bus.handle(bus.topics.approvals, data)  # the same record read again
    bus.produce_recorded()  # what the sender does: the reader waits for no broker
    (request,) = [AgentEnvelope.FromString(v) for v in recorder.on(bus.topics.events)]
    assert request.WhichOneof("payload") == "export_request" and request.entity_key == b"c-1"


def test_an_approval_read_while_the_broker_refuses_its_export_request_is_kept_quietly(
    tmp_path, clock
):
    # Review: the export request a new approval sends raised out of `handle`, so `poll` raised
    # and the reader thread ended (no approval read again until a restart); the approval was
    # stored already, so the record read again after the restart asked for no snapshot.
    broker = Recorder()
    broker.fail = True
    bus, _ = make_bus(tmp_path / "c.sqlite", broker, clock)
    bus.handle(bus.topics.approvals, approval_intent().SerializeToString(deterministic=True))
    assert bus.inbox.get("a-1").approvable
    broker.fail = False
    assert _decide(bus)[1]


def test_a_forged_approval_writes_nothing_and_the_real_copy_after_it_asks_once(tmp_path, clock):
    # Issue 38, item 3: every refused copy asked the forger's chosen key for a snapshot, a
    # write to the loop's trusted events topic; and the real intent arriving after a forged
    # copy of its id (which it replaces) asked for none.
    recorder = Recorder()
    bus, _ = make_bus(tmp_path / "c.sqlite", recorder, clock)
    forged = approval_intent(key=b"victim", ring=None)
    bus.handle(bus.topics.approvals, forged.SerializeToString(deterministic=True))
    assert bus.produce_recorded() == 0 and recorder.records == []
    assert bus.observations.keys()[1] == 0
    bus.handle(bus.topics.approvals, approval_intent().SerializeToString(deterministic=True))
    bus.handle(bus.topics.approvals, forged.SerializeToString(deterministic=True))
    bus.produce_recorded()
    (request,) = [AgentEnvelope.FromString(v) for v in recorder.on(bus.topics.events)]
    assert request.HasField("export_request") and request.entity_key == b"c-1"


def test_a_second_click_gets_the_first_decision_and_produces_nothing(tmp_path, clock):
    recorder = Recorder()
    bus, _ = make_bus(tmp_path / "c.sqlite", recorder, clock)
    _received(bus, approval_intent())
    first, _ = _decide(bus, approved=True)
    assert bus.produce_recorded() == 1
    clock.advance(10)
    second, made = _decide(bus, approved=False, user="ada")
    assert not made and bus.produce_recorded() == 0
    assert (second.approved, second.approver, second.envelope) == (True, "alice", first.envelope)
    assert len(recorder.on(bus.topics.events)) == 1


def test_two_console_processes_on_one_file_make_one_decision(tmp_path, clock):
    path = tmp_path / "c.sqlite"
    recorders = [Recorder(), Recorder()]
    buses = [make_bus(path, r, clock)[0] for r in recorders]
    _received(buses[0], approval_intent())
    start = threading.Barrier(8)
    made = []

    def click(bus, approved):
        start.wait()
        made.append(_decide(bus, approved=approved)[1])

    threads = [threading.Thread(target=click, args=(buses[i % 2], i % 2 == 0)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert made.count(True) == 1
    # A process that finds the decision recorded but not yet acknowledged produces it too: the
    # same bytes, which RunAgent takes as one answer (a duplicate copy), never two decisions.
    for bus in buses:
        bus.produce_recorded()
    produced = {v for r in recorders for v in r.on("loop.events")}
    assert len(produced) == 1


def test_a_decision_the_broker_refused_is_delivered_once_it_answers_without_another_click(
    tmp_path, clock
):
    # Review: ConsoleBus.run produced what was left recorded once, at start, outside its loop:
    # a broker down then ended the reader thread (no approval read until a restart), and a
    # decision whose click met a broker down stayed undelivered until someone clicked again or
    # restarted the console, while the agent's deadline ran out.
    broker = Recorder()
    broker.fail = True
    bus, _ = make_bus(tmp_path / "c.sqlite", broker, clock)
    _received(bus, approval_intent())
    assert _decide(bus)[1]  # recorded at once
    with pytest.raises(KafkaBusError):
        bus.produce_recorded()
    bus.connect("127.0.0.1:1", "console-review")  # nothing listens: every poll finds nothing
    stop = threading.Event()
    reader = threading.Thread(target=bus.run, args=(stop,), daemon=True)
    reader.start()
    try:
        time.sleep(1)
        assert reader.is_alive(), "a broker down at start ended the console's reader"
        broker.fail = False
        deadline = time.monotonic() + 20
        while not bus.inbox.decision("a-1").produced:
            assert time.monotonic() < deadline, "the recorded decision was never produced"
            time.sleep(0.1)
    finally:
        stop.set()
        reader.join(30)
    assert not reader.is_alive()
    (data,) = broker.on(bus.topics.events)
    assert AgentEnvelope.FromString(data).approval.intent_id == "a-1"


def test_a_decision_recorded_while_the_sender_waits_for_the_broker_is_produced_before_it_stops(
    tmp_path, clock
):
    # Found on the broker (kafka_test): the sender was producing a snapshot request (a first
    # record waits for the producer and the topic's metadata) when a person decided and the
    # console was stopped; it saw the stop as that pass ended and returned without another,
    # so the decision stayed recorded, not sent, until the next start.
    producing, release = threading.Event(), threading.Event()
    broker = Recorder()

    def slow_broker(records):
        producing.set()
        release.wait(10)
        broker(records)

    bus, _ = make_bus(tmp_path / "c.sqlite", slow_broker, clock)
    # The approval read from its topic queues its key's snapshot request.
    bus.handle(bus.topics.approvals, approval_intent().SerializeToString(deterministic=True))
    stop = threading.Event()
    sender = threading.Thread(target=bus.send, args=(stop,), daemon=True)
    sender.start()
    assert producing.wait(10)
    assert _decide(bus)[1]
    stop.set()
    release.set()
    sender.join(30)
    assert not sender.is_alive()
    assert bus.inbox.decision("a-1").produced
    kinds = [AgentEnvelope.FromString(v).WhichOneof("payload") for v in broker.on("loop.events")]
    assert kinds == ["export_request", "approval"]


def test_a_decision_the_broker_did_not_acknowledge_is_produced_on_restart_once(tmp_path, clock):
    path = tmp_path / "c.sqlite"
    broken = Recorder()
    broken.fail = True
    bus, _ = make_bus(path, broken, clock)
    _received(bus, approval_intent())
    assert _decide(bus)[1]
    with pytest.raises(KafkaBusError):
        bus.produce_recorded()
    recorded = bus.inbox.decision("a-1")
    assert recorded is not None and not recorded.produced
    # A click while the broker is still down is the same decision, not a new one.
    assert _decide(bus, approved=False) == (recorded, False)
    # The process crashed; a new one on the same file produces the recorded bytes.
    recorder = Recorder()
    restarted, _ = make_bus(path, recorder, clock)
    assert restarted.produce_recorded() == 1
    assert recorder.on("loop.events") == [recorded.envelope]
    assert AgentEnvelope.FromString(recorded.envelope).approval.approved is True
    assert restarted.produce_recorded() == 0
    assert restarted.inbox.decision("a-1").produced


@pytest.mark.parametrize(
    ("mode", "intent", "approvable"),
    [
        (VerifyMode.REQUIRE, approval_intent(), True),
        (VerifyMode.REQUIRE, approval_intent(ring=None), False),
        (VerifyMode.PERMISSIVE, approval_intent(ring=None), True),
        (VerifyMode.PERMISSIVE, approval_intent(ring=Keyring({"x": b"y" * 32}, active="x")), False),
        (
            VerifyMode.REQUIRE,
            ToolIntent(
                **{
                    **{f.name: v for f, v in approval_intent(ring=None).ListFields()},
                    "kind": ToolIntent.TOOL,
                }
            ),
            False,
        ),
    ],
    ids=["signed", "unsigned-require", "unsigned-permissive", "unknown-key", "tool-kind"],
)
def test_only_an_intent_the_mode_admits_can_be_decided(tmp_path, clock, mode, intent, approvable):
    if intent.kind == ToolIntent.TOOL:
        intent = sign(intent, INTENT_RING)
    bus, _ = make_bus(tmp_path / "c.sqlite", Recorder(), clock, mode=mode)
    assert _received(bus, intent).approvable is approvable
    if approvable:
        assert _decide(bus)[1]
        return
    with pytest.raises(DecisionRefused) as refused:
        _decide(bus)
    assert refused.value.reason == "unverified"
    assert bus.inbox.decision("a-1") is None


INQUIRY_RING = Keyring({"effector-inquiries": b"i" * 32}, active="effector-inquiries")


def _inquiry(ring: Keyring) -> ToolIntent:
    """The effector's question about a lost call, shaped as `Gate` makes it."""
    asked = approval_intent("x-1" + INQUIRY_SUFFIX, ring=None, question="Did it take effect?")
    asked.tool_name = INQUIRY_TOOL
    return sign(asked, ring)


@pytest.mark.parametrize(
    ("question", "approvable"),
    [
        (_inquiry(INQUIRY_RING), True),
        # The agents' key cannot pose as the effector, nor the effector's as an agent.
        (_inquiry(INTENT_RING), False),
        (approval_intent("x-1", ring=INQUIRY_RING), False),
    ],
    ids=["inquiry-by-the-effector", "inquiry-by-an-agent-key", "agent-question-by-the-effector"],
)
def test_the_effectors_inquiry_is_verified_with_its_inquiry_ring_and_only_it(
    tmp_path, clock, question, approvable
):
    bus, _ = make_bus(tmp_path / "c.sqlite", Recorder(), clock, inquiry_keyring=INQUIRY_RING)
    assert _received(bus, question).approvable is approvable
    if approvable:
        decision, made = _decide(bus, question.intent_id)
        assert made and decision.approved
        return
    with pytest.raises(DecisionRefused) as refused:
        _decide(bus, question.intent_id)
    assert refused.value.reason == "unverified"


def test_without_an_inquiry_ring_an_inquiry_is_refused_saying_which_ring_is_missing(
    tmp_path, clock
):
    bus, _ = make_bus(tmp_path / "c.sqlite", Recorder(), clock)
    refused = _received(bus, _inquiry(INQUIRY_RING))
    assert not refused.approvable and "inquiry keyring" in refused.verification


def test_a_tampered_copy_is_refused_and_cannot_shadow_the_real_intent(tmp_path, clock):
    bus, _ = make_bus(tmp_path / "c.sqlite", Recorder(), clock)
    real = approval_intent()
    forged = ToolIntent()
    forged.CopyFrom(real)
    forged.args_json = '{"amount":9999,"question":"Refund 9999?"}'
    assert not _received(bus, forged).approvable
    assert _received(bus, real).approvable
    assert bus.inbox.get("a-1").intent.args_json == real.args_json
    assert not _received(bus, forged).approvable or bus.inbox.get("a-1").intent == real
    assert bus.inbox.get("a-1").intent == real


@pytest.mark.parametrize("expires_at_ms", [NOW, NOW - 1, 0])
def test_a_decision_at_or_after_expiry_is_refused(tmp_path, clock, expires_at_ms):
    bus, _ = make_bus(tmp_path / "c.sqlite", Recorder(), clock)
    _received(bus, approval_intent(expires_at_ms=expires_at_ms))
    with pytest.raises(DecisionRefused, match="expired") as refused:
        _decide(bus)
    assert refused.value.reason == "expired"
    assert bus.inbox.decision("a-1") is None


def test_a_decision_after_the_suspensions_deadline_is_refused(tmp_path, clock):
    recorder = Recorder()
    bus, _ = make_bus(tmp_path / "c.sqlite", recorder, clock)
    _received(bus, approval_intent())
    snapshot = StateSnapshot(entity_key=b"c-1")
    snapshot.continuation.pending_intent_ids.append("a-1")
    snapshot.continuation.deadline_ms = NOW - 1
    bus.handle(bus.topics.snapshots, export_answer(bus, recorder, snapshot))
    with pytest.raises(DecisionRefused, match="deadline") as refused:
        _decide(bus)
    assert refused.value.reason == "after_deadline"
    # At the deadline itself the agent still takes the answer (RunAgent refuses only after).
    snapshot.continuation.deadline_ms = NOW
    bus.handle(bus.topics.snapshots, export_answer(bus, recorder, snapshot))
    assert _decide(bus)[1]


def test_an_unknown_approval_is_refused(tmp_path, clock):
    bus, _ = make_bus(tmp_path / "c.sqlite", Recorder(), clock)
    with pytest.raises(DecisionRefused) as refused:
        _decide(bus, intent_id="nope")
    assert refused.value.reason == "unknown"


def test_a_copy_refused_for_a_key_the_console_lacked_is_judged_again_when_it_has_it(
    tmp_path, clock
):
    # Review: the verdict on a copy was kept forever. Its record is committed once read, so an
    # approval signed with a key the console's keyring did not hold yet (a rotation the
    # console learned of late) stayed refused after the operator added the key and restarted:
    # an approval lost for good. The other way, a copy admitted under a key since removed
    # stayed approvable.
    path = tmp_path / "c.sqlite"
    rotated = Keyring({"intents-2": b"the rotated intent key, 32+ bytes long"}, active="intents-2")
    bus, _ = make_bus(path, Recorder(), clock)
    _received(bus, approval_intent("a-1", ring=rotated))
    _received(bus, approval_intent("a-2"))
    assert not bus.inbox.get("a-1").approvable and bus.inbox.get("a-2").approvable
    both = Keyring({**INTENT_RING.keys, **rotated.keys}, active="intents-2")
    restarted, _ = make_bus(path, Recorder(), clock, intent_keyring=both)
    assert restarted.inbox.get("a-1").approvable
    assert restarted.inbox.get("a-1").verification == Verification.VALID.value
    assert _decide(restarted, "a-1")[1]
    revoked, _ = make_bus(path, Recorder(), clock, intent_keyring=rotated)
    assert not revoked.inbox.get("a-2").approvable
    with pytest.raises(DecisionRefused) as refused:
        _decide(revoked, "a-2")
    assert refused.value.reason == "unverified"
    assert revoked.inbox.decision("a-1").approver == "alice"  # a decision is never judged again


def test_judging_the_kept_copies_again_at_start_holds_one_copy_at_a_time(tmp_path, clock):
    # Anyone may write to the approvals topic and every refused copy is kept, undecided for
    # ever: a start that read them all at once (fetchall) held every forged intent in memory,
    # so a topic filled with large forgeries kept the console from starting at all.
    path = tmp_path / "c.sqlite"
    bus, _ = make_bus(path, Recorder(), clock)
    for n in range(80):
        forged = approval_intent(f"f-{n}", question="x" * 256 * 1024, ring=None)
        _received(bus, forged)
    assert not bus.inbox.get("f-0").approvable
    tracemalloc.start()
    try:
        restarted, _ = make_bus(path, Recorder(), clock)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not restarted.inbox.get("f-79").approvable
    assert peak < 4 * 1024 * 1024, f"{peak} bytes held to judge 20 MB of copies again"


def test_refused_copies_are_kept_a_bounded_time_and_number_real_ones_are_not(tmp_path, clock):
    # Issue 38: every refused copy, anyone's, was kept for ever: a forger grew the inbox, and
    # the work of every page, without bound.
    bus, _ = make_bus(tmp_path / "c.sqlite", Recorder(), clock)
    _received(bus, approval_intent("a-1"))
    _received(bus, approval_intent("f-early", ring=None))
    # A day later the next refused copy finds the earlier one too old to keep; the real one
    # stays.
    clock.advance(REFUSED_KEEP_MS + 1)
    _received(bus, approval_intent("f-late", ring=None))
    assert [a.intent_id for a in bus.inbox.approvals()[0]] == ["a-1", "f-late"]
    inbox = Inbox(
        Database(tmp_path / "c.sqlite"), mode=VerifyMode.REQUIRE, intent_keyring=INTENT_RING,
        approvals_keyring=APPROVALS_RING, clock=clock, max_refused=5,
    )  # fmt: skip
    for n in range(8):
        clock.advance(1)
        inbox.receive(approval_intent(f"f-{n}", ring=None).SerializeToString())
    pending, total = inbox.approvals()
    newest = [f"f-{n}" for n in range(3, 8)]
    assert total == 6 and [a.intent_id for a in pending] == ["a-1", *newest]


def test_the_inbox_lists_verified_copies_first_in_the_order_received(tmp_path, clock):
    # Issue 38: ordered by created_at_ms, which an unsigned copy sets as it likes.
    bus, _ = make_bus(tmp_path / "c.sqlite", Recorder(), clock)
    _received(bus, approval_intent("a-1", created_at_ms=9_000))
    clock.advance(1)
    _received(bus, approval_intent("a-2", created_at_ms=8_000))
    _received(bus, approval_intent("f-1", created_at_ms=1, ring=None))
    assert [a.intent_id for a in bus.inbox.approvals(limit=2)[0]] == ["a-1", "a-2"]
    of_key, _ = bus.inbox.approvals(state="all", key=b"c-1")
    assert [a.intent_id for a in of_key] == ["a-1", "a-2", "f-1"]


def test_only_the_answer_to_the_consoles_own_request_decides(tmp_path, clock):
    # Issue 38: one forged snapshot (snapshot_at_ms=2**62, deadline_ms=1) refused every
    # decision on the key for good.
    recorder = Recorder()
    bus, _ = make_bus(tmp_path / "c.sqlite", recorder, clock)
    _received(bus, approval_intent("a-1"))
    _received(bus, approval_intent("a-2"))
    passed = StateSnapshot(entity_key=b"c-1")
    passed.continuation.pending_intent_ids.extend(["a-1", "a-2"])
    passed.continuation.deadline_ms = 1
    forged = StateSnapshot()
    forged.CopyFrom(passed)
    forged.snapshot_at_ms = 2**62
    bus.handle(bus.topics.snapshots, forged.SerializeToString())
    assert _decide(bus, "a-1")[1]
    # A real request id on a snapshot of another key is no answer to it.
    answer = StateSnapshot.FromString(export_answer(bus, recorder, passed))
    elsewhere = StateSnapshot()
    elsewhere.CopyFrom(answer)
    elsewhere.entity_key = b"c-2"
    bus.handle(bus.topics.snapshots, elsewhere.SerializeToString())
    assert bus.observations.snapshot(b"c-2", trusted=True) is None
    # The agent's own answer decides, and the forgery received after it does not replace it.
    bus.handle(bus.topics.snapshots, answer.SerializeToString())
    bus.handle(bus.topics.snapshots, forged.SerializeToString())
    assert bus.observations.snapshot_trusted(b"c-1")
    with pytest.raises(DecisionRefused) as refused:
        _decide(bus, "a-2")
    assert refused.value.reason == "after_deadline"


def test_a_file_from_before_trust_and_credentials_were_recorded_opens_failing_closed(
    tmp_path, clock
):
    # The console's file outlives the binary: the columns added for issue 38 are added to an
    # older file, whose snapshot is untrusted and whose session is no session.
    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE sessions (token_hash BLOB PRIMARY KEY, user TEXT NOT NULL, "
        "csrf TEXT NOT NULL, expires_at_ms INTEGER NOT NULL)"
    )
    old.execute(
        "CREATE TABLE snapshots (entity_key BLOB PRIMARY KEY, snapshot_at_ms INTEGER NOT NULL, "
        "snapshot BLOB NOT NULL)"
    )
    token = "an old session's token"
    digest = hashlib.sha256(token.encode()).digest()
    old.execute("INSERT INTO sessions VALUES (?, 'alice', 'c', ?)", (digest, NOW + 1000))
    snapshot = StateSnapshot(entity_key=b"c-1", snapshot_at_ms=NOW)
    old.execute(
        "INSERT INTO snapshots VALUES (?, ?, ?)", (b"c-1", NOW, snapshot.SerializeToString())
    )
    old.commit()
    old.close()
    bus, auth = make_bus(path, Recorder(), clock)
    assert bus.observations.snapshot(b"c-1") == snapshot
    assert not bus.observations.snapshot_trusted(b"c-1")
    assert auth.session(token) is None


# -- issue 38 items 14 and 16: urgency, filters, edited arguments ---------------------------


def _ids(approvals) -> list[str]:
    return [a.intent_id for a in approvals[0]]


def test_the_inbox_lists_what_a_person_can_decide_soonest_to_expire_first(tmp_path, clock):
    # Issue 38 item 14: listed in the order received, a request about to expire sat below
    # others with hours left.
    bus, _ = make_bus(tmp_path / "c.sqlite", Recorder(), clock)
    _received(bus, approval_intent("in-an-hour", expires_at_ms=NOW + 3_600_000))
    _received(bus, approval_intent("expired", expires_at_ms=NOW - 1))
    _received(bus, approval_intent("forged-soon", expires_at_ms=NOW + 1, ring=None))
    _received(bus, approval_intent("in-a-minute", expires_at_ms=NOW + 60_000))
    _received(bus, approval_intent("no-expiry", expires_at_ms=0))
    # Decidable ones by time left; then those nobody can decide; refused copies last, by
    # receipt (their unsigned expiry orders nothing).
    assert _ids(bus.inbox.approvals()) == [
        "in-a-minute", "in-an-hour", "no-expiry", "expired", "forged-soon",
    ]  # fmt: skip


def test_the_inbox_filters_by_state_tool_and_key(tmp_path, clock):
    bus, _ = make_bus(tmp_path / "c.sqlite", Recorder(), clock)
    _received(bus, approval_intent("a-1"))
    _received(bus, approval_intent("a-2", key=b"c-2"))
    _received(bus, approval_intent("a-3", tool="budget.raise"))
    _received(bus, approval_intent("f-1", ring=None))
    _decide(bus, "a-1")
    assert _ids(bus.inbox.approvals(state="pending")) == ["a-2", "a-3"]
    assert _ids(bus.inbox.approvals(state="undecided")) == ["a-2", "a-3", "f-1"]
    assert _ids(bus.inbox.approvals(state="decided")) == ["a-1"]
    assert _ids(bus.inbox.approvals(state="refused")) == ["f-1"]
    assert _ids(bus.inbox.approvals(state="all", tool="budget.raise")) == ["a-3"]
    assert _ids(bus.inbox.approvals(state="all", key=b"c-2")) == ["a-2"]
    assert bus.inbox.approvals(state="all", key=b"c-1")[1] == 3
    # A decided approval comes with its decision: what, by whom, when, with what comment.
    ((decided,), _) = bus.inbox.approvals(state="decided")
    assert decided.decision.approver == "alice" and decided.decision.comment == "ok"
    # A forger's tool name is no filter choice.
    assert bus.inbox.tools() == ["budget.raise", "human.approval"]


def test_an_older_console_file_gets_its_approvals_tool_names(tmp_path, clock):
    path = tmp_path / "c.sqlite"
    bus, _ = make_bus(path, Recorder(), clock)
    _received(bus, approval_intent("a-1", tool="budget.raise"))
    _decide(bus, "a-1")
    with sqlite3.connect(path) as db:  # as a console before the column kept it
        db.execute("UPDATE approvals SET tool_name = ''")
    reopened, _ = make_bus(path, Recorder(), clock)
    assert _ids(reopened.inbox.approvals(state="decided", tool="budget.raise")) == ["a-1"]


def test_an_approval_with_edited_arguments_is_signed_with_them(tmp_path, clock):
    # Issue 38 item 16: a person could only approve or decline the refund as asked.
    recorder = Recorder()
    bus, _ = make_bus(tmp_path / "c.sqlite", recorder, clock)
    intent = approval_intent(editable=["amount"])
    _received(bus, intent)
    decision, made = bus.decide(
        "a-1", approved=True, user="alice", comment="partial refund", address="10.0.0.7",
        edits={"amount": 30},
    )  # fmt: skip
    assert made and decision.edits == '{"amount":30}'
    bus.produce_recorded()
    approval = AgentEnvelope.FromString(recorder.on(bus.topics.events)[-1]).approval
    assert approval.edited_args_json == '{"amount":30}'
    assert verify(approval, APPROVALS_RING) is Verification.VALID
    trace = TraceEvent.FromString(recorder.on(bus.topics.traces)[-1])
    assert trace.attributes["beam_agents.approval.edited_args"] == '{"amount":30}'
    (row,) = bus.inbox.audit()[0]
    assert row[2] == "approve edited" and '"amount":30' in row[4]
    # An edit that changes nothing is no edit.
    _received(bus, approval_intent("a-2", editable=["amount"]))
    decision, _ = bus.decide(
        "a-2", approved=True, user="alice", comment="", address="", edits={"amount": 42}
    )
    assert decision.edits == ""


@pytest.mark.parametrize(
    ("editable", "edits", "approved"),
    [
        ((), {"amount": 30}, True),  # the request allows no edit
        (("amount",), {"question": "Refund 1 EUR?"}, True),
        (("amount",), {"amount": "30"}, True),  # text for a number
        (("amount",), {"amount": True}, True),
        (("amount",), {"amount": 30}, False),  # a decline carries no edits
    ],
)
def test_the_inbox_refuses_an_edit_the_request_does_not_allow(
    tmp_path, clock, editable, edits, approved
):
    recorder = Recorder()
    bus, _ = make_bus(tmp_path / "c.sqlite", recorder, clock)
    _received(bus, approval_intent(editable=editable))
    recorder.records.clear()
    with pytest.raises(DecisionRefused) as refused:
        bus.decide("a-1", approved=approved, user="alice", comment="", address="", edits=edits)
    assert refused.value.reason == "edit_refused"
    assert bus.inbox.decision("a-1") is None and bus.produce_recorded() == 0
    assert bus.inbox.audit()[1] == 0
