"""`beam-agents console`: an approvals inbox and an agent viewer in the browser, behind real
auth, as its own process on a Kafka loop (the beam-agents[console] extra).

Modules: `config` (the TOML file: loop, keys, users), `db` (the one SQLite file), `inbox`
(approvals in, exactly-once signed decisions out), `observed` (snapshots, traces, dead letters
for the viewer), `timeline` (a trace as bars, with the waits for a person), `status` (an
agent's status line), `display` (text, times, why an approval cannot be decided), `auth`
(argon2 passwords, sessions, CSRF, login rate limit), `bus` (the Kafka side), `app` (the
Starlette application and its templates), `service` (the process).

It may import what the operator tools may, every layer below them; it uses `beam_agents.bus`,
`beam_agents.intents` (the effector's approvals, identity and signing), `beam_agents.errors`, the
bindings and `beam_agents.ops.loading` (`beam_agents/layout_test.py` enforces it).
"""

__all__: list[str] = []
