"""Recorded histories for the backtest's tests, made fast: `record_history` runs an agent
through the runtime's per-key machine with recording on (the code RunAgent runs, without a
pipeline per round), answering every intent at once from a tool table and an approver, as an
effector and a person would. A thousand triage tickets take a few seconds; the pipeline test
of recording itself (beam_agents/runtime/recording_test.py) proves RunAgent emits the same
records.

`triage_tickets` makes tickets for the triage agent (beam_agents/examples/support_triage.py):
refund requests, bugs and questions, from the six customers of its CRM stand-in;
`triage_approver` is the people who decided its refunds, `gold_only_refunds` a candidate with a
changed refund rule, and `expected_refund_changes` what that rule changes, from the tickets
alone.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterable, Mapping

from beam_agents._protos import ActivationRecord, AgentEnvelope, ToolIntent, ToolResult
from beam_agents.errors import LlmCallError
from beam_agents.examples.support_triage import (
    MODEL,
    SYSTEM,
    TOOLS,
    scripted_model,
    ticket,
    triage,
)
from beam_agents.intents.identity import content_digest, parse_args_json
from beam_agents.runtime import INTENTS, RECORDS, LlmClient, Recording, RuntimeConfig, agent
from beam_agents.runtime.context import Agent
from beam_agents.runtime.key_driver import KeyDriver, recording_machine

__all__ = [
    "T0",
    "TIERS",
    "FailsOnce",
    "expected_refund_changes",
    "gold_only_refunds",
    "record_history",
    "triage_approver",
    "triage_history",
    "triage_tickets",
]

T0 = 1_764_460_800_000
#: How long after an intent its answer comes.
ANSWER_DELAY_MS = 1_000

_TEXTS = (
    "I want a refund for my order",
    "I was charged twice this month",
    "The app shows an error on login",
    "How do I change my address?",
)


def triage_tickets(count: int) -> list[AgentEnvelope]:
    """`count` ticket events, one key each (`ticket-<n>`), a second apart: the text and the
    customer cycle with coprime periods, so every pairing occurs."""
    return [
        AgentEnvelope(
            entity_key=f"ticket-{n}".encode(),
            event_time_ms=T0 + n * 1_000,
            external_event=ticket(f"t-{n}", f"c-{n % 6 + 1}", _TEXTS[n % len(_TEXTS)]),
        )
        for n in range(count)
    ]


def record_history(
    agent: Agent,
    events: Iterable[AgentEnvelope],
    *,
    tools: Mapping[str, Callable[[dict, ToolIntent], bytes]],
    approver: Callable[[ToolIntent], bool],
    llm_client: LlmClient,
    recording: Recording | None = None,
    config: RuntimeConfig | None = None,
) -> list[ActivationRecord]:
    """The ActivationRecords of `agent` run over `events`, key by key; see the module."""
    by_key = collections.defaultdict(list)
    for event in events:
        by_key[event.entity_key].append(event)
    records = []
    for key, keyed in by_key.items():
        machine = recording_machine(
            agent, llm_client, config or RuntimeConfig(), recording or Recording()
        )
        driver = KeyDriver(machine, key)
        for event in keyed:
            driver.schedule(event)
        outputs = []
        while True:
            for tag, value in outputs:
                if tag == RECORDS:
                    records.append(value)
                elif tag == INTENTS:
                    driver.schedule(_answer(value, tools, approver))
            waiting = driver.state.continuation
            if driver:
                outputs = driver.step()
            elif waiting is not None and waiting.retry_at_ms:
                # A failed resume is tried again on its timer, as the live job's would be.
                outputs = driver.fire_deadline(waiting.retry_at_ms)
            else:
                break
    return records


class FailsOnce:
    """A model that fails its first call (a timeout, not retryable) and then answers as
    `inner` does: a live job's model that failed once, its resume retried on its timer."""

    def __init__(self, inner: LlmClient) -> None:
        self._inner = inner
        self._failed = False

    def complete(self, request):
        if not self._failed:
            self._failed = True
            raise LlmCallError("timed out", model=request.model, retryable=False)
        return self._inner.complete(request)


def triage_history(count: int, **kwargs) -> list[ActivationRecord]:
    """The triage agent's records over `count` tickets: its tools run, its refunds decided by
    `triage_approver`, its model the example's scripted one (`kwargs` go to record_history)."""
    return record_history(
        triage,
        triage_tickets(count),
        tools=TOOLS,
        approver=triage_approver,
        llm_client=scripted_model(),
        **kwargs,
    )


def _answer(intent: ToolIntent, tools, approver) -> AgentEnvelope:
    at = intent.created_at_ms + ANSWER_DELAY_MS
    digest = content_digest(intent.SerializeToString(deterministic=True))
    envelope = AgentEnvelope(entity_key=intent.entity_key, event_time_ms=at)
    if intent.kind == ToolIntent.APPROVAL:
        envelope.approval.CopyFrom(
            AgentEnvelope.Approval(
                intent_id=intent.intent_id,
                approved=bool(approver(intent)),
                approver="recorded_history",
                decided_at_ms=at,
                intent_digest=digest,
            )
        )
        return envelope
    result = ToolResult(
        intent_id=intent.intent_id,
        entity_key=intent.entity_key,
        seq=intent.seq,
        completed_at_ms=at,
        intent_digest=digest,
    )
    try:
        result.payload = tools[intent.tool_name](parse_args_json(intent.args_json), intent)
        result.status = ToolResult.OK
    except Exception as e:  # a tool's failure is its ERROR result, as the effector's
        result.status = ToolResult.ERROR
        result.error_message = f"{type(e).__name__}: {e}"
    envelope.tool_result.CopyFrom(result)
    return envelope


# -- the triage agent's recorded history and a changed refund rule -----------------------


#: The customers' tiers, written out here: the ground truth must not come from the code tested.
TIERS = {
    "c-1": "gold",
    "c-2": "silver",
    "c-3": "bronze",
    "c-4": "gold",
    "c-5": "silver",
    "c-6": "bronze",
}


def triage_approver(intent: ToolIntent) -> bool:
    """The people who approved refunds in the recording: every one but a bronze customer's."""
    return "(bronze)" not in json.loads(intent.args_json)["question"]


def _done(summary: dict, **fields) -> bytes:
    return json.dumps({**summary, **fields}, sort_keys=True).encode()


@agent(name="candidate.gold_only_refunds/v2")
def gold_only_refunds(ctx, event: bytes) -> bytes:
    """The triage agent with a changed refund rule: only gold customers get one (and only they
    are put before a person); everything else as before, the model asked the same."""
    request = json.loads(event)
    summary = {"ticket_id": request["ticket_id"], "customer_id": request["customer_id"]}
    customer = ctx.call_tool("crm.lookup", {"customer_id": request["customer_id"]})
    if not customer.ok:
        return _done(summary, outcome="lookup_failed", detail=customer.result.error_message)
    profile = json.loads(customer.payload)
    ctx.memory.put(f"customer:{request['customer_id']}", customer.payload)
    reply = ctx.llm(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": request["text"]}],
        model=MODEL,
        temperature=0,
    )
    decision = json.loads(reply.text)
    summary["category"] = decision["category"]
    amount = int(decision.get("refund_cents", 0))
    if decision["category"] != "refund" or amount <= 0:
        return _done(summary, outcome="answered")
    if profile["tier"] != "gold":
        return _done(summary, outcome="refund_not_offered", amount_cents=amount)
    approval = ctx.request_approval(
        f"Refund {amount / 100:.2f} to {profile['name']} ({profile['tier']})?",
        ticket_id=request["ticket_id"],
        customer_id=request["customer_id"],
        amount_cents=amount,
    )
    if not approval.ok:
        return _done(summary, outcome="refund_declined", amount_cents=amount)
    refund = ctx.call_tool(
        "payments.refund",
        {
            "customer_id": request["customer_id"],
            "amount_cents": amount,
            "ticket_id": request["ticket_id"],
        },
    )
    receipt = json.loads(refund.payload)["receipt"] if refund.ok else None
    return _done(summary, outcome="refunded", amount_cents=amount, receipt=receipt)


def expected_refund_changes(count: int) -> tuple[set[bytes], set[bytes]]:
    """Ground truth from the tickets alone, not from any record: the keys whose refund is no
    longer paid (refund tickets of silver customers: approved before, never asked now), and
    those no longer put before a person (silver and bronze refund tickets)."""
    paid, asked = set(), set()
    for event in triage_tickets(count):
        request = json.loads(event.external_event)
        text = request["text"].lower()
        refund = "refund" in text or "charged twice" in text
        tier = TIERS[request["customer_id"]]
        if refund and tier != "gold":
            asked.add(event.entity_key)
            if tier == "silver":
                paid.add(event.entity_key)
    return paid, asked
