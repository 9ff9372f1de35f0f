"""A real LangGraph graph as a beam_agents agent on the DirectRunner: its checkpoint in the
key's Memory, parallel interrupts as one suspension answered together, an approval."""

from __future__ import annotations

import json
import operator
from typing import Annotated, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from beam_agents._protos import AgentEnvelope, ToolIntent, ToolResult, TraceEvent
from beam_agents.adapters.langgraph import (
    LangGraphAgent,
    MemoryCheckpointer,
    call_tool,
    llm,
    request_approval,
)
from beam_agents.core.intent import intent_id
from beam_agents.runtime import (
    COMPLETIONS,
    ERRORS,
    INTENTS,
    SNAPSHOTS,
    TRACES,
    Memory,
    RunAgent,
    ScriptedLlmClient,
)
from beam_agents.testing.pipelines import Advance, run_round

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
