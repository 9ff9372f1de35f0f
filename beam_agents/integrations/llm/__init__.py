"""LLM clients behind the runtime's LlmClient protocol (optional extras)."""
