"""The effector gate's decisions, through `Effector`: signatures by mode, expiry, kinds, tools
and their arguments, one run per intent_id, conflicting copies, signed results and retention."""

from __future__ import annotations

import threading

import pytest

from beam_agents._protos import ExecutionRecord, ToolIntent, ToolResult
from beam_agents.intents.effector import (
    REASON_CONFLICT,
    REASON_UNDECODABLE,
    Effector,
    ExecuteIntents,
    Route,
    SqliteExecutionStore,
    ToolSpec,
    VerifyMode,
    content_digest,
)
from beam_agents.intents.signing import LEGACY_UNTIL_MS, Keyring, Verification, sign, verify
from beam_agents.ops.rounds import ManualClock
from beam_agents.testing.effectors import (
    INT64_MAX,
    KEYS,
    NOW,
    RING,
    Recording,
    effector,
    flaky,
    lookup,
    signed,
    tampered,
)
from beam_agents.testing.samples import intent


def test_a_valid_intent_runs_its_tool_and_returns_an_ok_envelope():
    output = effector()(signed())
    assert output.route is Route.RESULT
    envelope = output.result
    assert envelope.entity_key == b"customer-42" and envelope.event_time_ms == NOW
    result = envelope.tool_result
    assert (result.intent_id, result.seq, result.status) == (intent().intent_id, 7, ToolResult.OK)
    assert result.payload == f"{intent().intent_id}:42".encode()
    assert result.completed_at_ms == NOW and result.entity_key == b"customer-42"


def _unknown_key() -> ToolIntent:
    return sign(intent(), Keyring({"other": bytes(32)}, active="other"))


def _unknown_scheme() -> ToolIntent:
    future = signed()
    future.signature_scheme = 3  # a scheme this binary does not implement
    return future


CASES = {
    "valid": signed,
    "unsigned": intent,
    "bad signature": tampered,
    "unknown key": _unknown_key,
    "unknown scheme": _unknown_scheme,
}
ADMITTED = {
    VerifyMode.OFF: set(CASES),
    VerifyMode.PERMISSIVE: {"valid", "unsigned"},
    VerifyMode.REQUIRE: {"valid"},
}


@pytest.mark.parametrize("mode", list(VerifyMode), ids=lambda m: m.value)
@pytest.mark.parametrize("case", list(CASES))
def test_signatures_are_checked_first_by_mode(mode, case):
    tool = Recording()
    output = effector(mode, **{"crm.lookup": tool})(CASES[case]())
    if case in ADMITTED[mode]:
        assert output.route is Route.RESULT and tool.calls == [intent().intent_id]
    else:
        assert output.route is Route.DEAD_LETTER and output.result is None
        assert tool.calls == []
        record = output.dead_letter
        assert record.reason == "signature_" + case.replace(" ", "_")
        assert record.entity_key == b"customer-42" and record.event_time_ms == NOW
        assert intent().intent_id in record.detail and mode.value in record.detail


@pytest.mark.parametrize("expires_at_ms", [NOW, NOW - 1, 0])
def test_an_expired_intent_gets_expired_without_running(expires_at_ms):
    tool = Recording()
    output = effector(**{"crm.lookup": tool})(signed(expires_at_ms=expires_at_ms))
    assert output.route is Route.RESULT
    assert output.result.tool_result.status == ToolResult.EXPIRED
    assert tool.calls == []


def test_the_signature_is_checked_before_expiry():
    expired_and_tampered = signed(expires_at_ms=NOW - 1)
    expired_and_tampered.tool_name = "crm.delete"
    assert effector()(expired_and_tampered).route is Route.DEAD_LETTER


def test_an_approval_intent_goes_to_a_human_and_never_runs():
    tool = Recording()
    approval = signed(kind=ToolIntent.APPROVAL)
    output = effector(**{"crm.lookup": tool})(approval)
    assert output.route is Route.APPROVAL and output.approval == approval
    assert output.result is None and tool.calls == []


def test_an_intent_without_kind_runs_as_a_tool_call():
    output = effector()(signed(kind=ToolIntent.TOOL_KIND_UNSPECIFIED))
    assert output.result.tool_result.status == ToolResult.OK


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tool_name": "crm.delete"}, "unknown tool 'crm.delete'"),
        ({"args_json": "[1,2]"}, "args_json refused: $: tool arguments must be a JSON object"),
        ({"args_json": "{broken"}, "args_json refused: $: not JSON"),
    ],
)
def test_intents_that_cannot_run_are_rejected(overrides, message):
    result = effector()(signed(**overrides)).result.tool_result
    assert result.status == ToolResult.REJECTED
    assert result.error_message.startswith(message)


def test_a_tool_runs_once_per_intent_id():
    tool = Recording()
    gate = effector(**{"crm.lookup": tool})
    first, second = gate(signed()), gate(signed(attempt=3))
    assert tool.calls == [intent().intent_id]
    assert first.route is Route.RESULT and second.route is Route.DUPLICATE
    assert second.result == first.result
    assert gate(signed(intent_id="another")).route is Route.RESULT
    assert len(tool.calls) == 2


def test_a_late_redelivery_gets_the_first_result_not_expired():
    tool, clock = Recording(), ManualClock(NOW)
    gate = effector(clock=clock, **{"crm.lookup": tool})
    first = gate(signed())
    clock.now_ms = intent().expires_at_ms + 1
    late = gate(signed())
    assert late.route is Route.DUPLICATE and late.result == first.result
    assert late.result.tool_result.status == ToolResult.OK
    assert tool.calls == [intent().intent_id]


def test_a_retry_with_a_later_expiry_after_the_first_expiry_does_not_run_again():
    tool, clock = Recording(), ManualClock(NOW)
    gate = effector(clock=clock, **{"crm.lookup": tool})
    first = gate(signed())
    clock.now_ms = intent().expires_at_ms + 10_000
    retry = gate(signed(attempt=3, expires_at_ms=clock.now_ms + 60_000))
    assert retry.route is Route.DUPLICATE and retry.result == first.result
    assert tool.calls == [intent().intent_id]


def test_a_redelivery_after_the_tool_is_gone_still_gets_the_first_result(tmp_path):
    store = tmp_path / "executions.sqlite"
    first = effector(store=store)(signed())
    without_tool = Effector(
        {}, mode=VerifyMode.REQUIRE, store=store, keyring=RING, clock=ManualClock(NOW)
    )
    again = without_tool(signed())
    assert again.route is Route.DUPLICATE and again.result == first.result


def test_the_signature_is_checked_over_the_bytes_as_received():
    # Protobuf does not fix field order; a signer that emits trace_id (11) before the other
    # fields signs those bytes, and re-serializing in number order would not reproduce them.
    trace_id_first = (
        ToolIntent(trace_id=intent().trace_id).SerializeToString()
        + intent(trace_id=b"").SerializeToString()
    )
    envelope = ToolIntent(
        signature_scheme=ToolIntent.HMAC_SHA256_TYPED,
        signing_key_id="k1",
        signature=RING.mac(
            "k1",
            trace_id_first,
            domain=b"\0beam_agents signature HMAC_SHA256_TYPED\0beam_agents.v1.ToolIntent\0",
        ),
    )
    output = effector()(trace_id_first + envelope.SerializeToString())
    assert output.route is Route.RESULT and output.result.tool_result.status == ToolResult.OK


@pytest.mark.parametrize(
    ("at", "route"),
    [(LEGACY_UNTIL_MS - 1, Route.RESULT), (LEGACY_UNTIL_MS, Route.DEAD_LETTER)],
    ids=["inside the window", "at its end"],
)
def test_a_legacy_signed_intent_runs_inside_the_window_and_is_refused_after_it(at, route):
    # A signer not yet upgraded, or held on the legacy scheme during a rolling upgrade.
    legacy = Keyring(KEYS, active="k1", sign_scheme=ToolIntent.HMAC_SHA256, legacy_until_ms=2**62)
    tool = Recording()
    data = sign(intent(expires_at_ms=INT64_MAX), legacy).SerializeToString()
    output = effector(clock=ManualClock(at), **{"crm.lookup": tool})(data)
    assert output.route is route
    if route is Route.DEAD_LETTER:
        assert output.dead_letter.reason == "signature_legacy_expired" and tool.calls == []
    else:
        assert tool.calls == [intent().intent_id]


def test_the_signature_is_checked_before_the_duplicate_check():
    gate = effector()
    gate(signed())
    assert gate(tampered()).route is Route.DEAD_LETTER


@pytest.mark.parametrize(
    "conflicting",
    [
        {"entity_key": b"customer-43"},
        {"args_json": '{"id":666}'},
        {"tool_name": "crm.lookup_all"},
        {"seq": 8},
        {"kind": ToolIntent.APPROVAL},
    ],
    ids=lambda o: next(iter(o)),
)
def test_another_intent_under_a_known_id_is_rejected_bound_to_its_own_content(conflicting):
    """The copy is never run and never handed the first content's result: whoever waits on
    it gets a REJECTED result naming the conflict, bound to the copy's own content."""
    tool = Recording()
    gate = effector(**{"crm.lookup": tool, "crm.lookup_all": tool})
    first = gate(signed()).result.tool_result
    copy = signed(**conflicting)
    output = gate(copy)
    assert output.route is Route.RESULT and not output.ran_tool
    rejected = output.result.tool_result
    assert rejected.status == ToolResult.REJECTED and rejected.intent_id == copy.intent_id
    assert rejected.entity_key == conflicting.get("entity_key", b"customer-42")
    assert rejected.intent_digest == content_digest(copy.SerializeToString())
    assert rejected.intent_digest != first.intent_digest
    assert first.intent_digest == content_digest(signed().SerializeToString())
    what = "another entity" if "entity_key" in conflicting else "other content"
    assert rejected.error_message.startswith(REASON_CONFLICT)
    assert f"reuses the id of an intent of {what}" in rejected.error_message
    assert tool.calls == [intent().intent_id]
    # The first content still gets its own result.
    assert gate(signed()).result.tool_result == first


def test_results_are_signed_by_the_result_key_and_verify_against_it():
    ring = Keyring({"effector-1": bytes(range(1, 33))}, active="effector-1")
    gate = Effector(
        {"crm.lookup": Recording()},
        mode=VerifyMode.REQUIRE,
        store=":memory:",
        keyring=RING,
        result_keyring=ring,
        clock=ManualClock(NOW),
    )
    result = gate(signed()).result.tool_result
    assert verify(result, ring) is Verification.VALID
    assert verify(result, RING) is Verification.UNKNOWN_KEY
    forged = ToolResult()
    forged.CopyFrom(result)
    forged.payload = b"refunded 5000"
    assert verify(forged, ring) is Verification.BAD_SIGNATURE
    # A duplicate is answered with the very same signed bytes.
    assert gate(signed()).result.tool_result == result


@pytest.mark.parametrize(
    "delivery",
    [
        {"attempt": 9},
        {"created_at_ms": NOW - 5},
        {"expires_at_ms": NOW + 1},
        {"trace_id": b"t" * 16},
    ],
    ids=lambda o: next(iter(o)),
)
def test_a_copy_differing_only_in_delivery_fields_is_a_duplicate(delivery):
    gate = effector()
    first = gate(signed())
    again = gate(signed(**delivery))
    assert again.route is Route.DUPLICATE and again.result == first.result


def test_an_expired_result_is_the_one_result_even_for_a_fresher_retry():
    tool, clock = Recording(), ManualClock(NOW)
    gate = effector(clock=clock, **{"crm.lookup": tool})
    expired = gate(signed(expires_at_ms=NOW - 1))
    retry = gate(signed(expires_at_ms=NOW + 60_000, attempt=3))
    assert expired.result.tool_result.status == ToolResult.EXPIRED
    assert retry.route is Route.DUPLICATE and retry.result == expired.result
    assert tool.calls == []


def test_a_duplicate_approval_reaches_a_human_once():
    gate = effector()
    first = gate(signed(kind=ToolIntent.APPROVAL))
    again = gate(signed(kind=ToolIntent.APPROVAL, attempt=5))
    assert first.route is Route.APPROVAL
    # The recorded request is sent again (the approvals channel dedupes by intent_id): an
    # effector killed before the first sending was acknowledged never loses it.
    assert again.route is Route.DUPLICATE and again.result is None
    assert again.approval.intent_id == first.approval.intent_id


@pytest.mark.parametrize("kind", [3, 99])
def test_an_unknown_future_kind_fails_closed(kind):
    tool = Recording()
    output = effector(**{"crm.lookup": tool})(signed(kind=kind))
    assert output.result.tool_result.status == ToolResult.REJECTED
    assert f"unknown intent kind {kind}" in output.result.tool_result.error_message


@pytest.mark.parametrize("expires_at_ms", [INT64_MAX, NOW + 1])
def test_any_future_expiry_up_to_int64_max_runs(expires_at_ms, tmp_path):
    gate = effector(store=tmp_path / "s.sqlite")
    assert gate(signed(expires_at_ms=expires_at_ms)).result.tool_result.status == ToolResult.OK
    assert gate(signed(expires_at_ms=expires_at_ms)).route is Route.DUPLICATE


@pytest.mark.parametrize("expires_at_ms", [-(2**63), -1])
def test_a_negative_expiry_is_expired(expires_at_ms):
    output = effector()(signed(expires_at_ms=expires_at_ms))
    assert output.result.tool_result.status == ToolResult.EXPIRED


HOSTILE_ARGS = {
    "5,000-digit integer": '{"id":' + "9" * 5000 + "}",
    "5,000-digit float": '{"id":' + "9" * 5000 + ".5}",
    "100,000-deep nesting": '{"id":' + "[" * 100_000 + "]" * 100_000 + "}",
    "beyond 2^53": '{"id":9007199254740993}',
    "NaN": '{"id":NaN}',
    "lone surrogate": '{"id":"\\ud800"}',
    "duplicate key": '{"id":1,"id":2}',
    "not an object": "[1,2]",
    "not JSON": "{broken",
}


@pytest.mark.parametrize("args_json", HOSTILE_ARGS.values(), ids=HOSTILE_ARGS)
def test_hostile_arguments_are_rejected_before_the_tool_runs(args_json):
    tool = Recording()
    output = effector(**{"crm.lookup": tool})(signed(args_json=args_json))
    result = output.result.tool_result
    assert result.status == ToolResult.REJECTED
    assert result.error_message.startswith("args_json refused: ")
    assert tool.calls == []


def test_invalid_utf8_in_a_string_field_is_an_undecodable_dead_letter():
    data = bytearray(signed(args_json='{"id":"xx"}').SerializeToString())
    data[data.index(b"xx") : data.index(b"xx") + 2] = b"\xff\xfe"
    output = effector()(bytes(data))
    assert output.route is Route.DEAD_LETTER
    assert output.dead_letter.reason == REASON_UNDECODABLE
    # No key can be read from bytes that are no ToolIntent: the record names none.
    assert output.dead_letter.entity_key == b""


class _Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("a __str__ that fails")


@pytest.mark.parametrize(
    "tool",
    [
        lambda a, i: (_ for _ in ()).throw(ValueError("bad \ud800 text")),
        lambda a, i: "surrogate \udc80",
        lambda a, i: (_ for _ in ()).throw(RuntimeError("x" * 1_000_000)),
        lambda a, i: (_ for _ in ()).throw(_Unprintable()),
    ],
    ids=["surrogate in exception", "surrogate in payload", "huge exception", "unprintable"],
)
def test_whatever_a_tool_does_it_ends_as_a_result(tool):
    output = effector(**{"crm.lookup": tool})(signed())
    result = output.result.tool_result
    assert result.status == ToolResult.ERROR
    assert len(result.error_message) < 5000
    assert ToolResult.FromString(result.SerializeToString()) == result


MINUTE = 60_000


def _retaining(tool, clock, store, retention_ms=2 * MINUTE) -> Effector:
    """An effector of `tool` as crm.lookup over `store`, keeping records `retention_ms`."""
    return Effector(
        {"crm.lookup": tool},
        mode=VerifyMode.REQUIRE,
        keyring=RING,
        clock=clock,
        store=store,
        retention_ms=retention_ms,
    )


def test_records_are_kept_for_the_retention_after_the_latest_expiry_then_pruned(tmp_path):
    tool, clock = Recording(), ManualClock(NOW)
    gate = _retaining(tool, clock, tmp_path / "s.sqlite")
    first_expiry = intent().expires_at_ms
    gate(signed())  # kept until first_expiry + 2 min
    later_expiry = first_expiry + 4 * MINUTE
    gate(signed(attempt=2, expires_at_ms=later_expiry))  # now kept until later_expiry + 2 min
    clock.now_ms = first_expiry + 3 * MINUTE  # past the first keep-until: a prune runs
    assert gate(signed(attempt=3, expires_at_ms=later_expiry)).route is Route.DUPLICATE
    assert len(gate.store) == 1 and tool.calls == [intent().intent_id]
    clock.now_ms = later_expiry + 3 * MINUTE
    fresh = signed(intent_id="other", expires_at_ms=clock.now_ms + MINUTE)
    assert gate(fresh).route is Route.RESULT  # prunes on the way
    assert len(gate.store) == 1  # only "other" is left
    assert tool.calls == [intent().intent_id, "other"]


def test_a_claim_is_not_pruned_while_its_tool_runs_past_the_retention(tmp_path):
    # A copy arriving meanwhile at another effector on the store must not find the claim gone
    # and record EXPIRED: the agent would be told the call failed, then that it ran. (The clock
    # jumps past the retention within the claim's lease, which a heartbeat would keep renewed.)
    clock, copies = ManualClock(NOW), []

    def gate(**tools):
        return Effector(
            tools or {"crm.lookup": lookup},
            mode=VerifyMode.REQUIRE,
            keyring=RING,
            clock=clock,
            store=tmp_path / "s.sqlite",
            retention_ms=2 * MINUTE,
            lease_ms=10 * MINUTE,
        )

    def slow(args, tool_intent):
        clock.now_ms = intent().expires_at_ms + 3 * MINUTE  # past expiry + retention
        copies.append(gate()(signed(attempt=2)))  # prunes on the way
        return "done"

    first = gate(**{"crm.lookup": slow})(signed())
    assert first.result.tool_result.status == ToolResult.OK
    assert [copy.route for copy in copies] == [Route.IN_FLIGHT]
    again = gate()(signed(attempt=3))
    assert again.route is Route.DUPLICATE and again.result == first.result


def test_a_decision_on_a_long_expired_intent_is_kept_for_the_retention_from_then():
    tool, clock = Recording(), ManualClock(NOW)
    gate = effector(clock=clock, **{"crm.lookup": tool})
    ten_days = 10 * 24 * 60 * MINUTE
    expired = gate(signed(expires_at_ms=NOW - ten_days))
    clock.now_ms = NOW + 2 * MINUTE  # a prune runs
    retry = gate(signed(attempt=2, expires_at_ms=clock.now_ms + MINUTE))
    assert expired.result.tool_result.status == ToolResult.EXPIRED
    assert retry.route is Route.DUPLICATE and retry.result == expired.result
    assert tool.calls == []


def test_retention_must_be_a_non_negative_int():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="retention_ms"):
            Effector({}, mode=VerifyMode.OFF, store=":memory:", retention_ms=bad)


@pytest.mark.parametrize(
    ("tool", "message"),
    [(flaky, "TimeoutError: upstream took 30s"), (lambda a, i: 42, "TypeError: tool returned int")],
)
def test_a_failing_tool_gives_an_error_result(tool, message):
    result = effector(**{"crm.lookup": tool})(signed()).result.tool_result
    assert result.status == ToolResult.ERROR
    assert result.error_message.startswith(message)


def test_a_payload_over_max_result_bytes_is_dropped_and_the_result_stays_ok():
    # The call took effect, so the agent hears OK, never a failure it might retry; the bytes
    # are not kept, since every copy would send them again past the bus's record limit.
    calls = []

    def tool(args, tool_intent):
        calls.append(tool_intent.intent_id)
        return b"y" * (17 if tool_intent.intent_id == intent().intent_id else 16)

    gate = Effector(
        {"crm.lookup": tool},
        mode=VerifyMode.REQUIRE,
        store=":memory:",
        keyring=RING,
        clock=ManualClock(NOW),
        max_result_bytes=16,
    )
    result = gate(signed()).result.tool_result
    assert (result.status, result.payload) == (ToolResult.OK, b"")
    assert result.error_message == (
        "the tool took effect; its result of 17 bytes is over the effector's max_result_bytes "
        "(16) and was not kept"
    )
    copy = gate(signed())
    assert copy.route is Route.DUPLICATE and copy.result.tool_result == result
    kept = gate(signed(intent_id="at-the-limit")).result.tool_result
    assert kept.payload == b"y" * 16 and not kept.error_message
    assert calls == [intent().intent_id, "at-the-limit"]


def test_max_result_bytes_must_be_a_non_negative_int():
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_result_bytes"):
            Effector({}, mode=VerifyMode.OFF, store=":memory:", max_result_bytes=bad)
        with pytest.raises(ValueError, match="max_result_bytes"):
            ExecuteIntents({}, mode=VerifyMode.OFF, max_result_bytes=bad)


def test_verifying_modes_need_a_keyring():
    with pytest.raises(
        ValueError,
        match="needs a keyring to verify intents with: pass keyring=, or for a local run",
    ):
        Effector({}, mode=VerifyMode.PERMISSIVE, store=":memory:")
    assert Effector({}, mode=VerifyMode.OFF, store=":memory:")(intent()).route is Route.RESULT


def test_a_tool_spec_is_one_policy_for_an_unknown_outcome():
    with pytest.raises(ValueError, match="one or the other"):
        ToolSpec(Recording(), idempotent=True, reconcile=lambda _: None)
    with pytest.raises(TypeError):
        ToolSpec("not callable")


class _PrunedBeforeTheWrite(SqliteExecutionStore):
    """A real SQLite store on which another effector, its clock past the record's retention,
    prunes the store between a copy's read of the record and its write of a later expiry."""

    def __init__(self, path, prune_at_ms: int) -> None:
        super().__init__(path)
        self._other = SqliteExecutionStore(path)
        self._prune_at_ms = prune_at_ms

    def replace(self, record, expected, keep_until_ms):
        self._other.prune(self._prune_at_ms)
        return super().replace(record, expected, keep_until_ms)


def test_a_copy_whose_record_is_pruned_before_its_write_gets_the_result_it_read(tmp_path):
    tool = Recording()
    store = _PrunedBeforeTheWrite(tmp_path / "shared.sqlite", intent().expires_at_ms + 1)
    gate = _retaining(tool, ManualClock(NOW), store, retention_ms=0)
    first = gate(signed())
    copy = gate(signed(attempt=3, expires_at_ms=intent().expires_at_ms + 60_000))
    assert copy.route is Route.DUPLICATE and copy.result == first.result
    assert tool.calls == [intent().intent_id]


def test_a_later_expiry_that_arrives_while_the_tool_runs_keeps_the_record_for_it(tmp_path):
    # The copy extends the claim's expiry; the call's result must keep it, or the record is
    # pruned before the copy's expiry and a redelivery of that copy runs the tool again.
    clock, copies, calls = ManualClock(NOW), [], []
    later_expiry = intent().expires_at_ms + 60 * MINUTE

    def slow(args, tool_intent):
        calls.append(tool_intent.intent_id)
        copy = threading.Thread(
            target=lambda: copies.append(gate(signed(attempt=2, expires_at_ms=later_expiry)))
        )
        copy.start()
        copy.join()
        return "done"

    gate = _retaining(slow, clock, tmp_path / "s.sqlite")
    first = gate(signed())
    assert [copy.route for copy in copies] == [Route.IN_FLIGHT]
    clock.now_ms = intent().expires_at_ms + 3 * MINUTE  # past the first expiry's retention
    again = gate(signed(attempt=3, expires_at_ms=later_expiry))  # prunes on the way
    assert again.route is Route.DUPLICATE and again.result == first.result
    assert calls == [intent().intent_id]


class _CopyAtTheResultWrite(SqliteExecutionStore):
    """A real SQLite store on which another effector's copy, with a later expiry, extends the
    claim between the next read of it (the result write's, or a copy's) and its write, once
    `armed`."""

    def __init__(self, path, later_expiry: int) -> None:
        super().__init__(path)
        self._other = SqliteExecutionStore(path)
        self._later = later_expiry
        self.armed = False

    def get(self, intent_id):
        held = super().get(intent_id)
        if self.armed and held is not None and held.outcome == ExecutionRecord.OUTCOME_RUNNING:
            self.armed = False
            extended = ExecutionRecord()
            extended.CopyFrom(held)
            extended.latest_expires_at_ms = self._later
            assert self._other.replace(extended, held, INT64_MAX)
        return held


def test_a_later_expiry_landing_at_the_result_write_is_kept(tmp_path):
    later_expiry = intent().expires_at_ms + 60 * MINUTE
    store = _CopyAtTheResultWrite(tmp_path / "s.sqlite", later_expiry)

    def arming(args, tool_intent):
        store.armed = True  # the copy lands once the tool has run
        return "done"

    first = _retaining(arming, ManualClock(NOW), store)(signed())
    assert first.route is Route.RESULT and not store.armed
    recorded = store.get(intent().intent_id)
    assert recorded.outcome == ExecutionRecord.OUTCOME_RESULT
    assert recorded.latest_expires_at_ms == later_expiry


def test_a_copy_never_moves_the_expiry_back_that_another_copy_moved_forward(tmp_path):
    latest = intent().expires_at_ms + 60 * MINUTE
    store = _CopyAtTheResultWrite(tmp_path / "s.sqlite", latest)
    copies = []

    def slow(args, tool_intent):
        store.armed = True
        # A copy with an expiry between the first's and the other copy's, while the tool runs.
        copies.append(gate(signed(attempt=2, expires_at_ms=intent().expires_at_ms + MINUTE)))
        return "done"

    gate = _retaining(slow, ManualClock(NOW), store)
    assert gate(signed()).route is Route.RESULT
    assert [copy.route for copy in copies] == [Route.IN_FLIGHT]
    assert store.get(intent().intent_id).latest_expires_at_ms == latest


@pytest.mark.parametrize("mode", [VerifyMode.PERMISSIVE, VerifyMode.REQUIRE], ids=str)
def test_a_refused_signature_names_the_fix(mode):
    """An unsigned intent (RunAgent given no keyring_loader) names that option and the local
    run's VerifyMode.OFF; a key the effector lacks names the keys both sides must share."""
    if mode is VerifyMode.REQUIRE:
        detail = effector(mode)(intent()).dead_letter.detail
        assert "RunAgent(keyring_loader=" in detail and "VerifyMode.OFF" in detail, detail
    detail = effector(mode)(_unknown_key()).dead_letter.detail
    assert "RunAgent's keyring_loader=" in detail and "the effector's keyring" in detail, detail
    assert "\n" not in detail


def test_an_unknown_tool_is_rejected_naming_the_registered_tools():
    gate = effector(**{"crm.lookup": lookup, "crm.update": lookup})
    result = gate(signed(tool_name="crm.delete")).result.tool_result
    assert result.status == ToolResult.REJECTED
    assert result.error_message == (
        "unknown tool 'crm.delete'; the effector's tools are 'crm.lookup', 'crm.update'"
    )


@pytest.mark.parametrize("keyring", ["result_keyring", "inquiry_keyring"])
def test_a_keyring_that_signs_for_the_gate_must_have_an_active_key(keyring):
    # Refused when the gate is built, not at its first result or inquiry.
    verify_only = Keyring({"k1": bytes(32)})
    with pytest.raises(ValueError, match=f"^{keyring} needs an active key"):
        Effector({}, mode=VerifyMode.OFF, store=":memory:", **{keyring: verify_only})
