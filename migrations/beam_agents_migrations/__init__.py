"""Registered state-schema migration steps (see beam_agents.core.migration)."""
