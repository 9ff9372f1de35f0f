"""beam_agents: LLM agents with durable keyed state on Apache Beam and Google Dataflow.

Each agent (one per entity key) keeps its working memory, LLM replay cache and suspension
continuation as protobuf keyed state in a Beam stateful DoFn. The wire and state schemas are in
protos/beam_agents.proto; their messages are part of the API below.

The public API is what `__all__` lists, imported from here:

    from beam_agents import RunAgent, agent, ExecuteIntents, Effector, AgentEnvelope

To run an agent locally end to end (its tool calls executed, its approval requests answered and
fed back round by round, as a message bus does in production), `run_locally` (a `LocalRun`):

    run = run_locally(my_agent, [b"an event"], tools={"stock.lookup": lookup},
                      approver=lambda intent: True, llm_client=ScriptedLlmClient(model))

Names resolve on first use (PEP 562), so importing the package stays cheap for the command line;
each comes from the module that owns it. Integrations that need an optional extra are imported from
their own modules: `beam_agents.integrations.llm.openai_chat`, `.anthropic_messages` and `.gemini`
(LLM clients), `beam_agents.integrations.langgraph`, `beam_agents.integrations.telemetry`,
`beam_agents.integrations.mcp_tools` and `beam_agents.ops.console`.

The package root is the top of the layers below it (the guide, "Layout"); importing it installs the
finder of the module paths the packages had before they were cut by concept (`_moved`), and
drops the one warning Beam logs on import about apitools, a Google Cloud client beam_agents
never uses.
"""

from __future__ import annotations

import importlib
import logging

from beam_agents import _moved, _protos

_moved.install()


def _not_apitools(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("apitools not found")


# Importing Beam warns on the root logger that apitools, a Google Cloud client Beam's BigQuery
# IO uses and beam_agents never does, is missing: noise on every command. Every import of
# beam_agents passes here before it imports Beam, so that one warning is dropped, and only it.
logging.getLogger().addFilter(_not_apitools)

#: Each public name and the module that owns it.
_OWNERS = {
    # The wire: every message of protos/beam_agents.proto (its bindings are cheap to import).
    **dict.fromkeys(_protos.__all__, "beam_agents._protos"),
    **dict.fromkeys(
        (
            "COMPLETIONS",
            "ERRORS",
            "INTENTS",
            "RECORDS",
            "SNAPSHOTS",
            "TRACES",
            "ActivationContext",
            "Agent",
            "Answer",
            "AtDeadline",
            "Budget",
            "Completion",
            "DeadlinePolicy",
            "LlmClient",
            "LlmRequest",
            "LlmResponse",
            "OnBudget",
            "Price",
            "Recording",
            "RefusingLlmClient",
            "RunAgent",
            "RuntimeConfig",
            "ScriptedLlmClient",
            "Suspension",
            "ToolCall",
            "ToolDefinition",
            "agent",
            "react_agent",
        ),
        "beam_agents.runtime",
    ),
    **dict.fromkeys(
        (
            # ExecuteIntents' output tags, beside RunAgent's (COMPLETIONS, INTENTS, ...).
            "APPROVALS",
            "DEAD_LETTERS",
            "RESULTS",
            "Effector",
            "ExecuteIntents",
            "SqliteExecutionStore",
            "ToolSpec",
            "VerifyMode",
            "content_digest",
        ),
        "beam_agents.intents.effector",
    ),
    **dict.fromkeys(("Memory", "ReplayCache"), "beam_agents.state"),
    **dict.fromkeys(("Keyring", "sign", "verify"), "beam_agents.intents.signing"),
    **dict.fromkeys(("AgentLoop", "EffectorService", "Topics"), "beam_agents.bus"),
    # The local loop: an agent end to end on local pipelines, answers fed back round by round.
    **dict.fromkeys(
        (
            "Approver",
            "Completed",
            "LocalRun",
            "ModelCall",
            "Step",
            "approval_answer",
            "run_locally",
        ),
        "beam_agents.ops.local_run",
    ),
    # Backtest: a candidate agent over a recorded history (RunAgent's RECORDS).
    **dict.fromkeys(
        (
            "Backtest",
            "BacktestOptions",
            "backtest_html",
            "backtest_markdown",
            "run_backtest",
            "backtest_summary",
            "tool_changes",
        ),
        "beam_agents.ops.backtest",
    ),
    "ShadowAgent": "beam_agents.ops.shadow",
    # Files of messages as the commands read them (backtest's records, replay's intents).
    **dict.fromkeys(("join_delimited", "split_delimited"), "beam_agents.wire.fields"),
    "BeamAgentsError": "beam_agents.errors",
}

__all__ = sorted(_OWNERS)


def __getattr__(name: str):
    owner = _OWNERS.get(name)
    if owner is None:
        raise AttributeError(f"module 'beam_agents' has no attribute {name!r}")
    value = getattr(importlib.import_module(owner), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
