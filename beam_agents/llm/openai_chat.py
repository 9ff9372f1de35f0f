"""An LlmClient for any OpenAI-compatible chat completions endpoint, on the official `openai`
package (the `beam-agents[openai]` extra): OpenAI itself, or vLLM, Ollama and llama.cpp's server
through `base_url`.

Failures are typed. LlmCallError.retryable is True for what may pass (429, 408, 409, 5xx,
timeouts, connection errors) and False for what will not (other 4xx, a body that is not a chat
completion). Retryable failures are retried here, `max_attempts` in all, sleeping as the
server's Retry-After (or retry-after-ms) says, else with exponential backoff and full jitter;
the SDK's own retries are off so that this policy is the only one. Token usage comes back in the
LlmResponse, and from there into the LLM_CALL trace event.

The runtime calls `complete` only on a replay-cache miss: a resumed or replayed activation gets
its earlier answers from the key's cache and pays for nothing twice. The client is picklable
(Beam ships it to workers inside the DoFn); its HTTP connection is made on the worker, at first
use.
"""

from __future__ import annotations

import email.utils
import os
import random
import time
from collections.abc import Callable

from beam_agents.errors import LlmCallError
from beam_agents.runtime.context import LlmRequest, LlmResponse

__all__ = ["OpenAIChatClient"]

_RETRYABLE_STATUS = frozenset({408, 409, 429})


class OpenAIChatClient:
    """`complete(request)` through POST {base_url}/chat/completions.

    `api_key` defaults to $OPENAI_API_KEY; local servers that want none get a placeholder.
    `timeout_s` bounds each attempt; `max_backoff_s` caps any one wait, Retry-After included.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout_s: float = 60.0,
        max_attempts: int = 4,
        initial_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {max_attempts}")
        self.base_url = base_url
        self._api_key = api_key
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self._sleep = sleep
        self._client = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_client"] = None  # an HTTP client does not travel; the worker makes its own
        return state

    def __repr__(self) -> str:  # never print the key
        return f"OpenAIChatClient(base_url={self.base_url!r}, timeout_s={self.timeout_s})"

    def _openai(self):
        if self._client is None:
            import openai  # the optional extra, imported where the client is used

            key = self._api_key or os.environ.get("OPENAI_API_KEY") or "unused-by-local-servers"
            self._client = openai.OpenAI(
                base_url=self.base_url, api_key=key, timeout=self.timeout_s, max_retries=0
            )
        return self._client

    def complete(self, request: LlmRequest) -> LlmResponse:
        import openai

        for attempt in range(1, self.max_attempts + 1):
            try:
                completion = self._openai().chat.completions.create(
                    model=request.model,
                    messages=[dict(m) for m in request.messages],
                    **dict(request.params),
                )
                return _response(completion, request.model)
            except openai.APIStatusError as e:
                retryable = e.status_code in _RETRYABLE_STATUS or e.status_code >= 500
                error = LlmCallError(
                    f"HTTP {e.status_code}: {_short(e.message)}",
                    model=request.model,
                    retryable=retryable,
                )
                wait = _retry_after(e.response.headers)
            except (openai.APITimeoutError, openai.APIConnectionError) as e:
                error = LlmCallError(
                    f"{type(e).__name__}: {_short(str(e))}", model=request.model, retryable=True
                )
                wait = None
            except (openai.APIResponseValidationError, ValueError, TypeError, KeyError) as e:
                raise LlmCallError(
                    f"the response is not a chat completion: {_short(str(e))}",
                    model=request.model,
                    retryable=False,
                ) from e
            if not error.retryable:
                raise error
            if attempt == self.max_attempts:
                raise LlmCallError(
                    f"gave up after {attempt} attempts; last: {error.reason}",
                    model=request.model,
                    retryable=True,
                ) from error
            backoff = random.uniform(0, self.initial_backoff_s * 2 ** (attempt - 1))
            self._sleep(min(self.max_backoff_s, backoff if wait is None else wait))
        raise AssertionError("unreachable: every attempt returns or raises")


def _response(completion, model: str) -> LlmResponse:
    if not getattr(completion, "choices", None):
        raise ValueError(f"no choices in {type(completion).__name__}")
    choice = completion.choices[0]
    usage = getattr(completion, "usage", None)
    return LlmResponse(
        text=choice.message.content or "",
        model=completion.model or model,
        input_tokens=getattr(usage, "prompt_tokens", 0) or 0,
        output_tokens=getattr(usage, "completion_tokens", 0) or 0,
        finish_reason=choice.finish_reason or "",
    )


def _retry_after(headers) -> float | None:
    """Seconds the server asked to wait (retry-after-ms, or Retry-After as seconds or an
    HTTP date), or None."""
    milliseconds = headers.get("retry-after-ms")
    if milliseconds:
        try:
            return max(0.0, float(milliseconds) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."
