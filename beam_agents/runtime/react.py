"""A ready ReAct agent: the model reasons, calls tools, reads their results, and answers.

    triage = react_agent(
        model="gpt-4.1",
        tools=[ToolDefinition("kb_search", "Searches the knowledge base.", schema), ...],
        system="You answer support tickets.",
    )
    RunAgent(triage, llm_client=OpenAIChatClient(...))

The event's bytes (UTF-8) are the user's message. Each turn asks the model with the tools; an
answer without tool calls ends the activation with its text as the completion. The tool calls
of one answer become signed TOOL intents of one step (`call_tools`: parallel calls in one turn
are one suspension); their results, or their errors, go back to the model as tool messages in
the next turn. A call naming a tool the agent was not given emits no intent: the model is told
so in that call's tool message. So is each call past the first `max_tool_calls` of one answer
(default 16): one answer, which may list thousands, never fans out into more tool runs than
that, and the model may ask for the rest in its next turn. A model still calling tools after
`max_turns` turns is a `TurnLimitError` (the `agent_raised` dead letter).

It is a function agent (`beam_agents.runtime.function_agent`), so it is replay-safe as they are:
a resume runs the loop again from the top, every model turn answered from the key's replay
cache and every step's calls from their answers, until the first new turn. Everything it does
is a pure function of the event, the answers and the recorded model responses.
"""

from __future__ import annotations

from collections.abc import Sequence

from beam_agents._protos import ToolResult
from beam_agents.errors import TurnLimitError
from beam_agents.runtime.context import Answer
from beam_agents.runtime.function_agent import FunctionAgent
from beam_agents.runtime.tool_calling import ToolDefinition, assistant_message, tool_message

__all__ = ["react_agent"]


def react_agent(
    *,
    model: str,
    tools: Sequence[ToolDefinition],
    system: str = "",
    name: str = "beam_agents.react/v1",
    max_turns: int = 10,
    max_tool_calls: int = 16,
    **params: object,
) -> FunctionAgent:
    """A FunctionAgent running the ReAct loop of the module docstring. `params` (temperature,
    max_tokens, ...) go with every model call; `name` names the agent in its Continuation;
    `max_tool_calls` bounds the tools one model answer runs."""
    definitions = tuple(tools)
    known = {t.name for t in definitions}
    if len(known) != len(definitions):
        raise ValueError(f"two tools share a name in {[t.name for t in definitions]}")
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, not {max_turns}")
    if max_tool_calls < 1:
        raise ValueError(f"max_tool_calls must be at least 1, not {max_tool_calls}")
    over = (
        f"error: not run: one turn runs at most {max_tool_calls} tool calls; call it again in "
        "a later turn"
    )

    def run(ctx, event: bytes) -> bytes:
        messages: list[dict] = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": event.decode("utf-8", "replace")})
        for _ in range(max_turns):
            response = ctx.llm(messages, model=model, tools=definitions, **params)
            if not response.tool_calls:
                return response.text.encode("utf-8")
            messages.append(assistant_message(response.text, response.tool_calls))
            runs = [i for i, c in enumerate(response.tool_calls) if c.name in known]
            runs = set(runs[:max_tool_calls])
            asked = [(c.name, c.arguments) for i, c in enumerate(response.tool_calls) if i in runs]
            answers = iter(ctx.call_tools(asked) if asked else ())
            for position, call in enumerate(response.tool_calls):
                if position in runs:
                    content = _content(next(answers))
                elif call.name in known:
                    content = over
                else:
                    content = (
                        f"error: there is no tool {call.name!r}; the tools are {sorted(known)}"
                    )
                messages.append(tool_message(call.id, content))
        raise TurnLimitError(agent=name, turns=max_turns)

    return FunctionAgent(run, name)


def _content(answer: Answer) -> str:
    """What the model reads of a tool's answer: its payload, or its error."""
    result = answer.result
    if result is not None and result.status == ToolResult.OK:
        if not result.payload and result.error_message:
            # It took effect, but the effector kept no payload (over its max_result_bytes):
            # an empty answer would read as one that found nothing.
            return f"done, without its result: {result.error_message}"
        return result.payload.decode("utf-8", "replace")
    if result is None:
        return "error: no result"
    status = ToolResult.Status.Name(result.status)
    return f"error ({status}): {result.error_message}"
