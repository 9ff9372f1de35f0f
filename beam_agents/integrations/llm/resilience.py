"""What every model client in beam_agents.integrations.llm shares: retries, deadlines, a cap.

`ResilientClient` is the base of the OpenAI, Anthropic and Gemini clients. A subclass builds its
provider's SDK on the HTTP client it is given (`_make_sdk`), sends one request (`_send`) and
says what a failure of its SDK means (`_failure`); the base does the rest, the same for all:

* Failures are typed. LlmCallError.retryable is True for what may pass (429, 408, 409, 5xx,
  timeouts, connection errors) and False for what will not (other 4xx, a body that is not an
  answer). Retryable failures are retried here, `max_attempts` in all, sleeping as the
  server's Retry-After (or retry-after-ms) says, else with exponential backoff and full
  jitter; the SDKs' own retries are off so that this policy is the only one.
* A call has real deadlines, whatever the server does. An SDK's timeout bounds each socket
  read, so a server dripping a byte at a time would keep a call alive for ever; here the SDK
  talks through an httpx transport of ours whose network streams check a monotonic deadline
  before and during every connect, read and write: each attempt ends by `timeout_s` after it
  starts, and the whole call, backoff included, by `total_timeout_s`.
* The same transport bounds the response: a Content-Length above `max_response_bytes` is
  refused before the body is read, and a body that grows past it is refused at that byte
  (non-retryable), so a huge answer is never read whole nor reaches the replay cache. It asks
  for an uncompressed body and refuses a compressed one, whose decoded size the cap could not
  bound. HTTP proxies from the environment are not used (their connections would not carry
  the deadline).

A client is picklable (Beam ships it to workers inside the DoFn): its SDK and HTTP connection
are made on the worker, at first use, and its API key never shows in its repr.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import email.utils
import functools
import importlib
import random
import time
from collections.abc import Callable, Iterator

from beam_agents.errors import CanonicalJsonError, LlmCallError, with_article
from beam_agents.intents.identity import canonical_args_json
from beam_agents.runtime.context import LlmRequest, LlmResponse

__all__ = [
    "RETRYABLE_STATUS",
    "Failure",
    "ResilientClient",
    "billed",
    "checked_arguments",
    "connection_failure",
    "reading_billed",
    "retry_after",
    "status_failure",
]

RETRYABLE_STATUS = frozenset({408, 409, 429})
# When the running attempt must end (time.monotonic()); set by `complete` around each attempt.
_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("llm_attempt_deadline")


class _Refused(Exception):
    """A response this client will not read (too large, compressed): never retried."""

    what = "response"


class _Unsendable(_Refused):
    """A request that is not valid HTTP: the same request never passes."""

    what = "request"


@functools.cache
def _transport_type(httpx, httpcore) -> type:
    """The bounded transport class for one httpx family: `httpx` over `httpcore`, or its fork
    `httpx2` over `httpcore2` (the SDKs differ in which they take)."""

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
                encoding = with_article(found["content-encoding"])
                problem = f"{encoding} body, whose decoded size cannot be bounded"
            elif int(found.get("content-length") or 0) > self._max_bytes:
                announced, limit = found["content-length"], self._max_bytes
                problem = f"{announced} bytes announced, over the limit of {limit}"
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
            if isinstance(error, httpcore.LocalProtocolError):
                # Most often a header value with a newline: a key read with its line end. The
                # message quotes that header, the key, so it is left behind.
                raise _Unsendable(
                    "it is not valid HTTP (a header value with a control character? an API key "
                    "read with its line end?)"
                ) from None
            if isinstance(error, httpcore.TimeoutException):
                raise httpx.TimeoutException(str(error), request=self._request) from error
            if isinstance(error, httpcore.NetworkError | httpcore.ProtocolError):
                raise httpx.TransportError(str(error)) from error

    return _BoundedTransport


def _refusal(error: BaseException) -> _Refused | None:
    """What the transport refused, if it did (the SDK wraps what it raises)."""
    while error is not None:
        if isinstance(error, _Refused):
            return error
        error = error.__cause__ or error.__context__
    return None


@dataclasses.dataclass(frozen=True)
class Failure:
    """What a failed attempt means: why, whether to try again, and the wait the server asked."""

    reason: str
    retryable: bool
    wait_s: float | None = None


def status_failure(status: int, message, headers) -> Failure:
    """The failure of an HTTP error status: retryable for 408, 409, 429 and 5xx. `message` is
    whatever the SDK took from the body (a string, if the server kept to its API)."""
    return Failure(
        f"HTTP {status}: {_short(str(message))}",
        retryable=status in RETRYABLE_STATUS or status >= 500,
        wait_s=retry_after(headers),
    )


def connection_failure(error: BaseException) -> Failure:
    """A timeout or a connection that failed or dropped: always retryable."""
    return Failure(f"{type(error).__name__}: {_short(str(error))}", retryable=True)


class ResilientClient:
    """The retry and deadline loop of the module docstring around one provider's SDK.

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
        return f"{type(self).__name__}(base_url={self.base_url!r}, timeout_s={self.timeout_s})"

    # -- what a provider supplies ----------------------------------------------------------

    #: The HTTP library the SDK takes a client of: httpx over httpcore, or the fork httpx2
    #: over httpcore2.
    _http_family = ("httpx", "httpcore")

    def _make_sdk(self, http):
        """The provider's SDK client, talking through `http`, its own retries off."""
        raise NotImplementedError

    def _send(self, sdk, request: LlmRequest) -> LlmResponse:
        """One attempt. Raises LlmCallError (not retried) for an answer it cannot carry."""
        raise NotImplementedError

    def _failure(self, error: Exception) -> Failure | None:
        """What the SDK's `error` means, or None when it is no failure the SDK reports (then
        a malformed body is assumed if it is a ValueError, TypeError, KeyError,
        AttributeError or RecursionError, and anything else propagates)."""
        raise NotImplementedError

    # -- the loop --------------------------------------------------------------------------

    def _sdk(self):
        if self._client is None:
            httpx, httpcore = map(importlib.import_module, self._http_family)
            http = httpx.Client(
                transport=_transport_type(httpx, httpcore)(self.max_response_bytes),
                trust_env=False,
                timeout=self.timeout_s,
            )
            self._client = self._make_sdk(http)
        return self._client

    def complete(self, request: LlmRequest) -> LlmResponse:
        call_ends = time.monotonic() + self.total_timeout_s
        for attempt in range(1, self.max_attempts + 1):
            token = _DEADLINE.set(min(time.monotonic() + self.timeout_s, call_ends))
            try:
                return _checked(self._send(self._sdk(), request), request.model)
            except LlmCallError:
                raise
            except Exception as e:
                cause, failure = e, self._judge(e)
            finally:
                _DEADLINE.reset(token)
            error = LlmCallError(failure.reason, model=request.model, retryable=failure.retryable)
            if not error.retryable:
                raise error from cause
            if attempt == self.max_attempts:
                raise LlmCallError(
                    f"gave up after {attempt} attempts; last: {error.reason}",
                    model=request.model,
                    retryable=True,
                ) from error
            backoff = random.uniform(0, self.initial_backoff_s * 2 ** (attempt - 1))
            wait = failure.wait_s
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

    def _judge(self, error: Exception) -> Failure:
        refused = _refusal(error)
        if refused is not None:
            return Failure(f"{refused.what} refused: {refused}", retryable=False)
        httpx = importlib.import_module(self._http_family[0])
        if isinstance(error, httpx.TimeoutException | httpx.TransportError):
            return connection_failure(error)
        failure = self._failure(error)
        if failure is not None:
            return failure
        # A RecursionError is JSON nested past the parser's depth: a few KB of brackets.
        if isinstance(error, ValueError | TypeError | KeyError | AttributeError | RecursionError):
            return Failure(
                f"the SDK could not make the call or read its answer: {_short(str(error))}",
                retryable=False,
            )
        raise error


def billed(input_tokens, output_tokens) -> dict:
    """The usage an answer reports, as LlmCallError's keywords, for an error refusing it: the
    provider billed it all the same. Empty when the counts are no counts (`_checked`)."""
    counts = {"input_tokens": input_tokens, "output_tokens": output_tokens}
    return counts if all(_is_count(n) for n in counts.values()) else {}


@contextlib.contextmanager
def reading_billed(model: str, usage: dict) -> Iterator[None]:
    """Reads an answer the provider billed for (`usage`, its `billed` keywords, taken from the
    answer first): an answer with no choice or candidate in it (a prompt a safety filter
    blocked, say), or a part of it no client could read, is a refusal, a non-retryable
    LlmCallError carrying that usage, which the key's meter counts. Raised anywhere else, a
    malformed answer would reach the retry loop as the SDK's error and lose it."""
    try:
        yield
    except LlmCallError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, IndexError) as e:
        raise LlmCallError(
            f"the answer cannot be read: {_short(str(e))}", model=model, retryable=False, **usage
        ) from e


def _is_count(value) -> bool:
    return type(value) is int and 0 <= value <= _MAX_TOKENS


def checked_arguments(arguments, call: str, model: str, usage: dict) -> dict:
    """A tool call's arguments object, refused (non-retryable, with the answer's `billed`
    usage) unless a tool intent can carry it: a JSON object under the I-JSON rules of
    `canonical_args_json`."""
    try:
        if not isinstance(arguments, dict):
            raise CanonicalJsonError(
                f"tool arguments must be a JSON object, not {type(arguments).__name__}", path="$"
            )
        canonical_args_json(arguments)
    except CanonicalJsonError as e:
        raise LlmCallError(
            f"the arguments of tool call {call} are no JSON object a tool intent can carry: {e}",
            model=model,
            retryable=False,
            **usage,
        ) from e
    return arguments


# Token counts past I-JSON's exact integers are no count a server meant (and would overflow
# the int64 usage of the key's LlmCacheBlob once priced and summed).
_MAX_TOKENS = 2**53


def _checked(response: LlmResponse, model: str) -> LlmResponse:
    """`response`, refused (non-retryable) unless every field has its type: the SDKs build
    their objects without validating the server's JSON, and what the server says goes into
    the key's budget (a negative count would give it back) and its replay cache."""
    problems = [
        f"{name} is {value!r}"
        for name, value in (
            ("text", response.text),
            ("model", response.model),
            ("finish_reason", response.finish_reason),
        )
        if not isinstance(value, str)
    ]
    problems += [
        f"{name} is {value!r}, not a count of tokens"
        for name, value in (
            ("input_tokens", response.input_tokens),
            ("output_tokens", response.output_tokens),
        )
        if not _is_count(value)
    ]
    problems += [
        f"tool call {call.id!r} names {call.name!r}"
        for call in response.tool_calls
        if not (isinstance(call.id, str) and call.id and isinstance(call.name, str) and call.name)
    ]
    if problems:
        raise LlmCallError(
            f"the answer is malformed: {_short('; '.join(problems))}",
            model=model,
            retryable=False,
            **billed(response.input_tokens, response.output_tokens),
        )
    return response


def retry_after(headers) -> float | None:
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
