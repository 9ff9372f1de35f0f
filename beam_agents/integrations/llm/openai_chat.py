"""An LlmClient for any OpenAI-compatible chat completions endpoint, on the official `openai`
package (the `beam-agents[openai]` extra): OpenAI itself, or vLLM, Ollama and llama.cpp's server
through `base_url`.

Retries, deadlines, the response size cap and typed errors are
`beam_agents.integrations.llm.resilience`'s, shared with the other providers; the SDK's own retries
are off. Token usage comes back in the LlmResponse, and from there into the LLM_CALL trace event.

Tool calling: `LlmRequest.tools` go out as OpenAI `tools` (functions); the message's
`tool_calls` come back as `LlmResponse.tool_calls` (a call without an id gets `call_<n>`, its
position in the answer), their JSON-text arguments parsed under the
I-JSON rules of tool intents (arguments that are no such object are a non-retryable error
naming the call). Conversations already use OpenAI's format (`beam_agents.runtime.tool_calling`),
so messages go out unchanged. A legacy `function_call` answer is refused, naming it.

The runtime calls `complete` only on a replay-cache miss: a resumed or replayed activation gets
its earlier answers from the key's cache and pays for nothing twice.
"""

from __future__ import annotations

import os

from beam_agents.errors import CanonicalJsonError, LlmCallError, with_article
from beam_agents.integrations.llm.resilience import (
    Failure,
    ResilientClient,
    billed,
    connection_failure,
    reading_billed,
    status_failure,
)
from beam_agents.intents.identity import parse_args_json
from beam_agents.runtime.context import LlmRequest, LlmResponse
from beam_agents.runtime.tool_calling import ToolCall

__all__ = ["OpenAIChatClient"]


class OpenAIChatClient(ResilientClient):
    """`complete(request)` through POST {base_url}/chat/completions. `api_key` defaults to
    $OPENAI_API_KEY; local servers that want none get a placeholder. The other options are
    `ResilientClient`'s."""

    def _make_sdk(self, http):
        import openai  # the optional extra, imported where the client is used

        key = self._api_key or os.environ.get("OPENAI_API_KEY") or "unused-by-local-servers"
        return openai.OpenAI(
            base_url=self.base_url,
            api_key=key,
            timeout=self.timeout_s,
            max_retries=0,
            http_client=http,
        )

    def _send(self, sdk, request: LlmRequest) -> LlmResponse:
        tools = [{"function": t.to_json(), "type": "function"} for t in request.tools]
        completion = sdk.chat.completions.create(
            model=request.model,
            messages=[dict(m) for m in request.messages],
            **({"tools": tools} if tools else {}),
            **dict(request.params),
        )
        return _response(completion, request.model)

    def _failure(self, error: Exception) -> Failure | None:
        import openai

        if isinstance(error, openai.APIConnectionError):
            return connection_failure(error)
        if isinstance(error, openai.APIStatusError):
            return status_failure(error.status_code, error.message, error.response.headers)
        if isinstance(error, openai.APIResponseValidationError):
            return Failure(f"the response is not a chat completion: {error}", retryable=False)
        return None


def _response(completion, model: str) -> LlmResponse:
    usage = getattr(completion, "usage", None)
    paid = billed(
        getattr(usage, "prompt_tokens", 0) or 0, getattr(usage, "completion_tokens", 0) or 0
    )
    with reading_billed(model, paid):
        return _read(completion, model, usage, paid)


def _read(completion, model: str, usage, paid: dict) -> LlmResponse:
    if not getattr(completion, "choices", None):
        # A content filter's answer (Azure's prompt filter), or a server's empty one.
        raise LlmCallError(
            f"the answer has no choices ({type(completion).__name__})",
            model=model,
            retryable=False,
            **paid,
        )
    choice = completion.choices[0]
    function_call = getattr(choice.message, "function_call", None)
    if function_call is not None:
        raise LlmCallError(
            f"the model answered with a legacy function_call ({function_call.name}): "
            "ask with tools instead; it is not dropped silently",
            model=model,
            retryable=False,
            **paid,
        )
    calls = []
    for index, call in enumerate(getattr(choice.message, "tool_calls", None) or []):
        function = getattr(call, "function", None)
        if function is None:
            raise LlmCallError(
                f"the model asked for {with_article(call.type)} tool call ({call.id}), "
                "not a function",
                model=model,
                retryable=False,
                **paid,
            )
        try:
            arguments = parse_args_json(function.arguments)
        except CanonicalJsonError as e:
            raise LlmCallError(
                f"the arguments of tool call {function.name}({call.id}) are no JSON object "
                f"a tool intent can carry: {e}",
                model=model,
                retryable=False,
                **paid,
            ) from e
        # Some OpenAI-compatible servers send none; the position names it, as for Gemini.
        call_id = f"call_{index}" if call.id is None or call.id == "" else call.id
        calls.append(ToolCall(call_id, function.name, arguments))
    return LlmResponse(
        text=choice.message.content or "",
        model=completion.model or model,
        input_tokens=getattr(usage, "prompt_tokens", 0) or 0,
        output_tokens=getattr(usage, "completion_tokens", 0) or 0,
        finish_reason=choice.finish_reason or "",
        tool_calls=tuple(calls),
    )
