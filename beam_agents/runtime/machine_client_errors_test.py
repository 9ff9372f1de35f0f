"""What a model client raises, however it is made, and a start deferred at time 0 without
backoff: the machine records it and goes on, never a failed bundle."""

from __future__ import annotations

import pytest

from beam_agents._protos import AgentEnvelope
from beam_agents.errors import LlmCallError
from beam_agents.runtime import RuntimeConfig, agent
from beam_agents.runtime.key_driver import KeyDriver, recording_machine
from beam_agents.runtime.recording import RECORDS

T0 = 1_764_460_800_000


@agent(name="review.catches/v1")
def catches(ctx, event: bytes) -> bytes:
    try:
        return ctx.llm([{"role": "user", "content": "hi"}], model="m").text.encode()
    except LlmCallError:
        return b"the model failed"


@agent(name="review.lets_it_fail/v1")
def lets_it_fail(ctx, event: bytes) -> bytes:
    return ctx.llm([{"role": "user", "content": "hi"}], model="m").text.encode()


class _ModelNamedBadly:
    """A provider client whose error names its model with a lone surrogate (text decoded
    from a provider's bytes with errors="surrogateescape", say)."""

    def complete(self, request):
        raise LlmCallError("unavailable", model="gpt\udce9", retryable=False)


@pytest.mark.parametrize("candidate", [catches, lets_it_fail], ids=["caught", "raised"])
def test_a_client_error_whose_model_name_holds_a_lone_surrogate_does_not_escape_the_machine(
    candidate,
):
    # d66407b records the failure under the client's error's `model` (context.py `_said`)
    # instead of the request's, and Recording._failures (recording.py:120) puts it in a proto
    # string uncut: UnicodeEncodeError escapes KeyMachine.on_envelope, so RunAgent's bundle
    # fails on every retry and the key is wedged. At 732bd42 the record held the request's
    # model. The reason is made safe (`_cut`); the model must be too.
    driver = KeyDriver(recording_machine(candidate, _ModelNamedBadly(), RuntimeConfig()), b"k")
    driver.schedule(AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"e"))
    outputs = driver.step()  # raised UnicodeEncodeError
    (record,) = [value for tag, value in outputs if tag == RECORDS]
    assert len(record.model_failures) == 1


class _BusyOnce:
    def __init__(self) -> None:
        self.calls = 0

    def complete(self, request):
        from beam_agents.runtime import LlmResponse

        self.calls += 1
        if self.calls == 1:
            raise LlmCallError("overloaded", model=request.model, retryable=True)
        return LlmResponse("ok", request.model, 3, 2)


def test_a_start_deferred_at_time_zero_without_backoff_is_retried_as_a_start():
    # Found by review: a retry_at_ms of 0 (an event at time 0, no backoff) read as "no retry",
    # so at its timer the runtime took the deferred start for a suspension at its deadline
    # with nothing unanswered and resumed the agent, answerless: agent_raised three times,
    # resume_failed, then the event drained as a start.
    config = RuntimeConfig(resume_backoff_ms=0)
    driver = KeyDriver(recording_machine(lets_it_fail, _BusyOnce(), config), b"k")
    driver.schedule(AgentEnvelope(entity_key=b"k", event_time_ms=0, external_event=b"e"))
    driver.step()
    waiting = driver.state.continuation
    assert waiting is not None and list(waiting.mailbox)  # deferred
    assert waiting.retry_at_ms == 1  # 0 would say no retry is due
    outputs = driver.fire_deadline(waiting.retry_at_ms)
    records = [value for tag, value in outputs if tag == RECORDS]
    assert [(r.HasField("event"), r.reason, r.output) for r in records] == [(True, "", b"ok")]


class _ProviderError(LlmCallError):
    """A provider client's own LlmCallError that sets only what it uses (no super().__init__):
    no model, reason, input_tokens or output_tokens attributes."""

    def __init__(self, text: str) -> None:
        Exception.__init__(self, text)
        self.retryable = False


class _QuotaClient:
    def complete(self, request):
        raise _ProviderError("quota exceeded")


def test_a_clients_llm_call_error_subclass_without_token_attributes_is_llm_failed():
    # d66407b makes a client's LlmCallError subclass `llm_failed` (machine_activations.py
    # `_REASONS`) and reads its model and reason safely (context.py `_said`), but
    # ActivationContext.llm still reads e.input_tokens / e.output_tokens bare
    # (context.py:~508): AttributeError replaces the model failure, so an agent that catches
    # LlmCallError cannot, and the dead letter says agent_raised.
    for candidate, reason in ((lets_it_fail, "llm_failed"), (catches, "")):
        driver = KeyDriver(recording_machine(candidate, _QuotaClient(), RuntimeConfig()), b"k")
        driver.schedule(AgentEnvelope(entity_key=b"k", event_time_ms=T0, external_event=b"e"))
        (record,) = [value for tag, value in driver.step() if tag == RECORDS]
        assert record.reason == reason, candidate.adapter
