"""Worked examples of beam_agents agents, shipped in the wheel so `beam-agents demo` runs
anywhere; examples/ at the top of the repository holds the pipelines that run them.

An example is written as a user would write an agent: it may import the layers below it
(`beam_agents.bus`, `beam_agents.integrations`, `beam_agents.runtime` and what the runtime
builds on), never the operator tools of `beam_agents.ops` (`beam_agents/layout_test.py`
enforces it).
"""
