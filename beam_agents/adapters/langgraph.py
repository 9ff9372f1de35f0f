"""LangGraph graphs as beam_agents agents (the `beam-agents[langgraph]` extra).

    builder = StateGraph(State)              # nodes call the helpers below
    ...
    agent = LangGraphAgent(builder, name="support/v2", to_input=lambda event: {...})
    pipeline | RunAgent(agent, llm_client=...)

The graph runs inside an activation with a checkpointer (`MemoryCheckpointer`) that keeps its
latest checkpoint, and the pending writes that record interrupts, in the key's Memory: a
graph's progress lives in the same keyed state, and commits or rolls back with the activation.
Serialization is LangGraph's own JsonPlusSerializer (msgpack), with its pickle fallback off.

A node acts on the world through LangGraph's `interrupt`: `call_tool(name, args)` and
`request_approval(question, ...)` interrupt the graph with a request the adapter turns into a
ToolIntent (all of a step's parallel interrupts become intents of one suspension, tool calls in
one step with several call indexes). When every answer has arrived the graph resumes with
`Command(resume={interrupt id: answer})`, and each helper returns its answer as a dict:
{"ok", "status", "payload", "error"} for a tool, {"ok", "approved", "approver"} for an approval.
`llm(config, messages, model=...)` calls the model through the activation's replay cache, keyed
by node and call, so a node that re-runs on resume replays its earlier answers.

Node functions must be deterministic given their state, answers and model answers, as in any
beam_agents agent. LangGraph's checkpoint ids come from the clock; they change the bytes of the
Memory entry between retries, never the intents, traces or outputs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Command, interrupt

from beam_agents._protos import ToolIntent, ToolResult
from beam_agents.errors import AgentContractError
from beam_agents.runtime.context import ActivationContext, Answer, Completion, Suspension
from beam_agents.runtime.memory import Memory

__all__ = [
    "CONTEXT_KEY",
    "LangGraphAgent",
    "MemoryCheckpointer",
    "call_tool",
    "llm",
    "request_approval",
]

#: Where nodes find the activation in `config["configurable"]` ("__" keeps it out of
#: checkpoint metadata).
CONTEXT_KEY = "__beam_agents_context"
_MEMORY_PREFIX = "langgraph/checkpoint/"
_THREAD = "agent"  # one graph thread per key: the key is the conversation
_REQUESTS = frozenset({"tool", "approval"})


class MemoryCheckpointer(BaseCheckpointSaver):
    """A LangGraph checkpointer over a key's Memory: the latest checkpoint of each namespace
    and its pending writes, nothing older (an agent resumes from where it is, never from a
    past checkpoint)."""

    def __init__(self, memory: Memory) -> None:
        super().__init__(serde=JsonPlusSerializer())
        self._memory = memory

    def _load(self, namespace: str) -> dict | None:
        data = self._memory.get(_MEMORY_PREFIX + namespace)
        if data is None:
            return None
        kind, _, body = data.partition(b"\n")
        return self.serde.loads_typed((kind.decode(), body))

    def _save(self, namespace: str, record: dict) -> None:
        kind, body = self.serde.dumps_typed(record)
        self._memory.put(_MEMORY_PREFIX + namespace, kind.encode() + b"\n" + body)

    def get_tuple(self, config) -> CheckpointTuple | None:
        namespace = config["configurable"].get("checkpoint_ns", "")
        record = self._load(namespace)
        wanted = get_checkpoint_id(config)
        if record is None or (wanted and wanted != record["id"]):
            return None
        return CheckpointTuple(
            config=_config(namespace, record["id"]),
            checkpoint=record["checkpoint"],
            metadata=record["metadata"],
            parent_config=_config(namespace, record["parent"]) if record["parent"] else None,
            pending_writes=[
                (task, channel, value) for task, channel, value, *_ in record["writes"]
            ],
        )

    def list(self, config, *, filter=None, before=None, limit=None) -> Iterator[CheckpointTuple]:
        found = self.get_tuple(config) if config else None
        if found is not None and limit != 0:
            yield found

    def put(
        self,
        config,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ):
        namespace = config["configurable"].get("checkpoint_ns", "")
        self._save(
            namespace,
            {
                "id": checkpoint["id"],
                "parent": config["configurable"].get("checkpoint_id"),
                "checkpoint": checkpoint,
                "metadata": get_checkpoint_metadata(config, metadata),
                "writes": [],
            },
        )
        return _config(namespace, checkpoint["id"])

    def put_writes(
        self, config, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str = ""
    ) -> None:
        namespace = config["configurable"].get("checkpoint_ns", "")
        record = self._load(namespace)
        if record is None or record["id"] != config["configurable"]["checkpoint_id"]:
            return  # writes of a checkpoint that is no longer the latest
        kept = {(w[0], w[4]): w for w in record["writes"]}
        for index, (channel, value) in enumerate(writes):
            slot = WRITES_IDX_MAP.get(channel, index)
            if slot >= 0 and (task_id, slot) in kept:
                continue  # a regular write is kept as first written (LangGraph's rule)
            kept[(task_id, slot)] = [task_id, channel, value, task_path, slot]
        record["writes"] = list(kept.values())
        self._save(namespace, record)

    def delete_thread(self, thread_id: str) -> None:
        for key in list(self._memory.keys()):
            if key.startswith(_MEMORY_PREFIX):
                self._memory.delete(key)


def _config(namespace: str, checkpoint_id: str) -> dict:
    return {
        "configurable": {
            "thread_id": _THREAD,
            "checkpoint_ns": namespace,
            "checkpoint_id": checkpoint_id,
        }
    }


class _NodeContext:
    """What nodes reach through the config: the activation, and per-node LLM call counts."""

    def __init__(self, ctx: ActivationContext) -> None:
        self.ctx = ctx
        self.llm_calls: dict[str, int] = {}


def llm(config, messages: Sequence[Mapping[str, object]], *, model: str, **params):
    """A model call from inside a node, through the activation's replay cache."""
    node_context: _NodeContext = config["configurable"][CONTEXT_KEY]
    node = config.get("metadata", {}).get("langgraph_node", "")
    count = node_context.llm_calls.get(node, 0)
    node_context.llm_calls[node] = count + 1
    return node_context.ctx.llm(messages, model=model, replay_key=f"{node}#{count}", **params)


def call_tool(name: str, args: Mapping[str, object]) -> dict:
    """Interrupts the graph for a tool call; returns its result when the graph resumes."""
    return interrupt({"tool": name, "args": dict(args)})


def request_approval(question: str, **details: object) -> dict:
    """Interrupts the graph for a human's approval; returns the decision when it resumes."""
    return interrupt({"approval": question, "details": details})


class LangGraphAgent:
    """A StateGraph builder run as an Agent; see the module docstring.

    `to_input(event)` makes the graph's input from an event's bytes (default: {"event": the
    bytes decoded as UTF-8}); `to_output(state)` the completion's bytes from the final state
    (default: the state as JSON).
    """

    def __init__(
        self,
        builder,
        *,
        name: str,
        to_input: Callable[[bytes], dict] | None = None,
        to_output: Callable[[dict], bytes] | None = None,
    ) -> None:
        self._builder = builder
        self.adapter = name
        self._to_input = to_input or (lambda event: {"event": event.decode("utf-8")})
        self._to_output = to_output or (
            lambda state: json.dumps(state, sort_keys=True, default=str).encode()
        )

    def start(self, ctx: ActivationContext, event: bytes) -> Completion | Suspension:
        return self._run(ctx, self._to_input(event))

    def resume(self, ctx: ActivationContext, answers: Sequence[Answer]) -> Completion | Suspension:
        interrupts = json.loads(ctx.resume_of.snapshot)["interrupts"]
        resume = {interrupts[a.intent.intent_id]: _answer(a) for a in answers}
        return self._run(ctx, Command(resume=resume))

    def _run(self, ctx: ActivationContext, graph_input) -> Completion | Suspension:
        graph = self._builder.compile(checkpointer=MemoryCheckpointer(ctx.memory))
        config = {"configurable": {"thread_id": _THREAD, CONTEXT_KEY: _NodeContext(ctx)}}
        state = graph.invoke(graph_input, config)
        pending = state.get("__interrupt__") if isinstance(state, dict) else None
        if not pending:
            return ctx.complete(self._to_output(state))
        for request in pending:
            if not (isinstance(request.value, Mapping) and request.value.keys() & _REQUESTS):
                raise AgentContractError(
                    f"interrupted with {request.value!r}: use call_tool or request_approval",
                    agent=self.adapter,
                )
        by_intent = {}
        calls = [i for i in pending if "tool" in i.value]
        if calls:
            intents = ctx.call_tools([(i.value["tool"], i.value["args"]) for i in calls])
            by_intent.update({t.intent_id: i.id for t, i in zip(intents, calls, strict=True)})
        for request in pending:
            if "approval" in request.value:
                asked = ctx.request_approval(
                    request.value["approval"], **request.value.get("details", {})
                )
                by_intent[asked.intent_id] = request.id
        return ctx.suspend(snapshot=json.dumps({"interrupts": by_intent}).encode())


def _answer(answer: Answer) -> dict:
    if answer.intent.kind == ToolIntent.APPROVAL:
        approval = answer.approval
        return {
            "ok": answer.ok,
            "approved": bool(approval and approval.approved),
            "approver": approval.approver if approval else "",
        }
    result = answer.result
    return {
        "ok": answer.ok,
        "status": ToolResult.Status.Name(result.status) if result else "EXPIRED",
        "payload": result.payload.decode("utf-8", "backslashreplace") if result else "",
        "error": result.error_message if result else "",
    }
