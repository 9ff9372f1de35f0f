"""LLM clients behind the runtime's LlmClient protocol (optional extras).

It may import what the integrations may, the layers below them: `beam_agents.runtime` (the
protocol and its requests), `beam_agents.intents`, `beam_agents.state`, `beam_agents.wire`,
`beam_agents.errors` and the bindings; nothing of the bus beside it or of the layers above
(`beam_agents/layout_test.py` enforces it).
"""
