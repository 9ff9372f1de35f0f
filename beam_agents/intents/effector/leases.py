"""Leases: how an effector's claim on a call stays its own while the call runs, as every
process sharing the store sees it, whatever PID namespace (container) each runs in.

A claim (an OUTCOME_RUNNING ExecutionRecord) carries a lease: its claimant (`lease_owner`, the
claim's `claimed_by`) and an expiry (`lease_expires_at_ms`, on the effector's clock). While the
tool runs, a heartbeat thread of the claimant (`Leases.holding`) renews the lease every third of
its duration, each renewal a conditional write over the record as read
(`ExecutionStore.replace`), so a tool that blocks however long keeps its claim; only a claimant
that stopped (killed, or its whole process frozen for two thirds of a lease) lets it lapse. A
call that ends without recording its result (a tool's BaseException, a store that failed to
take the result) releases its lease at once: nothing will renew it. A copy that finds the lease
unexpired is in flight; one that finds it expired has found a lost call, settled by the tool's
ToolSpec (run again if idempotent, its reconciler, or a person asked), and takes the claim over
only by a write conditional on the expired claim it read: a renewal landing in between makes it
fail, so a live lease is never taken over.

Nothing reads a pid. An owner id (`new_owner_id`) is unique per Effector instance: its
"<pid>:<start>:" prefix is only there for effectors of the binary before leases, which judge a
claim by the process it names (correctly within their own PID namespace) during a rolling
upgrade; this binary never looks at it.

Legacy claims. A claim written before leases carries no lease, or one that is not its
claimant's (a binary before leases, taking a claim over, copies the record with the unknown
lease fields in it). Its claimant never renews: it is either dead (an effector killed mid-call
before the upgrade) or an effector of the older binary still running its call. The first reader
stamps it, conditionally, with a lease for its claimant lasting one lease from its own clock
(`Leases.stamped`): the call is in flight until then and lost after, as is any call whose
claimant stopped renewing. Reading it as lost at once would question, or re-run through a
reconciler that finds no effect yet, a call an older effector may still be running: the defect
leases fix. Reading its pid would repeat that defect across namespaces. An older effector's
call that outlasts the stamped lease is read as lost: stop the old effectors before starting
new ones, or give the new ones a lease longer than any call.

A claimant whose lease lapsed while it still ran (a frozen process) may find its claim taken
over when its tool returns: `Gate._run_claimed` then writes its result over a claim or an
unanswered inquiry (the result is what happened), never over a result recorded meanwhile (a
reconciler's, or a person's answer), so the call keeps one result.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections.abc import Callable, Iterator

from beam_agents._protos import ExecutionRecord
from beam_agents.errors import ExecutionStoreError
from beam_agents.intents.effector.spec import check_lease_ms
from beam_agents.intents.effector.stores import ExecutionStore

__all__ = ["Leases", "new_owner_id", "settle"]

_INT64_MAX = 2**63 - 1


def new_owner_id() -> str:
    """ "<pid>:<process start time>:<random>", unique per effector instance by its random part
    (see the module docstring for the prefix)."""
    pid = os.getpid()
    return f"{pid}:{_process_start(pid)}:{uuid.uuid4().hex}"


def _process_start(pid: int) -> str:
    # The start time (in clock ticks since boot), which the binary before leases compares.
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


def settle(record: ExecutionRecord) -> None:
    """Clears the claim and its lease from `record`, which is being decided."""
    for field in ("claimed_by", "lease_owner", "lease_expires_at_ms"):
        record.ClearField(field)


class Leases:
    """The leases of one effector instance: `owner` names it in each claim it writes, and a lease
    lasts `lease_ms` on `clock` (the effector's) unless renewed."""

    def __init__(self, lease_ms: int, clock: Callable[[], int]) -> None:
        self.lease_ms = check_lease_ms(lease_ms)
        self.owner = new_owner_id()
        self._clock = clock

    def _until(self, now: int) -> int:
        return min(now + self.lease_ms, _INT64_MAX)

    def grant(self, claim: ExecutionRecord, now: int) -> None:
        """Makes `claim`, about to be written, this instance's, with a lease from `now`."""
        claim.claimed_by = claim.lease_owner = self.owner
        claim.lease_expires_at_ms = self._until(now)

    @staticmethod
    def legacy(claim: ExecutionRecord) -> bool:
        """Whether `claim` holds no lease of its claimant's (module docstring)."""
        return claim.lease_owner != claim.claimed_by

    def expired(self, claim: ExecutionRecord, now: int) -> bool:
        return not self.legacy(claim) and claim.lease_expires_at_ms <= now

    def stamped(self, claim: ExecutionRecord, now: int) -> ExecutionRecord:
        """A legacy `claim` with a lease for its claimant from `now`: the migration on read."""
        stamped = ExecutionRecord()
        stamped.CopyFrom(claim)
        stamped.lease_owner = claim.claimed_by
        stamped.lease_expires_at_ms = self._until(now)
        return stamped

    @contextlib.contextmanager
    def holding(
        self,
        intent_id: str,
        store: ExecutionStore,
        keep_until: Callable[[ExecutionRecord], int],
    ) -> Iterator[None]:
        """Renews this instance's lease on intent_id's claim from a heartbeat thread while the
        block runs (the tool, and the write of its result); releases it when the block raises,
        since nothing will renew it then."""
        stop = threading.Event()
        heartbeat = threading.Thread(
            target=self._renew,
            args=(intent_id, store, keep_until, stop),
            name=f"lease {intent_id}",
            daemon=True,
        )
        heartbeat.start()
        try:
            yield
        except BaseException:
            stop.set()
            heartbeat.join()
            # A store failing now too: the lease lapses by itself within lease_ms.
            with contextlib.suppress(ExecutionStoreError):
                self._rewrite(intent_id, store, keep_until, lambda held: 0)
            raise
        finally:
            stop.set()
            heartbeat.join()

    def _renew(self, intent_id, store, keep_until, stop: threading.Event) -> None:
        while not stop.wait(self.lease_ms / 3000):
            try:
                renewed = self._rewrite(
                    intent_id,
                    store,
                    keep_until,
                    lambda held: max(held.lease_expires_at_ms, self._until(self._clock())),
                )
            except ExecutionStoreError:
                continue  # the next beat tries again; past the lease the call is lost, not run
            if not renewed:
                return  # decided, or taken over: nothing of this instance's to renew

    def _rewrite(self, intent_id, store, keep_until, expiry: Callable) -> bool:
        """Sets the lease expiry of this instance's claim on intent_id to `expiry(held)`, over
        the record as read (a copy may move its expiry meanwhile); False when the record is no
        longer this instance's claim."""
        while True:
            held = store.get(intent_id)
            if (
                held is None
                or held.outcome != ExecutionRecord.OUTCOME_RUNNING
                or held.claimed_by != self.owner
                or held.lease_owner != self.owner
            ):
                return False
            updated = ExecutionRecord()
            updated.CopyFrom(held)
            updated.lease_expires_at_ms = expiry(held)
            if store.replace(updated, held, keep_until(updated)):
                return True
