"""Support-ticket triage: the worked example of a beam_agents agent.

A ticket arrives as an external event (JSON: ticket_id, customer_id, text). The agent looks the
customer up in the CRM (a tool: the activation suspends until the effector answers), asks the
model to classify the ticket, and when the model proposes a refund it asks a human to approve
it first; only an approved refund becomes a `payments.refund` intent. The output is a JSON
summary of what happened. A call can take effect with its answer unknown (`payload_unknown`:
its effector stopped mid-call and a person confirmed it acted): a refund is then reported done
without a receipt. Every step that touches the world is a ToolIntent executed once by
the effector; the agent itself is an ordinary, deterministic Python function.

`TOOLS` are stand-in implementations of the two tools for tests and the demo: a small customer
directory and a refund that returns a receipt keyed by the intent id (its idempotency key).
`scripted_model()` is a deterministic stand-in for the model.
"""

from __future__ import annotations

import json

from beam_agents._protos import ToolIntent
from beam_agents.runtime import LlmRequest, LlmResponse, ScriptedLlmClient, agent

__all__ = ["MODEL", "SYSTEM", "TOOLS", "scripted_model", "ticket", "triage", "triage_with_prompt"]

MODEL = "triage-model"
SYSTEM = (
    "Classify the support ticket. Answer JSON: "
    '{"category": "refund" | "question" | "bug", "refund_cents": <int, 0 unless a refund>}'
)


@agent(name="examples.support_triage/v1")
def triage(ctx, event: bytes) -> bytes:
    return triage_with_prompt(ctx, event, SYSTEM)


def triage_with_prompt(ctx, event: bytes, system: str) -> bytes:
    """The triage agent's body under the system prompt `system`: a candidate with another
    prompt is an agent that calls this (what the demo backtests)."""
    request = json.loads(event)
    summary = {"ticket_id": request["ticket_id"], "customer_id": request["customer_id"]}
    customer = ctx.call_tool("crm.lookup", {"customer_id": request["customer_id"]})
    if not customer.ok or customer.payload_unknown:
        return _done(summary, outcome="lookup_failed", detail=customer.result.error_message)
    profile = json.loads(customer.payload)
    ctx.memory.put(f"customer:{request['customer_id']}", customer.payload)
    reply = ctx.llm(
        [{"role": "system", "content": system}, {"role": "user", "content": request["text"]}],
        model=MODEL,
        temperature=0,
    )
    decision = json.loads(reply.text)
    summary["category"] = decision["category"]
    amount = int(decision.get("refund_cents", 0))
    if decision["category"] != "refund" or amount <= 0:
        return _done(summary, outcome="answered")
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
    if not refund.ok:
        return _done(summary, outcome="refund_failed", amount_cents=amount)
    if refund.payload_unknown:
        # Paid, but the receipt is lost (its effector stopped mid-call and a person confirmed
        # the refund): say so, never guess one or refund again.
        return _done(
            summary,
            outcome="refunded",
            amount_cents=amount,
            receipt=None,
            detail=refund.result.error_message,
        )
    receipt = json.loads(refund.payload)["receipt"]
    return _done(summary, outcome="refunded", amount_cents=amount, receipt=receipt)


def _done(summary: dict, **fields) -> bytes:
    return json.dumps({**summary, **fields}, sort_keys=True).encode()


def ticket(ticket_id: str, customer_id: str, text: str) -> bytes:
    """A ticket event as the agent expects it."""
    return json.dumps({"customer_id": customer_id, "text": text, "ticket_id": ticket_id}).encode()


_CUSTOMERS = {
    "c-1": {"name": "Ada Lovelace", "tier": "gold"},
    "c-2": {"name": "Grace Hopper", "tier": "silver"},
    "c-3": {"name": "Edsger Dijkstra", "tier": "bronze"},
    "c-4": {"name": "Barbara Liskov", "tier": "gold"},
    "c-5": {"name": "Alan Turing", "tier": "silver"},
    "c-6": {"name": "Frances Allen", "tier": "bronze"},
}


def crm_lookup(args: dict, intent: ToolIntent) -> bytes:
    customer = _CUSTOMERS.get(args["customer_id"])
    if customer is None:
        raise LookupError(f"no customer {args['customer_id']}")
    return json.dumps(customer, sort_keys=True).encode()


def payments_refund(args: dict, intent: ToolIntent) -> bytes:
    return json.dumps(
        {"amount_cents": args["amount_cents"], "receipt": f"r-{intent.intent_id}"}, sort_keys=True
    ).encode()


TOOLS = {"crm.lookup": crm_lookup, "payments.refund": payments_refund}


def _classify(request: LlmRequest) -> LlmResponse:
    text = str(request.messages[-1]["content"]).lower()
    if "refund" in text or "charged twice" in text:
        answer = {"category": "refund", "refund_cents": 4200}
    elif "error" in text or "crash" in text:
        answer = {"category": "bug", "refund_cents": 0}
    else:
        answer = {"category": "question", "refund_cents": 0}
    return LlmResponse(
        json.dumps(answer, sort_keys=True),
        model=request.model,
        input_tokens=len(text.split()),
        output_tokens=8,
        finish_reason="stop",
    )


def scripted_model() -> ScriptedLlmClient:
    """A deterministic stand-in for the model: refunds for "refund"/"charged twice", bugs
    for "error"/"crash", questions otherwise."""
    return ScriptedLlmClient(_classify)
