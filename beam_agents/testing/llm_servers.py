"""What the model providers' HTTP APIs answer, as replies for a LocalHttpServer: a message or
an error of Anthropic's Messages API and of Gemini's generateContent, and for each provider
what the shared resilience tests need (`PROVIDERS`)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from beam_agents.integrations.llm.anthropic_messages import AnthropicClient
from beam_agents.integrations.llm.gemini import GeminiClient
from beam_agents.runtime import LlmRequest
from beam_agents.testing.local_http import JSON, Reply
from beam_agents.testing.machine_harness import T0, Harness, event, summarise_event

__all__ = [
    "PROVIDERS",
    "Provider",
    "anthropic_error",
    "anthropic_message",
    "gemini_answer",
    "gemini_error",
    "usage_after_one_call",
]


def anthropic_message(*content, stop_reason="end_turn") -> Reply:
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


def anthropic_error(status: int, **headers) -> Reply:
    body = {"type": "error", "error": {"type": "x", "message": f"status {status}"}}
    return Reply(status, json.dumps(body).encode(), {**JSON, **headers})


def gemini_answer(*parts, finish="STOP") -> Reply:
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


def gemini_error(status: int, **headers) -> Reply:
    body = {"error": {"code": status, "message": f"status {status}", "status": "X"}}
    return Reply(status, json.dumps(body).encode(), {**JSON, **headers})


def usage_after_one_call(client) -> tuple[list[str], tuple[int, int]]:
    """(the dead letters' reasons, the key's input and output tokens) after one event whose
    agent asks `client` once: what the key's meter counted of the answer."""
    h = Harness(summarise_event, llm=client)
    h.send(event(T0, b"hi"))
    cache = h.states[2].value
    usage = (0, 0) if cache is None else (cache.input_tokens, cache.output_tokens)
    return [e.reason for e in h.values("errors")], usage


@dataclasses.dataclass(frozen=True)
class Provider:
    """One provider's client and replies, for tests every client must pass alike."""

    name: str
    #: client(server, **options): the provider's client pointed at a LocalHttpServer.
    client: Callable
    request: LlmRequest
    ok: Callable[[], Reply]
    error: Callable[..., Reply]
    #: The status its servers send when overloaded.
    overloaded: int
    #: A 200 whose JSON carries no answer.
    empty: bytes

    def __str__(self) -> str:
        return self.name


PROVIDERS = [
    Provider(
        "anthropic",
        lambda server, **options: AnthropicClient(
            base_url=server.url, api_key="sk-ant-test", **options
        ),
        LlmRequest("claude-test", ({"role": "user", "content": "hi"},), {"stop_sequences": ["."]}),
        anthropic_message,
        anthropic_error,
        529,
        b'{"type": "message"}',
    ),
    Provider(
        "gemini",
        lambda server, **options: GeminiClient(base_url=server.url, api_key="g-test", **options),
        LlmRequest("gemini-test", ({"role": "user", "content": "hi"},), {"temperature": 0}),
        gemini_answer,
        gemini_error,
        503,
        b'{"candidates": []}',
    ),
]
