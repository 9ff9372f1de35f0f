"""What every SDK client gets from `resilience` (the Anthropic and Gemini clients), against a
real HTTP server on 127.0.0.1 speaking each provider's API: retries after the server's
Retry-After, a bounded number of attempts, no retry of a client error, a deadline per attempt,
malformed and oversized bodies refused."""

from __future__ import annotations

import json
import time

import pytest

from beam_agents.errors import LlmCallError
from beam_agents.testing.llm_servers import PROVIDERS
from beam_agents.testing.local_http import JSON, LocalHttpServer, Reply, Sleeps, scripted

pytestmark = pytest.mark.parametrize("provider", PROVIDERS, ids=str)


def test_a_429_is_retried_after_the_servers_retry_after(provider):
    sleeps = Sleeps()
    replies = scripted(provider.error(429, **{"retry-after": "2"}), provider.ok())
    with LocalHttpServer(replies) as server:
        response = provider.client(server, sleep=sleeps).complete(provider.request)
    assert response.text == "hello" and len(server.requests) == 2 and sleeps == [2.0]


def test_a_5xx_storm_exhausts_the_attempts_with_a_retryable_error(provider):
    sleeps = Sleeps()
    storm = scripted(provider.error(provider.overloaded))
    with LocalHttpServer(storm) as server, pytest.raises(LlmCallError) as raised:
        provider.client(server, sleep=sleeps, max_attempts=3).complete(provider.request)
    assert raised.value.retryable and "gave up after 3 attempts" in raised.value.reason
    assert f"HTTP {provider.overloaded}" in raised.value.reason
    assert len(server.requests) == 3 and len(sleeps) == 2


def test_a_client_error_is_not_retried(provider):
    refused = scripted(provider.error(400))
    with LocalHttpServer(refused) as server, pytest.raises(LlmCallError) as raised:
        provider.client(server).complete(provider.request)
    assert not raised.value.retryable and len(server.requests) == 1


def test_a_timeout_is_a_retryable_error_within_the_attempts_deadline(provider):
    with LocalHttpServer(lambda request: Reply(200, b"{}", JSON, delay_s=2)) as server:
        started = time.monotonic()
        with pytest.raises(LlmCallError) as raised:
            provider.client(server, timeout_s=0.3, max_attempts=1).complete(provider.request)
    assert raised.value.retryable and "Timeout" in raised.value.reason
    assert time.monotonic() - started < 2  # before the server's reply, 2 s late


DEEP = b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}"  # 10 KB past the parser's recursion


@pytest.mark.parametrize(
    "body", [b"this is not json", None, DEEP], ids=["not json", "no answer", "nested too deep"]
)
def test_a_malformed_body_is_a_non_retryable_error(provider, body):
    malformed = scripted(Reply(200, provider.empty if body is None else body, JSON))
    with LocalHttpServer(malformed) as server, pytest.raises(LlmCallError) as raised:
        provider.client(server).complete(provider.request)
    assert not raised.value.retryable and len(server.requests) == 1


def test_a_huge_body_is_refused(provider):
    with LocalHttpServer(scripted(provider.ok())) as server, pytest.raises(LlmCallError) as raised:
        provider.client(server, max_response_bytes=64).complete(provider.request)
    assert not raised.value.retryable and "refused" in raised.value.reason


# Where each provider's answer says how many input tokens it read.
_INPUT_TOKENS = {
    "anthropic": ("usage", "input_tokens"),
    "gemini": ("usageMetadata", "promptTokenCount"),
}


def test_a_negative_token_count_is_a_non_retryable_error(provider):
    """It would give the key its budget back."""
    body = json.loads(provider.ok().body)
    usage, field = _INPUT_TOKENS[provider.name]
    body[usage][field] = -1_000_000
    answer = scripted(Reply(200, json.dumps(body).encode(), JSON))
    with LocalHttpServer(answer) as server, pytest.raises(LlmCallError) as raised:
        provider.client(server).complete(provider.request)
    assert not raised.value.retryable and "input_tokens" in raised.value.reason
