"""The integrations: the runtime's contracts met by other people's software, each behind an
optional extra, so that a worker imports none of their SDKs unless a job uses them.

It owns the LLM clients on the providers' SDKs (`llm`: `openai_chat`, `anthropic_messages`,
`gemini`, sharing `resilience`), agents written with LangGraph (`langgraph`), TraceEvents as
OpenTelemetry spans (`telemetry`) and tools served by MCP servers (`mcp_tools`). Import each
from its own module; this package imports none of them.

It may import the layers below it: `beam_agents.runtime`, `beam_agents.intents`,
`beam_agents.state`, `beam_agents.wire`, `beam_agents.errors` and the bindings
(`beam_agents/layout_test.py` enforces it).
"""
