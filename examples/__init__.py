"""Worked examples of beam_agents agents and pipelines."""
