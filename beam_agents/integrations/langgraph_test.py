"""A real LangGraph graph as a beam_agents agent on the DirectRunner: its checkpoint in the
key's Memory, parallel interrupts as one suspension answered together, an approval; and a
checkpoint edited to name a callable, refused before anything it names runs."""

from __future__ import annotations

import json
import operator
import pickle
from pathlib import Path
from typing import Annotated, TypedDict

import ormsgpack
import pydantic
import pytest
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from beam_agents._protos import AgentEnvelope, StateSnapshot, ToolIntent, ToolResult, TraceEvent
from beam_agents.errors import CheckpointRejectedError
from beam_agents.integrations.langgraph import (
    LangGraphAgent,
    MemoryCheckpointer,
    call_tool,
    llm,
    request_approval,
)
from beam_agents.intents.identity import intent_id
from beam_agents.ops.cli import main
from beam_agents.ops.rounds import Advance, run_round
from beam_agents.runtime import (
    COMPLETIONS,
    ERRORS,
    INTENTS,
    SNAPSHOTS,
    TRACES,
    RunAgent,
    ScriptedLlmClient,
)
from beam_agents.state import Memory
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION

KEY, T0 = b"c-7", 1_764_460_800_000
SEQ = T0 * 1000


class Ticket(TypedDict, total=False):
    event: str
    category: str
    found: Annotated[list, operator.add]
    decision: str


def classify(state: Ticket, config) -> dict:
    reply = llm(config, [{"role": "user", "content": state["event"]}], model="graph-model")
    return {"category": reply.text}


def look_up_customer(state: Ticket) -> dict:
    answer = call_tool("crm.lookup", {"customer": "c-7"})
    return {"found": [f"customer:{answer['payload']}"]}


def look_up_orders(state: Ticket) -> dict:
    answer = call_tool("orders.list", {"customer": "c-7"})
    return {"found": [f"orders:{answer['payload']}"]}


def decide(state: Ticket) -> dict:
    if state["category"] != "refund":
        return {"decision": "answered"}
    decision = request_approval("Refund c-7?", amount_cents=1200)
    return {
        "decision": f"refund {'approved' if decision['approved'] else 'declined'} by "
        f"{decision['approver']}"
    }


def builder() -> StateGraph:
    graph = StateGraph(Ticket)
    graph.add_node("classify", classify)
    graph.add_node("look_up_customer", look_up_customer)
    graph.add_node("look_up_orders", look_up_orders)
    graph.add_node("decide", decide)
    graph.add_edge(START, "classify")
    graph.add_edge("classify", "look_up_customer")
    graph.add_edge("classify", "look_up_orders")
    graph.add_edge(["look_up_customer", "look_up_orders"], "decide")
    graph.add_edge("decide", END)
    return graph


AGENT = LangGraphAgent(builder(), name="tests.langgraph_triage/v1")


def _result(at: int, answered: str, payload: bytes) -> AgentEnvelope:
    envelope = AgentEnvelope(entity_key=KEY, event_time_ms=at)
    envelope.tool_result.CopyFrom(
        ToolResult(intent_id=answered, entity_key=KEY, status=ToolResult.OK, payload=payload)
    )
    return envelope


def _approval(at: int) -> AgentEnvelope:
    envelope = AgentEnvelope(entity_key=KEY, event_time_ms=at)
    envelope.approval.intent_id = intent_id(KEY, SEQ, 1)
    envelope.approval.approved = True
    envelope.approval.approver = "ops@example.com"
    return envelope


def test_a_graph_suspends_on_parallel_interrupts_and_resumes_with_their_answers(tmp_path):
    customer, orders = intent_id(KEY, SEQ, 0, 0), intent_id(KEY, SEQ, 0, 1)
    export = AgentEnvelope(entity_key=KEY, event_time_ms=T0 + 2)
    export.export_request.request_id = "suspended"
    outputs = run_round(
        RunAgent(AGENT, llm_client=ScriptedLlmClient(["refund"])),
        [
            AgentEnvelope(entity_key=KEY, event_time_ms=T0, external_event=b"refund please"),
            Advance(T0 + 1),
            export,
            Advance(T0 + 3),
            _result(T0 + 10, orders, b"2 orders"),
            _result(T0 + 11, customer, b"Ada"),
            Advance(T0 + 12),
            _approval(T0 + 20),
            Advance(T0 + 21),
        ],
        tmp_path,
    ).before(T0 + 21)
    intents = outputs.values(INTENTS)
    assert [(i.tool_name, i.step_index, i.kind) for i in intents] == [
        ("crm.lookup", 0, ToolIntent.TOOL),
        ("orders.list", 0, ToolIntent.TOOL),
        ("human.approval", 1, ToolIntent.APPROVAL),
    ]
    assert [i.intent_id for i in intents[:2]] == [customer, orders]
    (final,) = outputs.values(COMPLETIONS)
    state = json.loads(final)
    assert state["category"] == "refund"
    assert sorted(state["found"]) == ["customer:Ada", "orders:2 orders"]
    assert state["decision"] == "refund approved by ops@example.com"
    # The checkpoint lives in the key's Memory while the graph waits.
    (snapshot,) = outputs.values(SNAPSHOTS)
    assert [e.key for e in snapshot.memory.entries] == ["langgraph/checkpoint/"]
    resumes = [t for t in outputs.values(TRACES) if t.event_type == TraceEvent.ACTIVATION_START]
    assert [t.attributes["beam_agents.resume"] for t in resumes] == ["false", "true", "true"]


class Asked(TypedDict, total=False):
    answer: str


def ask(state: Asked) -> dict:
    return {"answer": call_tool("kb.search", {"q": "x"})["payload"]}


def test_the_checkpointer_keeps_an_interrupted_graph_in_memory_until_it_resumes():
    memory = Memory()
    graph = StateGraph(Asked)
    graph.add_node("ask", ask)
    graph.add_edge(START, "ask")
    graph.add_edge("ask", END)
    compiled = graph.compile(checkpointer=MemoryCheckpointer(memory))
    config = {"configurable": {"thread_id": "agent"}}
    (pending,) = compiled.invoke({}, config)["__interrupt__"]
    assert pending.value == {"tool": "kb.search", "args": {"q": "x"}}
    (key,) = memory.keys()
    assert memory.get(key).startswith(b"msgpack\n")
    # A fresh graph and checkpointer over the same Memory resume it: all it needs is there.
    again = graph.compile(checkpointer=MemoryCheckpointer(Memory.from_blob(memory.to_blob())))
    saved = again.checkpointer.get_tuple(config)
    assert any(channel == "__interrupt__" for _, channel, _ in saved.pending_writes)
    resumed = again.invoke(Command(resume={pending.id: {"payload": "found"}}), config)
    assert resumed == {"answer": "found"}
    assert list(again.checkpointer.list(config)) == [again.checkpointer.get_tuple(config)]


def blurts(state: Asked) -> dict:
    return {"answer": interrupt("a bare question, not a tool call")}


def test_an_interrupt_that_is_no_tool_call_or_approval_is_a_contract_dead_letter(tmp_path):
    graph = StateGraph(Asked)
    graph.add_node("blurts", blurts)
    graph.add_edge(START, "blurts")
    graph.add_edge("blurts", END)
    agent = LangGraphAgent(graph, name="tests.blurts/v1")
    outputs = run_round(
        RunAgent(agent),
        [
            AgentEnvelope(entity_key=KEY, event_time_ms=T0, external_event=b"hi"),
            Advance(T0 + 1),
        ],
        tmp_path,
    ).before(T0 + 1)
    (error,) = outputs.values(ERRORS)
    assert error.reason == "agent_contract" and "use call_tool or request_approval" in error.detail
    assert outputs.values(INTENTS) == []


# -- hostile checkpoints ----------------------------------------------------------------------


def leave_mark(path: str, text: str = "ran") -> None:
    """A callable a hostile checkpoint names: if it ever runs, the file exists."""
    Path(path).write_text(text)


ASKER = LangGraphAgent(
    StateGraph(Asked).add_node("ask", ask).add_edge(START, "ask").add_edge("ask", END),
    name="tests.asker/v1",
)


def _ext(code: int, *fields) -> ormsgpack.Ext:
    return ormsgpack.Ext(code, ormsgpack.packb(list(fields)))


def _hostile_records(marker: Path) -> dict[str, tuple[ormsgpack.Ext, str]]:
    """Extension records as LangGraph's msgpack writes them, each naming something that would
    create `marker` if it were imported and called, with the name a rejection must give."""
    shell = f"touch {marker}"
    mark = (leave_mark.__module__, "leave_mark")
    dotted = ".".join(mark)
    return {
        "os.system, one argument": (_ext(0, "os", "system", shell), "os.system"),
        "os.system, positional": (_ext(1, "os", "system", [shell]), "os.system"),
        "a marker callable, keywords": (_ext(2, *mark, {"path": str(marker)}), dotted),
        "a method call": (_ext(3, "os", "system", shell, "__call__"), "os.system.__call__"),
        "a pydantic model": (_ext(5, *mark, {"path": str(marker)}, "model_validate"), dotted),
        "inside a delta snapshot": (
            ormsgpack.Ext(7, ormsgpack.packb(_ext(0, "os", "system", shell))),
            "os.system",
        ),
        "inside an allowed interrupt": (
            _ext(
                2,
                "langgraph.types",
                "Interrupt",
                {"value": _ext(0, "os", "system", shell), "id": "i"},
            ),
            "os.system",
        ),
    }


def _interrupted_memory() -> Memory:
    """A key's Memory holding the genuine checkpoint of a graph waiting on a tool call."""
    memory = Memory()
    ASKER._builder.compile(checkpointer=MemoryCheckpointer(memory)).invoke(
        {}, {"configurable": {"thread_id": "agent"}}
    )
    return memory


def _tampered(memory: Memory, value) -> Memory:
    """`memory` with its checkpoint edited as an attacker would: `value` as a channel value,
    re-encoded with LangGraph's own serializer."""
    (key,) = memory.keys()
    record = MemoryCheckpointer(memory)._load("")
    record["checkpoint"]["channel_values"]["answer"] = value
    kind, body = JsonPlusSerializer().dumps_typed(record)
    edited = Memory.from_blob(memory.to_blob())
    edited.put(key, kind.encode() + b"\n" + body)
    return edited


@pytest.mark.parametrize("case", list(_hostile_records(Path("unused"))))
def test_a_checkpoint_naming_a_callable_is_refused_before_anything_it_names_runs(tmp_path, case):
    marker = tmp_path / "marker"
    record, name = _hostile_records(marker)[case]
    memory = _tampered(_interrupted_memory(), record)
    checkpointer = MemoryCheckpointer(memory, agent="tests.asker/v1")
    with pytest.raises(CheckpointRejectedError) as raised:
        checkpointer.get_tuple({"configurable": {"thread_id": "agent", "checkpoint_ns": ""}})
    assert name in raised.value.type_names and name in str(raised.value)
    assert not marker.exists()


def test_the_stored_kind_is_not_trusted_pickle_and_json_are_refused(tmp_path):
    marker = tmp_path / "marker"

    class Marks:
        def __reduce__(self):
            return leave_mark, (str(marker),)

    memory = _interrupted_memory()
    (key,) = memory.keys()
    lc_constructor = {"lc": 2, "type": "constructor", "id": [leave_mark.__module__, "leave_mark"]}
    for kind, body in [
        (b"pickle", pickle.dumps(Marks())),
        (b"json", json.dumps({**lc_constructor, "kwargs": {"path": str(marker)}}).encode()),
        (b"", b""),
    ]:
        memory.put(key, kind + b"\n" + body)
        with pytest.raises(CheckpointRejectedError) as raised:
            MemoryCheckpointer(memory).get_tuple({"configurable": {"thread_id": "agent"}})
        assert raised.value.type_names == (f"kind:{kind.decode()}",)
    assert not marker.exists()


def test_bytes_that_are_not_msgpack_are_refused_not_a_crash():
    memory = Memory()
    memory.put("langgraph/checkpoint/", b"msgpack\n\xc1")  # 0xc1 is never used in msgpack
    with pytest.raises(CheckpointRejectedError, match="not msgpack"):
        MemoryCheckpointer(memory).get_tuple({"configurable": {"thread_id": "agent"}})


def _hostile_snapshot(marker: Path) -> StateSnapshot:
    memory = _tampered(_interrupted_memory(), _ext(0, "os", "system", f"touch {marker}"))
    snapshot = StateSnapshot(
        state_schema_version=CURRENT_STATE_SCHEMA_VERSION,
        entity_key=KEY,
        seq=SEQ,
        snapshot_at_ms=T0,
    )
    snapshot.memory.CopyFrom(memory.to_blob())
    snapshot.memory.state_schema_version = CURRENT_STATE_SCHEMA_VERSION
    return snapshot


def test_a_hostile_snapshot_restored_through_run_agent_is_a_checkpoint_rejected_dead_letter(
    tmp_path,
):
    marker = tmp_path / "marker"
    outputs = run_round(
        RunAgent(ASKER),
        [
            _hostile_snapshot(marker),
            Advance(T0),
            AgentEnvelope(entity_key=KEY, event_time_ms=T0 + 1, external_event=b"again"),
            Advance(T0 + 2),
        ],
        tmp_path,
    ).before(T0 + 2)
    (error,) = outputs.values(ERRORS)
    assert error.reason == "checkpoint_rejected" and "os.system" in error.detail
    assert outputs.values(INTENTS) == [] and outputs.values(COMPLETIONS) == []
    assert not marker.exists()


def test_beam_agents_replay_of_a_hostile_snapshot_cannot_reproduce_and_runs_nothing(
    tmp_path, capsys
):
    marker = tmp_path / "marker"
    snapshot, envelope = tmp_path / "snapshot.binpb", tmp_path / "envelope.binpb"
    snapshot.write_bytes(_hostile_snapshot(marker).SerializeToString())
    envelope.write_bytes(
        AgentEnvelope(
            entity_key=KEY, event_time_ms=T0 + 1, external_event=b"again"
        ).SerializeToString()
    )
    agent = f"{__name__}:ASKER"
    assert main(["replay", str(snapshot), str(envelope), "--agent", agent]) == 3
    out = capsys.readouterr().out
    assert "checkpoint rejected" in out and "os.system" in out
    assert not marker.exists()


class Order(pydantic.BaseModel):
    order_id: str
    cents: int


class Refund(TypedDict, total=False):
    order: Order
    answer: str


def asks_about_it(state: Refund) -> dict:
    answer = call_tool("refunds.check", {"order": state["order"].order_id})
    # Runs again on resume, from the restored checkpoint: the model must come back whole.
    order = state["order"]
    return {"answer": f"{type(order).__name__} {order.cents}: {answer['payload']}"}


def refund_graph() -> StateGraph:
    graph = StateGraph(Refund)
    graph.add_node("asks_about_it", asks_about_it)
    graph.add_edge(START, "asks_about_it")
    graph.add_edge("asks_about_it", END)
    return graph


def _order_input(event: bytes) -> dict:
    return {"order": Order(order_id=event.decode(), cents=1200)}


def test_a_pydantic_model_the_state_declares_round_trips_through_a_restored_checkpoint(tmp_path):
    agent = LangGraphAgent(
        refund_graph(),
        name="tests.refund/v1",
        to_input=_order_input,
        to_output=lambda state: state["answer"].encode(),
    )
    outputs = run_round(
        RunAgent(agent),
        [
            AgentEnvelope(entity_key=KEY, event_time_ms=T0, external_event=b"o-1"),
            Advance(T0 + 1),
            _result(T0 + 2, intent_id(KEY, SEQ, 0), b"eligible"),
            Advance(T0 + 3),
        ],
        tmp_path,
    ).before(T0 + 3)
    assert outputs.values(ERRORS) == []
    assert outputs.values(COMPLETIONS) == [b"Order 1200: eligible"]


def test_an_undeclared_pydantic_model_is_refused_and_allowed_types_admits_it():
    memory = Memory()
    graph = refund_graph()
    config = {"configurable": {"thread_id": "agent"}}
    graph.compile(checkpointer=MemoryCheckpointer(memory, allowed_types=[Order])).invoke(
        _order_input(b"o-1"), config
    )
    with pytest.raises(CheckpointRejectedError) as raised:
        MemoryCheckpointer(memory).get_tuple(config)
    assert raised.value.type_names == (f"{Order.__module__}.Order",)
    saved = MemoryCheckpointer(memory, allowed_types=[Order]).get_tuple(config)
    assert saved.checkpoint["channel_values"]["order"] == Order(order_id="o-1", cents=1200)
