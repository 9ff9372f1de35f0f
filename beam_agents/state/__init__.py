"""The state: what an agent keeps in Beam keyed state between activations, as this binary
reads it.

It owns the state-schema versions and the read-path migration of the keyed-state blobs
(`migration`: every blob a new binary reads goes through `migrate_to_current`, with the steps
registered in `beam_agents_migrations`), and the views an agent gets of them (`memory`:
`Memory`, the working memory, and `ReplayCache`, the LLM replay cache, both LRU maps over their
blobs). Which state spec ids hold the blobs, and with which coders, is RunAgent's
(`beam_agents.runtime`); `beam_agents/ops/state_manifest.json` freezes them.

It may import the layers below it: `beam_agents.wire`, `beam_agents.errors` and the bindings
(`beam_agents/layout_test.py` enforces it).
"""

from beam_agents.state.memory import Memory, ReplayCache

__all__ = ["Memory", "ReplayCache"]
