"""How the runtime reads a ToolIntent's kind.

`kind` was added to ToolIntent without a schema bump, so intents written before it existed
carry TOOL_KIND_UNSPECIFIED. Those were tool calls; only an explicit APPROVAL goes to a human.
"""

from __future__ import annotations

from beam_agents._protos import ToolIntent

__all__ = ["effective_kind"]


def effective_kind(intent: ToolIntent) -> ToolIntent.Kind.ValueType:
    """TOOL or APPROVAL; TOOL_KIND_UNSPECIFIED reads as TOOL."""
    if intent.kind == ToolIntent.APPROVAL:
        return ToolIntent.APPROVAL
    return ToolIntent.TOOL
