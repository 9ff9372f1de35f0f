"""An effector service for fault tests, killed (SIGKILL) at the moments a test names.

`python -m beam_agents.testing.chaos BOOTSTRAP PREFIX DIR` serves the loop `PREFIX` like
`beam-agents effector-service`, with its store at DIR/effector.sqlite and three stand-in tools
over one stand-in external system, DIR/ledger.jsonl (a line per effect, keyed by the call's
idempotency key, the intent_id):

* `payments.refund`, idempotent: a second call with a known key has no second effect;
* `crm.note`, reconciled: its `check` looks the key up in the ledger;
* `mail.send`, plain: neither.

Each call is logged to DIR/calls.log before it acts. A file DIR/die-in-TOOL makes the next
call of TOOL act and then kill the process (the effect happened, no result was sent); a file
DIR/die-after-approval kills it once an APPROVAL record is durable, before its request is
sent; DIR/die-after-request, once the broker acknowledged the request of a newly recorded
APPROVAL, before the intent's offset is committed (the redelivered intent sends it again).
The two approval files fire on two different approvals, die-after-approval first. Each such
file is removed as it fires, so a restarted service goes on. The service
prints `served ROUTE` to stdout for every message it handles. `FX_INSTANCE_ID` makes it a
static group member; `FX_SESSION_TIMEOUT_MS` sets its session timeout; `FX_LEASE_MS` its
effector's lease (default 2 s, so a restart finds a killed call's claim lost within 2 s rather
than the production default's 30 s; its tools return at once).

`python -m beam_agents.testing.chaos BOOTSTRAP PREFIX DIR triage` serves the support-triage
loop's own tools instead (beam_agents.examples.support_triage.TOOLS, the demo's keyrings, as
`beam-agents effector-service` does for beam_agents.testing.triage_loop), each call logged to
calls.log and its effect to the ledger (`triage_tools`: the lookup idempotent, the refund
reconciled): the execution logs the Flink fault tests check every effect against. The
die-in-TOOL and die-after-* files work there too, and a file DIR/payments-down makes the
refund's reconciler fail (the payments API cannot say), so a refund whose call was lost goes to
a person as an inquiry.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

from beam_agents._protos import ExecutionRecord, ToolIntent
from beam_agents.intents.effector import Effector, SqliteExecutionStore, ToolSpec, VerifyMode
from beam_agents.intents.signing import Keyring

__all__ = ["APPROVER_RING", "RESULTS_RING", "Ledger", "main", "triage_tools"]

RESULTS_RING = Keyring({"fx": bytes(range(1, 33))}, active="fx")
APPROVER_RING = Keyring({"ap": bytes(range(2, 34))}, active="ap")


class Ledger:
    """The external system's own record of effects, one JSON line each."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / "ledger.jsonl"

    def effects(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def find(self, key: str) -> dict | None:
        return next((e for e in self.effects() if e["key"] == key), None)

    def act(self, tool: str, key: str, *, dedupe: bool) -> dict:
        if dedupe and (known := self.find(key)) is not None:
            return known
        effect = {"tool": tool, "key": key, "effect": len(self.effects()) + 1}
        with self.path.open("a") as f:
            f.write(json.dumps(effect) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return effect


def _tool(directory: Path, name: str, *, dedupe: bool, answer=None):
    """A tool that logs its call, acts on the ledger and answers the effect, or what
    `answer(args, intent)` returns."""
    ledger = Ledger(directory)

    def call(args: dict, intent: ToolIntent) -> bytes:
        with (directory / "calls.log").open("a") as f:
            f.write(f"{name} {intent.intent_id}\n")
        effect = ledger.act(name, intent.intent_id, dedupe=dedupe)
        _die_if(directory / f"die-in-{name}")
        return json.dumps(effect).encode() if answer is None else answer(args, intent)

    return call


def _die_if(marker: Path) -> None:
    if marker.exists():
        marker.unlink()
        os.kill(os.getpid(), signal.SIGKILL)


def tools(directory: Path) -> dict:
    ledger = Ledger(directory)

    def check(intent: ToolIntent) -> bytes | None:
        found = ledger.find(intent.intent_id)
        return None if found is None else json.dumps(found).encode()

    return {
        "payments.refund": ToolSpec(
            _tool(directory, "payments.refund", dedupe=True), idempotent=True
        ),
        "crm.note": ToolSpec(_tool(directory, "crm.note", dedupe=False), reconcile=check),
        "mail.send": _tool(directory, "mail.send", dedupe=False),
    }


def triage_tools(directory: Path) -> dict:
    """The support-triage tools, each call logged in `directory`, declared as a production
    effector would declare them: the CRM lookup is a read, safe to run again (idempotent; the
    ledger keeps one entry per intent); the refund is reconciled against the ledger, which
    answers what the refund answered, unless `directory`/payments-down exists."""
    from beam_agents.examples.support_triage import TOOLS

    ledger = Ledger(directory)
    refund = TOOLS["payments.refund"]

    def refunded(intent: ToolIntent) -> bytes | None:
        if (directory / "payments-down").exists():
            raise ConnectionError("the payments API is down")
        if ledger.find(intent.intent_id) is None:
            return None
        return refund(json.loads(intent.args_json), intent)

    lookup = _tool(directory, "crm.lookup", dedupe=True, answer=TOOLS["crm.lookup"])
    return {
        "crm.lookup": ToolSpec(lookup, idempotent=True),
        "payments.refund": ToolSpec(
            _tool(directory, "payments.refund", dedupe=False, answer=refund), reconcile=refunded
        ),
    }


class _DyingStore(SqliteExecutionStore):
    def __init__(self, directory: Path) -> None:
        super().__init__(directory / "effector.sqlite")
        self._directory = directory
        #: A new approval was recorded while die-after-request was armed: the service dies
        #: at the commit that follows its request's acknowledgement.
        self.request_pending = False

    def claim(self, record: ExecutionRecord, keep_until_ms: int):
        known = super().claim(record, keep_until_ms)
        if known is None and record.outcome == ExecutionRecord.OUTCOME_APPROVAL:
            _die_if(self._directory / "die-after-approval")
            self.request_pending = (self._directory / "die-after-request").exists()
        return known


class _DyingConsumer:
    """The service's consumer, dying at the commit of an intent whose approval request the
    broker has acknowledged (EffectorService commits an intent only after that
    acknowledgement; a send that failed is retried on the same intent before its commit)."""

    def __init__(self, consumer, store: _DyingStore, directory: Path, intents: str) -> None:
        self._consumer = consumer
        self._store = store
        self._marker = directory / "die-after-request"
        self._intents = intents

    def commit(self, *args, **kwargs):
        pending = self._store.request_pending
        if pending and any(o.topic == self._intents for o in kwargs.get("offsets") or ()):
            self._store.request_pending = False
            _die_if(self._marker)
        return self._consumer.commit(*args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._consumer, name)


def main(argv: list[str]) -> int:
    from beam_agents.bus import EffectorService, Topics

    bootstrap, prefix, directory = argv[0], argv[1], Path(argv[2])
    store = _DyingStore(directory)
    lease_ms = int(os.environ.get("FX_LEASE_MS", "2000"))
    if argv[3:] == ["triage"]:
        from beam_agents.ops.demo import (
            demo_approver_keyring,
            demo_effector_keyring,
            demo_inquiry_keyring,
            demo_keyring,
        )

        effector = Effector(
            triage_tools(directory),
            mode=VerifyMode.REQUIRE,
            keyring=demo_keyring(),
            store=store,
            result_keyring=demo_effector_keyring(),
            approval_keyring=demo_approver_keyring(),
            lease_ms=lease_ms,
            inquiry_keyring=demo_inquiry_keyring(),
        )
    else:
        effector = Effector(
            tools(directory),
            mode=VerifyMode.OFF,
            store=store,
            result_keyring=RESULTS_RING,
            approval_keyring=APPROVER_RING,
            lease_ms=lease_ms,
        )
    topics = Topics(prefix)
    service = EffectorService(
        effector,
        bootstrap_servers=bootstrap,
        topics=topics,
        group_id=f"{prefix}.fx",
        instance_id=os.environ.get("FX_INSTANCE_ID") or None,
        session_timeout_ms=int(os.environ.get("FX_SESSION_TIMEOUT_MS", "10000")),
    )
    # The one moment the service's own code has no seam for: between the acknowledgement of
    # what it produced and its commit.
    service._consumer = _DyingConsumer(service._consumer, store, directory, topics.intents)
    stop = threading.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda *_: stop.set())
    print("serving", flush=True)
    service.run(stop, lambda route: print(f"served {route.value}", flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
