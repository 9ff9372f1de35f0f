"""`beam-agents demo`: the support-triage agent end to end, locally, with no network and no keys.

Each round is one real Beam pipeline (`TriageRound`): RunAgent runs the example agent
(beam_agents.examples.support_triage) for the customer's key, ExecuteIntents executes its tool
intents once with the stand-in tools, and a scripted approver answers approval requests. A
pipeline cannot loop, so the rounds are chained the way a message bus would close the loop in
production: each round ends by exporting the key's StateSnapshot, and the next round restores it
together with the answers the previous round produced. Intents are signed with a demo key made
for this run and verified by the effector in REQUIRE mode.

The account it prints follows the conversation: each activation, the intents it emitted and
what the effector or the approver answered, each suspension and resume, the exported snapshots,
and at the end the activation's traces as a tree. `python examples/support_triage.py` runs the
same rounds with ordinary Beam pipeline options (`--runner=...`).

`--bus=kafka` runs the same conversation as a production deployment would: one streaming job
(`add_triage_loop`, beam_agents.bus.AgentLoop) reads its events from Kafka, the effector
runs as its own process (`beam-agents effector-service`) on the intents topic, and the demo
plays the approver on the approvals topic. It needs a Kafka broker and Beam's Java expansion
service (`--kafka_bootstrap`, `--expansion_service`) and a runner that runs unbounded
cross-language pipelines: `bash tools/engines.sh flink-demo` runs it on a local Flink cluster.

`--bus=kafka --console` leaves the approval to a person: `beam-agents console` runs as its own
process on the loop (`launch_console`; the beam-agents[console] extra), verifying the approval
intents with the demo's intent key and signing the decision with the demo approver's key, which
the agent verifies answers with. The demo prints its URL and the one demo user's password (a
fixed, public demo credential, hashed with argon2 when the console starts) and waits, up to
the intent's hour, for the decision to come back on the events topic.

It may import what the operator tools may, every layer below them (the example agent, the bus,
the runtime, the intents and their effector, state, wire, errors and the bindings) and the other
operator tools it drives (`cli`, `console`, `processes`, `rounds`); `beam_agents/layout_test.py`
enforces it.

The package: `parts` (the demo's customer, ticket, keys, the scripted approver's answer and the
agent's RunAgent), `account` (what it prints), `local` (the rounds on local pipelines), `bus`
(the loop on Kafka, the effector and console as processes) and `command` (the command line;
`python -m beam_agents.ops.demo`). Objects named `beam_agents.ops.demo:NAME` on a command line (the
effector service's and the console's keyrings) resolve through the names below.
"""

from __future__ import annotations

from beam_agents.ops.demo.bus import add_triage_loop, launch_console, launch_effector, run_bus_demo
from beam_agents.ops.demo.command import main
from beam_agents.ops.demo.local import ScriptedApprover, TriageRound, run_demo
from beam_agents.ops.demo.parts import (
    CUSTOMER,
    DEMO_KEY_ID,
    DEMO_PASSWORD,
    DEMO_USER,
    approve,
    demo_approver_keyring,
    demo_effector_keyring,
    demo_inquiry_keyring,
    demo_keyring,
    demo_ticket,
    triage_agent,
)

__all__ = [
    "CUSTOMER",
    "DEMO_KEY_ID",
    "DEMO_PASSWORD",
    "DEMO_USER",
    "ScriptedApprover",
    "TriageRound",
    "add_triage_loop",
    "approve",
    "demo_approver_keyring",
    "demo_effector_keyring",
    "demo_inquiry_keyring",
    "demo_keyring",
    "demo_ticket",
    "launch_console",
    "launch_effector",
    "main",
    "run_bus_demo",
    "run_demo",
    "triage_agent",
]
