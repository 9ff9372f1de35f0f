"""An LlmClient for Anthropic's Messages API, on the official `anthropic` package (the
`beam-agents[anthropic]` extra).

Retries, deadlines, the response size cap and typed errors are
`beam_agents.integrations.llm.resilience`'s, shared with the other providers; the SDK's own retries
are off.

Conversations are in the one format of `beam_agents.runtime.tool_calling` (OpenAI's) and are
translated: system messages become the `system` parameter; an assistant message's text and
tool calls become `text` and `tool_use` blocks; each tool message becomes a `tool_result` block
of a user message, and consecutive messages of one role are merged, as the API wants roles to
alternate. `LlmRequest.tools` go out as tools with their `input_schema`; the answer's
`tool_use` blocks come back as `LlmResponse.tool_calls` (inputs a tool intent cannot carry are
a non-retryable error naming the call) and its text blocks, joined, as the text.
`max_tokens`, which the API requires, is `max_tokens` of the request's params, else the
client's.
"""

from __future__ import annotations

import json
import os

from beam_agents.errors import LlmCallError
from beam_agents.integrations.llm.resilience import (
    Failure,
    ResilientClient,
    billed,
    checked_arguments,
    connection_failure,
    reading_billed,
    status_failure,
)
from beam_agents.runtime.context import LlmRequest, LlmResponse
from beam_agents.runtime.tool_calling import ToolCall

__all__ = ["AnthropicClient"]


class AnthropicClient(ResilientClient):
    """`complete(request)` through POST {base_url}/v1/messages. `api_key` defaults to
    $ANTHROPIC_API_KEY; `max_tokens` is the default answer length. The other options are
    `ResilientClient`'s."""

    _http_family = ("httpx2", "httpcore2")

    def __init__(self, *, max_tokens: int = 4096, **options) -> None:
        super().__init__(**options)
        self.max_tokens = max_tokens

    def _make_sdk(self, http):
        import anthropic  # the optional extra, imported where the client is used

        return anthropic.Anthropic(
            base_url=self.base_url,
            api_key=self._api_key or os.environ.get("ANTHROPIC_API_KEY") or "unset",
            timeout=self.timeout_s,
            max_retries=0,
            http_client=http,
        )

    def _send(self, sdk, request: LlmRequest) -> LlmResponse:
        system, messages = _messages(request.messages)
        params = {"max_tokens": self.max_tokens, **dict(request.params)}
        if system:
            params["system"] = system
        if request.tools:
            params["tools"] = [
                {"description": t.description, "input_schema": dict(t.parameters), "name": t.name}
                for t in request.tools
            ]
        message = sdk.messages.create(model=request.model, messages=messages, **params)
        return _response(message, request.model)

    def _failure(self, error: Exception) -> Failure | None:
        import anthropic

        if isinstance(error, anthropic.APIConnectionError):
            return connection_failure(error)
        if isinstance(error, anthropic.APIStatusError):
            return status_failure(error.status_code, error.message, error.response.headers)
        if isinstance(error, anthropic.APIResponseValidationError):
            return Failure(f"the response is not a message: {error}", retryable=False)
        return None


def _messages(conversation) -> tuple[str, list[dict]]:
    """(system, messages) of the Messages API for a conversation in the neutral format."""
    system, messages = [], []
    for message in conversation:
        role = message.get("role")
        if role == "system":
            system.append(str(message.get("content") or ""))
            continue
        if role == "tool":
            role, blocks = (
                "user",
                [
                    {
                        "content": str(message.get("content") or ""),
                        "tool_use_id": message["tool_call_id"],
                        "type": "tool_result",
                    }
                ],
            )
        elif role == "assistant":
            blocks = (
                [{"text": message["content"], "type": "text"}] if message.get("content") else []
            )
            for call in message.get("tool_calls") or ():
                function = call["function"]
                blocks.append(
                    {
                        "id": call["id"],
                        "input": json.loads(function.get("arguments") or "{}"),
                        "name": function["name"],
                        "type": "tool_use",
                    }
                )
        else:
            content = message.get("content")
            blocks = [{"text": content, "type": "text"}] if isinstance(content, str) else content
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"content": list(blocks), "role": role})
    return "\n\n".join(system), messages


def _response(message, model: str) -> LlmResponse:
    usage = getattr(message, "usage", None)
    paid = billed(getattr(usage, "input_tokens", 0) or 0, getattr(usage, "output_tokens", 0) or 0)
    with reading_billed(model, paid):
        return _read(message, model, usage, paid)


def _read(message, model: str, usage, paid: dict) -> LlmResponse:
    if not isinstance(message.content, list):
        # An empty list is an answer (no text, no call); none at all is not.
        raise LlmCallError(
            f"the message has no content list (content is {message.content!r})",
            model=model,
            retryable=False,
            **paid,
        )
    texts, calls = [], []
    for block in message.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            arguments = checked_arguments(block.input, f"{block.name}({block.id})", model, paid)
            calls.append(ToolCall(block.id, block.name, arguments))
    return LlmResponse(
        text="".join(texts),
        model=message.model or model,
        input_tokens=getattr(usage, "input_tokens", 0) or 0,
        output_tokens=getattr(usage, "output_tokens", 0) or 0,
        finish_reason=message.stop_reason or "",
        tool_calls=tuple(calls),
    )
