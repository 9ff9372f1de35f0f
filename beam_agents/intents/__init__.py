"""The intents: what an agent asks the world to do, and the one place where it is done.

It owns a ToolIntent's identity and canonical arguments (`identity`: deterministic intent ids,
RFC 8785 canonical args_json, content digests), its signatures and their keyrings (`signing`),
and the effector (`effector`: the gate every intent goes through at most once, its execution
stores and its Beam transform `ExecuteIntents`). The runtime, above, emits intents and checks
the answers against them; the effector executes them and never needs the runtime.

It may import the layers below it: `beam_agents.state`, `beam_agents.wire`,
`beam_agents.errors` and the bindings (`beam_agents/layout_test.py` enforces it). Importing it
is cheap: the effector (and Beam) load only when `beam_agents.intents.effector` is imported.
"""
