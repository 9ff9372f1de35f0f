"""What the demo prints: its introduction, each round's (or each step's on Kafka) activations,
intents, results, approvals, completions and dead letters, the exported snapshots, and at the
end the activations' traces as a tree. `Account` is shared by the local and the Kafka demo."""

from __future__ import annotations

import json
from typing import TextIO

from beam_agents._protos import AgentEnvelope, StateSnapshot, ToolResult, TraceEvent
from beam_agents.ops.demo.parts import TICKET, demo_ticket
from beam_agents.runtime import COMPLETIONS, ERRORS, INTENTS, TRACES

__all__ = ["Account"]


class Account:
    """The demo's account, printed to `out`; `t0` is the ticket's event time."""

    approver = "a scripted approver"

    def __init__(self, out: TextIO, workdir: str, options, t0: int) -> None:
        self.out = out
        self.workdir = workdir
        self.options = options
        self.t0 = t0
        self.traces: list[TraceEvent] = []

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def introduce(self, where: str) -> AgentEnvelope:
        ticket_id, customer_id, text = TICKET
        self.say("beam_agents demo: support-ticket triage, one durable agent per customer key,")
        self.say(f"{where}. No model service, no keys: a scripted model, stand-in")
        self.say(f"tools, {self.approver} and a demo signing key made for this run.")
        self.say()
        self.say(f"ticket {ticket_id} from customer {customer_id}: {text!r}")
        return demo_ticket(self.t0)

    def _account(self, outputs) -> None:
        traces = outputs.values(TRACES)
        self.traces += traces
        intents = {i.intent_id: i for i in outputs.values(INTENTS)}
        for event in traces:
            kind = TraceEvent.EventType.Name(event.event_type)
            if kind == "ACTIVATION_START":
                how = (
                    "resumed with its answers"
                    if event.attributes.get("beam_agents.resume") == "true"
                    else "started on a new event"
                )
                self.say(f"  activation seq {event.seq} {how}")
            elif kind == "LLM_CALL":
                replayed = event.attributes.get("beam_agents.replayed") == "true"
                source = "replayed from the cache, no model call" if replayed else "model called"
                self.say(f"    llm {event.attributes['gen_ai.request.model']}: {source}")
            elif kind == "INTENT_EMITTED":
                intent = intents[event.attributes["beam_agents.intent_id"]]
                self.say(
                    f"    intent {intent.tool_name} {intent.args_json} "
                    f"(id {intent.intent_id[:8]}, signed {intent.signing_key_id})"
                )
            elif kind == "SUSPENDED":
                pending = event.attributes["beam_agents.pending"].split(",")
                self.say(f"  suspended, waiting for {len(pending)} answer(s)")
        for _, _, result in outputs.results:
            tool_result = result.tool_result
            intent = intents.get(tool_result.intent_id)
            name = intent.tool_name if intent else tool_result.intent_id
            status = ToolResult.Status.Name(tool_result.status)
            self.say(f"  effector ran {name}: {status} {tool_result.payload.decode()}")
        for _, _, answer in outputs.approved:
            intent = intents.get(answer.approval.intent_id)
            question = json.loads(intent.args_json)["question"] if intent else ""
            verdict = "approved" if answer.approval.approved else "declined"
            self.say(f"  approver {answer.approval.approver} {verdict}: {question}")
        for output in outputs.values(COMPLETIONS):
            self.say(f"  completed: {output.decode()}")
        for _, _, error in outputs.rows.get(ERRORS, []) + outputs.rows.get("effector_errors", []):
            self.say(f"  DEAD LETTER {error.reason}: {error.detail}")

    def _snapshot(self, snapshot: StateSnapshot) -> None:
        memory = [e.key for e in snapshot.memory.entries]
        self.say(
            f"  exported snapshot {snapshot.request_id}: seq {snapshot.seq}, memory "
            f"{memory}, {len(snapshot.llm_cache.entries)} cached LLM answer(s), "
            f"{len(snapshot.pending)} pending intent(s)"
        )

    def _trace_tree(self) -> None:
        roots = [
            e
            for e in self.traces
            if e.event_type == TraceEvent.ACTIVATION_START and not e.parent_span_id
        ]
        for root in roots:
            self.say(f"trace {root.trace_id.hex()} (OpenTelemetry ids; one tree per activation)")
            self._branch(root, "")

    def _branch(self, span_event: TraceEvent, indent: str) -> None:
        label = "activation" if span_event.parent_span_id == b"" else "resume"
        self.say(f"{indent}{label} span {span_event.span_id.hex()}")
        # ACTIVATION_END shares its activation's span: it closes the span, it is no child.
        children = [
            e
            for e in self.traces
            if e.parent_span_id == span_event.span_id and e.event_type != TraceEvent.ACTIVATION_END
        ]
        for child in children:
            if child.event_type == TraceEvent.ACTIVATION_START:
                self._branch(child, indent + "  ")
                continue
            kind = TraceEvent.EventType.Name(child.event_type)
            detail = (
                child.attributes.get("gen_ai.tool.name")
                or child.attributes.get("gen_ai.request.model")
                or ""
            )
            self.say(f"{indent}  {kind.lower()} {detail}".rstrip())
