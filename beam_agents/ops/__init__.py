"""The operations: everything a person runs against agents, their state and their loop.

It owns the `beam-agents` command line (`cli`: new, inspect, dry-run, replay, update-check,
export-traces, effector-service, demo, console) and what its commands are made of: the
project `new` writes (`scaffold`), an agent run locally end to end (`local_run`, the public
`run_locally`), Beam's Prism runner as tools/engines.sh builds it (`prism`), migration
verdicts and the dry run (`preflight`), one activation re-run offline (`replay`), two builds'
graphs compared as `--update` matches them (`update_check`) and the committed description of
the keyed state a running job depends on (`state_manifest`, `state_manifest.json`), scripted
rounds of a real pipeline on a manual clock (`rounds`), child processes with their output in a
log (`processes`), objects named MODULE:NAME on a command line (`loading`), the demo (`demo`)
and the approvals console (`console`, the beam-agents[console] extra).

It may import every layer below it: `beam_agents.examples`, `beam_agents.bus`,
`beam_agents.integrations`, `beam_agents.runtime`, `beam_agents.intents`, `beam_agents.state`,
`beam_agents.wire`, `beam_agents.errors` and the bindings (`beam_agents/layout_test.py`
enforces it). Only tests (`beam_agents.testing`) and the public API sit above it. Its modules
import what they need when a command asks for it, so `beam-agents inspect` stays cheap.
"""
