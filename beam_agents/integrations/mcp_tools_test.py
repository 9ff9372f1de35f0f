"""MCP tools run by the effector, against real MCP servers (the SDK's own server) that the tests
start: over stdio as the client's subprocess, and over streamable HTTP with uvicorn on
127.0.0.1 in a process of their own."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from beam_agents._protos import ToolResult
from beam_agents.errors import ToolCallError
from beam_agents.integrations.mcp_tools import (
    IDEMPOTENCY_META_KEY,
    HttpServer,
    McpTool,
    StdioServer,
    tool_definitions,
)
from beam_agents.intents.effector import Effector, Route, VerifyMode
from beam_agents.ops.rounds import ManualClock
from beam_agents.testing import mcp_servers
from beam_agents.testing.local_http import JSON, LocalHttpServer, Reply, scripted
from beam_agents.testing.samples import intent

NOW = 1_700_000_030_000  # between samples.intent()'s created_at and expires_at
# Run as a file, not as a module of beam_agents: the server then imports only the mcp SDK.
SERVER = Path(mcp_servers.__file__)


class Log:
    """The server's log: one line per tool call, with the request's _meta."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def lines(self) -> list[str]:
        return self.path.read_text().splitlines()

    def calls(self) -> list[tuple[str, dict]]:
        rows = [line.split(" ", 1) for line in self.lines() if not line.startswith("started ")]
        return [(tool, json.loads(meta)) for tool, meta in rows]

    def started_pid(self, timeout_s: float = 60) -> int:
        ends = time.monotonic() + timeout_s
        while time.monotonic() < ends:
            for line in self.lines():
                if line.startswith("started "):
                    return int(line.split()[1])
            time.sleep(0.05)
        raise AssertionError("the slow tool never started")


class HttpProcess:
    """The test server over streamable HTTP, in its own process."""

    def __init__(self, log: Log, tmp_path: Path) -> None:
        port_file = tmp_path / "port"
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(SERVER),
                "http",
                "--log",
                str(log.path),
                "--port-file",
                str(port_file),
            ]
        )
        ends = time.monotonic() + 60
        while not port_file.exists():
            assert self.process.poll() is None and time.monotonic() < ends, "no server"
            time.sleep(0.05)
        self.server = HttpServer(f"http://127.0.0.1:{port_file.read_text()}/mcp")

    def kill(self) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()


@pytest.fixture
def log(tmp_path) -> Log:
    return Log(tmp_path / "server.log")


@pytest.fixture(params=["stdio", "http"])
def transport(request, log, tmp_path):
    """(server config, the HttpProcess or None): the test server on each transport."""
    if request.param == "stdio":
        yield StdioServer(sys.executable, (str(SERVER), "stdio", "--log", str(log.path))), None
        return
    http = HttpProcess(log, tmp_path)
    try:
        yield http.server, http
    finally:
        http.kill()


def effector(tmp_path, **tools) -> Effector:
    return Effector(
        tools, mode=VerifyMode.OFF, store=tmp_path / "effector.sqlite", clock=ManualClock(NOW)
    )


def call(tool_name: str, args: dict, **overrides):
    return intent(tool_name=tool_name, args_json=json.dumps(args), **overrides)


def test_a_tool_result_becomes_the_ok_payload_once_with_the_intent_id_as_idempotency_key(
    transport, log, tmp_path
):
    server, _ = transport
    # The config maps the effector's tool name to the server's; it travels pickled to workers.
    run = effector(tmp_path, kb_echo=pickle.loads(pickle.dumps(McpTool(server, "echo"))))
    sent = call("kb_echo", {"text": "café"})
    first = run(sent)
    assert first.route is Route.RESULT and first.ran_tool
    result = first.result.tool_result
    assert result.status == ToolResult.OK, result.error_message
    assert json.loads(result.payload) == {
        "content": [{"type": "text", "text": "café"}],
        "structuredContent": {"result": "café"},
    }
    # Stable bytes: sorted keys, no whitespace, UTF-8.
    assert (
        result.payload
        == (
            '{"content":[{"text":"café","type":"text"}],"structuredContent":{"result":"café"}}'
        ).encode()
    )
    ((tool, meta),) = log.calls()
    assert tool == "echo" and meta[IDEMPOTENCY_META_KEY] == sent.intent_id
    again = run(sent)
    assert again.route is Route.DUPLICATE and not again.ran_tool
    assert again.result.tool_result.payload == result.payload
    assert len(log.calls()) == 1


def test_an_mcp_error_result_is_a_tool_error_that_is_not_retryable(transport, log, tmp_path):
    server, _ = transport
    run = effector(tmp_path, fail=McpTool(server, "fail"), ghost=McpTool(server, "no_such_tool"))
    failed = run(call("fail", {"why": "disk full"})).result.tool_result
    assert failed.status == ToolResult.ERROR
    assert failed.error_message.startswith("ToolCallError: tool 'fail' failed (not retryable)")
    assert "the tool reported an error" in failed.error_message
    unknown = run(call("ghost", {}, intent_id="ghost-1")).result.tool_result
    assert unknown.status == ToolResult.ERROR and "no_such_tool" in unknown.error_message
    assert "(not retryable)" in unknown.error_message


def test_a_server_that_is_down_is_a_retryable_error_and_the_tool_never_ran(
    transport, log, tmp_path
):
    server, http = transport
    if http is None:  # a stdio server that exits before it speaks
        server = StdioServer(sys.executable, ("-c", "pass"))
    else:
        http.kill()
    output = effector(tmp_path, echo=McpTool(server, "echo", connect_timeout_s=20))(
        call("echo", {"text": "x"})
    )
    result = output.result.tool_result
    assert result.status == ToolResult.ERROR
    assert "(retryable)" in result.error_message and "the call was not sent" in result.error_message
    assert log.calls() == []


def test_a_server_killed_mid_call_is_an_error_and_a_redelivery_does_not_run_the_tool_again(
    transport, log, tmp_path
):
    server, http = transport
    run = effector(tmp_path, slow=McpTool(server, "slow"))
    sent = call("slow", {"seconds": 120})
    outputs = []
    caller = threading.Thread(target=lambda: outputs.append(run(sent)))
    started = time.monotonic()
    caller.start()
    pid = log.started_pid()
    if http is None:
        os.kill(pid, signal.SIGKILL)  # the stdio server the client started, by its id
    else:
        assert pid == http.process.pid
        http.kill()
    caller.join(timeout=60)
    assert not caller.is_alive()
    assert time.monotonic() - started < 60
    (first,) = outputs
    result = first.result.tool_result
    assert result.status == ToolResult.ERROR
    assert "outcome unknown" in result.error_message and "(not retryable)" in result.error_message
    again = run(sent)
    assert again.route is Route.DUPLICATE and not again.ran_tool
    assert again.result.tool_result.error_message == result.error_message
    assert [tool for tool, _ in log.calls()] == ["slow"]


def test_a_call_past_its_deadline_is_an_unknown_outcome(log, tmp_path):
    server = StdioServer(sys.executable, (str(SERVER), "stdio", "--log", str(log.path)))
    with pytest.raises(ToolCallError) as raised:
        McpTool(server, "slow", timeout_s=1)({"seconds": 30}, intent())
    assert not raised.value.retryable and "outcome unknown" in raised.value.reason


def test_tool_definitions_come_from_the_servers_lists_under_the_configs_names(transport):
    server, _ = transport
    echo, lookup = tool_definitions(
        {"kb_echo": McpTool(server, "echo"), "crm_lookup": McpTool(server, "lookup")}
    )
    assert (echo.name, echo.description) == ("kb_echo", "Returns the text it is given.")
    assert echo.parameters["properties"]["text"]["type"] == "string"
    assert echo.parameters["required"] == ["text"]
    assert (lookup.name, lookup.parameters["required"]) == ("crm_lookup", ["customer_id"])
    with pytest.raises(ToolCallError, match="serves no tool 'nope'"):
        tool_definitions({"x": McpTool(server, "nope")})


def test_a_result_over_the_effectors_limit_is_ok_without_its_payload(transport, log, tmp_path):
    """A result lands in the key's state and on the bus: one the size of the server's whim
    must not, and the effector bounds it; the tool ran, so the result stays OK (an ERROR could
    have the agent run it again)."""
    server, _ = transport
    run = Effector(
        {"echo": McpTool(server, "echo")},
        mode=VerifyMode.OFF,
        store=tmp_path / "effector.sqlite",
        clock=ManualClock(NOW),
        max_result_bytes=4096,
    )
    result = run(call("echo", {"text": "x" * 5000})).result.tool_result
    assert (result.status, result.payload) == (ToolResult.OK, b"")
    assert "max_result_bytes (4096)" in result.error_message
    assert [tool for tool, _ in log.calls()] == ["echo"]


# A lying MCP server over stdio, by hand: newline-delimited JSON-RPC. Its mode (argv[1]):
# "cursor" pages its tool list for ever, "nan" answers a call with NaN in structuredContent.
LIAR = """
import json, sys
mode = sys.argv[1]
for line in sys.stdin:
    message = json.loads(line)
    method, number = message.get("method"), message.get("id")
    if number is None:
        continue
    if method == "initialize":
        result = {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "liar", "version": "1"},
        }
    elif method == "tools/list":
        tools = [{"name": f"t{i}", "inputSchema": {"type": "object"}} for i in range(100)]
        result = {"tools": tools, "nextCursor": "again"}
    elif method == "tools/call":
        result = {"content": [], "structuredContent": {"v": float("nan")}}
    else:
        result = {}
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": number, "result": result}) + "\\n")
    sys.stdout.flush()
"""


def liar(mode: str) -> StdioServer:
    return StdioServer(sys.executable, ("-c", LIAR, mode))


def test_a_tool_list_paged_for_ever_is_refused_at_a_bound_not_read_until_the_deadline():
    started = time.monotonic()
    with pytest.raises(ToolCallError) as raised:
        tool_definitions({"t0": McpTool(liar("cursor"), "t0", connect_timeout_s=60)})
    assert not raised.value.retryable and "tools" in raised.value.reason
    assert time.monotonic() - started < 30


def test_a_result_that_is_no_json_is_an_error_not_a_payload():
    with pytest.raises(ToolCallError) as raised:
        McpTool(liar("nan"), "t0")({}, intent())
    assert not raised.value.retryable and "no JSON" in raised.value.reason


def test_an_error_never_quotes_the_servers_credentials(tmp_path):
    """A token read with its line end cannot be sent (h11 refuses the header and quotes it);
    the error becomes the intent's error_message, which the agent, and a ReAct agent's model,
    read."""
    token = "-".join(("Bearer", "tok", "1234567890"))  # not in this source
    with LocalHttpServer(scripted(Reply(200, b"{}", JSON))) as listening:
        server = HttpServer(f"{listening.url}/mcp", headers={"Authorization": token + "\n"})
        run = effector(tmp_path, echo=McpTool(server, "echo", connect_timeout_s=5))
        result = run(call("echo", {"text": "x"})).result.tool_result
        with pytest.raises(ToolCallError) as raised:
            tool_definitions({"echo": McpTool(server, "echo", connect_timeout_s=5)})
    assert result.status == ToolResult.ERROR and "the call was not sent" in result.error_message
    assert "tok-1234567890" not in result.error_message
    assert "tok-1234567890" not in str(raised.value)
    assert listening.requests == []
