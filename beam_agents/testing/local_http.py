"""A real HTTP server on 127.0.0.1 for tests: scripted replies, every request recorded.

    with LocalHttpServer(lambda request: Reply(200, body=b"ok")) as server:
        call(server.url)
    server.requests  # [Request(method, path, headers, body), ...]

The server binds an ephemeral port on the loopback interface only, answers from a thread,
and is shut down (and its port freed) when the block ends.
"""

from __future__ import annotations

import dataclasses
import http.server
import threading
import time
from collections.abc import Callable, Mapping

__all__ = ["LocalHttpServer", "Reply", "Request"]


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


class LocalHttpServer:
    def __init__(self, reply: Callable[[Request], Reply]) -> None:
        self.requests: list[Request] = []
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
                try:
                    self.send_response(answer.status)
                    for name, value in answer.headers.items():
                        self.send_header(name, value)
                    self.send_header("content-length", str(len(answer.body)))
                    self.end_headers()
                    self.wfile.write(answer.body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

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
