"""The demo's fixed parts: its one customer and ticket, its keys (fixed bytes, public, never a
secret), the scripted approver's signed answer, RunAgent running the support-triage agent
with the scripted model and those keys, and the changed prompt the demo ends by backtesting."""

from __future__ import annotations

from beam_agents._protos import AgentEnvelope, ToolIntent
from beam_agents.examples.support_triage import (
    SYSTEM,
    scripted_model,
    ticket,
    triage,
    triage_with_prompt,
)
from beam_agents.intents.signing import Keyring
from beam_agents.ops.local_run import approval_answer
from beam_agents.runtime import Recording, RunAgent, agent

__all__ = [
    "CUSTOMER",
    "DEMO_KEY_ID",
    "DEMO_PASSWORD",
    "DEMO_USER",
    "TICKET",
    "approve",
    "candidate_triage",
    "demo_approver_keyring",
    "demo_effector_keyring",
    "demo_inquiry_keyring",
    "demo_keyring",
    "demo_ticket",
    "triage_agent",
]

DEMO_KEY_ID = "demo-key"
CUSTOMER = b"c-1"
TICKET = ("t-1", "c-1", "I was charged twice, please refund me")
DEMO_USER = "demo"
#: The demo console's one password: printed by the demo for anyone to use, never a secret.
DEMO_PASSWORD = "beam-agents-demo"


def demo_keyring() -> Keyring:
    """The demo's signing key: fixed bytes, labelled as what they are (never a real secret)."""
    return Keyring(
        {DEMO_KEY_ID: b"beam_agents demo key, not a secret, 32+ bytes"}, active=DEMO_KEY_ID
    )


def demo_effector_keyring() -> Keyring:
    """The demo effector's key, which signs its results (as fixed and as public as the rest)."""
    return Keyring(
        {"demo-effector": b"beam_agents demo effector key, not a secret"}, active="demo-effector"
    )


def demo_inquiry_keyring() -> Keyring:
    """The demo effector's key for its inquiries about lost calls, which the console verifies
    (a ring of its own: the console never holds the key that signs results)."""
    return Keyring(
        {"demo-inquiry": b"beam_agents demo inquiry key, not a secret"}, active="demo-inquiry"
    )


def demo_approver_keyring() -> Keyring:
    """The demo approvals channel's key, which signs its decisions."""
    return Keyring(
        {"demo-approver": b"beam_agents demo approver key, not a secret"}, active="demo-approver"
    )


def approve(intent: ToolIntent) -> AgentEnvelope:
    """The scripted approver's answer to an approval intent: approved, by ops@example.com, a
    millisecond after the intent was made, bound to the intent's content and signed."""
    return approval_answer(
        intent,
        approved=True,
        approver="ops@example.com",
        keyring=demo_approver_keyring(),
        decided_at_ms=intent.created_at_ms + 1,
    )


def triage_agent(recording: Recording | None = None) -> RunAgent:
    """RunAgent running the support-triage agent with the scripted model, signing its intents
    with the demo key and verifying results with the effector's key and approvals with the
    approver's; recording its activations when given a `recording`."""
    return RunAgent(
        triage,
        llm_client=scripted_model(),
        keyring_loader=demo_keyring,
        result_keyring_loader=demo_effector_keyring,
        approval_keyring_loader=demo_approver_keyring,
        recording=recording,
    )


#: The prompt change the demo backtests: the model is also asked for the refund's reason.
CANDIDATE_SYSTEM = SYSTEM + ' Add "reason": <a few words on why>.'


@agent(name="examples.support_triage/v2")
def candidate_triage(ctx, event: bytes) -> bytes:
    """The triage agent with the changed prompt (CANDIDATE_SYSTEM)."""
    return triage_with_prompt(ctx, event, CANDIDATE_SYSTEM)


def demo_ticket(event_time_ms: int) -> AgentEnvelope:
    """The demo's one external event: customer c-1's ticket asking for a refund."""
    ticket_id, customer_id, text = TICKET
    return AgentEnvelope(
        entity_key=CUSTOMER,
        event_time_ms=event_time_ms,
        external_event=ticket(ticket_id, customer_id, text),
    )
