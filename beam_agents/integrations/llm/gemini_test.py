"""The Gemini client against a real HTTP server on 127.0.0.1 that speaks generateContent."""

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
from beam_agents.testing.llm_servers import PROVIDERS, gemini_answer, usage_after_one_call
from beam_agents.testing.local_http import JSON, LocalHttpServer, Reply, Sleeps, scripted

REQUEST = PROVIDERS[1].request
SEARCH = ToolDefinition(
    "kb_search", "Searches.", {"type": "object", "properties": {"q": {"type": "string"}}}
)


answer = gemini_answer
client = PROVIDERS[1].client


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


def test_arguments_a_tool_intent_cannot_carry_are_an_error_naming_the_call_and_its_usage():
    reply = answer({"functionCall": {"name": "kb_search", "args": {"n": 2**60}, "id": "fc_9"}})
    with LocalHttpServer(scripted(reply)) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and "kb_search(fc_9)" in raised.value.reason
    # The answer was billed all the same: the error says for how much.
    assert (raised.value.input_tokens, raised.value.output_tokens) == (7, 2)


@pytest.mark.parametrize("message", [5, [0] * 400], ids=["a number", "a long list"])
def test_an_error_whose_message_is_no_string_is_still_a_typed_error(message):
    """The SDK takes the error's message from the body as it is: a 429 saying so must still
    be a retryable LlmCallError, not a TypeError out of the client."""
    body = {"error": {"code": 429, "message": message, "status": "RESOURCE_EXHAUSTED"}}
    busy = Reply(429, json.dumps(body).encode(), JSON)
    with LocalHttpServer(scripted(busy)) as server, pytest.raises(LlmCallError) as raised:
        client(server, max_attempts=2, sleep=Sleeps()).complete(REQUEST)
    assert raised.value.retryable and "HTTP 429" in raised.value.reason
    assert len(server.requests) == 2


def _blocked() -> Reply:
    """generateContent's answer to a prompt its safety filters blocked: no candidates, the
    prompt's tokens billed."""
    body = {
        "promptFeedback": {
            "blockReason": "SAFETY",
            "safetyRatings": [{"category": "HARM_CATEGORY_HARASSMENT", "probability": "HIGH"}],
        },
        "usageMetadata": {"promptTokenCount": 7, "totalTokenCount": 7},
        "modelVersion": "gemini-served",
    }
    return Reply(200, json.dumps(body).encode(), JSON)


def test_a_blocked_prompt_is_a_refusal_that_carries_the_tokens_it_was_billed_for():
    with LocalHttpServer(scripted(_blocked())) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and len(server.requests) == 1
    assert "no candidates" in raised.value.reason and "SAFETY" in raised.value.reason
    assert (raised.value.input_tokens, raised.value.output_tokens) == (7, 0)


def test_a_blocked_prompt_counts_in_the_keys_usage():
    with LocalHttpServer(scripted(_blocked())) as server:
        assert usage_after_one_call(client(server)) == (["llm_failed"], (7, 0))
