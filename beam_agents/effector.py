"""The effector: the one place where ToolIntents act on the world, each at most once.

Every intent goes through the same gate, and every step before the last decides without a side
effect:

1. Decode and signature. Bytes that are no ToolIntent become a dead letter
   (`undecodable_intent`). The signature is checked by `VerifyMode` (OFF checks nothing;
   PERMISSIVE, for rolling signing out, admits valid and unsigned intents; REQUIRE admits only
   valid ones), from the bytes as received, so fields this binary does not know stay covered.
   A refused intent becomes a dead letter (`signature_<outcome>`) and gets no result; it is not
   remembered, so a correctly signed copy may still come.
2. Identity. Executions are remembered by intent_id, with the entity_key and a digest of the
   intent's content (its signing input without the delivery fields attempt, created_at_ms,
   expires_at_ms and trace_id, `content_digest`). A copy with the same entity and content is a
   duplicate: nothing runs and it gets the first decision again (`Route.DUPLICATE`); its expiry
   extends the record's retention. Another entity or other content under a known id is never
   run and never given the first content's result: it gets a REJECTED result naming the
   conflict (`intent_id_conflict`) and bound to its own content, so whoever waits on it is
   answered. (A failed bundle's retry whose model answered differently emits such a copy.)
3. Expiry. expires_at_ms at or before now gives EXPIRED; no expiry (0) too: fail closed.
4. Kind. An APPROVAL intent goes to the approvals output for a human, once. An unknown (newer)
   kind is REJECTED, never executed. TOOL_KIND_UNSPECIFIED reads as TOOL.
5. Tool. An unknown tool, or args_json that `parse_args_json` refuses (not an object, numbers
   beyond I-JSON's range, nesting deeper than MAX_ARGS_DEPTH, duplicate keys), gives REJECTED.
6. Execution. The record is claimed (RUNNING) in the store before the tool runs and finished
   with its result after: OK with the tool's bytes, ERROR with its exception.

Every decision of steps 3 to 6 is remembered: an intent_id has one result, whatever arrives
later. A record is kept for `retention_ms` (default 24 h) after the later of the latest
expires_at_ms seen for its id and the last time it was decided, then forgotten; only a copy
arriving after that, still unexpired, could run again.

Two faces share the gate:

* `Effector`, a plain callable for a service reading intents from a topic, keeps its records in
  an `ExecutionStore`: `SqliteExecutionStore` (standard library sqlite3, WAL, fsync on commit)
  by default. A claim naming the effector's process is committed before the tool runs. A copy
  that finds the claim of a process still running is in flight (`Route.IN_FLIGHT`, no result
  yet: deliver it again later);
  one that finds the claim of a process that is gone (an effector killed mid-call) has an
  unknown outcome, settled by the tool's `ToolSpec`: run again if idempotent, its reconciler,
  or a person asked through an APPROVAL intent (`resolve` records their answer). The agent is
  never told a call failed that may have acted.
* `ExecuteIntents`, a Beam transform, re-windows intents into the global window (the same
  intent in two windows is still one intent) and keeps each record in keyed state under its
  intent_id, cleared by an event-time timer at the end of retention. Beam commits state with
  the bundle's outputs, so a worker that dies after a tool ran but before its bundle committed
  runs the tool again on retry: tools with effects outside the pipeline should pass the
  intent_id to the system they call as its idempotency key.

Results are AgentEnvelopes carrying the ToolResult, keyed by entity_key. Every ToolResult
carries `intent_digest`, the content digest of the intent it answers, and is signed when the
effector has a result key, so RunAgent can refuse a forged result or one computed for other
content. Signing keys are loaded
where the effector runs (`keyring_loader`), never carried in a pipeline's serialized graph.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping

import apache_beam as beam
from apache_beam.coders.coders import DeterministicProtoCoder
from apache_beam.transforms import window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.typehints import Tuple
from google.protobuf.message import DecodeError

from beam_agents._protos import (
    ActivationErrorRecord,
    AgentEnvelope,
    ExecutionRecord,
    ToolIntent,
    ToolResult,
)
from beam_agents.beam_support import timer_timestamp, typed
from beam_agents.core.intent import (
    DELIVERY_FIELDS,
    canonical_args_json,
    content_digest,
    effective_kind,
    parse_args_json,
)
from beam_agents.core.signing import Keyring, Verification, sign, verify
from beam_agents.errors import CanonicalJsonError

__all__ = [
    "APPROVALS",
    "DEAD_LETTERS",
    "DEFAULT_RETENTION_MS",
    "DELIVERY_FIELDS",
    "INQUIRY_SUFFIX",
    "INQUIRY_TOOL",
    "REASON_CONFLICT",
    "REASON_UNDECODABLE",
    "RESULTS",
    "Effector",
    "EffectorOutput",
    "ExecuteIntents",
    "ExecutionStore",
    "Route",
    "SqliteExecutionStore",
    "Tool",
    "ToolSpec",
    "VerifyMode",
    "content_digest",
    "wall_clock_ms",
]

#: A tool: called with the parsed args_json object and the intent; returns the result payload.
#: The intent's intent_id is the call's idempotency key: pass it to the system the tool calls.
Tool = Callable[[dict, ToolIntent], bytes | str]

#: The tool name and intent_id suffix of the APPROVAL intent that asks a person whether a call
#: whose outcome is unknown took effect (the id is the original intent's id + the suffix).
INQUIRY_TOOL = "beam_agents.outcome_unknown"
INQUIRY_SUFFIX = "#outcome"


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """A tool with what the effector may do when a call's outcome is unknown (its effector
    died mid-call). A plain callable is `ToolSpec(fn)`.

    * `idempotent`: the tool is run again with the same intent (so the same intent_id as its
      idempotency key); the system it calls makes the second call a no-op.
    * `reconcile(intent)`: asks the system whether the call took effect: the payload (bytes or
      str) when it did, which becomes the OK result, or None when it did not, and the tool is
      run. An exception from it leaves the outcome unknown.
    * neither, or a reconciler that fails: the outcome goes to a person as an APPROVAL intent
      (`INQUIRY_TOOL`) asking whether it took effect; the agent hears nothing until they
      answer (`Effector.resolve`). An agent is never told a call failed that may have acted.
    """

    fn: Tool
    idempotent: bool = False
    reconcile: Callable[[ToolIntent], bytes | str | None] | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"a tool must be callable, not {type(self.fn).__name__}")
        if self.idempotent and self.reconcile is not None:
            raise ValueError("an idempotent tool needs no reconciler: give one or the other")
        if self.reconcile is not None and not callable(self.reconcile):
            raise TypeError("reconcile must be callable")


def _spec(tool: Tool | ToolSpec) -> ToolSpec:
    return tool if isinstance(tool, ToolSpec) else ToolSpec(tool)


RESULTS = "results"
APPROVALS = "approvals"
DEAD_LETTERS = "dead_letters"

#: Dead-letter reasons (besides "signature_<outcome>", one per refused Verification).
REASON_UNDECODABLE = "undecodable_intent"
REASON_CONFLICT = "intent_id_conflict"

DEFAULT_RETENTION_MS = 24 * 60 * 60 * 1000
_INT64_MAX = 2**63 - 1
#: Longest error_message kept from a failing tool; exception texts can be unbounded.
_MAX_ERROR_CHARS = 4096


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class VerifyMode(enum.Enum):
    OFF = "off"
    PERMISSIVE = "permissive"
    REQUIRE = "require"

    def admits(self, outcome: Verification) -> bool:
        if self is VerifyMode.PERMISSIVE:
            return outcome in (Verification.VALID, Verification.UNSIGNED)
        return outcome is Verification.VALID


class Route(enum.Enum):
    RESULT = "result"
    APPROVAL = "approval"
    DEAD_LETTER = "dead letter"
    #: Decided before: nothing ran. `result` is the first result, or `approval` the intent
    #: put before a human: what was sent for the first copy, to be sent again (a receiver
    #: dedupes by intent_id), since the first sending may never have been acknowledged.
    DUPLICATE = "duplicate"
    #: Another effector process that is still running holds the claim: nothing ran and there
    #: is no result yet. Deliver this copy again later; never acknowledge it as done.
    IN_FLIGHT = "in flight"


@dataclasses.dataclass(frozen=True)
class EffectorOutput:
    route: Route
    #: The result envelope (RESULT, DUPLICATE of a result).
    result: AgentEnvelope | None = None
    #: The intent to put before a human (APPROVAL).
    approval: ToolIntent | None = None
    #: Why the intent was refused without a result (DEAD_LETTER).
    dead_letter: ActivationErrorRecord | None = None
    #: True when this call ran the tool.
    ran_tool: bool = False


class ExecutionStore(abc.ABC):
    """Where the gate remembers decisions, by intent_id. Each method is atomic; `claim` is the
    one that must be atomic across processes sharing the store."""

    @abc.abstractmethod
    def get(self, intent_id: str) -> ExecutionRecord | None:
        """The record of intent_id, or None."""

    @abc.abstractmethod
    def claim(self, record: ExecutionRecord, keep_until_ms: int) -> ExecutionRecord | None:
        """Stores `record` unless intent_id has one already; returns that one, or None when
        `record` was stored. Durable on return."""

    @abc.abstractmethod
    def put(self, record: ExecutionRecord, keep_until_ms: int) -> None:
        """Stores `record`, replacing intent_id's record. Durable on return."""

    @abc.abstractmethod
    def take_over(self, record: ExecutionRecord, claimed_by: str, keep_until_ms: int) -> bool:
        """Stores `record` if intent_id's record is still the RUNNING claim of `claimed_by`
        (a claimant that died); False when another caller took it over first. Durable on
        return."""


class SqliteExecutionStore(ExecutionStore):
    """An ExecutionStore in one SQLite file (WAL, synchronous=FULL), safe to share between
    threads and between processes on one machine. Records past their keep-until time are
    deleted at most once a minute of the effector's clock."""

    _PRUNE_EVERY_MS = 60_000

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE in claim).
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=10000")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS executions ("
            " intent_id TEXT PRIMARY KEY,"
            " keep_until_ms INTEGER NOT NULL,"
            " record BLOB NOT NULL"
            ") WITHOUT ROWID"
        )
        self._db.execute(
            "CREATE INDEX IF NOT EXISTS executions_keep_until ON executions (keep_until_ms)"
        )
        self._next_prune_ms: int | None = None

    def get(self, intent_id: str) -> ExecutionRecord | None:
        with self._lock:
            row = self._db.execute(
                "SELECT record FROM executions WHERE intent_id = ?", (intent_id,)
            ).fetchone()
        return None if row is None else ExecutionRecord.FromString(row[0])

    def claim(self, record: ExecutionRecord, keep_until_ms: int) -> ExecutionRecord | None:
        held, _ = self._swap(record, keep_until_ms, lambda held: held is None)
        return held

    def put(self, record: ExecutionRecord, keep_until_ms: int) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO executions VALUES (?, ?, ?)",
                (record.intent_id, keep_until_ms, _serialize(record)),
            )

    def take_over(self, record: ExecutionRecord, claimed_by: str, keep_until_ms: int) -> bool:
        _, taken = self._swap(
            record,
            keep_until_ms,
            lambda held: (
                held is not None
                and held.outcome == ExecutionRecord.OUTCOME_RUNNING
                and held.claimed_by == claimed_by
            ),
        )
        return taken

    def _swap(self, record: ExecutionRecord, keep_until_ms: int, replaces) -> tuple:
        """In one immediate transaction: reads the record held for `record.intent_id` and
        writes `record` when `replaces(held)`; returns (held, written)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT record FROM executions WHERE intent_id = ?", (record.intent_id,)
                ).fetchone()
                held = None if row is None else ExecutionRecord.FromString(row[0])
                written = replaces(held)
                if written:
                    self._db.execute(
                        "INSERT OR REPLACE INTO executions VALUES (?, ?, ?)",
                        (record.intent_id, keep_until_ms, _serialize(record)),
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return held, written

    def prune(self, now_ms: int) -> int:
        """Deletes the records kept until before now_ms (at most once a minute); returns how
        many."""
        if self._next_prune_ms is not None and now_ms < self._next_prune_ms:
            return 0
        self._next_prune_ms = now_ms + self._PRUNE_EVERY_MS
        with self._lock:
            cursor = self._db.execute("DELETE FROM executions WHERE keep_until_ms < ?", (now_ms,))
        return cursor.rowcount

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT count(*) FROM executions").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _serialize(record: ExecutionRecord) -> bytes:
    return record.SerializeToString(deterministic=True)


class _Gate:
    """Steps 1 to 6 of the module docstring over any ExecutionStore."""

    def __init__(
        self,
        tools: Mapping[str, Tool],
        mode: VerifyMode,
        keyring: Keyring | None,
        retention_ms: int,
        result_keyring: Keyring | None = None,
        approval_keyring: Keyring | None = None,
    ) -> None:
        if mode is not VerifyMode.OFF and keyring is None:
            raise ValueError(f"verify mode {mode.value} needs a keyring")
        if result_keyring is not None and result_keyring.active is None:
            raise ValueError("result_keyring needs an active key to sign results with")
        _check_retention(retention_ms)
        self.tools = {name: _spec(tool) for name, tool in tools.items()}
        self.mode = mode
        self.keyring = keyring
        self.retention_ms = retention_ms
        self.result_keyring = result_keyring
        self.approval_keyring = approval_keyring

    def keep_until(self, record: ExecutionRecord, now: int) -> int:
        return min(max(record.latest_expires_at_ms, now) + self.retention_ms, _INT64_MAX)

    def decide(
        self,
        data: bytes,
        *,
        now: Callable[[], int],
        store: ExecutionStore,
        owner: str,
    ) -> EffectorOutput:
        """The gate's output for one serialized intent; runs its tool at most once."""
        try:
            intent = ToolIntent.FromString(data)
        except DecodeError as e:
            detail = f"{len(data)} bytes are not a ToolIntent: {e}"
            return _dead_letter(b"", REASON_UNDECODABLE, detail, now())
        at = now()
        if self.mode is not VerifyMode.OFF:
            outcome = verify(intent, self.keyring, wire=data)
            if not self.mode.admits(outcome):
                detail = (
                    f"intent {intent.intent_id} ({intent.tool_name}) refused in "
                    f"{self.mode.value} mode: {outcome.value} (key id {intent.signing_key_id!r})"
                )
                reason = "signature_" + outcome.name.lower()
                return _dead_letter(intent.entity_key, reason, detail, at)
        record = ExecutionRecord(
            intent_id=intent.intent_id,
            entity_key=intent.entity_key,
            content_digest=content_digest(data),
            latest_expires_at_ms=intent.expires_at_ms,
        )
        known = store.get(intent.intent_id)
        if known is not None:
            return self._again(known, intent, record, now, store, owner)
        decided = self._refusal(intent, record.content_digest, at)
        if decided is None:
            record.outcome = ExecutionRecord.OUTCOME_RUNNING
            record.claimed_by = owner
        else:
            record.outcome, result = decided
            if result is not None:
                record.result.CopyFrom(result)
        known = store.claim(record, self.keep_until(record, at))
        if known is not None:  # another caller decided this intent first
            return self._again(known, intent, record, now, store, owner)
        if record.outcome != ExecutionRecord.OUTCOME_RUNNING:
            return self._first_output(record, intent)
        return self._run_claimed(record, intent, now, store)

    def _run_claimed(
        self, record: ExecutionRecord, intent: ToolIntent, now: Callable[[], int], store
    ) -> EffectorOutput:
        """Runs the tool of `record`, a RUNNING claim this caller holds, and records its
        result."""
        record.result.CopyFrom(self._run(intent, record.content_digest, now))
        record.outcome = ExecutionRecord.OUTCOME_RESULT
        record.ClearField("claimed_by")
        store.put(record, self.keep_until(record, now()))
        return dataclasses.replace(self._first_output(record, intent), ran_tool=True)

    def _first_output(self, record: ExecutionRecord, intent: ToolIntent) -> EffectorOutput:
        if record.outcome == ExecutionRecord.OUTCOME_APPROVAL:
            return EffectorOutput(Route.APPROVAL, approval=_approval_of(record, intent))
        return EffectorOutput(Route.RESULT, result=self._envelope(record.result))

    def _envelope(self, result: ToolResult) -> AgentEnvelope:
        """The result as it leaves the effector: signed when the effector has a result key
        (HMAC is deterministic, so every copy of one result carries the same bytes)."""
        if self.result_keyring is not None:
            result = sign(result, self.result_keyring)
        return AgentEnvelope(
            entity_key=result.entity_key, event_time_ms=result.completed_at_ms, tool_result=result
        )

    def _refusal(self, intent: ToolIntent, digest: bytes, now: int):
        """(outcome, result) of steps 3 to 5, or None when the tool is to run."""
        if intent.expires_at_ms <= now:
            return _decided(
                intent, digest, ToolResult.EXPIRED, now, error=f"expired at {intent.expires_at_ms}"
            )
        kind = effective_kind(intent)
        if kind is None:
            return _decided(
                intent, digest, ToolResult.REJECTED, now, error=f"unknown intent kind {intent.kind}"
            )
        if kind == ToolIntent.APPROVAL:
            return ExecutionRecord.OUTCOME_APPROVAL, None
        if intent.tool_name not in self.tools:
            return _decided(
                intent, digest, ToolResult.REJECTED, now, error=f"unknown tool {intent.tool_name!r}"
            )
        try:
            parse_args_json(intent.args_json)
        except CanonicalJsonError as e:
            return _decided(
                intent, digest, ToolResult.REJECTED, now, error=f"args_json refused: {e}"
            )
        return None

    def _run(self, intent: ToolIntent, digest: bytes, now: Callable[[], int]) -> ToolResult:
        try:
            payload = self.tools[intent.tool_name].fn(parse_args_json(intent.args_json), intent)
            if isinstance(payload, str):
                payload = payload.encode("utf-8")
            if not isinstance(payload, bytes):
                raise TypeError(f"tool returned {type(payload).__name__}, not bytes or str")
        except Exception as e:  # a tool's failure is its result, never the effector's
            return _result(
                intent, digest, ToolResult.ERROR, now(), error=f"{type(e).__name__}: {e}"
            )
        return _result(intent, digest, ToolResult.OK, now(), payload=payload)

    def _again(
        self,
        known: ExecutionRecord,
        intent: ToolIntent,
        record: ExecutionRecord,
        clock: Callable[[], int],
        store: ExecutionStore,
        owner: str,
    ) -> EffectorOutput:
        """The output for an intent_id decided before. `known` came from the store and is
        never changed in place (a Beam state read may be the stored object itself)."""
        now = clock()
        # The digest covers entity_key too; comparing it apart names the conflict.
        if known.entity_key != record.entity_key or known.content_digest != record.content_digest:
            what = "another entity" if known.entity_key != record.entity_key else "other content"
            # The copy's sender waits on it: it gets a REJECTED result bound to its own content,
            # never the first content's result and never silence. Nothing is remembered for it.
            rejected = _result(
                intent,
                record.content_digest,
                ToolResult.REJECTED,
                now,
                error=(
                    f"{REASON_CONFLICT}: intent {intent.intent_id} ({intent.tool_name}) reuses "
                    f"the id of an intent of {what} (its content "
                    f"{known.content_digest.hex()}, this copy's {record.content_digest.hex()}); "
                    "it is not run"
                ),
            )
            return EffectorOutput(Route.RESULT, result=self._envelope(rejected))
        updated = ExecutionRecord()
        updated.CopyFrom(known)
        if known.outcome == ExecutionRecord.OUTCOME_RUNNING and not _running(known.claimed_by):
            return self._unknown_outcome(known, intent, clock, store, owner)
        if intent.expires_at_ms > known.latest_expires_at_ms:
            updated.latest_expires_at_ms = intent.expires_at_ms
            store.put(updated, self.keep_until(updated, now))
        if known.outcome == ExecutionRecord.OUTCOME_RESULT:
            return EffectorOutput(Route.DUPLICATE, result=self._envelope(known.result))
        if known.outcome == ExecutionRecord.OUTCOME_APPROVAL:
            return EffectorOutput(Route.DUPLICATE, approval=_approval_of(known, intent))
        return EffectorOutput(Route.IN_FLIGHT)

    def _unknown_outcome(
        self,
        known: ExecutionRecord,
        intent: ToolIntent,
        clock: Callable[[], int],
        store: ExecutionStore,
        owner: str,
    ) -> EffectorOutput:
        """The claimant of `known` stopped mid-call: the tool may or may not have acted. What
        the tool's ToolSpec allows decides: run it again (idempotent), ask its reconciler, or
        ask a person. Every path takes the dead claim over first, so one caller acts."""
        now = clock()
        spec = self.tools.get(intent.tool_name)
        updated = ExecutionRecord()
        updated.CopyFrom(known)
        updated.latest_expires_at_ms = max(known.latest_expires_at_ms, intent.expires_at_ms)
        run_again = spec is not None and spec.idempotent
        if spec is not None and spec.reconcile is not None:
            try:
                payload = spec.reconcile(intent)
                if isinstance(payload, str):
                    payload = payload.encode("utf-8")
                if payload is not None and not isinstance(payload, bytes):
                    raise TypeError(f"reconcile returned {type(payload).__name__}")
            except Exception:  # the system cannot say now: a person decides
                pass
            else:
                if payload is not None:
                    updated.ClearField("claimed_by")
                    updated.outcome = ExecutionRecord.OUTCOME_RESULT
                    updated.result.CopyFrom(
                        _result(intent, known.content_digest, ToolResult.OK, now, payload=payload)
                    )
                    return self._take_over(known, updated, intent, clock, store, owner)
                run_again = True  # it did not act: running it is the first effect
        if run_again:
            updated.claimed_by = owner
            if not store.take_over(updated, known.claimed_by, self.keep_until(updated, now)):
                return self._again(
                    store.get(intent.intent_id), intent, updated, clock, store, owner
                )
            return self._run_claimed(updated, intent, clock, store)
        updated.ClearField("claimed_by")
        updated.outcome = ExecutionRecord.OUTCOME_APPROVAL
        inquiry = _inquiry(intent, now)
        if self.result_keyring is not None:
            inquiry = sign(inquiry, self.result_keyring)
        # The record keeps the inquiry, so a copy re-sends the very same one.
        updated.result.CopyFrom(
            ToolResult(intent_id=inquiry.intent_id, payload=_serialize(inquiry))
        )
        return self._take_over(known, updated, intent, clock, store, owner)

    def resolve(
        self, answer: AgentEnvelope, *, now: int, store: ExecutionStore
    ) -> EffectorOutput | None:
        """A person's answer to an inquiry (`_inquiry`) as the result of the call it asked
        about: approved, it took effect (OK); denied, it did not (ERROR saying so, not run:
        the agent may ask again). None when `answer` answers no inquiry of this store."""
        approval = answer.approval
        if not answer.HasField("approval") or not approval.intent_id.endswith(INQUIRY_SUFFIX):
            return None
        known = store.get(approval.intent_id.removesuffix(INQUIRY_SUFFIX))
        if known is None:
            return None
        if known.outcome == ExecutionRecord.OUTCOME_RESULT:
            # Answered before; this is a copy: the recorded result again.
            return EffectorOutput(Route.DUPLICATE, result=self._envelope(known.result))
        if known.outcome != ExecutionRecord.OUTCOME_APPROVAL or not known.result.payload:
            return None
        inquiry = ToolIntent.FromString(known.result.payload)
        refusal = None
        if self.approval_keyring is not None:
            outcome = verify(approval, self.approval_keyring)
            if outcome is not Verification.VALID:
                refusal = f"answer_signature_{outcome.name.lower()}"
        if refusal is None and approval.intent_digest != content_digest(known.result.payload):
            refusal = "answer_for_other_content"
        if refusal is not None:
            detail = f"answer to inquiry {approval.intent_id} by {approval.approver!r} refused"
            return _dead_letter(inquiry.entity_key, refusal, detail, now)
        original = ToolIntent(
            intent_id=known.intent_id, entity_key=known.entity_key, seq=inquiry.seq
        )
        if approval.approved:
            payload = canonical_args_json({"took_effect": True, "confirmed_by": approval.approver})
            result = _result(
                original, known.content_digest, ToolResult.OK, now, payload=payload.encode()
            )
        else:
            error = (
                f"not done: {approval.approver} confirmed that {inquiry.intent_id} did not take "
                "effect; it was not run"
            )
            result = _result(original, known.content_digest, ToolResult.ERROR, now, error=error)
        updated = ExecutionRecord()
        updated.CopyFrom(known)
        updated.outcome = ExecutionRecord.OUTCOME_RESULT
        updated.result.CopyFrom(result)
        store.put(updated, self.keep_until(updated, now))
        return EffectorOutput(Route.RESULT, result=self._envelope(result))

    def _take_over(self, known, updated, intent, clock, store, owner) -> EffectorOutput:
        if not store.take_over(updated, known.claimed_by, self.keep_until(updated, clock())):
            return self._again(store.get(intent.intent_id), intent, updated, clock, store, owner)
        return self._first_output(updated, intent)


def _approval_of(record: ExecutionRecord, intent: ToolIntent) -> ToolIntent:
    """What goes before a person for an APPROVAL record: the intent itself, or for a tool call
    whose outcome was unknown, the inquiry the record keeps."""
    if record.result.payload:
        return ToolIntent.FromString(record.result.payload)
    return intent


def _inquiry(intent: ToolIntent, now: int) -> ToolIntent:
    """The APPROVAL intent asking whether `intent`'s call took effect; deterministic but for
    its creation time."""
    question = (
        f"The effector stopped while running {intent.tool_name} {intent.args_json} "
        f"(intent {intent.intent_id}). Did it take effect? Approve if it did; deny if it did "
        "not, and it is then run."
    )
    args = {"question": question, "intent_id": intent.intent_id, "tool": intent.tool_name}
    return ToolIntent(
        intent_id=intent.intent_id + INQUIRY_SUFFIX,
        entity_key=intent.entity_key,
        seq=intent.seq,
        step_index=intent.step_index,
        tool_name=INQUIRY_TOOL,
        args_json=canonical_args_json(args),
        created_at_ms=now,
        expires_at_ms=intent.expires_at_ms,
        kind=ToolIntent.APPROVAL,
        trace_id=intent.trace_id,
    )


def _instance_id() -> str:
    """ "<pid>:<process start time>:<random>": a claim names a process that can be checked for
    life (a SQLite store is local to one machine), and an instance within it."""
    pid = os.getpid()
    return f"{pid}:{_process_start(pid)}:{uuid.uuid4().hex}"


def _process_start(pid: int) -> str:
    # The start time (in clock ticks since boot) tells a live claimant from a new process that
    # reused its pid; "" where /proc does not say, and then the pid alone decides.
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return ""


def _running(claimed_by: str) -> bool:
    """Whether the effector process that wrote a claim is still running (so the call is in
    flight, not lost)."""
    pid, _, rest = claimed_by.partition(":")
    started, _, _ = rest.partition(":")
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by another user
    return _process_start(int(pid)) == started


def _check_retention(retention_ms: int) -> None:
    if isinstance(retention_ms, bool) or not isinstance(retention_ms, int) or retention_ms < 0:
        raise ValueError(f"retention_ms must be a non-negative int, not {retention_ms!r}")


def _decided(intent: ToolIntent, digest: bytes, status, now: int, *, error: str):
    return ExecutionRecord.OUTCOME_RESULT, _result(intent, digest, status, now, error=error)


def _result(
    intent: ToolIntent, digest: bytes, status, now: int, *, payload: bytes = b"", error: str = ""
):
    """A result of `intent`, bound to the content it was computed for by `digest`."""
    return ToolResult(
        intent_id=intent.intent_id,
        entity_key=intent.entity_key,
        seq=intent.seq,
        status=status,
        payload=payload,
        error_message=_printable(error),
        completed_at_ms=now,
        intent_digest=digest,
    )


def _printable(text: str) -> str:
    # Exception texts may hold lone surrogates, which a proto string cannot carry.
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= _MAX_ERROR_CHARS else text[:_MAX_ERROR_CHARS] + "..."


def _dead_letter(entity_key: bytes, reason: str, detail: str, now: int) -> EffectorOutput:
    record = ActivationErrorRecord(
        entity_key=entity_key, reason=reason, detail=_printable(detail), event_time_ms=now
    )
    return EffectorOutput(Route.DEAD_LETTER, dead_letter=record)


class Effector:
    """The gate of the module docstring as a plain callable: `effector(intent_or_bytes)`.

    `tools` maps names to callables or `ToolSpec`s. `store` is an ExecutionStore, or a path for
    a SqliteExecutionStore (":memory:" keeps nothing across restarts: tests only). `keyring`
    verifies intents; `result_keyring`, with an active key, signs every ToolResult (RunAgent
    verifies them with its answer keyring) and every inquiry; `approval_keyring` verifies the
    answers to inquiries (`resolve`).
    """

    def __init__(
        self,
        tools: Mapping[str, Tool],
        *,
        mode: VerifyMode,
        store: ExecutionStore | str | os.PathLike,
        keyring: Keyring | None = None,
        result_keyring: Keyring | None = None,
        approval_keyring: Keyring | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        retention_ms: int = DEFAULT_RETENTION_MS,
    ) -> None:
        self._gate = _Gate(tools, mode, keyring, retention_ms, result_keyring, approval_keyring)
        if isinstance(store, str | os.PathLike):
            store = SqliteExecutionStore(store)
        self.store = store
        self._clock = clock
        #: Names this instance, and the process it runs in, in the claims it writes.
        self.instance_id = _instance_id()

    def __call__(self, intent: ToolIntent | bytes) -> EffectorOutput:
        if isinstance(intent, ToolIntent):
            intent = intent.SerializeToString(deterministic=True)
        prune = getattr(self.store, "prune", None)
        if prune is not None:
            prune(self._clock())
        return self._gate.decide(intent, now=self._clock, store=self.store, owner=self.instance_id)

    def resolve(self, answer: AgentEnvelope) -> EffectorOutput | None:
        """A person's answer (an AgentEnvelope with an approval) to an inquiry this effector
        sent about a call whose outcome was unknown: the call's result (RESULT, or DUPLICATE
        for a copy of an answer), a dead letter for an answer whose signature or content does
        not hold, or None when it answers no inquiry of this store."""
        return self._gate.resolve(answer, now=self._clock(), store=self.store)


# Beam -------------------------------------------------------------------------------------


class _Serialize(beam.DoFn):
    """Intents as bytes keyed by intent_id; message inputs serialized deterministically (what
    a signer did), bytes kept as received so the signature covers them exactly."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock

    def process(self, element: bytes | ToolIntent) -> Iterator:
        if isinstance(element, ToolIntent):
            yield (element.intent_id, element.SerializeToString(deterministic=True))
            return
        try:
            intent_id = ToolIntent.FromString(element).intent_id
        except DecodeError as e:
            detail = f"{len(element)} bytes are not a ToolIntent: {e}"
            letter = _dead_letter(b"", REASON_UNDECODABLE, detail, self._clock()).dead_letter
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, (b"", letter))
            return
        yield (intent_id, bytes(element))


class _StateStore(ExecutionStore):
    """One key's ExecutionStore over Beam keyed state; its retention timer follows each put."""

    def __init__(self, state, timer) -> None:
        self._state = state
        self._timer = timer

    def get(self, intent_id: str) -> ExecutionRecord | None:
        return self._state.read()

    def claim(self, record: ExecutionRecord, keep_until_ms: int) -> ExecutionRecord | None:
        known = self._state.read()
        if known is None:
            self.put(record, keep_until_ms)
        return known

    def put(self, record: ExecutionRecord, keep_until_ms: int) -> None:
        self._state.write(record)
        self._timer.set(timer_timestamp(keep_until_ms))

    def take_over(self, record: ExecutionRecord, claimed_by: str, keep_until_ms: int) -> bool:
        # One key's state is read and written by one bundle at a time.
        held = self._state.read()
        if held is None or held.claimed_by != claimed_by:
            return False
        self.put(record, keep_until_ms)
        return True


class _ExecuteOnce(beam.DoFn):
    """The gate, with each intent_id's record in keyed state."""

    # Frozen: renaming a spec or changing its coder breaks state restore on --update.
    RECORD = ReadModifyWriteStateSpec("execution", DeterministicProtoCoder(ExecutionRecord))
    RETENTION = TimerSpec("retention", TimeDomain.WATERMARK)

    def __init__(
        self, tools, mode, keyring_loader, result_keyring_loader, clock, retention_ms
    ) -> None:
        self._tools = tools
        self._mode = mode
        self._keyring_loader = keyring_loader
        self._result_keyring_loader = result_keyring_loader
        self._clock = clock
        self._retention_ms = retention_ms
        self._gate: _Gate | None = None
        self._duplicates = beam.metrics.Metrics.counter("beam_agents.effector", "duplicates")
        self._executions = beam.metrics.Metrics.counter("beam_agents.effector", "executions")

    def setup(self) -> None:
        keyring = None if self._mode is VerifyMode.OFF else self._keyring_loader()
        signer = self._result_keyring_loader
        self._gate = _Gate(
            self._tools,
            self._mode,
            keyring,
            self._retention_ms,
            None if signer is None else signer(),
        )

    def process(
        self,
        element: tuple[str, bytes],
        record=beam.DoFn.StateParam(RECORD),
        retention=beam.DoFn.TimerParam(RETENTION),
    ) -> Iterable:
        _, data = element
        store = _StateStore(record, retention)
        output = self._gate.decide(data, now=self._clock, store=store, owner="")
        # Beam retries a bundle with its state, so a copy here follows a committed decision
        # whose outputs were committed with it: nothing to send again.
        if output.route in (Route.DUPLICATE, Route.IN_FLIGHT):
            self._duplicates.inc()
            return
        if output.ran_tool:
            self._executions.inc()
        if output.route is Route.RESULT:
            result = output.result
            yield (result.entity_key, result)
        elif output.route is Route.APPROVAL:
            yield beam.pvalue.TaggedOutput(APPROVALS, (output.approval.entity_key, output.approval))
        else:
            letter = output.dead_letter
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, (letter.entity_key, letter))

    @on_timer(RETENTION)
    def forget(self, record=beam.DoFn.StateParam(RECORD)) -> None:
        record.clear()


class ExecuteIntents(beam.PTransform):
    """ToolIntents (messages or serialized bytes, in any windowing) in; a dict of three keyed
    PCollections out, in the global window: RESULTS (entity_key, AgentEnvelope), APPROVALS
    (entity_key, ToolIntent) and DEAD_LETTERS (entity_key, ActivationErrorRecord).
    `result_keyring_loader`, called on the worker, gives the ring whose active key signs every
    ToolResult."""

    def __init__(
        self,
        tools: Mapping[str, Tool],
        *,
        mode: VerifyMode,
        keyring_loader: Callable[[], Keyring] = Keyring.from_environment,
        result_keyring_loader: Callable[[], Keyring] | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        retention_ms: int = DEFAULT_RETENTION_MS,
    ) -> None:
        super().__init__()
        _check_retention(retention_ms)
        self._tools = dict(tools)
        self._mode = mode
        self._keyring_loader = keyring_loader
        self._result_keyring_loader = result_keyring_loader
        self._clock = clock
        self._retention_ms = retention_ms

    def expand(self, intents):
        # Keyed state is per window: without this, one intent in two windows would run twice.
        global_window = intents | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
        keyed = global_window | "KeyByIntentId" >> beam.ParDo(_Serialize(self._clock)).with_outputs(
            DEAD_LETTERS, main="intents"
        )
        by_intent_id = typed(keyed.intents, Tuple[str, bytes])
        gated = by_intent_id | "ExecuteOnce" >> beam.ParDo(
            _ExecuteOnce(
                self._tools,
                self._mode,
                self._keyring_loader,
                self._result_keyring_loader,
                self._clock,
                self._retention_ms,
            )
        ).with_outputs(APPROVALS, DEAD_LETTERS, main=RESULTS)
        typed(keyed[DEAD_LETTERS], Tuple[bytes, ActivationErrorRecord])
        typed(gated[DEAD_LETTERS], Tuple[bytes, ActivationErrorRecord])
        dead_letters = (keyed[DEAD_LETTERS], gated[DEAD_LETTERS]) | "DeadLetters" >> beam.Flatten()
        return {
            RESULTS: typed(gated[RESULTS], Tuple[bytes, AgentEnvelope]),
            APPROVALS: typed(gated[APPROVALS], Tuple[bytes, ToolIntent]),
            DEAD_LETTERS: typed(dead_letters, Tuple[bytes, ActivationErrorRecord]),
        }
