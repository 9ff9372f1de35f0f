"""The Anthropic client against a real HTTP server on 127.0.0.1 that speaks the Messages API."""

from __future__ import annotations

import json
import time

import pytest

from beam_agents.errors import LlmCallError
from beam_agents.llm.anthropic_messages import AnthropicClient
from beam_agents.runtime import LlmRequest
from beam_agents.runtime.tool_calling import (
    ToolCall,
    ToolDefinition,
    assistant_message,
    tool_message,
)
from beam_agents.testing.local_http import JSON, LocalHttpServer, Reply, Sleeps, scripted

REQUEST = LlmRequest("claude-test", ({"role": "user", "content": "hi"},), {"stop_sequences": ["."]})
SEARCH = ToolDefinition(
    "kb_search", "Searches.", {"type": "object", "properties": {"q": {"type": "string"}}}
)


def message(*content, stop_reason="end_turn") -> Reply:
    body = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-served",
        "content": list(content) or [{"type": "text", "text": "hello"}],
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 2},
    }
    return Reply(200, json.dumps(body).encode(), JSON)


def error(status: int, **headers) -> Reply:
    body = {"type": "error", "error": {"type": "x", "message": f"status {status}"}}
    return Reply(status, json.dumps(body).encode(), {**JSON, **headers})


def client(server, **options) -> AnthropicClient:
    return AnthropicClient(base_url=server.url, api_key="sk-ant-test", **options)


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


def test_a_429_is_retried_after_the_servers_retry_after():
    sleeps = Sleeps()
    with LocalHttpServer(scripted(error(429, **{"retry-after": "2"}), message())) as server:
        response = client(server, sleep=sleeps).complete(REQUEST)
    assert response.text == "hello" and len(server.requests) == 2 and sleeps == [2.0]


def test_a_5xx_storm_exhausts_the_attempts_with_a_retryable_error():
    sleeps = Sleeps()
    with LocalHttpServer(scripted(error(529))) as server, pytest.raises(LlmCallError) as raised:
        client(server, sleep=sleeps, max_attempts=3).complete(REQUEST)
    assert raised.value.retryable and "gave up after 3 attempts" in raised.value.reason
    assert "HTTP 529" in raised.value.reason and len(server.requests) == 3 and len(sleeps) == 2


def test_a_client_error_is_not_retried():
    with LocalHttpServer(scripted(error(400))) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and len(server.requests) == 1


def test_a_timeout_is_a_retryable_error_within_the_attempts_deadline():
    with LocalHttpServer(lambda request: Reply(200, b"{}", JSON, delay_s=2)) as server:
        started = time.monotonic()
        with pytest.raises(LlmCallError) as raised:
            client(server, timeout_s=0.3, max_attempts=1).complete(REQUEST)
    assert raised.value.retryable and "Timeout" in raised.value.reason
    assert time.monotonic() - started < 2  # before the server's reply, 2 s late


@pytest.mark.parametrize(
    "reply",
    [Reply(200, b"this is not json", JSON), Reply(200, b'{"type": "message"}', JSON)],
    ids=["not json", "no content"],
)
def test_a_malformed_body_is_a_non_retryable_error(reply):
    with LocalHttpServer(scripted(reply)) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and len(server.requests) == 1


def test_a_huge_body_is_refused():
    with LocalHttpServer(scripted(message())) as server, pytest.raises(LlmCallError) as raised:
        client(server, max_response_bytes=64).complete(REQUEST)
    assert not raised.value.retryable and "refused" in raised.value.reason


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
