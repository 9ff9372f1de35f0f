"""The ReAct agent through RunAgent on real Beam pipelines: parallel tool calls of one model turn
are one suspension of signed intents, the effector answers them, and a key restored from its
exported snapshot resumes, replays the first turn from its cache and feeds the results back."""

from __future__ import annotations

import pytest

from beam_agents._protos import AgentEnvelope, ToolResult, TraceEvent
from beam_agents.errors import ToolCallError
from beam_agents.intents.effector import Effector, Route, VerifyMode
from beam_agents.intents.identity import intent_id
from beam_agents.intents.signing import Keyring, Verification, verify
from beam_agents.ops.rounds import Advance, ManualClock, run_round
from beam_agents.runtime import LlmRequest, LlmResponse, RunAgent, ScriptedLlmClient
from beam_agents.runtime.react import react_agent
from beam_agents.runtime.tool_calling import ToolCall, ToolDefinition

KEY = b"c-1"
T0 = 1_764_460_800_000
SEQ = T0 * 1000  # a fresh key's first seq
RING = Keyring({"runtime-2026-11": bytes(range(32))}, active="runtime-2026-11")
OBJECT = {"type": "object", "properties": {"q": {"type": "string"}}}
TOOLS = (
    ToolDefinition("kb_search", "Searches the knowledge base.", OBJECT),
    ToolDefinition("crm_lookup", "Looks a customer up.", OBJECT),
)
SYSTEM = "You answer support tickets."


def load_ring() -> Keyring:
    return RING


def model(request: LlmRequest) -> LlmResponse:
    """The first turn asks for three tools at once (one unknown); the second answers from what
    the tool messages say."""
    assert [t.name for t in request.tools] == ["kb_search", "crm_lookup"]
    assert request.messages[0] == {"role": "system", "content": SYSTEM}
    if request.messages[-1]["role"] == "user":
        calls = (
            ToolCall("call_a", "kb_search", {"q": request.messages[-1]["content"]}),
            ToolCall("call_b", "crm_lookup", {"q": "c-1"}),
            ToolCall("call_c", "weather", {}),
        )
        return LlmResponse("Let me look.", "m-1", finish_reason="tool_calls", tool_calls=calls)
    said = [f"{m['tool_call_id']}={m['content']}" for m in request.messages if m["role"] == "tool"]
    return LlmResponse("answer: " + " | ".join(said), "m-1", finish_reason="stop")


def kb_search(args: dict, intent) -> str:
    return f"kb says {args['q']!r}"


def crm_lookup(args: dict, intent) -> str:
    raise ToolCallError("the CRM is down", tool="crm_lookup", retryable=True)


def export(at: int, request_id: str) -> AgentEnvelope:
    envelope = AgentEnvelope(entity_key=KEY, event_time_ms=at)
    envelope.export_request.request_id = request_id
    return envelope


def run_agent(agent) -> RunAgent:
    return RunAgent(agent, llm_client=ScriptedLlmClient(model), keyring_loader=load_ring)


def llm_replays(outputs) -> list[str]:
    traces = outputs.values("traces")
    return [
        t.attributes["beam_agents.replayed"] for t in traces if t.event_type == TraceEvent.LLM_CALL
    ]


def test_parallel_tool_calls_are_one_suspension_and_a_restored_key_feeds_the_results_back(
    tmp_path,
):
    agent = react_agent(model="m-1", tools=TOOLS, system=SYSTEM)
    event = AgentEnvelope(entity_key=KEY, event_time_ms=T0, external_event=b"refund?")
    first = run_round(run_agent(agent), [event, export(T0 + 100, "r1")], tmp_path).before(T0 + 101)
    assert first.errors == [] and first.completions == []
    intents = first.values("intents")
    # The two known tools of one turn: one step, call indexes 0 and 1, signed.
    assert [(i.tool_name, i.args_json) for i in intents] == [
        ("kb_search", '{"q":"refund?"}'),
        ("crm_lookup", '{"q":"c-1"}'),
    ]
    assert [i.intent_id for i in intents] == [intent_id(KEY, SEQ, 0, c) for c in (0, 1)]
    assert all(verify(i, RING) is Verification.VALID for i in intents)
    assert llm_replays(first) == ["false"]
    (snapshot,) = first.values("snapshots")
    assert list(snapshot.continuation.pending_intent_ids) == [i.intent_id for i in intents]

    effector = Effector(
        {"kb_search": kb_search, "crm_lookup": crm_lookup},
        mode=VerifyMode.REQUIRE,
        store=tmp_path / "effector.sqlite",
        keyring=RING,
        clock=ManualClock(T0 + 150),
    )
    answers = []
    for emitted in intents:
        decided = effector(emitted.SerializeToString())
        assert decided.route is Route.RESULT
        answers.append(decided.result)
        answers[-1].event_time_ms = T0 + 200
    # A new pipeline: the key exists only in its exported snapshot.
    second = run_round(run_agent(agent), [snapshot, *answers, Advance(T0 + 300)], tmp_path)
    second = second.before(T0 + 300)
    assert second.errors == [] and second.intents == []
    (completion,) = second.values("completions")
    assert completion.decode() == (
        "answer: call_a=kb says 'refund?' | "
        "call_b=error (ERROR): ToolCallError: tool 'crm_lookup' failed (retryable): "
        "the CRM is down | "
        "call_c=error: there is no tool 'weather'; the tools are ['crm_lookup', 'kb_search']"
    )
    # The resume replayed the first turn from the restored cache and asked only the second.
    assert llm_replays(second) == ["true", "false"]


def _one_call_answered(tmp_path, **effector_options) -> tuple[bytes, ToolResult]:
    """(the completion, the result the agent got): a react_agent running one tool call a turn
    asks for kb_search, a real Effector (with `effector_options`) runs it, and the restored
    key is resumed with its result."""
    agent = react_agent(model="m-1", tools=TOOLS, system=SYSTEM, max_tool_calls=1)
    event = AgentEnvelope(entity_key=KEY, event_time_ms=T0, external_event=b"refund?")
    first = run_round(run_agent(agent), [event, export(T0 + 100, "r1")], tmp_path).before(T0 + 101)
    (emitted,) = first.values("intents")
    assert emitted.tool_name == "kb_search"
    (snapshot,) = first.values("snapshots")
    effector = Effector(
        {"kb_search": kb_search},
        mode=VerifyMode.REQUIRE,
        store=tmp_path / "effector.sqlite",
        keyring=RING,
        clock=ManualClock(T0 + 150),
        **effector_options,
    )
    answer = effector(emitted.SerializeToString()).result
    answer.event_time_ms = T0 + 200
    second = run_round(run_agent(agent), [snapshot, answer, Advance(T0 + 300)], tmp_path)
    (completion,) = second.before(T0 + 300).values("completions")
    return completion, answer.tool_result


def test_calls_past_max_tool_calls_are_told_to_the_model_not_run(tmp_path):
    completion, _ = _one_call_answered(tmp_path)
    assert completion.decode() == (
        "answer: call_a=kb says 'refund?' | "
        "call_b=error: not run: one turn runs at most 1 tool calls; call it again in a later "
        "turn | "
        "call_c=error: there is no tool 'weather'; the tools are ['crm_lookup', 'kb_search']"
    )
    with pytest.raises(ValueError, match="max_tool_calls"):
        react_agent(model="m-1", tools=TOOLS, max_tool_calls=0)


def looping_model(request: LlmRequest) -> LlmResponse:
    return LlmResponse("", "m-1", tool_calls=(ToolCall("call_x", "weather", {}),))


def test_a_model_that_keeps_calling_tools_past_the_turn_limit_is_a_dead_letter(tmp_path):
    agent = react_agent(model="m-1", tools=TOOLS, max_turns=3)
    event = AgentEnvelope(entity_key=KEY, event_time_ms=T0, external_event=b"weather?")
    outputs = run_round(
        RunAgent(agent, llm_client=ScriptedLlmClient(looping_model)),
        [event, Advance(T0 + 100)],
        tmp_path,
    ).before(T0 + 100)
    (error,) = outputs.values("errors")
    assert error.reason == "agent_raised" and "after 3 turns" in error.detail
    assert outputs.completions == [] and outputs.intents == []


def test_tools_must_have_distinct_names():
    with pytest.raises(ValueError, match="share a name"):
        react_agent(model="m", tools=(TOOLS[0], TOOLS[0]))


def test_one_model_answer_cannot_fan_out_into_hundreds_of_tool_runs(tmp_path):
    import json

    from beam_agents.integrations.llm.openai_chat import OpenAIChatClient
    from beam_agents.testing.local_http import JSON, LocalHttpServer, Reply, scripted

    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "kb_search", "arguments": "{}"}}
        for i in range(300)
    ]
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m-1",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "content": None, "tool_calls": calls},
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9},
    }
    agent = react_agent(model="m-1", tools=TOOLS)
    event = AgentEnvelope(entity_key=KEY, event_time_ms=T0, external_event=b"search!")
    with LocalHttpServer(scripted(Reply(200, json.dumps(body).encode(), JSON))) as server:
        client = OpenAIChatClient(base_url=f"{server.url}/v1")
        outputs = run_round(
            RunAgent(agent, llm_client=client), [event, Advance(T0 + 1)], tmp_path
        ).before(T0 + 1)
    first_turn = [i for i in outputs.values("intents") if i.step_index == 0]
    assert len(first_turn) == 16


def test_a_result_whose_payload_the_effector_dropped_tells_the_model_so(tmp_path):
    # Over the effector's max_result_bytes a result is OK without its payload, its
    # error_message saying why: the model read an empty answer, as if the tool had found
    # nothing, and may call it again for an effect it already had.
    completion, result = _one_call_answered(tmp_path, max_result_bytes=4)
    assert result.status == ToolResult.OK and not result.payload
    told = completion.decode().split(" | ")[0]
    assert told.startswith("answer: call_a=") and "was not kept" in told
