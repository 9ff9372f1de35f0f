"""Signed intents, tools and effectors shared by the effector's tests
(beam_agents/intents/effector/).

`signed()` is samples.intent() signed with RING; `effector()` is an Effector over an in-memory
store on a manual clock at NOW, between the sample intent's created_at and expires_at.
"""

from __future__ import annotations

from beam_agents._protos import ToolIntent
from beam_agents.intents.effector import Effector, VerifyMode
from beam_agents.intents.signing import Keyring, sign
from beam_agents.ops.rounds import ManualClock
from beam_agents.testing.samples import intent

__all__ = [
    "INT64_MAX",
    "KEYS",
    "NOW",
    "RING",
    "Recording",
    "effector",
    "flaky",
    "lookup",
    "signed",
    "tampered",
]

NOW = 1_700_000_030_000  # between samples.intent()'s created_at and expires_at
KEYS = {"k1": bytes(range(32))}
RING = Keyring(KEYS, active="k1")
INT64_MAX = 2**63 - 1


def lookup(args: dict, tool_intent: ToolIntent) -> bytes:
    return f"{tool_intent.intent_id}:{args['id']}".encode()


def flaky(args: dict, tool_intent: ToolIntent) -> bytes:
    raise TimeoutError("upstream took 30s")


class Recording:
    def __init__(self):
        self.calls = []

    def __call__(self, args, tool_intent):
        self.calls.append(tool_intent.intent_id)
        return "done"


def signed(**overrides) -> ToolIntent:
    return sign(intent(**overrides), RING)


def effector(mode=VerifyMode.REQUIRE, *, store=":memory:", clock=None, **tools) -> Effector:
    return Effector(
        tools or {"crm.lookup": lookup},
        mode=mode,
        store=store,
        keyring=RING,
        clock=clock or ManualClock(NOW),
    )


def tampered() -> ToolIntent:
    """A signed intent whose args changed after signing."""
    bad = signed()
    bad.args_json = '{"id":666}'
    return bad
