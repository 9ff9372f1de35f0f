"""RunAgent's recording (issue 42 item 1): an ActivationRecord per activation on RECORDS when on,
and with it off, the graph jobs run today."""

from __future__ import annotations

import hashlib
import json

import apache_beam as beam
import pytest

from beam_agents._protos import ActivationRecord, ToolResult
from beam_agents.errors import LlmCallError
from beam_agents.examples.support_triage import MODEL, SYSTEM, TOOLS, scripted_model, ticket, triage
from beam_agents.ops.local_run import run_locally
from beam_agents.ops.rounds import env_options
from beam_agents.ops.update_check import describe_graph, differences
from beam_agents.runtime import RECORDS, LlmRequest, LlmResponse, Recording, RunAgent, agent
from beam_agents.runtime.recording import request_digest
from beam_agents.testing.recorded_history import record_history, triage_tickets

Outcome = ActivationRecord.Outcome
REFUND = "I want a refund for my order"


def _approve(intent) -> bool:
    return True


def test_runagent_records_each_activation_with_its_inputs_model_calls_intents_and_outcome():
    run = run_locally(
        triage,
        [ticket("t-1", "c-1", REFUND)],
        tools=TOOLS,
        approver=_approve,
        llm_client=scripted_model(),
        options=env_options(),
        recording=Recording(),
    )
    records = run.records
    assert [r.outcome for r in records] == [Outcome.OUTCOME_SUSPENDED] * 3 + [
        Outcome.OUTCOME_COMPLETED
    ]
    assert [[i.tool_name for i in r.intents] for r in records] == [
        ["crm.lookup"],
        ["human.approval"],
        ["payments.refund"],
        [],
    ]
    # The records' intents are the ones RunAgent emitted, signatures and all.
    assert [i for r in records for i in r.intents] == run.intents
    start, lookup, approval, refund = records
    assert start.event.external_event == ticket("t-1", "c-1", REFUND)
    assert start.first_step == 0 and not start.answers
    assert lookup.answers[0].tool_result.status == ToolResult.OK
    assert json.loads(lookup.answers[0].tool_result.payload)["tier"] == "gold"
    assert approval.answers[-1].approval.approved
    assert refund.output == run.completions[0]
    # Only a completion has an output: a suspended activation returned nothing.
    assert [r.output for r in (start, lookup, approval)] == [b"", b"", b""]
    assert len({r.seq for r in records}) == 1
    assert [r.first_step for r in records] == [0, 1, 2, 3]
    # The model answered the first resume; later resumes replay it from the key's cache.
    calls = [c for r in records for c in r.model_calls]
    assert [c.replayed for c in calls] == [False, True, True]
    request = LlmRequest(
        MODEL,
        (
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": REFUND},
        ),
        {"temperature": 0},
    )
    assert {c.request_digest for c in calls} == {request_digest(request.canonical())}
    assert (
        request_digest(request.canonical()) == hashlib.sha256(request.canonical().encode()).digest()
    )
    answer = scripted_model().complete(request)
    assert calls[0].response == answer.to_bytes()
    assert calls[0].response_digest == hashlib.sha256(answer.to_bytes()).digest()
    assert (calls[0].input_tokens, calls[0].output_tokens) == (
        answer.input_tokens,
        answer.output_tokens,
    )


def test_recording_is_off_by_default_and_leaves_the_graph_as_it_was():
    def graph(**kwargs):
        pipeline = beam.Pipeline()
        _ = pipeline | beam.Create([b""]) | RunAgent(triage, **kwargs)
        return pipeline.to_runner_api()

    def outputs(proto):
        (activate,) = [
            t for t in proto.components.transforms.values() if t.unique_name == "RunAgent/Activate"
        ]
        return set(activate.outputs)

    today, recording = graph(), graph(recording=Recording())
    assert outputs(today) == {"None", "intents", "traces", "errors", "snapshots"}
    assert outputs(recording) == outputs(today) | {RECORDS}
    # An output added or removed is a legal --update either way: no state spec changes.
    assert differences(describe_graph(today), describe_graph(recording)) == []
    assert differences(describe_graph(recording), describe_graph(today)) == []


def test_an_answer_over_the_limit_is_kept_as_its_digest_only():
    (event,) = triage_tickets(1)  # a refund request: the model is asked once
    records = record_history(
        triage,
        [event],
        tools=TOOLS,
        approver=_approve,
        llm_client=scripted_model(),
        recording=Recording(max_answer_bytes=16),
    )
    (call,) = [c for r in records for c in r.model_calls if not c.replayed]
    assert call.digest_only and call.response == b""
    whole = record_history(
        triage, [event], tools=TOOLS, approver=_approve, llm_client=scripted_model()
    )
    (kept,) = [c for r in whole for c in r.model_calls if not c.replayed]
    assert not kept.digest_only and len(kept.response) > 16
    assert call.response_digest == hashlib.sha256(kept.response).digest()


@pytest.mark.parametrize("size", [-1, True, 1.5, None])
def test_a_recording_limit_must_be_a_size(size):
    with pytest.raises(ValueError, match="max_answer_bytes"):
        Recording(max_answer_bytes=size)


def test_runagent_takes_only_a_recording():
    with pytest.raises(TypeError, match="Recording"):
        RunAgent(triage, recording=True)


class _RefusesThenAnswers:
    """A model client that refuses its first answer (billed, its reason long and holding a
    lone surrogate), then answers, then fails for good."""

    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request):
        self.calls += 1
        if self.calls == 1:
            raise LlmCallError(
                "\ud800" + "x" * 5_000, model=request.model, retryable=True, input_tokens=7
            )
        if self.calls == 2:
            return LlmResponse("ok", "m", 10, 5)
        raise LlmCallError("down", model=request.model, retryable=False)


@agent(name="recording_test.asks_again/v1")
def asks_again(ctx, event: bytes) -> bytes:
    """Asks once more after a failure it catches; the third request's failure ends it."""
    try:
        ctx.llm([{"role": "user", "content": "first"}], model="m")
    except LlmCallError:
        ctx.llm([{"role": "user", "content": "first"}], model="m")
    return ctx.llm([{"role": "user", "content": "third"}], model="m").text.encode()


def test_a_model_call_that_failed_is_recorded_in_its_place_with_its_retryability_and_billing():
    run = run_locally(
        asks_again,
        [b"e"],
        tools={},
        approver=_approve,
        llm_client=_RefusesThenAnswers(),
        options=env_options(),
        # The failures' reasons are cut as answers are.
        recording=Recording(max_answer_bytes=1_024),
    )
    (record,) = run.records
    assert (record.outcome, record.reason) == (Outcome.OUTCOME_FAILED, "llm_failed")
    assert [c.request_digest for c in record.model_calls] == [_digest("first")]
    busy, down = record.model_failures
    assert (busy.after_calls, busy.request_digest, busy.retryable) == (0, _digest("first"), True)
    assert (busy.input_tokens, busy.output_tokens, busy.model) == (7, 0, "m")
    assert busy.error == "?" + "x" * 1_023
    assert busy.text.startswith("LLM call to 'm' failed: ?xxx") and len(busy.text) == 1_024
    assert (down.after_calls, down.request_digest, down.retryable) == (1, _digest("third"), False)
    assert (down.error, down.input_tokens) == ("down", 0)
    assert down.text == "LLM call to 'm' failed: down"
    # Each failed call has the cache key of its position, as an answered one would.
    assert len({busy.cache_key, down.cache_key, record.model_calls[0].cache_key}) == 3


def _digest(content: str) -> bytes:
    return request_digest(LlmRequest("m", ({"role": "user", "content": content},)).canonical())
