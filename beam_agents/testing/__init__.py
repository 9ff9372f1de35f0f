"""Test support for beam_agents and for users' own tests.

A leaf: it may import every package of beam_agents, and nothing but tests (`*_test.py`) and
other test support imports it (`beam_agents/layout_test.py` enforces both).
"""
