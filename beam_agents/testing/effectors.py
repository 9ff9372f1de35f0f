"""Signed intents, tools and effectors shared by the effector's tests
(beam_agents/intents/effector/).

`signed()` is samples.intent() signed with RING; `effector()` is an Effector over an in-memory
store on a manual clock at NOW, between the sample intent's created_at and expires_at;
`effector_process()` is an Effector in a child process of its own, `deliver()` hands it an
intent.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

from beam_agents._protos import ToolIntent
from beam_agents.intents.effector import DEFAULT_LEASE_MS, Effector, VerifyMode
from beam_agents.intents.signing import KEYS_ENV, Keyring, sign
from beam_agents.ops.rounds import ManualClock
from beam_agents.testing.samples import intent

__all__ = [
    "INT64_MAX",
    "KEYS",
    "NOW",
    "RING",
    "Recording",
    "deliver",
    "effector",
    "effector_process",
    "flaky",
    "killed_inside",
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


# The child of `effector_process`: argv is STORE LOG NOW LEASE_MS THEN.
_EFFECTOR_PROCESS = """
import json, os, signal, sys, time
from beam_agents.intents.effector import Effector, VerifyMode, wall_clock_ms
from beam_agents.intents.signing import Keyring

store, log, now, lease_ms, then = sys.argv[1:6]

def tool(args, intent):
    with open(log, "a") as f:
        f.write(intent.intent_id + "\\n")
    if then == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    if then == "block":
        print(json.dumps({"running": os.getpid()}), flush=True)
        time.sleep(3600)
    return "looked up %d" % args["id"]

effector = Effector({"crm.lookup": tool}, mode=VerifyMode.REQUIRE, store=store,
                    keyring=Keyring.from_environment(), lease_ms=int(lease_ms),
                    clock=wall_clock_ms if now == "wall" else lambda: int(now))
print(json.dumps({"ready": os.getpid()}), flush=True)
for line in sys.stdin:
    out = effector(bytes.fromhex(line))
    result, asked = out.result.tool_result if out.result else None, out.approval
    print(json.dumps({"route": out.route.value,
                      "asks": asked.intent_id if asked else None,
                      "asked_at_ms": asked.created_at_ms if asked else None,
                      "status": result.status if result else None,
                      "payload": result.payload.decode() if result else None,
                      "error": result.error_message if result else None}), flush=True)
"""


def effector_process(
    store, log, *, now: int | str = "wall", lease_ms=DEFAULT_LEASE_MS, then="return", prefix=()
) -> subprocess.Popen:
    """An Effector of crm.lookup in a child process, started with `prefix` (say, unshare), on the
    SQLite file `store`, verifying with RING's keys, its clock fixed at `now` or the wall
    clock. Its tool writes each call's intent_id to the file `log`, then returns ("return"),
    kills its process ("die") or prints {"running": PID} and blocks until it is killed
    ("block"). Once it is ready, its pid as it sees it (in its own PID namespace) is its
    `pid_inside`."""
    keys = {name: base64.b64encode(key).decode() for name, key in KEYS.items()}
    process = subprocess.Popen(
        [*prefix, sys.executable, "-c", _EFFECTOR_PROCESS]
        + [str(arg) for arg in (store, log, now, lease_ms, then)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, KEYS_ENV: json.dumps({"keys": keys})},
    )
    process.pid_inside = json.loads(process.stdout.readline())["ready"]
    return process


def deliver(process: subprocess.Popen, data: bytes) -> dict | None:
    """Hands an `effector_process` an intent: what it printed of the output, or None when it
    died first."""
    process.stdin.write(data.hex() + "\n")
    process.stdin.flush()
    line = process.stdout.readline()
    return json.loads(line) if line else None


# An effector process whose tool acts, notes what it answered in a ledger and is killed before
# its result is recorded: the call took effect, and its claim is left to a dead process.
_KILLED_INSIDE = """
import os, signal, sys
from beam_agents.intents.effector import Effector, VerifyMode
from beam_agents.intents.signing import Keyring
from beam_agents.ops.loading import load_object

store, tools, name, ledger, now = sys.argv[1:]
real = load_object(tools)[name]

def dying(args, intent):
    answer = real(args, intent)
    with open(ledger, "ab") as f:
        f.write(answer + b"\\n")
        f.flush()
        os.fsync(f.fileno())
    os.kill(os.getpid(), signal.SIGKILL)

Effector({name: dying}, mode=VerifyMode.REQUIRE, store=store, keyring=Keyring.from_environment(),
         clock=lambda: int(now))(sys.stdin.buffer.read())
"""


def killed_inside(
    store: Path, data: bytes, *, tools: str, keyring: Keyring, now: int, ledger: Path
) -> int:
    """Delivers the serialized intent `data` to an effector process on the SQLite file `store`
    verifying with `keyring`, whose tool (of the dict MODULE:NAME `tools`) acts, appends its
    answer to `ledger` and is killed (SIGKILL) before anything is recorded; returns the
    process's exit status."""
    ring = {"keys": {k: base64.b64encode(v).decode() for k, v in keyring.keys.items()}}
    name = ToolIntent.FromString(data).tool_name
    return subprocess.run(
        [sys.executable, "-c", _KILLED_INSIDE, str(store), tools, name, str(ledger), str(now)],
        input=data,
        env={**os.environ, KEYS_ENV: json.dumps(ring)},
        check=False,
        timeout=120,
    ).returncode
