"""LangGraph graphs as beam_agents agents (the `beam-agents[langgraph]` extra).

    builder = StateGraph(State)              # nodes call the helpers below
    ...
    agent = LangGraphAgent(builder, name="support/v2", to_input=lambda event: {...})
    pipeline | RunAgent(agent, llm_client=...)

The graph runs inside an activation with a checkpointer (`MemoryCheckpointer`) that keeps its
latest checkpoint, and the pending writes that record interrupts, in the key's Memory: a
graph's progress lives in the same keyed state, and commits or rolls back with the activation.
Serialization is LangGraph's own JsonPlusSerializer (msgpack), with its pickle fallback off.

A checkpoint is data from the key's state, and state arrives from outside (a restored or
replayed StateSnapshot), so reading one never imports or calls what the data names. LangGraph's
msgpack carries objects as extension records naming a module and a callable, which its
serializer imports and calls (in permissive mode, any of them). Reading is therefore two passes:
the first walks every extension record, at any depth, without importing anything, and refuses
(CheckpointRejectedError, the `checkpoint_rejected` dead letter) a record naming a type outside
the allowlist, or any encoding but msgpack whatever the stored kind says; only then does
LangGraph's serializer, in strict mode with the same allowlist, build the objects. The
allowlist is what LangGraph itself writes into a checkpoint (interrupts, sends, commands), plain
value types, every class the graph's schemas declare (walked through their fields: a Pydantic
model, dataclass or enum in state round-trips with no configuration), and `allowed_types`.

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
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import ormsgpack
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
from langgraph.checkpoint.serde.jsonplus import (
    EXT_CONSTRUCTOR_KW_ARGS,
    EXT_CONSTRUCTOR_POS_ARGS,
    EXT_CONSTRUCTOR_SINGLE_ARG,
    EXT_DELTA_SNAPSHOT,
    EXT_METHOD_SINGLE_ARG,
    EXT_NUMPY_ARRAY,
    EXT_PYDANTIC_V1,
    EXT_PYDANTIC_V2,
    JsonPlusSerializer,
)
from langgraph.types import Command, interrupt

from beam_agents._protos import ToolIntent, ToolResult
from beam_agents.errors import AgentContractError, CheckpointRejectedError
from beam_agents.runtime.context import ActivationContext, Answer, Completion, Suspension
from beam_agents.state.memory import Memory

__all__ = [
    "BASE_ALLOWED_TYPES",
    "CONTEXT_KEY",
    "LangGraphAgent",
    "MemoryCheckpointer",
    "call_tool",
    "declared_types",
    "llm",
    "request_approval",
]

#: Where nodes find the activation in `config["configurable"]` ("__" keeps it out of
#: checkpoint metadata).
CONTEXT_KEY = "__beam_agents_context"
_MEMORY_PREFIX = "langgraph/checkpoint/"
_THREAD = "agent"  # one graph thread per key: the key is the conversation
_REQUESTS = frozenset({"tool", "approval"})
_KIND = "msgpack"  # the one encoding _save writes, and so the only one _load reads

#: (module, name) of what a checkpoint may name without being declared: what LangGraph writes
#: into its own checkpoints, and value types whose constructors have no side effects.
BASE_ALLOWED_TYPES = frozenset(
    {
        ("langgraph.types", "Interrupt"),
        ("langgraph.types", "Send"),
        ("langgraph.types", "Command"),
        ("langgraph.types", "Overwrite"),
        ("datetime", "datetime"),
        ("datetime", "date"),
        ("datetime", "time"),
        ("datetime", "timedelta"),
        ("datetime", "timezone"),
        ("uuid", "UUID"),
        ("decimal", "Decimal"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("collections", "deque"),
    }
)
# The one method call LangGraph writes (datetimes); any other is refused.
_ALLOWED_METHODS = frozenset({("datetime", "datetime", "fromisoformat")})
_NAMED_RECORDS = frozenset(
    {
        EXT_CONSTRUCTOR_SINGLE_ARG,
        EXT_CONSTRUCTOR_POS_ARGS,
        EXT_CONSTRUCTOR_KW_ARGS,
        EXT_PYDANTIC_V1,
        EXT_PYDANTIC_V2,
    }
)


def declared_types(schemas: Iterable[object]) -> set[tuple[str, str]]:
    """(module, name) of every class the schemas declare, through their fields, container
    and union arguments and Annotated types; builtins and TypedDicts (plain dicts in a
    checkpoint) are walked but not listed."""
    found: set[tuple[str, str]] = set()
    seen: set[int] = set()

    def visit(annotation: object) -> None:
        if id(annotation) in seen:
            return
        seen.add(id(annotation))
        if typing.get_origin(annotation) is not None:
            for argument in typing.get_args(annotation):
                visit(argument)  # metadata such as a reducer is no type and is skipped below
            return
        if not isinstance(annotation, type):
            return
        if annotation.__module__ != "builtins" and not typing.is_typeddict(annotation):
            found.add((annotation.__module__, annotation.__name__))
        try:
            hints = typing.get_type_hints(annotation, include_extras=True)
        except Exception:  # an unresolvable forward reference: its fields stay undeclared
            hints = {}
        for hint in hints.values():
            visit(hint)

    for schema in schemas:
        visit(schema)
    return found


def _allowlist(allowed_types: Iterable[type | tuple[str, str]]) -> frozenset[tuple[str, str]]:
    return BASE_ALLOWED_TYPES | {
        (t.__module__, t.__name__) if isinstance(t, type) else tuple(t) for t in allowed_types
    }


def _refused_names(body: bytes, allowed: frozenset[tuple[str, str]]) -> list[str]:
    """What the msgpack `body` names outside `allowed`, found without importing anything."""
    refused: list[str] = []

    def inspect(code: int, data: bytes) -> None:
        record = ormsgpack.unpackb(data, ext_hook=inspect, option=ormsgpack.OPT_NON_STR_KEYS)
        if code == EXT_DELTA_SNAPSHOT:
            return
        if code == EXT_NUMPY_ARRAY:
            if ("numpy", "ndarray") not in allowed:
                refused.append("numpy.ndarray")
            return
        named = isinstance(record, list | tuple) and len(record) >= 3
        module, name = (record[0], record[1]) if named else (None, None)
        if not (isinstance(module, str) and isinstance(name, str)):
            refused.append(f"<extension record {code} naming no type>")
        elif code == EXT_METHOD_SINGLE_ARG:
            method = record[3] if len(record) > 3 else None
            if (module, name, method) not in _ALLOWED_METHODS:
                refused.append(f"{module}.{name}.{method}")
        elif code not in _NAMED_RECORDS:
            refused.append(f"<extension record {code}> {module}.{name}")
        elif (module, name) not in allowed:
            refused.append(f"{module}.{name}")

    try:
        ormsgpack.unpackb(body, ext_hook=inspect, option=ormsgpack.OPT_NON_STR_KEYS)
    except ValueError as e:  # ormsgpack's decode error
        refused.append(f"<not msgpack: {e}>")
    return refused


class MemoryCheckpointer(BaseCheckpointSaver):
    """A LangGraph checkpointer over a key's Memory: the latest checkpoint of each namespace
    and its pending writes, nothing older (an agent resumes from where it is, never from a
    past checkpoint).

    Reading a checkpoint builds only types in the allowlist (`BASE_ALLOWED_TYPES` and
    `allowed_types`, classes or (module, name) pairs); anything else raises
    CheckpointRejectedError naming it, before anything is imported (see the module docstring).
    """

    def __init__(
        self,
        memory: Memory,
        *,
        allowed_types: Iterable[type | tuple[str, str]] = (),
        agent: str = "langgraph",
    ) -> None:
        self._allowed = _allowlist(allowed_types)
        super().__init__(serde=JsonPlusSerializer(allowed_msgpack_modules=tuple(self._allowed)))
        self._memory = memory
        self._agent = agent

    def _load(self, namespace: str) -> dict | None:
        data = self._memory.get(_MEMORY_PREFIX + namespace)
        if data is None:
            return None
        kind, _, body = data.partition(b"\n")
        if kind != _KIND.encode():
            shown = kind[:40].decode("utf-8", "backslashreplace")
            raise CheckpointRejectedError(
                f"stored as {shown!r}, not {_KIND}",
                type_names=(f"kind:{shown}",),
                agent=self._agent,
            )
        refused = _refused_names(body, self._allowed)
        if refused:
            names = tuple(sorted(set(refused)))
            raise CheckpointRejectedError(
                f"names {', '.join(names)}, not in the allowlist (declare the type in the "
                "graph's state schema or pass it in allowed_types)",
                type_names=names,
                agent=self._agent,
            )
        return self.serde.loads_typed((_KIND, body))

    def _save(self, namespace: str, record: dict) -> None:
        kind, body = self.serde.dumps_typed(record)  # a dict is always msgpack
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
    (default: the state as JSON). A restored checkpoint may hold the classes the builder's
    schemas declare and `allowed_types` (classes or (module, name) pairs); see the module
    docstring.
    """

    def __init__(
        self,
        builder,
        *,
        name: str,
        to_input: Callable[[bytes], dict] | None = None,
        to_output: Callable[[dict], bytes] | None = None,
        allowed_types: Iterable[type | tuple[str, str]] = (),
    ) -> None:
        self._builder = builder
        self.adapter = name
        self._allowed_types = tuple(declared_types(builder.schemas)) + tuple(allowed_types)
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
        checkpointer = MemoryCheckpointer(
            ctx.memory, allowed_types=self._allowed_types, agent=self.adapter
        )
        graph = self._builder.compile(checkpointer=checkpointer)
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
