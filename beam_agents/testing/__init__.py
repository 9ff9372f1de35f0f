"""Test support for beam_agents' own tests.

A leaf: it may import every package of beam_agents, and nothing but tests (`*_test.py`) and
other test support imports it (`beam_agents/layout_test.py` enforces both). It is not in the
wheel (pyproject.toml, //:wheel): a Dataflow worker installs the wheel, and test support there
is code a pickled DoFn could drag along (tools/wheel_test.py checks both).
"""
