"""Recorded histories for the backtest's tests, made fast: `record_history` runs an agent
through the runtime's per-key machine with recording on (the code RunAgent runs, without a
pipeline per round), answering every intent at once from a tool table and an approver, as an
effector and a person would. A thousand triage tickets take a few seconds; the pipeline test
of recording itself (beam_agents/runtime/recording_test.py) proves RunAgent emits the same
records.

`triage_tickets` makes tickets for the triage agent (beam_agents/examples/support_triage.py):
refund requests, bugs and questions, from the six customers of its CRM stand-in.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Mapping

from beam_agents._protos import ActivationRecord, AgentEnvelope, ToolIntent, ToolResult
from beam_agents.examples.support_triage import ticket
from beam_agents.intents.identity import content_digest, parse_args_json
from beam_agents.runtime import INTENTS, RECORDS, LlmClient, Recording, RuntimeConfig
from beam_agents.runtime.context import Agent
from beam_agents.runtime.key_driver import KeyDriver, recording_machine

__all__ = ["T0", "record_history", "triage_tickets"]

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
        while driver:
            for tag, value in driver.step():
                if tag == RECORDS:
                    records.append(value)
                elif tag == INTENTS:
                    driver.schedule(_answer(value, tools, approver))
    return records


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
