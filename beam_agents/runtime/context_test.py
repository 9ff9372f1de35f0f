"""The agent contract (context): calls to one model are capped per worker, what an answer says,
and the names a model call and an intent are traced under."""

from __future__ import annotations


def test_calls_to_one_model_are_capped_per_worker():
    import threading
    import time

    from beam_agents.runtime.context import model_slot

    running, peak, lock = [0], [0], threading.Lock()

    def call():
        with model_slot("capped-model", 2):
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.02)
            with lock:
                running[0] -= 1

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak[0] == 2


def _tool_answer(**result):
    from beam_agents._protos import ToolIntent, ToolResult
    from beam_agents.runtime.context import Answer

    return Answer(ToolIntent(intent_id="i-1", kind=ToolIntent.TOOL), result=ToolResult(**result))


def test_an_answer_says_when_a_call_took_effect_with_its_payload_unknown():
    from beam_agents._protos import ToolResult

    ok = ToolResult.OK
    settled = _tool_answer(
        status=ok, error_message="the tool took effect, as ops confirmed; its result is unknown"
    )
    # What an effector before this rule recorded for a person's confirmation, sent again
    # from its store: a confirmation in place of the tool's payload.
    legacy = _tool_answer(status=ok, payload=b'{"confirmed_by":"ops","took_effect":true}')
    for answer in (settled, legacy):
        assert answer.ok and answer.payload_unknown and answer.payload == b""
    paid = _tool_answer(status=ok, payload=b'{"receipt":"r-1"}')
    empty = _tool_answer(status=ok)  # a tool that answered nothing answered that
    failed = _tool_answer(status=ToolResult.ERROR, error_message="not done: ...")
    assert not any(a.payload_unknown for a in (paid, empty, failed))
    assert paid.payload == b'{"receipt":"r-1"}'


def test_a_model_call_and_an_intent_are_traced_under_the_opentelemetry_genai_names():
    # Exporters and dashboards read these attributes by name (docs/operations.md): the GenAI
    # conventions' gen_ai.* and beam_agents.* for what they do not name.
    from beam_agents._protos import TraceEvent
    from beam_agents.runtime import LlmResponse, RuntimeConfig, agent
    from beam_agents.runtime.budget import Budget, Price
    from beam_agents.testing.machine_harness import T0, Harness, event, pending

    @agent(name="tests.traced/v1")
    def traced(ctx, event: bytes) -> bytes:
        ctx.llm([{"role": "user", "content": "hi"}], model="m")
        ctx.request_approval("refund?", amount=1)
        return b""

    class Model:
        def complete(self, request):
            return LlmResponse("ok", "m-2026-01", 100, 50, finish_reason="stop")

    prices = {"m": Price(input_per_million=2_000_000, output_per_million=8_000_000)}
    h = Harness(traced, llm=Model(), config=RuntimeConfig(budget=Budget(prices=prices)))
    h.send(event(T0, b"x"))
    traces = {t.event_type: dict(t.attributes) for t in h.values("traces")}
    assert traces[TraceEvent.LLM_CALL] == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m",
        "gen_ai.response.model": "m-2026-01",
        "gen_ai.usage.input_tokens": "100",
        "gen_ai.usage.output_tokens": "50",
        "gen_ai.response.finish_reasons": "stop",
        "beam_agents.replayed": "false",
        "beam_agents.cost_micros": "600",
    }
    (question,) = pending(h)
    assert traces[TraceEvent.INTENT_EMITTED] == {
        "beam_agents.intent_id": question.intent_id,
        "gen_ai.tool.name": "human.approval",
        "beam_agents.intent.kind": "APPROVAL",
    }


def test_a_response_that_names_no_model_is_traced_under_the_model_asked():
    from beam_agents._protos import TraceEvent
    from beam_agents.runtime import LlmResponse
    from beam_agents.testing.machine_harness import T0, Harness, event, summarise_event

    class Anonymous:
        def complete(self, request):
            return LlmResponse("ok")

    assert LlmResponse("ok").model == ""
    h = Harness(summarise_event, llm=Anonymous())
    h.send(event(T0, b"x"))
    (call,) = [t for t in h.values("traces") if t.event_type == TraceEvent.LLM_CALL]
    assert call.attributes["gen_ai.response.model"] == "m"
