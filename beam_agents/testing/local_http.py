"""A real HTTP server on 127.0.0.1 for tests: scripted replies, every request recorded.

    with LocalHttpServer(lambda request: Reply(200, body=b"ok")) as server:
        call(server.url)
    server.requests  # [Request(method, path, headers, body), ...]
    server.sent_bytes  # body bytes written for each request before it ended or the client left

The server binds an ephemeral port on the loopback interface only, answers from a thread,
and is shut down (and its port freed) when the block ends.
"""

from __future__ import annotations

import dataclasses
import http.server
import threading
import time
from collections.abc import Callable, Iterable, Mapping

__all__ = ["JSON", "LocalHttpServer", "Reply", "Request", "Sleeps", "scripted"]

#: The headers of a JSON reply.
JSON = {"content-type": "application/json"}


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes


@dataclasses.dataclass(frozen=True)
class Reply:
    status: int
    body: bytes = b""
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: Seconds to wait before answering (a slow server).
    delay_s: float = 0.0
    #: The body in pieces, each sent `drip_s` after the last (a dripping or endless server);
    #: no Content-Length unless `headers` gives one, so the body ends when the server closes.
    pieces: Callable[[], Iterable[bytes]] | None = None
    drip_s: float = 0.0


class LocalHttpServer:
    def __init__(self, reply: Callable[[Request], Reply]) -> None:
        self.requests: list[Request] = []
        self.sent_bytes: list[int] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                request = Request(
                    self.command, self.path, dict(self.headers), self.rfile.read(length)
                )
                server.requests.append(request)
                answer = reply(request)
                if answer.delay_s:
                    time.sleep(answer.delay_s)
                server.sent_bytes.append(0)
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    if answer.pieces is None:
                        self.send_header("content-length", str(len(answer.body)))
                    self.end_headers()
                    for piece in [answer.body] if answer.pieces is None else answer.pieces():
                        time.sleep(answer.drip_s)
                        self.wfile.write(piece)
                        self.wfile.flush()
                        server.sent_bytes[-1] += len(piece)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout or size test)

            do_GET = do_POST = _answer

            def log_message(self, *args) -> None:  # keep test output clean
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> LocalHttpServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=10)


def scripted(*replies):
    """A handler answering with `replies` in order, the last one for ever after."""
    queue = list(replies)
    return lambda request: queue.pop(0) if len(queue) > 1 else queue[0]


class Sleeps(list):
    """A client's `sleep`: records each wait instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
