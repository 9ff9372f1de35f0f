"""The Gemini client against a real HTTP server on 127.0.0.1 that speaks generateContent."""

from __future__ import annotations

import json
import time

import pytest

from beam_agents.errors import LlmCallError
from beam_agents.llm.gemini import GeminiClient
from beam_agents.runtime import LlmRequest
from beam_agents.runtime.tool_calling import (
    ToolCall,
    ToolDefinition,
    assistant_message,
    tool_message,
)
from beam_agents.testing.local_http import JSON, LocalHttpServer, Reply, Sleeps, scripted

REQUEST = LlmRequest("gemini-test", ({"role": "user", "content": "hi"},), {"temperature": 0})
SEARCH = ToolDefinition(
    "kb_search", "Searches.", {"type": "object", "properties": {"q": {"type": "string"}}}
)


def answer(*parts, finish="STOP") -> Reply:
    body = {
        "candidates": [
            {
                "content": {"role": "model", "parts": list(parts) or [{"text": "hello"}]},
                "finishReason": finish,
                "index": 0,
            }
        ],
        "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 2, "totalTokenCount": 9},
        "modelVersion": "gemini-served",
    }
    return Reply(200, json.dumps(body).encode(), JSON)


def error(status: int, **headers) -> Reply:
    body = {"error": {"code": status, "message": f"status {status}", "status": "X"}}
    return Reply(status, json.dumps(body).encode(), {**JSON, **headers})


def client(server, **options) -> GeminiClient:
    return GeminiClient(base_url=server.url, api_key="g-test", **options)


def test_an_answer_comes_back_with_its_usage_and_the_request_is_generate_content():
    with LocalHttpServer(scripted(answer())) as server:
        response = client(server).complete(REQUEST)
    assert (response.text, response.model, response.finish_reason) == (
        "hello",
        "gemini-served",
        "STOP",
    )
    assert (response.input_tokens, response.output_tokens) == (7, 2)
    (sent,) = server.requests
    assert sent.method == "POST" and sent.path.endswith("/models/gemini-test:generateContent")
    body = json.loads(sent.body)
    assert body["contents"] == [{"role": "user", "parts": [{"text": "hi"}]}]
    assert body["generationConfig"]["temperature"] == 0


def test_a_429_is_retried_after_the_servers_retry_after():
    sleeps = Sleeps()
    with LocalHttpServer(scripted(error(429, **{"retry-after": "2"}), answer())) as server:
        response = client(server, sleep=sleeps).complete(REQUEST)
    assert response.text == "hello" and len(server.requests) == 2 and sleeps == [2.0]


def test_a_5xx_storm_exhausts_the_attempts_with_a_retryable_error():
    sleeps = Sleeps()
    with LocalHttpServer(scripted(error(503))) as server, pytest.raises(LlmCallError) as raised:
        client(server, sleep=sleeps, max_attempts=3).complete(REQUEST)
    assert raised.value.retryable and "gave up after 3 attempts" in raised.value.reason
    assert "HTTP 503" in raised.value.reason and len(server.requests) == 3 and len(sleeps) == 2


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
    [Reply(200, b"this is not json", JSON), Reply(200, b'{"candidates": []}', JSON)],
    ids=["not json", "no candidates"],
)
def test_a_malformed_body_is_a_non_retryable_error(reply):
    with LocalHttpServer(scripted(reply)) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and len(server.requests) == 1


def test_a_huge_body_is_refused():
    with LocalHttpServer(scripted(answer())) as server, pytest.raises(LlmCallError) as raised:
        client(server, max_response_bytes=64).complete(REQUEST)
    assert not raised.value.retryable and "refused" in raised.value.reason


def test_function_calls_are_tool_calls_and_the_conversation_is_translated():
    reply = answer(
        {"functionCall": {"name": "kb_search", "args": {"q": "refund"}, "id": "fc_1"}},
        {"functionCall": {"name": "kb_search", "args": {"q": "fee"}}},
    )
    conversation = (
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        assistant_message("Looking.", (ToolCall("c0", "kb_search", {"q": "x"}),)),
        tool_message("c0", "nothing"),
    )
    with LocalHttpServer(scripted(reply)) as server:
        response = client(server).complete(LlmRequest("gemini-test", conversation, {}, (SEARCH,)))
    assert response.tool_calls == (
        ToolCall("fc_1", "kb_search", {"q": "refund"}),
        ToolCall("call_1", "kb_search", {"q": "fee"}),
    )
    body = json.loads(server.requests[0].body)
    assert body["systemInstruction"]["parts"] == [{"text": "Be brief."}]
    (declared,) = body["tools"][0]["functionDeclarations"]
    assert declared["name"] == "kb_search" and declared["description"] == "Searches."
    # The SDK writes this field by its proto name, which the API's JSON mapping accepts.
    assert declared["parameters_json_schema"] == dict(SEARCH.parameters)
    assert body["contents"] == [
        {"role": "user", "parts": [{"text": "hi"}]},
        {
            "role": "model",
            "parts": [
                {"text": "Looking."},
                {"functionCall": {"args": {"q": "x"}, "id": "c0", "name": "kb_search"}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {
                    "functionResponse": {
                        "id": "c0",
                        "name": "kb_search",
                        "response": {"result": "nothing"},
                    }
                }
            ],
        },
    ]
