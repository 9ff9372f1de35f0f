"""What RunAgent keeps and what it never changes: an idle key is wiped after its TTL, a failing
resume keeps its answers and retries with backoff, export and restore are lossless and refuse
a key with state, and an agent that fails anywhere leaves state as it was, but for the seq of a
start that failed for good and the count of the model calls it paid for."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.transforms import window

from beam_agents._protos import (
    StateSnapshot,
    ToolResult,
    TraceEvent,
)
from beam_agents.errors import LlmCallError
from beam_agents.intents.identity import intent_id
from beam_agents.ops.rounds import Advance, _AppendLines, run_round
from beam_agents.ops.rounds import _read as read_rows
from beam_agents.runtime import (
    LlmResponse,
    RunAgent,
    RuntimeConfig,
)
from beam_agents.testing.probe import (
    DAY,
    FAR,
    KEY,
    SEQ,
    T0,
    Probe,
    command,
    export,
    memory_blob,
    message_bytes,
    probe,
    result,
)


def test_an_idle_key_is_wiped_after_its_ttl_and_never_reissues_an_intent_id(tmp_path):
    config = RuntimeConfig(ttl_ms=DAY, intent_ttl_ms=1)
    later = T0 + 3 * DAY
    outputs = run_round(
        probe(config),
        [
            command(T0, calls=["a.tool"], put={"k": "v"}, deadline_ms=T0 + 50),
            Advance(T0 + 60),  # the deadline resumes and completes it
            command(T0 + 100, calls=["b.tool"], deadline_ms=T0 + 150),
            Advance(T0 + 200),
            export(T0 + 300, "before wipe"),
            Advance(later),  # idle past the TTL: wiped
            export(later + 1, "wiped"),
            command(later + 2, calls=["a.tool"], deadline_ms=later + 50),
            Advance(later + 60),
        ],
        tmp_path,
    ).before(later + 60)
    before, wiped = outputs.values("snapshots")
    assert before.memory.entries and before.seq == SEQ + 1
    assert not wiped.HasField("memory") and not wiped.HasField("llm_cache")
    assert wiped.seq == SEQ + 1  # the seq outlives the wipe
    ids = [i.intent_id for i in outputs.values("intents")]
    assert len(ids) == 3 and len(set(ids)) == 3
    assert ids[2] == intent_id(KEY, SEQ + 2, 0)


def test_a_failing_resume_keeps_its_answers_retries_with_backoff_then_dead_letters_them(
    tmp_path,
):
    """The refund case: the tool ran and its result came in, the resume failed. The result is
    never thrown away nor turned into EXPIRED: it is kept, tried again, and at last handed to
    an operator inside the dead letter."""
    config = RuntimeConfig(resume_retries=2, resume_backoff_ms=10, resume_backoff_max_ms=15)
    paid = intent_id(KEY, SEQ, 0)
    outputs = run_round(
        probe(config),
        [
            command(T0, calls=["payments.refund"], raise_at="resume", deadline_ms=T0 + 1000),
            Advance(T0 + 1),
            result(T0 + 2, paid),
            Advance(T0 + 3),
            export(T0 + 4, "kept"),
            Advance(T0 + 5000),
            export(T0 + 5001, "ended"),
            Advance(T0 + 5002),
        ],
        tmp_path,
    ).before(T0 + 5002)
    errors = outputs.values("errors")
    # First try at the answer, retries at +10 and then +15 (doubling, capped), then given up.
    assert [(e.reason, e.event_time_ms) for e in errors] == [
        ("agent_raised", T0 + 2),
        ("agent_raised", T0 + 12),
        ("resume_failed", T0 + 27),
    ]
    for error in errors:
        (kept,) = error.answers
        assert kept.tool_result.intent_id == paid and kept.tool_result.status == ToolResult.OK
    assert "tried again at 1764460800012 (retry 1 of 2)" in errors[0].detail
    kept, ended = outputs.values("snapshots")
    assert [a.tool_result.intent_id for a in kept.continuation.answers] == [paid]
    assert kept.continuation.resume_failures == 1 and kept.continuation.retry_at_ms == T0 + 12
    assert not ended.HasField("continuation") and not ended.pending
    assert outputs.values("completions") == []  # never resumed as EXPIRED


def test_a_resume_that_fails_once_succeeds_on_its_retry_with_the_same_answers(tmp_path):
    """A model briefly down: the resume fails on a retryable LlmCallError, and the retry on the
    timer resumes the agent with the result it was given, never EXPIRED."""
    flaky = _FlakyLlm(1, tmp_path / "calls")
    agent = RunAgent(
        Probe(), llm_client=flaky, config=RuntimeConfig(resume_retries=0, resume_backoff_ms=10)
    )
    paid = intent_id(KEY, SEQ, 0)
    outputs = run_round(
        agent,
        [
            command(T0, calls=["payments.refund"], llm_on_resume="summarise", deadline_ms=T0 + 5),
            Advance(T0 + 1),
            result(T0 + 2, paid),
            Advance(T0 + 100),
        ],
        tmp_path,
    ).before(T0 + 100)
    ((reason, answers),) = [(e.reason, list(e.answers)) for e in outputs.values("errors")]
    assert reason == "llm_failed" and answers[0].tool_result.intent_id == paid
    (done,) = outputs.values("completions")
    assert json.loads(done) == [["payments.refund", "OK"], ["escalations", 0]]


class _FlakyLlm:
    """Fails its first `failures` calls with a retryable LlmCallError, then answers. It counts
    calls in a file, so the count holds across the pickled copies a runner makes."""

    def __init__(self, failures: int, counter) -> None:
        self._failures = failures
        self._counter = str(counter)

    def complete(self, request):
        with open(self._counter, "ab") as counter:
            counter.write(b".")
            calls = counter.tell()
        if calls <= self._failures:
            raise LlmCallError("503 from the provider", model=request.model, retryable=True)
        return LlmResponse("summary", request.model)


def test_export_restore_export_is_lossless_and_export_changes_nothing(tmp_path):
    first = run_round(
        probe(),
        [
            command(
                T0,
                calls=["a.tool", "b.tool"],
                put={"x": "1", "y": "2"},
                llm="hello",
                deadline_ms=FAR,
            ),
            Advance(T0 + 1),
            result(T0 + 5, intent_id(KEY, SEQ, 0, 1)),
            export(T0 + 6, "one"),
            export(T0 + 7, "two"),
            Advance(T0 + 8),
        ],
        tmp_path,
    ).before(T0 + 8)
    one, two = first.values("snapshots")
    assert _state(one) == _state(two)  # exporting changed nothing
    assert one.memory.entries and one.llm_cache.entries and len(one.continuation.answers) == 1
    second = run_round(
        probe(), [one, Advance(T0 + 100), export(T0 + 101, "three")], tmp_path
    ).before(T0 + 102)
    (three,) = second.values("snapshots")
    assert _state(three) == _state(one)
    assert three.request_id == "three" and three.snapshot_at_ms == T0 + 101


def _state(snapshot: StateSnapshot) -> bytes:
    copy = StateSnapshot()
    copy.CopyFrom(snapshot)
    copy.ClearField("request_id")
    copy.ClearField("snapshot_at_ms")
    return copy.SerializeToString(deterministic=True)


def test_a_snapshot_onto_a_key_with_state_is_refused(tmp_path):
    snapshot = StateSnapshot(entity_key=KEY, seq=99, snapshot_at_ms=T0 + 5)
    snapshot.memory.CopyFrom(memory_blob(1))
    outputs = run_round(
        probe(),
        [
            command(T0, put={"mine": "1"}),
            Advance(T0 + 1),
            snapshot,
            Advance(T0 + 6),
            export(T0 + 7, "after"),
        ],
        tmp_path,
    )
    assert [e.reason for e in outputs.values("errors")] == ["restore_conflict"]
    (after,) = outputs.values("snapshots")
    assert [e.key for e in after.memory.entries] == ["mine"] and after.seq == SEQ


FAILURES = ["start", "after_put", "after_llm", "after_call"]


@pytest.mark.parametrize("point", [*FAILURES, "resume", "not bytes", "nothing", "budget"])
def test_a_failing_agent_changes_no_state_but_the_seq_and_its_models_usage(tmp_path, point):
    setup = [
        command(T0, calls=["a.tool"], put={"kept": "yes"}, llm="first", deadline_ms=FAR),
        Advance(T0 + 1),
        export(T0 + 2, "before"),
        Advance(T0 + 3),
    ]
    if point == "resume":
        setup = [
            command(T0, calls=["a.tool"], raise_at="resume", deadline_ms=FAR),
            Advance(T0 + 1),
            export(T0 + 2, "before"),
            Advance(T0 + 3),
        ]
        failing = [result(T0 + 4, intent_id(KEY, SEQ, 0))]
    else:
        setup = [
            command(T0, put={"kept": "yes"}, llm="first"),
            Advance(T0 + 1),
            export(T0 + 2, "before"),
            Advance(T0 + 3),
        ]
        fields = {"raise_at": point} if point in FAILURES else {"return": point}
        put = {"new": "1", "huge": "x" * 2000} if point == "budget" else {"new": "1"}
        calls = [] if point in ("not bytes", "nothing") else ["b.tool"]  # else it suspends
        failing = [command(T0 + 4, calls=calls, put=put, llm="second", **fields)]
    config = RuntimeConfig(memory_budget_bytes=1000)
    outputs = run_round(
        probe(config),
        [*setup, *failing, Advance(T0 + 5), export(T0 + 6, "after"), Advance(T0 + 7)],
        tmp_path,
    ).before(T0 + 7)
    before, after = outputs.values("snapshots")
    if point == "resume":
        # Its durable input, the accepted answer, is kept for the retry; nothing else changed.
        kept = after.continuation
        assert [a.tool_result.intent_id for a in kept.answers] == [intent_id(KEY, SEQ, 0)]
        assert kept.resume_failures == 1 and kept.retry_at_ms > T0 + 4
        after.continuation.CopyFrom(before.continuation)
    else:
        # A start that failed for good moves the key past its seq, so no later event's start
        # can replay what it paid for, and its cache keeps no call, every one dead then (the
        # completion before it dropped its own). Its model call (at "after_llm" and later) is
        # counted, here 0 tokens, and is the key's activity: the memory's mark moves to it.
        assert after.seq == before.seq + 1 and before.HasField("llm_cache")
        assert not after.llm_cache.entries
        assert after.llm_cache.input_tokens == before.llm_cache.input_tokens
        paid = point in ("after_llm", "after_call", "not bytes", "nothing")
        assert after.memory.last_activity_ms == (T0 + 4 if paid else T0)
        after.seq = before.seq
        after.llm_cache.CopyFrom(before.llm_cache)
        after.memory.last_activity_ms = before.memory.last_activity_ms
    assert _state(after) == _state(before)
    (error,) = outputs.values("errors")
    expected = {
        "not bytes": "agent_contract",
        "nothing": "agent_contract",
        "budget": "memory_budget",
    }.get(point, "agent_raised")
    assert error.reason == expected and error.entity_key == KEY
    failed = [t for t in outputs.values("traces") if t.start_ms == T0 + 4]
    assert [t.event_type for t in failed] == [TraceEvent.ERROR]
    assert [i.created_at_ms for i in outputs.values("intents")] == (
        [T0] if point == "resume" else []
    )


class _RefusesOnResume:
    """Answers every request (10 + 10 tokens) but "refuse", which it refuses, billing 10,000
    input tokens (a safety block, say). Module-level: Beam pickles it."""

    def complete(self, request):
        if request.messages[-1]["content"] == "refuse":
            raise LlmCallError("refused", model=request.model, retryable=False, input_tokens=10_000)
        return LlmResponse("ok", request.model, 10, 10)


def _on_the_fn_api_runner(transform, inputs, folder: Path) -> dict[str, list]:
    """Runs `transform` over `inputs` (envelopes, one bundle per key, in order) on Beam's
    portable FnApiRunner, whose state reads hand back the very object stored, as Prism's,
    Flink's and Dataflow's do; returns each output tag's values."""
    folder.mkdir()
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        stamped = [window.TimestampedValue(e, e.event_time_ms / 1000) for e in inputs]
        outputs = pipeline | beam.Create(stamped) | transform
        for tag, pcollection in outputs.items():
            pcollection | f"Write{tag}" >> beam.ParDo(_AppendLines(str(folder / tag)))
    return {tag: [value for _, _, value in read_rows(folder / tag)] for tag in outputs}


def test_a_refused_answer_that_fails_a_resume_is_counted_alike_on_every_runner(tmp_path):
    # The resume's only model call is refused, billed; the cache it read is unchanged. Its
    # usage was counted in place on the stored blob and never written: 20 tokens on the
    # DirectRunner (which decodes a fresh copy per read), 10,020 on a portable runner.
    def transform():
        return RunAgent(Probe(), llm_client=_RefusesOnResume(), config=RuntimeConfig())

    inputs = [
        command(T0, llm="first", calls=["a.tool"], llm_on_resume="refuse"),
        result(T0 + 1, intent_id(KEY, SEQ, 0)),
        export(T0 + 2, "after the refusal"),
    ]
    direct = run_round(transform(), inputs, tmp_path)
    fn_api = _on_the_fn_api_runner(transform(), inputs, tmp_path / "fn_api")
    (snapshot,) = direct.values("snapshots")
    assert (snapshot.llm_cache.input_tokens, snapshot.llm_cache.output_tokens) == (10_010, 10)
    assert direct.values("errors")[0].reason == "llm_failed"
    assert message_bytes(fn_api["snapshots"]) == message_bytes([snapshot])
