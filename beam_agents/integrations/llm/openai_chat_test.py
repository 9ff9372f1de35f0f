"""The OpenAI-compatible client against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import pickle
import time
import traceback

import pytest

from beam_agents._protos import AgentEnvelope
from beam_agents.errors import LlmCallError
from beam_agents.integrations.llm.openai_chat import OpenAIChatClient
from beam_agents.intents.identity import intent_id
from beam_agents.ops.rounds import Advance, run_round
from beam_agents.runtime import LlmRequest, RunAgent, RuntimeConfig, agent
from beam_agents.runtime.tool_calling import (
    ToolCall,
    ToolDefinition,
    assistant_message,
    tool_message,
)
from beam_agents.testing.llm_servers import usage_after_one_call
from beam_agents.testing.local_http import LocalHttpServer, Reply, Sleeps, scripted

REQUEST = LlmRequest("local-model", ({"role": "user", "content": "hi"},), {"temperature": 0})


def completion(text="hello", prompt_tokens=7, completion_tokens=2) -> Reply:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "served-model",
        "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }
    return Reply(200, json.dumps(body).encode(), {"content-type": "application/json"})


def error(status: int, **headers) -> Reply:
    body = json.dumps({"error": {"message": f"status {status}", "type": "x"}}).encode()
    return Reply(status, body, {"content-type": "application/json", **headers})


def client(server, **options) -> OpenAIChatClient:
    return OpenAIChatClient(base_url=f"{server.url}/v1", **options)


def test_a_completion_comes_back_with_its_token_usage():
    with LocalHttpServer(scripted(completion())) as server:
        response = client(server).complete(REQUEST)
    assert (response.text, response.model, response.finish_reason) == (
        "hello",
        "served-model",
        "stop",
    )
    assert (response.input_tokens, response.output_tokens) == (7, 2)
    (sent,) = server.requests
    assert (sent.method, sent.path) == ("POST", "/v1/chat/completions")
    body = json.loads(sent.body)
    assert body["model"] == "local-model" and body["temperature"] == 0
    assert body["messages"] == [{"role": "user", "content": "hi"}]


def test_a_429_is_retried_after_the_servers_retry_after():
    sleeps = Sleeps()
    with LocalHttpServer(scripted(error(429, **{"retry-after": "2"}), completion())) as server:
        response = client(server, sleep=sleeps).complete(REQUEST)
    assert response.text == "hello" and len(server.requests) == 2
    assert sleeps == [2.0]


def test_retry_after_ms_and_http_dates_are_honoured_and_capped():
    sleeps = Sleeps()
    replies = scripted(
        error(503, **{"retry-after-ms": "250"}),
        error(429, **{"retry-after": "Fri, 31 Dec 2100 23:59:59 GMT"}),
        completion(),
    )
    with LocalHttpServer(replies) as server:
        client(server, sleep=sleeps, max_backoff_s=5).complete(REQUEST)
    assert sleeps == [0.25, 5]


def test_a_500_storm_exhausts_the_attempts_with_backoff_and_a_retryable_error():
    sleeps = Sleeps()
    with LocalHttpServer(scripted(error(500))) as server, pytest.raises(LlmCallError) as raised:
        client(server, sleep=sleeps, max_attempts=3, initial_backoff_s=1).complete(REQUEST)
    assert raised.value.retryable and "gave up after 3 attempts" in raised.value.reason
    assert len(server.requests) == 3
    assert len(sleeps) == 2 and 0 <= sleeps[0] <= 1 and 0 <= sleeps[1] <= 2


def test_a_timeout_is_a_retryable_error():
    with LocalHttpServer(lambda request: Reply(200, b"{}", delay_s=2)) as server:
        started = time.monotonic()
        with pytest.raises(LlmCallError) as raised:
            client(server, timeout_s=0.3, max_attempts=1).complete(REQUEST)
    assert raised.value.retryable and "Timeout" in raised.value.reason
    assert time.monotonic() - started < 2  # before the server's reply, 2 s late


@pytest.mark.parametrize(
    "reply",
    [
        Reply(200, b"this is not json", {"content-type": "application/json"}),
        Reply(
            200,
            b'{"object": "chat.completion", "choices": []}',
            {"content-type": "application/json"},
        ),
    ],
    ids=["not json", "no choices"],
)
def test_a_malformed_body_is_a_non_retryable_error(reply):
    with LocalHttpServer(scripted(reply)) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and len(server.requests) == 1


@pytest.mark.parametrize("status", [400, 401, 404])
def test_client_errors_are_not_retried(status):
    with LocalHttpServer(scripted(error(status))) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and f"HTTP {status}" in raised.value.reason
    assert len(server.requests) == 1


def test_the_client_pickles_without_its_connection_or_showing_its_key():
    with LocalHttpServer(scripted(completion())) as server:
        original = OpenAIChatClient(base_url=f"{server.url}/v1", api_key="sk-secret")
        original.complete(REQUEST)
        copy = pickle.loads(pickle.dumps(original))
        assert copy.complete(REQUEST).text == "hello"
    assert "sk-secret" not in repr(original)


def _ask_then_look_up(tmp_path, text: str):
    """(the completions, the requests the server saw): an agent asks the model, calls a tool
    with the answer's first 12 characters and is resumed with the tool's answer; the model
    always answers `text`."""

    @agent(name="tests.ask_then_look_up/v1")
    def ask_then_look_up(ctx, event: bytes) -> bytes:
        reply = ctx.llm([{"role": "user", "content": event.decode()}], model="local-model")
        found = ctx.call_tool("kb.search", {"q": reply.text[:12]})
        return reply.text[:12].encode() + b" / " + found.payload

    t0, key = 1_764_460_800_000, b"k-1"
    answer = AgentEnvelope(entity_key=key, event_time_ms=t0 + 10)
    answer.tool_result.intent_id = intent_id(key, t0 * 1000, 0)
    answer.tool_result.payload = b"found"
    with LocalHttpServer(scripted(completion(text))) as server:
        outputs = run_round(
            RunAgent(ask_then_look_up, llm_client=client(server)),
            [
                AgentEnvelope(entity_key=key, event_time_ms=t0, external_event=b"question"),
                Advance(t0 + 1),
                answer,
                Advance(t0 + 20),
            ],
            tmp_path,
        ).before(t0 + 20)
    return outputs.values("completions"), server.requests


def test_a_resumed_agent_replays_its_llm_answer_instead_of_calling_the_server_again(tmp_path):
    completions, requests = _ask_then_look_up(tmp_path, "search terms")
    assert completions == [b"search terms / found"]
    assert len(requests) == 1  # the resume replayed the answer from the key's cache


def _body(reply: Reply) -> bytes:
    return reply.body


def test_a_dripping_server_cannot_stretch_an_attempt_past_its_deadline():
    body = _body(completion())
    drip_s = 8 / len(body)  # the whole body would take 8 s, one byte at a time
    dripping = Reply(
        200,
        headers={"content-type": "application/json"},
        drip_s=drip_s,
        pieces=lambda: (body[i : i + 1] for i in range(len(body))),
    )
    with LocalHttpServer(lambda request: dripping) as server:
        started = time.monotonic()
        with pytest.raises(LlmCallError) as raised:
            client(server, timeout_s=1, max_attempts=1).complete(REQUEST)
        elapsed = time.monotonic() - started
    assert raised.value.retryable and "Timeout" in raised.value.reason
    assert elapsed < 8 / 2
    assert server.sent_bytes[0] < len(body)


def test_the_calls_deadline_bounds_its_retries_and_waits():
    body = _body(completion())
    dripping = Reply(
        200, drip_s=8 / len(body), pieces=lambda: (body[i : i + 1] for i in range(len(body)))
    )
    with LocalHttpServer(lambda request: dripping) as server:
        started = time.monotonic()
        with pytest.raises(LlmCallError) as raised:
            client(
                server, timeout_s=1, total_timeout_s=1.5, max_attempts=5, sleep=Sleeps()
            ).complete(REQUEST)
        elapsed = time.monotonic() - started
    assert raised.value.retryable and "deadline" in raised.value.reason
    # The second attempt had only what was left of the call's 1.5 s; no third started.
    assert len(server.requests) == 2 and elapsed < 8 / 2


HUGE = 50 * 1024 * 1024


def _huge(announced: bool) -> Reply:
    chunk = b" " * 65536
    headers = {"content-type": "application/json"}
    if announced:
        headers["content-length"] = str(HUGE)
    return Reply(200, headers=headers, pieces=lambda: (chunk for _ in range(HUGE // len(chunk))))


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "streamed"])
def test_a_huge_response_is_refused_before_it_is_read_whole(announced):
    with LocalHttpServer(lambda request: _huge(announced)) as server:
        with pytest.raises(LlmCallError) as raised:
            client(server, max_attempts=3).complete(REQUEST)
        # Until the server has noticed the client hung up: its count stops growing.
        seen = -1
        while seen != server.sent_bytes[0]:
            seen = server.sent_bytes[0]
            time.sleep(0.2)
    assert not raised.value.retryable and "refused" in raised.value.reason
    assert len(server.requests) == 1
    # What the server managed to send before the client hung up: socket buffers, no more.
    assert server.sent_bytes[0] < HUGE / 4


def test_a_compressed_response_is_refused():
    gzip = Reply(200, b"\x1f\x8b", {"content-type": "application/json", "content-encoding": "gzip"})
    with LocalHttpServer(scripted(gzip)) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and "gzip" in raised.value.reason
    assert server.requests[0].headers["Accept-Encoding"] == "identity"


def test_a_refused_response_never_reaches_the_replay_cache(tmp_path):
    @agent(name="tests.asks/v1")
    def asks(ctx, event: bytes) -> bytes:
        return ctx.llm([{"role": "user", "content": "hi"}], model="local-model").text.encode()

    t0, key = 1_764_460_800_000, b"k-1"
    export = AgentEnvelope(entity_key=key, event_time_ms=t0 + 2)
    export.export_request.request_id = "after"
    with LocalHttpServer(lambda request: _huge(False)) as server:
        outputs = run_round(
            RunAgent(asks, llm_client=client(server, max_response_bytes=4096)),
            [
                AgentEnvelope(entity_key=key, event_time_ms=t0, external_event=b"q"),
                Advance(t0 + 1),
                export,
                Advance(t0 + 3),
            ],
            tmp_path,
        ).before(t0 + 3)
    (failed,) = outputs.values("errors")
    assert failed.reason == "llm_failed" and "refused" in failed.detail
    (snapshot,) = outputs.values("snapshots")
    assert list(snapshot.llm_cache.entries) == []


def tool_calls_reply(*calls, content=None) -> Reply:
    body = json.loads(_body(completion()))
    body["choices"][0]["message"] = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            for call_id, name, args in calls
        ],
    }
    body["choices"][0]["finish_reason"] = "tool_calls"
    return Reply(200, json.dumps(body).encode(), {"content-type": "application/json"})


SEARCH = ToolDefinition(
    "kb_search", "Searches.", {"type": "object", "properties": {"q": {"type": "string"}}}
)


def test_tools_go_out_as_functions_and_parallel_tool_calls_come_back_in_order():
    reply = tool_calls_reply(
        ("call_1", "kb_search", '{"q": "refund"}'), ("call_2", "kb_search", '{"q":"fee"}')
    )
    conversation = (
        {"role": "user", "content": "hi"},
        assistant_message("", (ToolCall("call_0", "kb_search", {"q": "x"}),)),
        tool_message("call_0", "nothing"),
    )
    with LocalHttpServer(scripted(reply)) as server:
        response = client(server).complete(LlmRequest("local-model", conversation, {}, (SEARCH,)))
    assert response.text == "" and response.finish_reason == "tool_calls"
    assert response.tool_calls == (
        ToolCall("call_1", "kb_search", {"q": "refund"}),
        ToolCall("call_2", "kb_search", {"q": "fee"}),
    )
    body = json.loads(server.requests[0].body)
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "kb_search",
                "description": "Searches.",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
            },
        }
    ]
    assert body["messages"] == [dict(m) for m in conversation]


def test_a_request_without_tools_sends_no_tools_field():
    with LocalHttpServer(scripted(completion())) as server:
        client(server).complete(REQUEST)
    assert "tools" not in json.loads(server.requests[0].body)


@pytest.mark.parametrize("arguments", ['{"q": ', "[1, 2]", '{"n": 12345678901234567890}'])
def test_tool_call_arguments_that_are_no_i_json_object_are_an_error_naming_the_call(arguments):
    reply = tool_calls_reply(("call_9", "kb_search", arguments))
    with LocalHttpServer(scripted(reply)) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and "kb_search(call_9)" in raised.value.reason


def test_a_legacy_function_call_is_refused_naming_it():
    body = json.loads(_body(completion()))
    body["choices"][0]["message"] = {
        "role": "assistant",
        "content": None,
        "function_call": {"name": "kb_search", "arguments": "{}"},
    }
    reply = Reply(200, json.dumps(body).encode(), {"content-type": "application/json"})
    with LocalHttpServer(scripted(reply)) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and "function_call (kb_search)" in raised.value.reason


def test_a_model_busy_past_its_retries_defers_the_activation_until_it_answers(tmp_path):
    """Issue 19 point 5 on a real HTTP server: a 429 for a while is not a dead letter. Each
    activation try makes one request (one attempt per call); the start waits on its timer with
    backoff and completes once the server answers."""

    @agent(name="tests.summarise/v1")
    def summarise(ctx, event: bytes) -> bytes:
        messages = [{"role": "user", "content": event.decode()}]
        return ctx.llm(messages, model="local-model").text.encode()

    t0, key = 1_764_460_800_000, b"k-1"
    busy = [error(429, **{"retry-after": "0"})] * 3
    config = RuntimeConfig(resume_backoff_ms=10, resume_backoff_max_ms=40, llm_concurrency=2)
    with LocalHttpServer(scripted(*busy, completion("answered at last"))) as server:
        outputs = run_round(
            RunAgent(summarise, llm_client=client(server, max_attempts=1), config=config),
            [
                AgentEnvelope(entity_key=key, event_time_ms=t0, external_event=b"question"),
                Advance(t0 + 1),
                Advance(t0 + 1000),
            ],
            tmp_path,
        ).before(t0 + 1000)
    assert outputs.values("errors") == []
    assert outputs.values("completions") == [b"answered at last"]
    assert len(server.requests) == 4


def _two_events_under(budget, reply: Reply, tmp_path, tools=(), fallback: bytes | None = None):
    """(the outputs, the requests the server saw): two events of one key, each asking the
    model once, then an export of the key; the model always answers `reply`. With a
    `fallback`, the agent completes with it when the call raises LlmCallError."""

    @agent(name="tests.summarise/v1")
    def summarise(ctx, event: bytes) -> bytes:
        messages = [{"role": "user", "content": event.decode()}]
        try:
            return ctx.llm(messages, model="local-model", tools=tools).text.encode()
        except LlmCallError:
            if fallback is None:
                raise
            return fallback

    t0, key = 1_764_460_800_000, b"k-1"
    export = AgentEnvelope(entity_key=key, event_time_ms=t0 + 3)
    export.export_request.request_id = "usage"
    with LocalHttpServer(scripted(reply)) as server:
        outputs = run_round(
            RunAgent(summarise, llm_client=client(server), config=RuntimeConfig(budget=budget)),
            [
                AgentEnvelope(entity_key=key, event_time_ms=t0, external_event=b"first"),
                Advance(t0 + 1),
                AgentEnvelope(entity_key=key, event_time_ms=t0 + 2, external_event=b"second"),
                Advance(t0 + 3),
                export,
            ],
            tmp_path,
        )
    return outputs, server.requests


def test_a_keys_budget_counts_the_servers_usage_and_refuses_the_call_past_it(tmp_path):
    """Issue 19 point 3 on a real HTTP server: the usage the server reports is kept for the
    key; the call that would pass the key's limit is not made."""
    from beam_agents.runtime import Budget, Price

    prices = {"local-model": Price(input_per_million=10**6, output_per_million=10**6)}
    budget = Budget(key_tokens=1905, prices=prices)
    outputs, requests = _two_events_under(budget, completion("one", 1500, 400), tmp_path)
    assert outputs.values("completions") == [b"one"]
    (refused,) = outputs.values("errors")
    assert refused.reason == "budget_exceeded" and refused.input.external_event == b"second"
    assert len(requests) == 1
    (snapshot,) = outputs.values("snapshots")
    usage = snapshot.llm_cache
    assert (usage.input_tokens, usage.output_tokens, usage.cost_micros) == (1500, 400, 1900)


def _answer(message, usage) -> Reply:
    body = json.loads(_body(completion()))
    body["choices"][0]["message"], body["usage"] = message, usage
    return Reply(200, json.dumps(body).encode(), {"content-type": "application/json"})


TEXT = {"role": "assistant", "content": "x"}
USAGE = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}


def _call(name, call_id="call_1"):
    function = {"arguments": "{}"} if name is None else {"name": name, "arguments": "{}"}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


@pytest.mark.parametrize(
    "message, usage",
    [
        (TEXT, {"prompt_tokens": -1_000_000, "completion_tokens": 2, "total_tokens": 0}),
        (TEXT, {"prompt_tokens": 7.5, "completion_tokens": 2, "total_tokens": 9}),
        (TEXT, {"prompt_tokens": 7, "completion_tokens": 10**30, "total_tokens": 9}),
        ({"role": "assistant", "content": [{"type": "text", "text": "x"}]}, USAGE),
        (_call(5), USAGE),
        (_call(None), USAGE),
        (_call("kb_search", 5), USAGE),
    ],
    ids=[
        "negative usage",
        "fractional usage",
        "usage past int64",
        "content not a string",
        "tool name not a string",
        "no tool name",
        "call id not a string",
    ],
)
def test_an_answer_whose_fields_have_the_wrong_type_is_a_non_retryable_error(message, usage):
    """What the server says goes into the budget (a negative count would give the key its
    budget back) and the replay cache; it must be what an LlmResponse holds, or refused."""
    answer = scripted(_answer(message, usage))
    with LocalHttpServer(answer) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and len(server.requests) == 1


def test_a_call_without_an_id_gets_its_position_as_gemini_calls_do():
    with LocalHttpServer(scripted(_answer(_call("kb_search", None), USAGE))) as server:
        response = client(server).complete(REQUEST)
    assert response.tool_calls == (ToolCall("call_0", "kb_search", {}),)


def test_a_negative_usage_does_not_give_the_key_its_budget_back(tmp_path):
    from beam_agents.runtime import Budget

    @agent(name="tests.summarise/v1")
    def summarise(ctx, event: bytes) -> bytes:
        messages = [{"role": "user", "content": event.decode()}]
        return ctx.llm(messages, model="local-model").text.encode()

    t0, key = 1_764_460_800_000, b"k-1"
    config = RuntimeConfig(budget=Budget(key_tokens=1000))
    export = AgentEnvelope(entity_key=key, event_time_ms=t0 + 2)
    export.export_request.request_id = "usage"
    refund = _answer(TEXT, {"prompt_tokens": -(10**9), "completion_tokens": 0, "total_tokens": 0})
    with LocalHttpServer(scripted(refund)) as server:
        outputs = run_round(
            RunAgent(summarise, llm_client=client(server), config=config),
            [
                AgentEnvelope(entity_key=key, event_time_ms=t0, external_event=b"first"),
                Advance(t0 + 1),
                export,
            ],
            tmp_path,
        )
    (snapshot,) = outputs.values("snapshots")
    assert snapshot.llm_cache.input_tokens >= 0
    (failed,) = outputs.values("errors")
    assert failed.reason == "llm_failed"


def test_an_answer_the_client_refuses_still_counts_the_tokens_it_was_billed_for(tmp_path):
    """The server did the work and reported it: a key whose every answer is refused (here,
    tool-call arguments that are no object) must not call the model for ever for free."""
    from beam_agents.runtime import Budget

    body = json.loads(_body(tool_calls_reply(("call_1", "kb_search", "[1, 2]"))))
    body["usage"] = {"prompt_tokens": 1500, "completion_tokens": 400, "total_tokens": 1900}
    refused = Reply(200, json.dumps(body).encode(), {"content-type": "application/json"})
    outputs, requests = _two_events_under(Budget(key_tokens=1905), refused, tmp_path, (SEARCH,))
    assert [e.reason for e in outputs.values("errors")] == ["llm_failed", "budget_exceeded"]
    assert len(requests) == 1
    (snapshot,) = outputs.values("snapshots")
    assert (snapshot.llm_cache.input_tokens, snapshot.llm_cache.output_tokens) == (1500, 400)


def test_a_refused_answer_the_agent_gets_over_still_counts_the_tokens_it_was_billed_for(
    tmp_path,
):
    """An agent may catch the error and complete (a fallback text): the tokens were billed
    all the same, and a key answered only so must not call the model for ever for free."""
    from beam_agents.runtime import Budget

    body = json.loads(_body(tool_calls_reply(("call_1", "kb_search", "[1, 2]"))))
    body["usage"] = {"prompt_tokens": 1500, "completion_tokens": 400, "total_tokens": 1900}
    refused = Reply(200, json.dumps(body).encode(), {"content-type": "application/json"})
    outputs, requests = _two_events_under(
        Budget(key_tokens=1905), refused, tmp_path, (SEARCH,), fallback=b"no answer"
    )
    assert outputs.values("completions")[:1] == [b"no answer"]
    (snapshot,) = outputs.values("snapshots")
    assert (snapshot.llm_cache.input_tokens, snapshot.llm_cache.output_tokens) == (1500, 400)
    assert [e.reason for e in outputs.values("errors")] == ["budget_exceeded"]
    assert len(requests) == 1


def test_a_resumed_agent_replays_a_large_answer_instead_of_paying_for_it_again(tmp_path):
    completions, requests = _ask_then_look_up(tmp_path, "x" * (300 * 1024))
    assert completions == [b"x" * 12 + b" / found"]
    assert len(requests) == 1


def test_a_key_read_with_its_line_end_is_a_non_retryable_error_that_does_not_quote_it():
    """The header cannot be sent (h11 refuses the newline), so no attempt can pass: it must
    not look like a connection error to retry for hours; and h11's message quotes the header,
    the key."""
    key = "-".join(("sk", "secret", "1234"))  # not in this source, which a traceback quotes
    with LocalHttpServer(scripted(completion())) as server, pytest.raises(LlmCallError) as raised:
        client(server, api_key=key + "\n", sleep=Sleeps()).complete(REQUEST)
    assert not raised.value.retryable and "not valid HTTP" in raised.value.reason
    assert server.requests == []
    # Nor does its traceback, as a log would show it, down the chain of causes.
    assert key not in "".join(traceback.format_exception(raised.value))


def _no_choices() -> Reply:
    """A completion with no choices (a content filter's, or a server's empty answer), its
    prompt's tokens billed."""
    body = json.loads(_body(completion()))
    body["choices"] = []
    body["usage"] = {"prompt_tokens": 7, "completion_tokens": 0, "total_tokens": 7}
    return Reply(200, json.dumps(body).encode(), {"content-type": "application/json"})


def test_an_answer_with_no_choices_is_a_refusal_that_carries_the_tokens_it_was_billed_for():
    with LocalHttpServer(scripted(_no_choices())) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and len(server.requests) == 1
    assert "no choices" in raised.value.reason
    assert (raised.value.input_tokens, raised.value.output_tokens) == (7, 0)


def test_an_answer_with_no_choices_counts_in_the_keys_usage():
    with LocalHttpServer(scripted(_no_choices())) as server:
        assert usage_after_one_call(client(server)) == (["llm_failed"], (7, 0))


def test_a_choice_with_no_message_is_a_refusal_that_carries_the_tokens_it_was_billed_for():
    no_message = scripted(_answer(None, USAGE))
    with LocalHttpServer(no_message) as server, pytest.raises(LlmCallError) as raised:
        client(server).complete(REQUEST)
    assert not raised.value.retryable and "cannot be read" in raised.value.reason
    assert (raised.value.input_tokens, raised.value.output_tokens) == (7, 2)
