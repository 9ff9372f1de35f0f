"""`ExecuteIntents` on the DirectRunner: every intent routed, one run per intent_id across
bundles, windows and redeliveries within retention, and the record dropped after it."""

from __future__ import annotations

import functools
import subprocess
import sys
import time

import apache_beam as beam
import pytest
from apache_beam.metrics import MetricsFilter
from apache_beam.options.pipeline_options import DebugOptions, PipelineOptions, StandardOptions
from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline
from apache_beam.testing.test_stream import TestStream as EventStream
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window
from apache_beam.typehints import Any, Tuple

from beam_agents._protos import ToolIntent, ToolResult
from beam_agents.errors import KeyringError
from beam_agents.intents.effector import (
    APPROVALS,
    DEAD_LETTERS,
    RESULTS,
    ExecuteIntents,
    VerifyMode,
)
from beam_agents.intents.signing import KEYS_ENV, KEYS_FILE_ENV, Keyring
from beam_agents.ops.rounds import ManualClock, env_options
from beam_agents.testing.effectors import (
    KEYS,
    NOW,
    signed,
    tampered,
)
from beam_agents.testing.samples import intent
from beam_agents.wire.beam_support import NO_PRISM_SPLITS, typed

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
        tampered(),
        b"\xff\xff not an intent",
    ]
    pipeline = BeamPipeline(options=env_options())
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
    result = _run_then_check(pipeline, tool, [intent().intent_id])
    assert _counter(result, "executions") == 1
    assert _counter(result, "duplicates") == 1


def _run_then_check(pipeline, tool: AppendingTool, executions: list[str]):
    """Runs `pipeline`, then checks the tool ran `executions`; the check runs even when an
    assert_that inside the pipeline fails it, so a failure says whether the tool ran again or
    only an output came out twice."""
    try:
        result = pipeline.run()
        result.wait_until_finish()
    finally:
        assert tool.executions() == executions
    return result


class AppendingTool:
    """A tool with a real side effect: one line per execution in a file (picklable), each call
    then taking `seconds`."""

    def __init__(self, path, seconds: float = 0) -> None:
        self.path = str(path)
        self.seconds = seconds

    def __call__(self, args: dict, tool_intent: ToolIntent) -> bytes:
        with open(self.path, "a") as log:
            log.write(f"{tool_intent.intent_id}\n")
        time.sleep(self.seconds)
        return b"done"

    def executions(self) -> list[str]:
        try:
            with open(self.path) as log:
                return log.read().splitlines()
        except FileNotFoundError:
            return []


def _streaming_pipeline() -> BeamPipeline:
    options = env_options()
    options.view_as(StandardOptions).streaming = True
    return BeamPipeline(options=options)


def _stream(events):
    stream = EventStream()
    for event in events:
        if isinstance(event, int):
            stream = stream.advance_watermark_to(event)
        else:
            stream = stream.add_elements([event.SerializeToString()])
    return stream.advance_watermark_to_infinity()


def _run_stream(events, tool: AppendingTool, executions: int, retention_ms: int) -> None:
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
    expected = [(b"customer-42", intent().intent_id, "OK")] * executions
    assert_that(outputs[RESULTS] | beam.Map(_summary), equal_to(expected))
    _run_then_check(pipeline, tool, [intent().intent_id] * executions)


EXPIRES_S = intent().expires_at_ms // 1000


def test_a_duplicate_in_a_later_bundle_of_a_stream_does_not_run_again(tmp_path):
    tool = AppendingTool(tmp_path / "executions.log")
    _run_stream([signed(), EXPIRES_S - 20, signed()], tool, executions=1, retention_ms=5_000)


def test_a_redelivery_after_the_expiry_within_retention_does_not_run_again(tmp_path):
    # The clock is pinned before expiry so the gate would admit the copy; only the record
    # kept past the expiry stops it.
    tool = AppendingTool(tmp_path / "executions.log")
    _run_stream([signed(), EXPIRES_S + 1, signed()], tool, executions=1, retention_ms=5_000)


def test_the_record_is_dropped_when_the_watermark_passes_the_retention(tmp_path):
    tool = AppendingTool(tmp_path / "executions.log")
    _run_stream([signed(), EXPIRES_S + 6, signed()], tool, executions=2, retention_ms=5_000)


def test_a_copy_with_a_later_expiry_keeps_the_record_for_the_retention_after_it(tmp_path):
    # The copy moves the record's expiry (through the store's replace of the record it read),
    # so a third copy past the first expiry's retention, still unexpired, is a duplicate.
    later = intent().expires_at_ms + 10_000
    tool = AppendingTool(tmp_path / "executions.log")
    _run_stream(
        [
            signed(),
            EXPIRES_S - 20,
            signed(attempt=2, expires_at_ms=later),
            EXPIRES_S + 6,
            signed(attempt=3, expires_at_ms=later),
        ],
        tool,
        executions=1,
        retention_ms=5_000,
    )


def _run_batch(inputs, tool, *, windowed=False):
    """Runs ExecuteIntents over timestamped inputs; returns the outputs' summaries."""
    pipeline = BeamPipeline(options=env_options())
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
    _run_then_check(pipeline, tool, [intent().intent_id])


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
    _run_then_check(pipeline, tool, [intent().intent_id])


def test_duplicate_approvals_reach_a_human_once_in_the_transform(tmp_path):
    tool = AppendingTool(tmp_path / "executions.log")
    approval = signed(intent_id="approval-1", kind=ToolIntent.APPROVAL)
    again = signed(intent_id="approval-1", kind=ToolIntent.APPROVAL, attempt=4)
    pipeline, outputs = _run_batch([approval, again], tool)
    assert_that(outputs[APPROVALS], equal_to([(b"customer-42", "approval-1")]))
    _run_then_check(pipeline, tool, [])


def test_an_int64_max_expiry_runs_once_in_the_transform(tmp_path):
    tool = AppendingTool(tmp_path / "executions.log")
    forever = signed(expires_at_ms=2**63 - 1)
    pipeline, outputs = _run_batch([forever, forever.SerializeToString()], tool)
    assert_that(outputs[RESULTS], equal_to([(b"customer-42", intent().intent_id, "OK")]))
    _run_then_check(pipeline, tool, [intent().intent_id])


def test_a_copy_behind_a_slow_call_in_its_bundle_does_not_run_again(tmp_path):
    # Prism splits a bundle that makes no progress for two of its 100 ms ticks, and its
    # splitBundle frees the key, so the copy runs in a bundle of its own before the first
    # commits its record: without NO_PRISM_SPLITS, which ExecuteIntents adds to its pipeline,
    # the copy finds no record and runs the tool again.
    tool = AppendingTool(tmp_path / "executions.log", seconds=0.5)
    data = signed().SerializeToString()
    pipeline, outputs = _run_batch([data, data], tool)
    assert_that(outputs[RESULTS], equal_to([(b"customer-42", intent().intent_id, "OK")]))
    _run_then_check(pipeline, tool, [intent().intent_id])


def test_the_transform_turns_prisms_bundle_splits_off_in_its_pipeline():
    pipeline = beam.Pipeline(options=PipelineOptions())
    _ = pipeline | beam.Create([b""]) | ExecuteIntents({}, mode=VerifyMode.OFF)
    assert NO_PRISM_SPLITS in pipeline.options.view_as(DebugOptions).experiments


def test_a_payload_over_max_result_bytes_leaves_the_transform_ok_without_it(tmp_path):
    tool = AppendingTool(tmp_path / "executions.log")
    pipeline = BeamPipeline(options=env_options())
    outputs = (
        pipeline
        | beam.Create([signed().SerializeToString()], reshuffle=False)
        | ExecuteIntents(
            {"crm.lookup": tool},
            mode=VerifyMode.REQUIRE,
            keyring_loader=LOAD_RING,
            clock=ManualClock(NOW),
            max_result_bytes=1,
        )
    )
    assert_that(
        outputs[RESULTS]
        | beam.Map(lambda kv: (kv[1].tool_result.payload, kv[1].tool_result.error_message)),
        equal_to(
            [
                (
                    b"",
                    "the tool took effect; its result of 4 bytes is over the effector's "
                    "max_result_bytes (1) and was not kept",
                )
            ]
        ),
    )
    _run_then_check(pipeline, tool, [intent().intent_id])


def test_a_missing_signing_key_is_one_line_naming_the_fix_before_the_pipeline_runs(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(KEYS_ENV, raising=False)
    monkeypatch.delenv(KEYS_FILE_ENV, raising=False)
    with pytest.raises(KeyringError) as raised:
        ExecuteIntents({"t": _tool}, mode=VerifyMode.REQUIRE)
    message = str(raised.value)
    assert "\n" not in message
    for fix in (KEYS_ENV, KEYS_FILE_ENV, "keyring_loader=", "VerifyMode.OFF"):
        assert fix in message, fix
    # A script that forgets the key fails at once with that line, not in 24 retried bundles.
    script = tmp_path / "forgot_the_key.py"
    script.write_text(
        "import apache_beam as beam\n"
        "from beam_agents import ExecuteIntents, VerifyMode\n"
        "with beam.Pipeline() as p:\n"
        "    _ = p | beam.Create([b'']) | ExecuteIntents({}, mode=VerifyMode.REQUIRE)\n"
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert result.stderr.count("Traceback") == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"beam_agents.errors.KeyringError: {message}"


def test_a_worker_side_key_loader_is_not_checked_in_the_driver(monkeypatch):
    monkeypatch.delenv(KEYS_ENV, raising=False)
    monkeypatch.delenv(KEYS_FILE_ENV, raising=False)
    # Named explicitly, the loader runs where the effector runs (a worker holding the key).
    ExecuteIntents({"t": _tool}, mode=VerifyMode.REQUIRE, keyring_loader=Keyring.from_environment)
    ExecuteIntents({"t": _tool}, mode=VerifyMode.OFF)


def _tool(args, intent) -> bytes:
    return b"{}"


def test_runagents_keyed_intents_go_into_the_transform_as_they_are(tmp_path):
    """RunAgent's INTENTS output is (entity_key, ToolIntent): wired straight in, its intents
    run, with no beam.Values() in between."""
    tool = AppendingTool(tmp_path / "executions.log")
    approval = signed(intent_id="approval-1", kind=ToolIntent.APPROVAL)
    pairs = [(b"customer-42", signed()), (b"customer-42", approval)]
    pipeline = BeamPipeline(options=env_options())
    keyed = typed(pipeline | beam.Create(pairs, reshuffle=False), Tuple[bytes, ToolIntent])
    outputs = keyed | ExecuteIntents(
        {"crm.lookup": tool}, mode=VerifyMode.REQUIRE, keyring_loader=LOAD_RING,
        clock=ManualClock(NOW),
    )  # fmt: skip
    assert_that(
        outputs[RESULTS] | beam.Map(_summary),
        equal_to([(b"customer-42", intent().intent_id, "OK")]),
    )
    assert_that(
        outputs[APPROVALS] | "A" >> beam.Map(lambda kv: (kv[0], kv[1].intent_id)),
        equal_to([(b"customer-42", "approval-1")]),
        label="approvals",
    )
    _run_then_check(pipeline, tool, [intent().intent_id])


def test_an_input_that_is_no_intent_is_a_dead_letter_not_a_failed_bundle(tmp_path):
    tool = AppendingTool(tmp_path / "executions.log")
    pipeline = BeamPipeline(options=env_options())
    inputs = pipeline | beam.Create(["a str", (b"k", 42)]).with_output_types(Any)
    outputs = inputs | ExecuteIntents(
        {"crm.lookup": tool}, mode=VerifyMode.OFF, clock=ManualClock(NOW)
    )
    assert_that(
        outputs[DEAD_LETTERS] | beam.Map(lambda kv: (kv[1].reason, kv[1].detail)),
        equal_to(
            [
                ("undecodable_intent", "a str is not a ToolIntent"),
                ("undecodable_intent", "an int is not a ToolIntent"),
            ]
        ),
    )
    _run_then_check(pipeline, tool, [])
