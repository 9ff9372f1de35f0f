"""Leases on real SQLite files: effector processes in separate PID namespaces (`unshare`, as
containers sharing the store's volume are), the heartbeat that keeps a long call in flight, a
renewal racing a takeover, and a claimant whose lease lapsed while it ran."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import pytest

from beam_agents._protos import AgentEnvelope, ExecutionRecord, ToolResult
from beam_agents.intents.effector import (
    DEFAULT_LEASE_MS,
    INQUIRY_SUFFIX,
    Effector,
    Route,
    SqliteExecutionStore,
    ToolSpec,
    VerifyMode,
    content_digest,
    wall_clock_ms,
)
from beam_agents.intents.effector.leases import Leases
from beam_agents.ops.rounds import ManualClock
from beam_agents.testing.effectors import (
    INT64_MAX,
    NOW,
    RING,
    Recording,
    deliver,
    effector_process,
    signed,
)
from beam_agents.testing.samples import intent
from tools.workspace import data_root

UNSHARE = ("unshare", "--pid", "--fork", "--kill-child", "--mount-proc")


def _unshare_refused() -> str | None:
    """Why this machine cannot start a process in a PID namespace of its own, or None."""
    try:
        done = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return "unshare (util-linux) is not installed"
    if done.returncode:
        return f"unshare --pid is not permitted here: {done.stderr.strip()}"
    return None


needs_pid_namespaces = pytest.mark.skipif(
    _unshare_refused() is not None, reason=str(_unshare_refused())
)


def _in_own_pid_namespace(tmp_path, lease_ms: int, then: str) -> subprocess.Popen:
    """An effector process as pid 1 of a PID namespace of its own (killed with its unshare),
    on tmp_path's store, its clock the wall clock."""
    return effector_process(
        tmp_path / "shared.sqlite",
        tmp_path / "tool.log",
        lease_ms=lease_ms,
        then=then,
        prefix=UNSHARE,
    )


def _stop(effector: subprocess.Popen) -> None:
    effector.kill()
    effector.wait()


def _on_the_shared_store(tmp_path, tool, **options) -> Effector:
    """An effector of `tool` as crm.lookup in this process on tmp_path's shared store;
    `options` go to Effector."""
    return Effector(
        {"crm.lookup": tool},
        mode=VerifyMode.REQUIRE,
        store=tmp_path / "shared.sqlite",
        keyring=RING,
        **options,
    )


def _live_intent() -> bytes:
    return signed(expires_at_ms=wall_clock_ms() + 10 * 60_000).SerializeToString()


@needs_pid_namespaces
def test_two_effectors_in_separate_pid_namespaces_share_a_call_by_its_lease(tmp_path):
    """Both effectors are pid 1, each in its own namespace, on one SQLite file. While the
    first runs the call, renewing its lease, the second answers every copy IN_FLIGHT for more
    than two leases; once the first is SIGKILLed, the second finds the call lost only after
    the lease it last renewed expired, and asks a person; the tool ran once."""
    lease_ms = 3_000
    data = _live_intent()
    store = SqliteExecutionStore(tmp_path / "shared.sqlite")
    first = _in_own_pid_namespace(tmp_path, lease_ms, "block")
    second = _in_own_pid_namespace(tmp_path, lease_ms, "return")
    try:
        assert (first.pid_inside, second.pid_inside) == (1, 1)
        first.stdin.write(data.hex() + "\n")
        first.stdin.flush()
        assert json.loads(first.stdout.readline()) == {"running": 1}
        granted = store.get(intent().intent_id).lease_expires_at_ms
        copies = []
        ends = time.monotonic() + 2.5 * lease_ms / 1000
        while time.monotonic() < ends:
            copies.append(deliver(second, data))
            time.sleep(lease_ms / 10_000)
        assert {copy["route"] for copy in copies} == {"in flight"}
        # The first's heartbeat renewed the lease meanwhile, from its own thread.
        assert store.get(intent().intent_id).lease_expires_at_ms > granted
        first.send_signal(signal.SIGKILL)  # its unshare, and with it the effector (--kill-child)
        assert first.wait() == -signal.SIGKILL
        assert first.stdout.read() == ""  # the effector itself is gone: its pipe is closed
        lapses = store.get(intent().intent_id).lease_expires_at_ms
        assert deliver(second, data)["route"] == "in flight"  # the lease is not yet expired
        deadline = time.monotonic() + lease_ms / 1000 + 30
        while (asked := deliver(second, data))["route"] == "in flight":
            assert time.monotonic() < deadline, "the lease of a dead effector never expired"
            time.sleep(lease_ms / 10_000)
        again = deliver(second, data)
    finally:
        _stop(first)
        _stop(second)
    assert asked["route"] == "approval" and asked["asks"] == intent().intent_id + INQUIRY_SUFFIX
    assert asked["asked_at_ms"] >= lapses  # never before the lease expired
    assert again == {**asked, "route": "duplicate"}
    # The first's call; the second never ran the tool.
    assert (tmp_path / "tool.log").read_text().splitlines() == [intent().intent_id]
    recorded = store.get(intent().intent_id)
    assert recorded.outcome == ExecutionRecord.OUTCOME_APPROVAL and not recorded.claimed_by


@needs_pid_namespaces
def test_a_call_in_flight_in_another_pid_namespace_on_the_store_is_not_run_again(tmp_path):
    # A reconciler finds no effect of a call still running: were the call judged lost, the tool
    # would run a second time.
    container = _in_own_pid_namespace(tmp_path, DEFAULT_LEASE_MS, "block")
    try:
        container.stdin.write(_live_intent().hex() + "\n")
        container.stdin.flush()
        assert json.loads(container.stdout.readline()) == {"running": 1}
        tool = Recording()
        here = _on_the_shared_store(tmp_path, ToolSpec(tool, reconcile=lambda _: None))
        copy = here(_live_intent())
    finally:
        _stop(container)
    assert tool.calls == [] and copy.route is Route.IN_FLIGHT


def test_a_call_longer_than_its_lease_stays_in_flight_while_its_heartbeat_renews_it(tmp_path):
    lease_ms, started, release, copies = 300, threading.Event(), threading.Event(), []

    def slow(args, tool_intent):
        started.set()
        release.wait(10)
        return "done"

    tool, first = Recording(), []
    busy = _on_the_shared_store(tmp_path, slow, lease_ms=lease_ms)
    other = _on_the_shared_store(tmp_path, tool, lease_ms=lease_ms)
    worker = threading.Thread(target=lambda: first.append(busy(_live_intent())))
    worker.start()
    try:
        assert started.wait(10)
        ends = time.monotonic() + 4 * lease_ms / 1000
        while time.monotonic() < ends:
            copies.append(other(_live_intent()).route)
            time.sleep(lease_ms / 10_000)
    finally:
        release.set()
        worker.join()
    assert set(copies) == {Route.IN_FLIGHT} and tool.calls == []
    assert first[0].route is Route.RESULT
    assert other(_live_intent()).result == first[0].result


class _RenewedAtTheTakeover(SqliteExecutionStore):
    """A real SQLite store on which the claimant, alive after all, renews its lease through its
    own connection to the file between a copy's read of the expired claim and the copy's
    takeover."""

    def __init__(self, path, renewed_until: int) -> None:
        super().__init__(path)
        self._claimant = SqliteExecutionStore(path)
        self._renewed_until = renewed_until
        self.renewed = False

    def get(self, intent_id):
        held = super().get(intent_id)
        if not self.renewed and held is not None:
            self.renewed = True
            renewed = ExecutionRecord()
            renewed.CopyFrom(held)
            renewed.lease_expires_at_ms = self._renewed_until
            assert self._claimant.replace(renewed, held, INT64_MAX)
        return held


@pytest.mark.parametrize(
    "spec",
    [
        lambda tool: ToolSpec(tool, idempotent=True),
        lambda tool: ToolSpec(tool, reconcile=lambda _: None),
        ToolSpec,
    ],
    ids=["idempotent", "reconciler finds nothing", "plain"],
)
def test_a_renewal_between_the_read_and_the_takeover_refuses_the_takeover(tmp_path, spec):
    store = _RenewedAtTheTakeover(tmp_path / "shared.sqlite", NOW + DEFAULT_LEASE_MS)
    claim = ExecutionRecord(
        intent_id=intent().intent_id,
        entity_key=intent().entity_key,
        content_digest=content_digest(signed().SerializeToString()),
        outcome=ExecutionRecord.OUTCOME_RUNNING,
        latest_expires_at_ms=intent().expires_at_ms,
        claimed_by="the claimant",
        lease_owner="the claimant",
        lease_expires_at_ms=NOW,  # expired as the copy reads it
    )
    store.claim(claim, INT64_MAX)
    store.renewed = False
    tool = Recording()
    gate = Effector(
        {"crm.lookup": spec(tool)},
        mode=VerifyMode.REQUIRE,
        store=store,
        keyring=RING,
        clock=ManualClock(NOW),
    )
    output = gate(signed())
    assert store.renewed and output.route is Route.IN_FLIGHT and tool.calls == []
    held = store.get(intent().intent_id)
    assert (held.claimed_by, held.lease_expires_at_ms) == ("the claimant", NOW + DEFAULT_LEASE_MS)


def _answer(inquiry, approved: bool) -> AgentEnvelope:
    envelope = AgentEnvelope(entity_key=inquiry.entity_key, event_time_ms=NOW)
    envelope.approval.intent_id = inquiry.intent_id
    envelope.approval.approved = approved
    envelope.approval.approver = "ops@example.com"
    envelope.approval.intent_digest = content_digest(inquiry.SerializeToString())
    return envelope


@pytest.mark.parametrize("answered", [False, True], ids=["unanswered", "answered"])
def test_a_claimant_whose_lease_lapsed_while_it_ran_keeps_the_call_to_one_result(
    tmp_path, answered
):
    """Its process froze past the lease: another effector found the call lost and asked a
    person. The frozen call's result, when its tool returns, replaces the unanswered question
    (it is what happened); a person's answer recorded first stays the call's one result."""
    clock, asked, answers = ManualClock(NOW), [], []

    def frozen(args, tool_intent):
        clock.now_ms = NOW + DEFAULT_LEASE_MS  # no renewal landed: the lease lapsed
        asked.append(other(signed(attempt=2)))
        if answered:
            answers.append(other.resolve(_answer(asked[0].approval, approved=False)))
        return "done"

    other = _on_the_shared_store(tmp_path, Recording(), clock=clock)
    first = _on_the_shared_store(tmp_path, frozen, clock=clock)(signed())
    assert asked[0].route is Route.APPROVAL and first.ran_tool
    copy = other(signed(attempt=3))
    if answered:
        one = answers[0].result
        assert one.tool_result.status == ToolResult.ERROR
        assert first.route is Route.DUPLICATE and first.result == one
    else:
        one = first.result
        assert first.route is Route.RESULT and one.tool_result.payload == b"done"
        assert other.resolve(_answer(asked[0].approval, approved=True)).result == one
    assert copy.route is Route.DUPLICATE and copy.result == one


@pytest.mark.parametrize("lease_ms", [0, 299, -1, 1.5, True])
def test_a_lease_must_be_an_int_of_at_least_300_ms(lease_ms):
    with pytest.raises(ValueError, match="lease_ms"):
        Effector({}, mode=VerifyMode.OFF, store=":memory:", lease_ms=lease_ms)


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_claim_the_binary_before_leases_wrote_is_stamped_for_its_claimant_on_read(version):
    # The golden corpus's claim, as written: no lease. Migrated on read, it keeps every field
    # and gains a lease of its claimant's for one lease from the read.
    data = (data_root() / "golden" / version / "execution_record_running.binpb").read_bytes()
    claim = ExecutionRecord.FromString(data)
    leases = Leases(DEFAULT_LEASE_MS, ManualClock(NOW))
    assert Leases.legacy(claim) and not leases.expired(claim, NOW)
    stamped = leases.stamped(claim, NOW)
    assert not Leases.legacy(stamped) and stamped.lease_owner == claim.claimed_by
    assert not leases.expired(stamped, NOW + DEFAULT_LEASE_MS - 1)
    assert leases.expired(stamped, NOW + DEFAULT_LEASE_MS)
    stamped.ClearField("lease_owner")
    stamped.ClearField("lease_expires_at_ms")
    assert stamped.SerializeToString(deterministic=True) == data


def test_an_owner_id_names_its_process_as_effectors_before_leases_read_it():
    # During a rolling upgrade an effector of the binary before leases judges a claim by the
    # process its owner id names: its pid and its start time (field 22 of /proc/<pid>/stat). A
    # wrong start time would make it take a live claim for a dead one and run the call again.
    import os
    from pathlib import Path

    from beam_agents.intents.effector.leases import new_owner_id

    stat = Path(f"/proc/{os.getpid()}/stat")
    if not stat.exists():
        pytest.skip("no /proc: the start time is left empty")
    fields = stat.read_text().rpartition(")")[2].split()  # after the command, from field 3
    pid, started, unique = new_owner_id().split(":")
    assert (pid, started) == (str(os.getpid()), fields[22 - 3]) and len(unique) == 32
