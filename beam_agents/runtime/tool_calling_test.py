"""Tool definitions and tool calls in LlmRequest and LlmResponse, and replay-cache bytes that
stay readable across the change."""

from __future__ import annotations

import pytest

from beam_agents.runtime import LlmRequest, LlmResponse
from beam_agents.runtime.tool_calling import (
    ToolCall,
    ToolDefinition,
    assistant_message,
    tool_message,
)

SEARCH = ToolDefinition(
    "kb_search",
    "Searches the knowledge base.",
    {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)

# A cache entry as the binary before tool calling wrote it (RFC 8785 of the old dataclass).
OLD_ENTRY = (
    b'{"finish_reason":"stop","input_tokens":7,"model":"m-1","output_tokens":2,"text":"hello"}'
)


def test_a_cache_entry_written_before_tool_calls_existed_is_read_and_rewritten_the_same():
    response = LlmResponse.from_bytes(OLD_ENTRY)
    assert response == LlmResponse("hello", "m-1", 7, 2, "stop")
    assert response.tool_calls == ()
    assert response.to_bytes() == OLD_ENTRY


def test_tool_calls_round_trip_through_the_cache_bytes():
    response = LlmResponse(
        "",
        "m-1",
        finish_reason="tool_calls",
        tool_calls=(
            ToolCall("call_1", "kb_search", {"q": "refund", "limit": 3}),
            ToolCall("call_2", "crm_lookup", {}),
        ),
    )
    data = response.to_bytes()
    assert LlmResponse.from_bytes(data) == response
    assert b'"tool_calls":[{"arguments":{"limit":3,"q":"refund"},"id":"call_1"' in data


def test_a_request_without_tools_keeps_its_old_cache_key_and_tools_change_it():
    messages = ({"role": "user", "content": "hi"},)
    plain = LlmRequest("m", messages, {"temperature": 0})
    assert plain.canonical() == (
        '{"messages":[{"content":"hi","role":"user"}],"model":"m","params":{"temperature":0}}'
    )
    with_tools = LlmRequest("m", messages, {"temperature": 0}, (SEARCH,))
    assert with_tools.canonical() != plain.canonical()
    assert '"tools":[{"description":"Searches the knowledge base.","name":"kb_search"' in (
        with_tools.canonical()
    )


@pytest.mark.parametrize("name", ["kb.search", "", "x" * 65, "with space"])
def test_a_name_some_provider_would_refuse_is_refused_where_it_is_declared(name):
    with pytest.raises(ValueError, match="not one every provider accepts"):
        ToolDefinition(name)


def test_parameters_must_describe_an_object():
    with pytest.raises(ValueError, match="JSON Schema of an object"):
        ToolDefinition("t", parameters={"type": "string"})


def test_the_conversation_records_calls_and_answers_in_the_openai_format():
    calls = (ToolCall("call_1", "kb_search", {"q": "x"}),)
    assert assistant_message("", calls) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "kb_search", "arguments": '{"q":"x"}'},
            }
        ],
    }
    assert assistant_message("done", ()) == {"role": "assistant", "content": "done"}
    assert tool_message("call_1", "found") == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "found",
    }
