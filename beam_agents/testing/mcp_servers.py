"""A real MCP server for tests, on the `mcp` SDK's own server (`MCPServer`, formerly FastMCP).

    python -m beam_agents.testing.mcp_servers stdio --log FILE
    python -m beam_agents.testing.mcp_servers http --log FILE --port-file FILE

Its tools:

* `echo(text)`: returns the text; `lookup(customer_id)`: a structured result;
* `fail(why)`: raises, which the server answers with `isError`;
* `slow(seconds)`: writes "started <pid>" to the log, then sleeps (a test kills the server
  mid-call);
* every call first appends "<tool> <the request's _meta as JSON>" to the log, so a test
  counts how often a tool ran and sees the idempotency key it was given.

It imports nothing of beam_agents (which would pull in Beam), so it starts in about a second.

Over HTTP it serves streamable HTTP with uvicorn on 127.0.0.1, on a port the system picks, and
writes the port to --port-file once it listens.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Sequence

from mcp.server.mcpserver import Context, MCPServer

__all__ = ["build_server", "main"]


def build_server(log_path: str) -> MCPServer:
    server = MCPServer("beam-agents-test-server")

    def record(tool: str, ctx: Context) -> None:
        meta = ctx.request_context.meta or {}
        with open(log_path, "a") as log:
            log.write(f"{tool} {json.dumps(dict(meta), sort_keys=True)}\n")

    @server.tool(description="Returns the text it is given.")
    def echo(text: str, ctx: Context) -> str:
        record("echo", ctx)
        return text

    @server.tool(description="Looks a customer up.")
    def lookup(customer_id: str, ctx: Context) -> dict:
        record("lookup", ctx)
        return {"customer_id": customer_id, "plan": "pro"}

    @server.tool(description="Always fails.")
    def fail(why: str, ctx: Context) -> str:
        record("fail", ctx)
        raise RuntimeError(why)

    @server.tool(description="Sleeps; a test kills the server meanwhile.")
    def slow(seconds: float, ctx: Context) -> str:
        record("slow", ctx)
        with open(log_path, "a") as log:
            log.write(f"started {os.getpid()}\n")
        time.sleep(seconds)
        return "woke up"

    return server


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m beam_agents.testing.mcp_servers")
    parser.add_argument("transport", choices=["stdio", "http"])
    parser.add_argument("--log", required=True)
    parser.add_argument("--port-file")
    args = parser.parse_args(argv)
    server = build_server(args.log)
    if args.transport == "stdio":
        server.run("stdio")
        return 0
    import uvicorn

    # Our own socket, so the port is known before uvicorn serves on it.
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    with open(args.port_file + ".tmp", "w") as port_file:
        port_file.write(str(listener.getsockname()[1]))
    os.replace(args.port_file + ".tmp", args.port_file)
    app = server.streamable_http_app()
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[listener])
    return 0


if __name__ == "__main__":
    sys.exit(main())
