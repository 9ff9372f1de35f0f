"""Tool calling, provider-neutral: the tools a model may call and the calls it makes.

A `ToolDefinition` (name, description, JSON Schema of the arguments) travels in
`LlmRequest.tools`; it is declared in Python or read from an MCP server's tool list
(`beam_agents.integrations.mcp_tools.tool_definitions`). A model's answer carries its calls in
`LlmResponse.tool_calls`, each a `ToolCall` with the model's call id, the tool's name and the
arguments as a JSON object (I-JSON, so a call becomes a ToolIntent's RFC 8785 args_json as is).

A conversation with tool calls is a list of messages in one format that every client in
`beam_agents.integrations.llm` accepts, OpenAI's chat format (the OpenAI client sends it unchanged;
the Anthropic and Gemini clients translate it):

* `{"role": "system" | "user", "content": str}`;
* `assistant_message(response)`: `{"role": "assistant", "content": str | None, "tool_calls":
  [{"id", "type": "function", "function": {"name", "arguments": JSON text}}]}`;
* `tool_message(call_id, content)`: `{"role": "tool", "tool_call_id": str, "content": str}`.

Names are what every provider accepts for a function, `[A-Za-z0-9_-]{1,64}`, so a definition
that one provider would refuse fails where it is made, not at the model.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from beam_agents.intents.identity import canonical_args_json

__all__ = [
    "TOOL_NAME",
    "ToolCall",
    "ToolDefinition",
    "assistant_message",
    "tool_message",
]

#: What OpenAI, Anthropic and Gemini all accept as a function name.
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclasses.dataclass(frozen=True)
class ToolDefinition:
    """A tool the model may call: `parameters` is the JSON Schema of its arguments object."""

    name: str
    description: str = ""
    parameters: Mapping[str, object] = dataclasses.field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not TOOL_NAME.fullmatch(self.name):
            raise ValueError(
                f"tool name {self.name!r} is not one every provider accepts ({TOOL_NAME.pattern})"
            )
        if not isinstance(self.parameters, Mapping) or self.parameters.get("type") != "object":
            raise ValueError(
                f"tool {self.name}: parameters must be the JSON Schema of an object, "
                f"not {self.parameters!r}"
            )

    def to_json(self) -> dict:
        return {
            "description": self.description,
            "name": self.name,
            "parameters": dict(self.parameters),
        }


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: its id (the provider's, echoed in the tool's answer), the
    tool's name and the arguments object."""

    id: str
    name: str
    arguments: Mapping[str, object] = dataclasses.field(default_factory=dict)


def assistant_message(text: str, tool_calls: tuple[ToolCall, ...]) -> dict:
    """The model's turn as the conversation records it (see the module docstring)."""
    message: dict = {"role": "assistant", "content": text or None}
    if tool_calls:
        message["tool_calls"] = [
            {
                "function": {"arguments": canonical_args_json(c.arguments), "name": c.name},
                "id": c.id,
                "type": "function",
            }
            for c in tool_calls
        ]
    return message


def tool_message(call_id: str, content: str) -> dict:
    """A tool's answer to the call `call_id`, as the conversation records it."""
    return {"content": content, "role": "tool", "tool_call_id": call_id}
