"""Worked examples of beam_agents agents, shipped in the wheel so `beam-agents demo` runs
anywhere; examples/ at the top of the repository holds the pipelines that run them."""
