"""The effector gate as a callable and as a Beam transform on the DirectRunner."""

from __future__ import annotations

import functools

import apache_beam as beam
import pytest
from apache_beam.metrics import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
from apache_beam.testing.test_stream import TestStream as EventStream
from apache_beam.testing.util import assert_that, equal_to

from beam_agents._protos import ToolIntent, ToolResult
from beam_agents.core.signing import Keyring, sign
from beam_agents.effector import (
    APPROVALS,
    DEAD_LETTERS,
    RESULTS,
    Effector,
    ExecuteIntents,
    Route,
    VerifyMode,
)
from beam_agents.testing.clock import ManualClock
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


def effector(mode=VerifyMode.REQUIRE, **tools) -> Effector:
    return Effector(
        tools or {"crm.lookup": lookup}, mode=mode, keyring=RING, clock=ManualClock(NOW)
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
        ({"args_json": "[1,2]"}, "args_json is not a JSON object"),
        ({"args_json": "{broken"}, "args_json is not a JSON object"),
    ],
)
def test_intents_that_cannot_run_are_rejected(overrides, message):
    result = effector()(signed(**overrides)).result.tool_result
    assert (result.status, result.error_message) == (ToolResult.REJECTED, message)


def test_a_tool_runs_once_per_intent_id():
    tool = Recording()
    gate = effector(**{"crm.lookup": tool})
    first, second = gate(signed()), gate(signed(attempt=3))
    assert tool.calls == [intent().intent_id]
    assert first.route is Route.RESULT and second.route is Route.DUPLICATE
    assert second.result == first.result
    assert gate(signed(intent_id="another")).route is Route.RESULT
    assert len(tool.calls) == 2


def test_an_execution_record_is_forgotten_once_the_intent_has_expired():
    tool = Recording()
    clock = ManualClock(NOW)
    gate = Effector({"crm.lookup": tool}, mode=VerifyMode.REQUIRE, keyring=RING, clock=clock)
    gate(signed())
    assert gate.remembered == 1
    clock.now_ms = intent().expires_at_ms
    assert gate(signed()).result.tool_result.status == ToolResult.EXPIRED
    assert gate.remembered == 0
    assert tool.calls == [intent().intent_id]


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
        Effector({}, mode=VerifyMode.PERMISSIVE)
    assert Effector({}, mode=VerifyMode.OFF)(intent()).route is Route.RESULT


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


def _run_stream(events, tool: AppendingTool, results: int) -> None:
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
        )
    )
    expected = [(b"customer-42", intent().intent_id, "OK")] * results
    assert_that(outputs[RESULTS] | beam.Map(_summary), equal_to(expected))
    pipeline.run().wait_until_finish()


def test_a_duplicate_in_a_later_bundle_of_a_stream_does_not_run_again(tmp_path):
    tool = AppendingTool(tmp_path / "executions.log")
    expires_s = intent().expires_at_ms // 1000
    _run_stream([signed(), expires_s - 20, signed()], tool, results=1)
    assert tool.executions() == [intent().intent_id]


def test_the_execution_record_is_dropped_when_the_watermark_passes_the_expiry(tmp_path):
    # The clock is pinned before expiry so the gate would admit the re-arrival; only the
    # cleared state lets it run again. (With a real clock the gate refuses it as EXPIRED.)
    tool = AppendingTool(tmp_path / "executions.log")
    expires_s = intent().expires_at_ms // 1000
    _run_stream([signed(), expires_s + 1, signed()], tool, results=2)
    assert tool.executions() == [intent().intent_id] * 2
