"""An LlmClient for any OpenAI-compatible chat completions endpoint, on the official `openai`
package (the `beam-agents[openai]` extra): OpenAI itself, or vLLM, Ollama and llama.cpp's server
through `base_url`.

Failures are typed. LlmCallError.retryable is True for what may pass (429, 408, 409, 5xx,
timeouts, connection errors) and False for what will not (other 4xx, a body that is not a chat
completion). Retryable failures are retried here, `max_attempts` in all, sleeping as the
server's Retry-After (or retry-after-ms) says, else with exponential backoff and full jitter;
the SDK's own retries are off so that this policy is the only one. Token usage comes back in the
LlmResponse, and from there into the LLM_CALL trace event.

A call has real deadlines, whatever the server does. The SDK's timeout bounds each socket read,
so a server dripping a byte at a time would keep a call alive for ever; here the SDK talks
through an httpx transport of ours whose network streams check a monotonic deadline before
and during every connect, read and write: each attempt ends by `timeout_s` after it starts,
and the whole call, backoff included, by `total_timeout_s`. The same transport bounds the
response: a Content-Length above `max_response_bytes` is refused before the body is read, and
a body that grows past it is refused at that byte (non-retryable), so a huge completion is
never read whole nor reaches the replay cache. It asks for an uncompressed body and refuses a
compressed one, whose decoded size the cap could not bound. HTTP proxies from the environment
are not used (their connections would not carry the deadline).

Tool calling: `LlmRequest.tools` go out as OpenAI `tools` (functions); the message's
`tool_calls` come back as `LlmResponse.tool_calls`, their JSON-text arguments parsed under the
I-JSON rules of tool intents (arguments that are no such object are a non-retryable error
naming the call). Conversations already use OpenAI's format (`beam_agents.runtime.tool_calling`),
so messages go out unchanged. A legacy `function_call` answer is refused, naming it.

The runtime calls `complete` only on a replay-cache miss: a resumed or replayed activation gets
its earlier answers from the key's cache and pays for nothing twice. The client is picklable
(Beam ships it to workers inside the DoFn); its HTTP connection is made on the worker, at first
use.
"""

from __future__ import annotations

import contextvars
import email.utils
import os
import random
import time
from collections.abc import Callable, Iterator

import httpcore
import httpx

from beam_agents.core.intent import parse_args_json
from beam_agents.errors import CanonicalJsonError, LlmCallError
from beam_agents.runtime.context import LlmRequest, LlmResponse
from beam_agents.runtime.tool_calling import ToolCall

__all__ = ["OpenAIChatClient"]

_RETRYABLE_STATUS = frozenset({408, 409, 429})
# When the running attempt must end (time.monotonic()); set by `complete` around each attempt.
_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("llm_attempt_deadline")


class _Refused(Exception):
    """A response this client will not read (too large, compressed): never retried."""


def _remaining(timeout: float | None) -> float:
    """The timeout for one network operation: the SDK's, cut to what the attempt has left."""
    left = _DEADLINE.get(float("inf")) - time.monotonic()
    if left <= 0:
        raise httpcore.ReadTimeout("the attempt's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self._stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, _remaining(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, _remaining(timeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        tls = self._stream.start_tls(ssl_context, server_hostname, _remaining(timeout))
        return _DeadlineStream(tls)

    def get_extra_info(self, info: str):
        return self._stream.get_extra_info(info)


class _DeadlineBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self._backend = httpcore.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        stream = self._backend.connect_tcp(
            host, port, _remaining(timeout), local_address, socket_options
        )
        return _DeadlineStream(stream)

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        stream = self._backend.connect_unix_socket(path, _remaining(timeout), socket_options)
        return _DeadlineStream(stream)

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


class _BoundedTransport(httpx.BaseTransport):
    """Direct HTTP connections whose every network operation keeps the attempt's deadline,
    and whose response bodies stop at `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self._pool = httpcore.ConnectionPool(network_backend=_DeadlineBackend())
        self._max_bytes = max_bytes

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"accept-encoding"]
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=[*headers, (b"Accept-Encoding", b"identity")],
            content=request.stream,
            extensions=request.extensions,
        )
        with _as_httpx(request):
            response = self._pool.handle_request(core)
        found = httpx.Headers(response.headers)
        problem = None
        if found.get("content-encoding", "identity").lower() != "identity":
            problem = f"a {found['content-encoding']} body, whose decoded size cannot be bounded"
        elif int(found.get("content-length") or 0) > self._max_bytes:
            problem = (
                f"{found['content-length']} bytes announced, over the limit of {self._max_bytes}"
            )
        if problem:
            response.close()
            raise _Refused(problem)
        return httpx.Response(
            status_code=response.status,
            headers=response.headers,
            stream=_BoundedBody(response, request, self._max_bytes),
            extensions=response.extensions,
        )

    def close(self) -> None:
        self._pool.close()


class _BoundedBody(httpx.SyncByteStream):
    def __init__(self, response: httpcore.Response, request: httpx.Request, max_bytes: int):
        self._response, self._request, self._max_bytes = response, request, max_bytes

    def __iter__(self) -> Iterator[bytes]:
        received = 0
        with _as_httpx(self._request):
            for chunk in self._response.stream:
                received += len(chunk)
                if received > self._max_bytes:
                    raise _Refused(f"the body passed the limit of {self._max_bytes} bytes")
                yield chunk

    def close(self) -> None:
        self._response.close()


class _as_httpx:
    """httpcore's timeouts and network errors as httpx's, which the SDK knows."""

    def __init__(self, request: httpx.Request) -> None:
        self._request = request

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> None:
        if isinstance(error, httpcore.TimeoutException):
            raise httpx.TimeoutException(str(error), request=self._request) from error
        if isinstance(error, httpcore.NetworkError | httpcore.ProtocolError):
            raise httpx.TransportError(str(error)) from error


class OpenAIChatClient:
    """`complete(request)` through POST {base_url}/chat/completions.

    `api_key` defaults to $OPENAI_API_KEY; local servers that want none get a placeholder.
    `timeout_s` is the deadline of each attempt, `total_timeout_s` (default: `timeout_s` times
    `max_attempts`) of the whole call, waits included; `max_backoff_s` caps any one wait,
    Retry-After included. A response body over `max_response_bytes` is refused unread.
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
        total_timeout_s: float | None = None,
        max_response_bytes: int = 1 << 20,
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
        self.total_timeout_s = (
            timeout_s * max_attempts if total_timeout_s is None else total_timeout_s
        )
        self.max_response_bytes = max_response_bytes
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
            http = httpx.Client(
                transport=_BoundedTransport(self.max_response_bytes),
                trust_env=False,
                timeout=self.timeout_s,
            )
            self._client = openai.OpenAI(
                base_url=self.base_url,
                api_key=key,
                timeout=self.timeout_s,
                max_retries=0,
                http_client=http,
            )
        return self._client

    def complete(self, request: LlmRequest) -> LlmResponse:
        import openai

        call_ends = time.monotonic() + self.total_timeout_s
        for attempt in range(1, self.max_attempts + 1):
            token = _DEADLINE.set(min(time.monotonic() + self.timeout_s, call_ends))
            try:
                tools = [{"function": t.to_json(), "type": "function"} for t in request.tools]
                completion = self._openai().chat.completions.create(
                    model=request.model,
                    messages=[dict(m) for m in request.messages],
                    **({"tools": tools} if tools else {}),
                    **dict(request.params),
                )
                return _response(completion, request.model)
            except (_Refused, openai.APIConnectionError) as e:
                refused = _refusal(e)
                if refused is not None:
                    raise LlmCallError(
                        f"response refused: {refused}", model=request.model, retryable=False
                    ) from e
                error = LlmCallError(
                    f"{type(e).__name__}: {_short(str(e))}", model=request.model, retryable=True
                )
                wait = None
            except openai.APIStatusError as e:
                retryable = e.status_code in _RETRYABLE_STATUS or e.status_code >= 500
                error = LlmCallError(
                    f"HTTP {e.status_code}: {_short(e.message)}",
                    model=request.model,
                    retryable=retryable,
                )
                wait = _retry_after(e.response.headers)
            except (openai.APIResponseValidationError, ValueError, TypeError, KeyError) as e:
                raise LlmCallError(
                    f"the response is not a chat completion: {_short(str(e))}",
                    model=request.model,
                    retryable=False,
                ) from e
            finally:
                _DEADLINE.reset(token)
            if not error.retryable:
                raise error
            if attempt == self.max_attempts:
                raise LlmCallError(
                    f"gave up after {attempt} attempts; last: {error.reason}",
                    model=request.model,
                    retryable=True,
                ) from error
            backoff = random.uniform(0, self.initial_backoff_s * 2 ** (attempt - 1))
            pause = min(self.max_backoff_s, backoff if wait is None else wait)
            if time.monotonic() + pause >= call_ends:
                raise LlmCallError(
                    f"gave up after {attempt} attempts: the call's deadline of "
                    f"{self.total_timeout_s} s leaves no time for another; last: {error.reason}",
                    model=request.model,
                    retryable=True,
                ) from error
            self._sleep(pause)
        raise AssertionError("unreachable: every attempt returns or raises")


def _refusal(error: BaseException) -> str | None:
    """Why the transport refused the response, if it did (the SDK wraps what it raises)."""
    while error is not None:
        if isinstance(error, _Refused):
            return str(error)
        error = error.__cause__ or error.__context__
    return None


def _response(completion, model: str) -> LlmResponse:
    if not getattr(completion, "choices", None):
        raise ValueError(f"no choices in {type(completion).__name__}")
    choice = completion.choices[0]
    function_call = getattr(choice.message, "function_call", None)
    if function_call is not None:
        raise LlmCallError(
            f"the model answered with a legacy function_call ({function_call.name}): "
            "ask with tools instead; it is not dropped silently",
            model=model,
            retryable=False,
        )
    calls = []
    for call in getattr(choice.message, "tool_calls", None) or []:
        function = getattr(call, "function", None)
        if function is None:
            raise LlmCallError(
                f"the model asked for a {call.type} tool call ({call.id}), not a function",
                model=model,
                retryable=False,
            )
        try:
            arguments = parse_args_json(function.arguments)
        except CanonicalJsonError as e:
            raise LlmCallError(
                f"the arguments of tool call {function.name}({call.id}) are no JSON object "
                f"a tool intent can carry: {e}",
                model=model,
                retryable=False,
            ) from e
        calls.append(ToolCall(call.id, function.name, arguments))
    usage = getattr(completion, "usage", None)
    return LlmResponse(
        text=choice.message.content or "",
        model=completion.model or model,
        input_tokens=getattr(usage, "prompt_tokens", 0) or 0,
        output_tokens=getattr(usage, "completion_tokens", 0) or 0,
        finish_reason=choice.finish_reason or "",
        tool_calls=tuple(calls),
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
