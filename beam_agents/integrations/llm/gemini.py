"""An LlmClient for Gemini's generateContent, on the official `google-genai` package (the
`beam-agents[gemini]` extra).

Retries, deadlines, the response size cap and typed errors are
`beam_agents.integrations.llm.resilience`'s, shared with the other providers; the SDK retries
nothing unless told to, and is not told.

Conversations are in the one format of `beam_agents.runtime.tool_calling` (OpenAI's) and are
translated: system messages become the `system_instruction`; the assistant is the `model`
role, its tool calls `functionCall` parts; each tool message becomes a `functionResponse` part
(`{"result": content}`) of a user turn, named after the call it answers, and consecutive turns
of one role are merged. `LlmRequest.tools` go out as function declarations with their JSON
Schema; the answer's `functionCall` parts come back as `LlmResponse.tool_calls` (a call without
an id gets `call_<n>`, its position in the answer; arguments a tool intent cannot carry are a
non-retryable error naming the call). The request's params are `GenerateContentConfig` fields
(`temperature`, `max_output_tokens`, ...).
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
    reading_billed,
    status_failure,
)
from beam_agents.runtime.context import LlmRequest, LlmResponse
from beam_agents.runtime.tool_calling import ToolCall

__all__ = ["GeminiClient"]


class GeminiClient(ResilientClient):
    """`complete(request)` through POST {base_url}/v1beta/models/{model}:generateContent.
    `api_key` defaults to $GEMINI_API_KEY (then $GOOGLE_API_KEY). The other options are
    `ResilientClient`'s."""

    def _make_sdk(self, http):
        from google import genai  # the optional extra, imported where the client is used

        key = (
            self._api_key
            or os.environ.get("GEMINI_API_KEY")
            or os.environ.get("GOOGLE_API_KEY")
            or "unset"
        )
        options = genai.types.HttpOptions(
            base_url=self.base_url, timeout=int(self.timeout_s * 1000), httpx_client=http
        )
        return genai.Client(api_key=key, http_options=options)

    def _send(self, sdk, request: LlmRequest) -> LlmResponse:
        from google.genai import types

        system, contents = _contents(request.messages)
        config = dict(request.params)
        if system:
            config["system_instruction"] = system
        if request.tools:
            declarations = [
                types.FunctionDeclaration(
                    name=t.name,
                    description=t.description,
                    parameters_json_schema=dict(t.parameters),
                )
                for t in request.tools
            ]
            config["tools"] = [types.Tool(function_declarations=declarations)]
        answer = sdk.models.generate_content(
            model=request.model,
            contents=contents,
            config=types.GenerateContentConfig(**config),
        )
        return _response(answer, request.model)

    def _failure(self, error: Exception) -> Failure | None:
        from google.genai import errors

        if isinstance(error, errors.APIError):
            headers = getattr(getattr(error, "response", None), "headers", None) or {}
            return status_failure(error.code, error.message or str(error), headers)
        return None


def _contents(conversation) -> tuple[str, list[dict]]:
    """(system instruction, contents) of generateContent for a neutral conversation."""
    system, contents, names = [], [], {}
    for message in conversation:
        role = message.get("role")
        if role == "system":
            system.append(str(message.get("content") or ""))
            continue
        if role == "tool":
            call_id = message["tool_call_id"]
            role, parts = (
                "user",
                [
                    {
                        "function_response": {
                            "id": call_id,
                            "name": names.get(call_id, ""),
                            "response": {"result": str(message.get("content") or "")},
                        }
                    }
                ],
            )
        elif role == "assistant":
            role = "model"
            parts = [{"text": message["content"]}] if message.get("content") else []
            for call in message.get("tool_calls") or ():
                function = call["function"]
                names[call["id"]] = function["name"]
                arguments = json.loads(function.get("arguments") or "{}")
                parts.append(
                    {
                        "function_call": {
                            "args": arguments,
                            "id": call["id"],
                            "name": function["name"],
                        }
                    }
                )
        else:
            parts = [{"text": str(message.get("content") or "")}]
        if contents and contents[-1]["role"] == role:
            contents[-1]["parts"].extend(parts)
        else:
            contents.append({"parts": list(parts), "role": role})
    return "\n\n".join(system), contents


def _response(answer, model: str) -> LlmResponse:
    usage = getattr(answer, "usage_metadata", None)
    paid = billed(
        getattr(usage, "prompt_token_count", 0) or 0,
        getattr(usage, "candidates_token_count", 0) or 0,
    )
    with reading_billed(model, paid):
        return _read(answer, model, usage, paid)


def _read(answer, model: str, usage, paid: dict) -> LlmResponse:
    if not answer.candidates:
        # A prompt the safety filters blocked: no candidate, its input tokens billed.
        raise LlmCallError(
            f"the answer has no candidates{_blocked(answer.prompt_feedback)}",
            model=model,
            retryable=False,
            **paid,
        )
    candidate = answer.candidates[0]
    texts, calls = [], []
    parts = candidate.content.parts if candidate.content is not None else None
    for index, part in enumerate(parts or ()):
        if part.function_call is not None:
            call = part.function_call
            call_id = call.id or f"call_{index}"
            arguments = checked_arguments(call.args or {}, f"{call.name}({call_id})", model, paid)
            calls.append(ToolCall(call_id, call.name, arguments))
        elif part.text:
            texts.append(part.text)
    reason = candidate.finish_reason
    return LlmResponse(
        text="".join(texts),
        model=answer.model_version or model,
        input_tokens=getattr(usage, "prompt_token_count", 0) or 0,
        output_tokens=getattr(usage, "candidates_token_count", 0) or 0,
        finish_reason=getattr(reason, "value", reason) or "",
        tool_calls=tuple(calls),
    )


def _blocked(feedback) -> str:
    """Why the prompt was blocked, as the answer's promptFeedback says, or nothing."""
    reason = getattr(feedback, "block_reason", None)
    if not reason:
        return ""
    said = getattr(reason, "value", reason)
    message = getattr(feedback, "block_reason_message", None)
    if message:
        said = f"{said}: {message}"
    return f": the prompt was blocked ({said})"
