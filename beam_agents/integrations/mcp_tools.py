"""Tools served by MCP servers, run by the effector (the `beam-agents[mcp]` extra).

    KB = StdioServer("kb-server", ("--db", "kb.sqlite"))
    CRM = HttpServer("https://crm.example.com/mcp", headers={"Authorization": "Bearer ..."})
    tools = {"kb_search": McpTool(KB, "search"), "crm_lookup": McpTool(CRM, "lookup")}
    Effector({**tools, ...}, ...)          # or ExecuteIntents(tools, ...)
    definitions = tool_definitions(tools)  # what the model is told it may call

The config maps each effector tool name to a server and the tool's name there. An `McpTool` is
an effector `Tool`: called with the intent's parsed arguments, it connects to its server
through the official `mcp` SDK's `Client` (a subprocess over stdio, or streamable HTTP), calls
the tool and disconnects. One connection per call keeps the tool stateless and picklable, as
Beam needs to ship it to workers; a stdio server is started for each call, so a server that is
slow to start is better run behind streamable HTTP.

What comes back:

* a result becomes the ToolResult's OK payload: MCP's own JSON of the result,
  `{"content": [...content blocks...], "structuredContent": ...}` (the latter only when the
  server gave one), keys sorted, no whitespace, UTF-8: stable bytes whatever the transport;
* a result flagged `isError`, or a JSON-RPC error (an unknown tool, arguments the server
  refuses), is a `ToolCallError` that is not retryable, and so is a result whose payload is no
  JSON (a NaN). A payload too large for the key's state and the bus is the effector's to
  bound (`max_result_bytes`): the call took effect, so it stays OK, without the payload;
* a server that cannot be started or reached, or that fails before the call is sent, is a
  retryable `ToolCallError`: the tool did not run;
* a connection lost (or the call's deadline passed) after the call was sent is a
  `ToolCallError` saying the outcome is unknown, not retryable: the tool may have acted.

The effector turns each `ToolCallError` into the intent's ERROR result, its error_message
saying "retryable" or "not retryable". At-most-once is the effector's: its claim is recorded
before the tool runs, so a redelivered intent is answered from the record, never run again.
The intent_id also travels to the server as an idempotency key in the call's `_meta`
(`IDEMPOTENCY_META_KEY`), for a server that acts on outside systems.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from contextlib import AsyncExitStack
from typing import Any

from beam_agents._protos import ToolIntent
from beam_agents.errors import ToolCallError
from beam_agents.runtime.tool_calling import ToolDefinition

__all__ = [
    "IDEMPOTENCY_META_KEY",
    "HttpServer",
    "McpTool",
    "StdioServer",
    "tool_definitions",
]

#: The `_meta` key under which a call carries its intent_id.
IDEMPOTENCY_META_KEY = "beam-agents/intent-id"
# More tools than any model is given: a server paging past it lies (a cursor that never ends).
_MAX_LISTED_TOOLS = 10_000


@dataclasses.dataclass(frozen=True)
class StdioServer:
    """An MCP server started as a subprocess, spoken to over its stdin and stdout."""

    command: str
    args: tuple[str, ...] = ()
    #: Variables set for the server, over the SDK's safe default environment.
    env: Mapping[str, str] | None = None
    cwd: str | None = None

    def _transport(self, stack: AsyncExitStack):
        from mcp import StdioServerParameters

        return StdioServerParameters(
            command=self.command,
            args=list(self.args),
            env=None if self.env is None else dict(self.env),
            cwd=self.cwd,
        )

    def __str__(self) -> str:
        return f"stdio server {self.command!r}"


@dataclasses.dataclass(frozen=True)
class HttpServer:
    """An MCP server at a streamable HTTP endpoint; `headers` go with every request (auth)."""

    url: str
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def _transport(self, stack: AsyncExitStack):
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        # Proxies from the environment are not used, as for the model clients.
        http = httpx2.AsyncClient(headers=dict(self.headers), trust_env=False)
        stack.push_async_callback(http.aclose)
        return streamable_http_client(self.url, http_client=http)

    def __repr__(self) -> str:  # headers may hold credentials
        return f"HttpServer(url={self.url!r})"

    def __str__(self) -> str:
        return f"HTTP server {self.url}"


Server = StdioServer | HttpServer


@dataclasses.dataclass(frozen=True)
class McpTool:
    """The effector Tool that calls tool `name` of `server`. `connect_timeout_s` bounds the
    connection (a subprocess started, the protocol negotiated), `timeout_s` the call."""

    server: Server
    name: str
    timeout_s: float = 60.0
    connect_timeout_s: float = 30.0

    def __call__(self, args: dict, intent: ToolIntent) -> bytes:
        import anyio

        return anyio.run(self._call, args, intent.intent_id)

    async def _call(self, args: dict, idempotency_key: str) -> bytes:
        import anyio
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        result, sent, failure = None, False, None
        # One scope for both phases (anyio's scopes must nest with the client's task groups):
        # its deadline is the connection's, then the call's.
        with anyio.CancelScope(deadline=anyio.current_time() + self.connect_timeout_s) as scope:
            try:
                async with AsyncExitStack() as stack:
                    client = await _enter_client(self.server, stack)
                    sent = True
                    scope.deadline = anyio.current_time() + self.timeout_s
                    result = await client.call_tool(
                        self.name, args, meta={IDEMPOTENCY_META_KEY: idempotency_key}
                    )
            except Exception as e:
                failure = e
        if result is None:  # an answer that arrived stands, whatever disconnecting did
            leaf = None if failure is None else _first_cause(failure)
            cause = "the deadline passed" if leaf is None else _describe(leaf, self.server)
            if not sent:
                raise ToolCallError(
                    f"{self.server} is unavailable, the call was not sent: {cause}",
                    tool=self.name,
                    retryable=True,
                ) from failure
            # The client reports a lost connection or its own timeout as MCPError too; only
            # the server's own JSON-RPC error is a refusal.
            if isinstance(leaf, MCPError) and leaf.code not in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                raise ToolCallError(
                    f"{self.server} refused the call: {cause}", tool=self.name, retryable=False
                ) from failure
            raise ToolCallError(
                f"outcome unknown: {self.server} did not answer after the call was sent "
                f"({cause}); the tool may have run",
                tool=self.name,
                retryable=False,
            ) from failure
        if result.is_error:
            raise ToolCallError(
                f"the tool reported an error: {_text(result.content)}",
                tool=self.name,
                retryable=False,
            )
        try:
            payload = _payload(result)
        except ValueError as e:
            raise ToolCallError(
                f"the tool ran, but its result is no JSON: {e}", tool=self.name, retryable=False
            ) from e
        return payload


async def _enter_client(server: Server, stack: AsyncExitStack):
    from mcp import Client

    return await stack.enter_async_context(Client(server._transport(stack), cache=None))


def tool_definitions(tools: Mapping[str, McpTool]) -> list[ToolDefinition]:
    """What a model may call, from the servers' own tool lists: one ToolDefinition per entry
    of `tools`, named by its key, with the server's description and input schema. Each server
    is asked once. Raises ToolCallError when a server is unavailable or lacks a tool."""
    import anyio

    return anyio.run(_definitions, dict(tools))


async def _definitions(tools: dict[str, McpTool]) -> list[ToolDefinition]:
    import anyio

    # (server, its tools by name); servers compare by value but need not be hashable.
    listed: list[tuple[Server, dict[str, Any]]] = []
    definitions = []
    for name, tool in tools.items():
        served = next((found for server, found in listed if server == tool.server), None)
        if served is None:
            failure = None
            with anyio.move_on_after(tool.connect_timeout_s + tool.timeout_s):
                try:
                    async with AsyncExitStack() as stack:
                        client = await _enter_client(tool.server, stack)
                        listing = await _all_tools(client, tool.server, tool.name)
                        served = {t.name: t for t in listing}
                except Exception as e:
                    failure = e
            if served is None:
                leaf = None if failure is None else _first_cause(failure)
                if isinstance(leaf, ToolCallError):
                    raise leaf from failure
                cause = "the deadline passed" if leaf is None else _describe(leaf, tool.server)
                raise ToolCallError(
                    f"could not list the tools of {tool.server}: {cause}",
                    tool=tool.name,
                    retryable=True,
                ) from failure
            listed.append((tool.server, served))
        if tool.name not in served:
            raise ToolCallError(
                f"{tool.server} serves no tool {tool.name!r} (it serves {sorted(served)})",
                tool=tool.name,
                retryable=False,
            )
        found = served[tool.name]
        definitions.append(ToolDefinition(name, found.description or "", dict(found.input_schema)))
    return definitions


async def _all_tools(client, server: Server, tool: str) -> Sequence[Any]:
    tools, cursor = [], None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools
        if len(tools) > _MAX_LISTED_TOOLS:
            raise ToolCallError(
                f"{server} lists more than {_MAX_LISTED_TOOLS} tools and has more pages",
                tool=tool,
                retryable=False,
            )


def _payload(result) -> bytes:
    document: dict[str, Any] = {
        "content": [
            b.model_dump(mode="json", by_alias=True, exclude_none=True) for b in result.content
        ]
    }
    if result.structured_content is not None:
        document["structuredContent"] = result.structured_content
    text = json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


def _text(content) -> str:
    texts = [getattr(block, "text", None) for block in content]
    return " ".join(t for t in texts if t) or f"{len(content)} content blocks without text"


def _first_cause(error: BaseException) -> BaseException:
    """The first leaf of an exception group (anyio's task groups wrap what failed)."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _describe(error: BaseException, server: Server) -> str:
    """The error as its type and message, with `server`'s credentials (header values, env
    values) blanked: the message becomes the intent's error_message, which the agent and a
    ReAct agent's model read, and some quote them (h11 quotes a header it refuses)."""
    text = str(error)
    secrets = (
        server.headers.values() if isinstance(server, HttpServer) else (server.env or {}).values()
    )
    for secret in secrets:
        # Whole, and each word of it: a message may quote the value escaped (b'Bearer ...\n').
        parts = {secret.strip(), *re.split(r"[\s\x00-\x1f\x7f]+", secret)}
        for part in sorted(parts, key=len, reverse=True):
            if len(part) >= 8:
                text = text.replace(part, "<redacted>")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
