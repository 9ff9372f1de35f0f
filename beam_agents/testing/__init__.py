"""Test support for beam_agents and for users' own tests."""
