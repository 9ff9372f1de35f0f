"""The Anthropic client against a real HTTP server on 127.0.0.1 that speaks the Messages API."""

from __future__ import annotations

import json

import pytest

from beam_agents.errors import LlmCallError
from beam_agents.runtime import LlmRequest
from beam_agents.runtime.tool_calling import (
    ToolCall,
    ToolDefinition,
    assistant_message,
    tool_message,
)
from beam_agents.testing.llm_servers import PROVIDERS, anthropic_message, usage_after_one_call
from beam_agents.testing.local_http import JSON, LocalHttpServer, Reply, scripted

REQUEST = PROVIDERS[0].request
SEARCH = ToolDefinition(
    "kb_search", "Searches.", {"type": "object", "properties": {"q": {"type": "string"}}}
)


message = anthropic_message
client = PROVIDERS[0].client


def test_a_message_comes_back_with_its_usage_and_the_request_is_the_messages_api():
    with LocalHttpServer(scripted(message())) as server:
        response = client(server).complete(REQUEST)
    assert (response.text, response.model, response.finish_reason) == (
        "hello",
        "claude-served",
        "end_turn",
    )
    assert (response.input_tokens, response.output_tokens) == (7, 2)
    (sent,) = server.requests
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    assert sent.headers["Authorization"] == "Bearer sk-ant-test"
    body = json.loads(sent.body)
    assert body["model"] == "claude-test" and body["max_tokens"] == 4096
    assert body["stop_sequences"] == ["."]
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


def test_tool_use_blocks_are_tool_calls_and_the_conversation_is_translated():
    reply = message(
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "kb_search", "input": {"q": "refund"}},
        {"type": "tool_use", "id": "toolu_2", "name": "kb_search", "input": {"q": "fee"}},
        stop_reason="tool_use",
    )
    conversation = (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        assistant_message("Looking.", (ToolCall("toolu_0", "kb_search", {"q": "x"}),)),
        tool_message("toolu_0", "nothing"),
    )
    with LocalHttpServer(scripted(reply)) as server:
        response = client(server).complete(LlmRequest("claude-test", conversation, {}, (SEARCH,)))
    assert response.text == "Let me look." and response.finish_reason == "tool_use"
    assert response.tool_calls == (
        ToolCall("toolu_1", "kb_search", {"q": "refund"}),
        ToolCall("toolu_2", "kb_search", {"q": "fee"}),
    )
    body = json.loads(server.requests[0].body)
    assert body["system"] == "Be brief."
    assert body["tools"] == [
        {
            "name": "kb_search",
            "description": "Searches.",
            "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}},
        }
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_0", "name": "kb_search", "input": {"q": "x"}},
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_0", "content": "nothing"}],
        },
    ]


def test_a_tool_input_a_tool_intent_cannot_carry_is_an_error_naming_the_call():
    reply = message(
        {"type": "tool_use", "id": "toolu_9", "name": "kb_search", "input": {"n": 2**60}}
    )
    with LocalHttpServer(scripted(reply)) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and "kb_search(toolu_9)" in raised.value.reason
    # The answer was billed all the same: the error says for how much.
    assert (raised.value.input_tokens, raised.value.output_tokens) == (7, 2)


def _with_content(content) -> Reply:
    """A message whose content is `content`, its tokens billed."""
    body = json.loads(message().body)
    body["content"] = content
    return Reply(200, json.dumps(body).encode(), JSON)


def test_a_message_with_no_content_is_a_refusal_that_carries_the_tokens_it_was_billed_for():
    none = scripted(_with_content(None))
    with LocalHttpServer(none) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and len(server.requests) == 1
    assert "no content" in raised.value.reason
    assert (raised.value.input_tokens, raised.value.output_tokens) == (7, 2)


def test_a_message_with_no_content_counts_in_the_keys_usage():
    with LocalHttpServer(scripted(_with_content(None))) as server:
        assert usage_after_one_call(client(server)) == (["llm_failed"], (7, 2))


def test_a_message_with_an_empty_content_list_is_an_empty_answer():
    with LocalHttpServer(scripted(_with_content([]))) as server:
        response = client(server).complete(REQUEST)
    assert (response.text, response.tool_calls, response.input_tokens) == ("", (), 7)
