"""The effector gate as a callable and as a Beam transform on the DirectRunner."""

from __future__ import annotations

import base64
import functools
import json
import os
import signal
import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam.metrics import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
from apache_beam.testing.test_stream import TestStream as EventStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

from beam_agents._protos import AgentEnvelope, ExecutionRecord, ToolIntent, ToolResult
from beam_agents.core.signing import KEYS_ENV, Keyring, Verification, sign, verify
from beam_agents.effector import (
    APPROVALS,
    DEAD_LETTERS,
    INQUIRY_SUFFIX,
    INQUIRY_TOOL,
    REASON_CONFLICT,
    REASON_UNDECODABLE,
    RESULTS,
    Effector,
    ExecuteIntents,
    Route,
    ToolSpec,
    VerifyMode,
    content_digest,
)
from beam_agents.rounds import ManualClock
from beam_agents.testing.samples import intent

NOW = 1_700_000_030_000  # between samples.intent()'s created_at and expires_at
KEYS = {"k1": bytes(range(32))}
RING = Keyring(KEYS, active="k1")


def lookup(args: dict, tool_intent: ToolIntent) -> bytes:
    return f"{tool_intent.intent_id}:{args['id']}".encode()


def flaky(args: dict, tool_intent: ToolIntent) -> bytes:
    raise TimeoutError("upstream took 30s")


class Recording:
    def __init__(self):
        self.calls = []

    def __call__(self, args, tool_intent):
        self.calls.append(tool_intent.intent_id)
        return "done"


def signed(**overrides) -> ToolIntent:
    return sign(intent(**overrides), RING)


def effector(mode=VerifyMode.REQUIRE, *, store=":memory:", clock=None, **tools) -> Effector:
    return Effector(
        tools or {"crm.lookup": lookup},
        mode=mode,
        store=store,
        keyring=RING,
        clock=clock or ManualClock(NOW),
    )


def test_a_valid_intent_runs_its_tool_and_returns_an_ok_envelope():
    output = effector()(signed())
    assert output.route is Route.RESULT
    envelope = output.result
    assert envelope.entity_key == b"customer-42" and envelope.event_time_ms == NOW
    result = envelope.tool_result
    assert (result.intent_id, result.seq, result.status) == (intent().intent_id, 7, ToolResult.OK)
    assert result.payload == f"{intent().intent_id}:42".encode()
    assert result.completed_at_ms == NOW and result.entity_key == b"customer-42"


def _tampered() -> ToolIntent:
    bad = signed()
    bad.args_json = '{"id":666}'
    return bad


def _unknown_key() -> ToolIntent:
    return sign(intent(), Keyring({"other": bytes(32)}, active="other"))


def _unknown_scheme() -> ToolIntent:
    future = signed()
    future.signature_scheme = 2
    return future


CASES = {
    "valid": signed,
    "unsigned": intent,
    "bad signature": _tampered,
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
        signature_scheme=ToolIntent.HMAC_SHA256,
        signing_key_id="k1",
        signature=RING.mac("k1", trace_id_first),
    )
    output = effector()(trace_id_first + envelope.SerializeToString())
    assert output.route is Route.RESULT and output.result.tool_result.status == ToolResult.OK


def test_the_signature_is_checked_before_the_duplicate_check():
    gate = effector()
    gate(signed())
    assert gate(_tampered()).route is Route.DEAD_LETTER


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
    assert tool.calls == []


INT64_MAX = 2**63 - 1


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


@pytest.mark.parametrize(
    "tool",
    [
        lambda a, i: (_ for _ in ()).throw(ValueError("bad \ud800 text")),
        lambda a, i: "surrogate \udc80",
        lambda a, i: (_ for _ in ()).throw(RuntimeError("x" * 1_000_000)),
    ],
    ids=["surrogate in exception", "surrogate in payload", "huge exception"],
)
def test_whatever_a_tool_does_it_ends_as_a_result(tool):
    output = effector(**{"crm.lookup": tool})(signed())
    result = output.result.tool_result
    assert result.status == ToolResult.ERROR
    assert len(result.error_message) < 5000
    assert ToolResult.FromString(result.SerializeToString()) == result


MINUTE = 60_000


def test_records_are_kept_for_the_retention_after_the_latest_expiry_then_pruned(tmp_path):
    tool, clock = Recording(), ManualClock(NOW)
    gate = Effector(
        {"crm.lookup": tool},
        mode=VerifyMode.REQUIRE,
        keyring=RING,
        clock=clock,
        store=tmp_path / "s.sqlite",
        retention_ms=2 * MINUTE,
    )
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


def test_verifying_modes_need_a_keyring():
    with pytest.raises(ValueError, match="needs a keyring"):
        Effector({}, mode=VerifyMode.PERMISSIVE, store=":memory:")
    assert Effector({}, mode=VerifyMode.OFF, store=":memory:")(intent()).route is Route.RESULT


# Beam -------------------------------------------------------------------------------------

LOAD_RING = functools.partial(Keyring, KEYS, "k1")


def _summary(kv):
    entity_key, envelope = kv
    result = envelope.tool_result
    return entity_key, result.intent_id, ToolResult.Status.Name(result.status)


def _counter(pipeline_result, name: str) -> int:
    (counter,) = pipeline_result.metrics().query(MetricsFilter().with_name(name))["counters"]
    return counter.committed


def test_the_transform_routes_every_intent_and_executes_once_per_intent_id(tmp_path):
    tool = AppendingTool(tmp_path / "executions.log")
    approval = signed(intent_id="approval-1", kind=ToolIntent.APPROVAL)
    inputs = [
        signed().SerializeToString(),
        signed(attempt=2).SerializeToString(),  # the same intent again
        signed(intent_id="late", expires_at_ms=NOW).SerializeToString(),
        signed(intent_id="nope", tool_name="crm.delete"),
        approval,
        _tampered(),
        b"\xff\xff not an intent",
    ]
    pipeline = BeamPipeline(runner="DirectRunner")
    outputs = (
        pipeline
        | beam.Create(inputs, reshuffle=False)
        | ExecuteIntents(
            {"crm.lookup": tool},
            mode=VerifyMode.REQUIRE,
            keyring_loader=LOAD_RING,
            clock=ManualClock(NOW),
        )
    )
    assert_that(
        outputs[RESULTS] | beam.Map(_summary),
        equal_to(
            [
                (b"customer-42", intent().intent_id, "OK"),
                (b"customer-42", "late", "EXPIRED"),
                (b"customer-42", "nope", "REJECTED"),
            ]
        ),
        label="results",
    )
    assert_that(
        outputs[APPROVALS] | beam.Map(lambda kv: (kv[0], kv[1].intent_id)),
        equal_to([(b"customer-42", "approval-1")]),
        label="approvals",
    )
    assert_that(
        outputs[DEAD_LETTERS] | beam.Map(lambda kv: (kv[0], kv[1].reason)),
        equal_to([(b"customer-42", "signature_bad_signature"), (b"", "undecodable_intent")]),
        label="dead letters",
    )
    result = pipeline.run()
    result.wait_until_finish()
    assert tool.executions() == [intent().intent_id]
    assert _counter(result, "executions") == 1
    assert _counter(result, "duplicates") == 1


class AppendingTool:
    """A tool with a real side effect: one line per execution in a file (picklable)."""

    def __init__(self, path) -> None:
        self.path = str(path)

    def __call__(self, args: dict, tool_intent: ToolIntent) -> bytes:
        with open(self.path, "a") as log:
            log.write(f"{tool_intent.intent_id}\n")
        return b"done"

    def executions(self) -> list[str]:
        try:
            with open(self.path) as log:
                return log.read().splitlines()
        except FileNotFoundError:
            return []


def _streaming_pipeline() -> BeamPipeline:
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    return BeamPipeline(runner="DirectRunner", options=options)


def _stream(events):
    stream = EventStream()
    for event in events:
        if isinstance(event, int):
            stream = stream.advance_watermark_to(event)
        else:
            stream = stream.add_elements([event.SerializeToString()])
    return stream.advance_watermark_to_infinity()


def _run_stream(events, tool: AppendingTool, results: int, retention_ms: int) -> None:
    # Counters of later bundles are lost by the streaming DirectRunner's stateful ParDo, so
    # executions are counted by the tool's own side effect.
    pipeline = _streaming_pipeline()
    outputs = (
        pipeline
        | _stream(events)
        | ExecuteIntents(
            {"crm.lookup": tool},
            mode=VerifyMode.REQUIRE,
            keyring_loader=LOAD_RING,
            clock=ManualClock(NOW),
            retention_ms=retention_ms,
        )
    )
    expected = [(b"customer-42", intent().intent_id, "OK")] * results
    assert_that(outputs[RESULTS] | beam.Map(_summary), equal_to(expected))
    pipeline.run().wait_until_finish()


EXPIRES_S = intent().expires_at_ms // 1000


def test_a_duplicate_in_a_later_bundle_of_a_stream_does_not_run_again(tmp_path):
    tool = AppendingTool(tmp_path / "executions.log")
    _run_stream([signed(), EXPIRES_S - 20, signed()], tool, results=1, retention_ms=5_000)
    assert tool.executions() == [intent().intent_id]


def test_a_redelivery_after_the_expiry_within_retention_does_not_run_again(tmp_path):
    # The clock is pinned before expiry so the gate would admit the copy; only the record
    # kept past the expiry stops it.
    tool = AppendingTool(tmp_path / "executions.log")
    _run_stream([signed(), EXPIRES_S + 1, signed()], tool, results=1, retention_ms=5_000)
    assert tool.executions() == [intent().intent_id]


def test_the_record_is_dropped_when_the_watermark_passes_the_retention(tmp_path):
    tool = AppendingTool(tmp_path / "executions.log")
    _run_stream([signed(), EXPIRES_S + 6, signed()], tool, results=2, retention_ms=5_000)
    assert tool.executions() == [intent().intent_id] * 2


def _run_batch(inputs, tool, *, windowed=False):
    """Runs ExecuteIntents over timestamped inputs; returns the outputs' summaries."""
    pipeline = BeamPipeline(runner="DirectRunner")
    created = pipeline | beam.Create(inputs, reshuffle=False)
    if windowed:
        created = created | beam.WindowInto(window.FixedWindows(60))
    outputs = created | ExecuteIntents(
        {"crm.lookup": tool},
        mode=VerifyMode.REQUIRE,
        keyring_loader=LOAD_RING,
        clock=ManualClock(NOW),
    )
    summaries = {
        RESULTS: outputs[RESULTS] | "R" >> beam.Map(_summary),
        APPROVALS: outputs[APPROVALS] | "A" >> beam.Map(lambda kv: (kv[0], kv[1].intent_id)),
        DEAD_LETTERS: outputs[DEAD_LETTERS] | "D" >> beam.Map(lambda kv: (kv[0], kv[1].reason)),
    }
    return pipeline, summaries


def test_the_same_intent_in_two_windows_runs_once(tmp_path):
    tool = AppendingTool(tmp_path / "executions.log")
    data = signed().SerializeToString()
    inputs = [window.TimestampedValue(data, 10), window.TimestampedValue(data, 500)]
    pipeline, outputs = _run_batch(inputs, tool, windowed=True)
    assert_that(outputs[RESULTS], equal_to([(b"customer-42", intent().intent_id, "OK")]))
    pipeline.run().wait_until_finish()
    assert tool.executions() == [intent().intent_id]


def test_two_keys_sharing_an_intent_id_never_get_each_others_result(tmp_path):
    tool = AppendingTool(tmp_path / "executions.log")
    inputs = [signed(), signed(entity_key=b"customer-43")]
    pipeline, outputs = _run_batch(inputs, tool)
    # Which copy the runner processes first is not fixed; the other one is REJECTED, each
    # result going to its own entity.
    assert_that(
        outputs[RESULTS] | beam.Map(lambda s: (s[1], s[2])).with_output_types(tuple[str, str]),
        equal_to([(intent().intent_id, "OK"), (intent().intent_id, "REJECTED")]),
        label="one result, one rejection",
    )
    assert_that(
        outputs[RESULTS] | "RK" >> beam.Map(lambda s: s[0]),
        equal_to([b"customer-42", b"customer-43"]),
        label="each output to its own entity",
    )
    pipeline.run().wait_until_finish()
    assert tool.executions() == [intent().intent_id]


def test_duplicate_approvals_reach_a_human_once_in_the_transform(tmp_path):
    tool = AppendingTool(tmp_path / "executions.log")
    approval = signed(intent_id="approval-1", kind=ToolIntent.APPROVAL)
    again = signed(intent_id="approval-1", kind=ToolIntent.APPROVAL, attempt=4)
    pipeline, outputs = _run_batch([approval, again], tool)
    assert_that(outputs[APPROVALS], equal_to([(b"customer-42", "approval-1")]))
    pipeline.run().wait_until_finish()


def test_an_int64_max_expiry_runs_once_in_the_transform(tmp_path):
    tool = AppendingTool(tmp_path / "executions.log")
    forever = signed(expires_at_ms=2**63 - 1)
    pipeline, outputs = _run_batch([forever, forever.SerializeToString()], tool)
    assert_that(outputs[RESULTS], equal_to([(b"customer-42", intent().intent_id, "OK")]))
    pipeline.run().wait_until_finish()
    assert tool.executions() == [intent().intent_id]


# A restart ------------------------------------------------------------------------------

SERVICE = """
import json, os, signal, sys
from beam_agents.core.signing import Keyring
from beam_agents.effector import Effector, VerifyMode

store, log, now, die_in_tool = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"

def tool(args, intent):
    with open(log, "a") as f:
        f.write(intent.intent_id + "\\n")
    if die_in_tool:
        os.kill(os.getpid(), signal.SIGKILL)
    return "looked up %d" % args["id"]

effector = Effector({"crm.lookup": tool}, mode=VerifyMode.REQUIRE, store=store,
                    keyring=Keyring.from_environment(), clock=lambda: now)
for line in sys.stdin:
    out = effector(bytes.fromhex(line))
    result = out.result.tool_result if out.result else None
    print(json.dumps({"route": out.route.value,
                      "asks": out.approval.intent_id if out.approval else None,
                      "status": result.status if result else None,
                      "payload": result.payload.decode() if result else None,
                      "error": result.error_message if result else None}), flush=True)
"""


def _service(tmp_path, *, die_in_tool=False):
    env = {
        **os.environ,
        KEYS_ENV: json.dumps({"keys": {"k1": base64.b64encode(KEYS["k1"]).decode()}}),
    }
    args = [str(tmp_path / "executions.sqlite"), str(tmp_path / "tool.log"), str(NOW)]
    return subprocess.Popen(
        [sys.executable, "-c", SERVICE, *args, "1" if die_in_tool else "0"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def _deliver(service, data: bytes) -> dict | None:
    service.stdin.write(data.hex() + "\n")
    service.stdin.flush()
    line = service.stdout.readline()
    return json.loads(line) if line else None


def _tool_log(tmp_path) -> list[str]:
    return (tmp_path / "tool.log").read_text().splitlines()


def test_an_effector_killed_between_two_deliveries_does_not_run_the_tool_again(tmp_path):
    data = signed().SerializeToString()
    first_process = _service(tmp_path)
    first = _deliver(first_process, data)
    first_process.kill()
    first_process.wait()
    restarted = _service(tmp_path)
    try:
        again = _deliver(restarted, data)
    finally:
        restarted.stdin.close()
        restarted.wait()
    assert first["route"] == "result" and first["payload"] == "looked up 42"
    assert again == {**first, "route": "duplicate"}
    assert _tool_log(tmp_path) == [intent().intent_id]


def test_an_effector_killed_inside_a_plain_tool_asks_a_person_and_never_reruns(tmp_path):
    data = signed().SerializeToString()
    dying = _service(tmp_path, die_in_tool=True)
    assert _deliver(dying, data) is None  # killed mid-call: no answer
    assert dying.wait() == -signal.SIGKILL
    restarted = _service(tmp_path)
    try:
        after, again = _deliver(restarted, data), _deliver(restarted, data)
    finally:
        restarted.stdin.close()
        restarted.wait()
    # No result for the agent (it would be a guess): an inquiry for a person, sent again to
    # a copy.
    assert after["route"] == "approval" and after["status"] is None
    assert after["asks"] == intent().intent_id + INQUIRY_SUFFIX
    assert again == {**after, "route": "duplicate"}
    assert _tool_log(tmp_path) == [intent().intent_id]


def _running_claim(claimed_by):
    """A RUNNING ledger row for the test intent, as if `claimed_by` had claimed it."""
    return ExecutionRecord(
        intent_id=intent().intent_id,
        entity_key=intent().entity_key,
        content_digest=content_digest(signed().SerializeToString()),
        outcome=ExecutionRecord.OUTCOME_RUNNING,
        latest_expires_at_ms=intent().expires_at_ms,
        claimed_by=claimed_by,
    )


def test_an_intent_in_flight_in_another_live_effector_is_in_flight_not_a_lost_call(tmp_path):
    store = tmp_path / "shared.sqlite"
    tool = Recording()
    busy = Effector(
        {"crm.lookup": tool},
        mode=VerifyMode.REQUIRE,
        store=store,
        keyring=RING,
        clock=ManualClock(NOW),
    )
    # This test's own process is the claimant, so the claim is live.
    assert busy.store.claim(_running_claim(busy.instance_id), INT64_MAX) is None
    other = effector(store=store, **{"crm.lookup": tool})
    assert other.instance_id != busy.instance_id
    output = other(signed())
    assert output.route is Route.IN_FLIGHT and output.result is None
    assert tool.calls == []
    assert other.store.get(intent().intent_id).outcome == ExecutionRecord.OUTCOME_RUNNING


def _dead_claim(gate: Effector) -> str:
    """A claim naming this process's pid with an earlier start: a process that is gone."""
    pid, started, _ = gate.instance_id.split(":")
    return f"{pid}:{int(started) - 1}:0123"


def test_a_claim_by_a_reused_pid_reads_as_a_lost_call(tmp_path):
    gate = effector(store=tmp_path / "shared.sqlite")
    gate.store.claim(_running_claim(_dead_claim(gate)), INT64_MAX)
    output = gate(signed())
    assert output.route is Route.APPROVAL and output.result is None
    assert output.approval.tool_name == INQUIRY_TOOL


def _lost_call(tmp_path, tool) -> Effector:
    """An effector whose store holds the dead claim of an effector killed inside `tool`."""
    gate = Effector(
        {"crm.lookup": tool},
        mode=VerifyMode.REQUIRE,
        store=tmp_path / "shared.sqlite",
        keyring=RING,
        result_keyring=RESULTS_RING,
        approval_keyring=APPROVER_RING,
        clock=ManualClock(NOW),
    )
    gate.store.claim(_running_claim(_dead_claim(gate)), INT64_MAX)
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
    assert json.loads(result.payload) == {"confirmed_by": "ops@example.com", "took_effect": True}
    assert verify(result, RESULTS_RING) is Verification.VALID
    # The answer again, or the intent again: the same result, and the tool never ran.
    assert gate.resolve(_answer(inquiry, approved=True)).route is Route.DUPLICATE
    assert gate(signed()).result.tool_result == result
    assert tool.calls == []


def test_a_person_who_says_the_call_did_not_happen_gets_the_agent_a_not_done_error(tmp_path):
    gate = _lost_call(tmp_path, Recording())
    inquiry = gate(signed()).approval
    result = gate.resolve(_answer(inquiry, approved=False)).result.tool_result
    assert result.status == ToolResult.ERROR and result.error_message.startswith("not done: ")


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


def test_a_dead_claim_is_taken_over_by_one_caller_only(tmp_path):
    gate = effector(store=tmp_path / "shared.sqlite")
    dead = _dead_claim(gate)
    gate.store.claim(_running_claim(dead), INT64_MAX)
    mine = _running_claim(gate.instance_id)
    assert gate.store.take_over(mine, dead, INT64_MAX)
    assert not gate.store.take_over(_running_claim("another"), dead, INT64_MAX)
    assert gate.store.get(intent().intent_id).claimed_by == gate.instance_id


def test_a_tool_spec_is_one_policy_for_an_unknown_outcome():
    with pytest.raises(ValueError, match="one or the other"):
        ToolSpec(Recording(), idempotent=True, reconcile=lambda _: None)
    with pytest.raises(TypeError):
        ToolSpec("not callable")
