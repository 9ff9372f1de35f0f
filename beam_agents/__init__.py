"""beam_agents: LLM agents with durable keyed state on Apache Beam and Google Dataflow.

Each agent (one per entity key) keeps its working memory, LLM replay cache and suspension
continuation as protobuf keyed state in a Beam stateful DoFn. The wire and state schemas are in
protos/beam_agents.proto; their messages are part of the API below.

The public API is what `__all__` lists, imported from here:

    from beam_agents import RunAgent, agent, ExecuteIntents, Effector, AgentEnvelope

Names resolve on first use (PEP 562), so importing the package stays cheap for the command line;
each comes from the module that owns it. Integrations that need an optional extra are imported from
their own modules: `beam_agents.integrations.llm.openai_chat`, `.anthropic_messages` and `.gemini`
(LLM clients), `beam_agents.integrations.langgraph`, `beam_agents.integrations.telemetry`,
`beam_agents.integrations.mcp_tools` and `beam_agents.ops.console`.

The package root is the top of the layers below it (the guide, "Layout"); importing it installs the
finder of the module paths the packages had before they were cut by concept (`_moved`).
"""

from __future__ import annotations

import importlib

from beam_agents import _moved, _protos

_moved.install()

#: Each public name and the module that owns it.
_OWNERS = {
    # The wire: every message of protos/beam_agents.proto (its bindings are cheap to import).
    **dict.fromkeys(_protos.__all__, "beam_agents._protos"),
    **dict.fromkeys(
        (
            "COMPLETIONS",
            "ERRORS",
            "INTENTS",
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
            "Effector",
            "ExecuteIntents",
            "SqliteExecutionStore",
            "ToolSpec",
            "VerifyMode",
        ),
        "beam_agents.intents.effector",
    ),
    **dict.fromkeys(("Memory", "ReplayCache"), "beam_agents.state"),
    **dict.fromkeys(("Keyring", "sign", "verify"), "beam_agents.intents.signing"),
    **dict.fromkeys(("AgentLoop", "EffectorService", "Topics"), "beam_agents.bus"),
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
