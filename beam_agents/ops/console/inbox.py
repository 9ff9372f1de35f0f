"""The approvals inbox: APPROVAL intents in, one signed decision per intent out.

Receiving. Each record of the approvals topic is decoded and verified as the effector verifies
an intent (`VerifyMode`, from the bytes as received): an agent's APPROVAL intent with the intent
keyring, and the effector's inquiry about a lost call (`INQUIRY_TOOL`, an intent_id ending in
`INQUIRY_SUFFIX`) with the inquiry keyring, the ring the effector signs its inquiries with. Each
key vouches only for what its holder sends: an inquiry signed with the intent key is refused,
and so is an agent's question signed with the inquiry key. (An HMAC key that verifies also
signs: the effector's own inquiry ring, not its result ring, keeps the console from holding a
key RunAgent takes results from.) Every copy is kept, but only one the mode
admits, of kind APPROVAL, is approvable; a refused one is listed with its verification outcome
and can never be decided. A copy the mode admits replaces a refused one under the same
intent_id (a forger cannot shadow the real intent by sending first); two admissible copies keep
the first. Each process judges the undecided copies kept again when it starts, by its own mode
and keyring (a key added since admits, a key removed refuses).

Anyone may write to the approvals topic, so nothing a refused copy claims orders or bounds the
inbox: lists show the approvable copies first, each part in the order this console received
them (its own clock, not the intent's unsigned created_at_ms), and refused copies are kept for
`REFUSED_KEEP_MS` after they were received and at most `MAX_REFUSED` of them, the newest (a
copy refused for a key the console lacks is admitted if the key arrives within that).

Deciding, exactly once. `decide` runs in one BEGIN IMMEDIATE transaction: it refuses an intent
that is not approvable, expired (`expires_at_ms` at or before now, or no expiry: fail closed as
the effector does), or whose suspension's deadline (from the key's latest trusted
StateSnapshot, observed.py) has passed; an intent decided before gets that decision back,
whoever asks (a second click, a replayed form post, another console process on the same
file). Otherwise it builds the
AgentEnvelope (the Approval with intent_id, approved, approver = the signed-in user,
decided_at_ms, intent_digest = the content digest of the intent decided, signed with the
approvals keyring) and the decision's TraceEvent, and records both with the audit row before
anything is produced. The caller produces the recorded bytes and then marks them produced
(`mark_produced`); `unproduced` lists what a crash left between the two, to be produced again
on start. A copy produced twice carries the same bytes, which RunAgent counts as a duplicate
answer: the agent sees one decision, never two, never none.

The comment has no field in the Approval; it is kept in the audit log and the TraceEvent.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable

from google.protobuf.message import DecodeError

from beam_agents._protos import AgentEnvelope, StateSnapshot, ToolIntent, TraceEvent
from beam_agents.errors import BeamAgentsError
from beam_agents.intents.effector import INQUIRY_SUFFIX, INQUIRY_TOOL, VerifyMode, wall_clock_ms
from beam_agents.intents.identity import content_digest, effective_kind
from beam_agents.intents.signing import Keyring, Verification, is_unsigned, sign, verify
from beam_agents.ops.console.db import Database

__all__ = ["MAX_REFUSED", "REFUSED_KEEP_MS", "Approval", "Decision", "DecisionRefused", "Inbox"]

#: Longest comment kept; a form field is otherwise unbounded.
MAX_COMMENT_CHARS = 2000
#: How long and how many refused copies are kept (module docstring).
REFUSED_KEEP_MS = 24 * 60 * 60 * 1000
MAX_REFUSED = 1000
#: The order of every list of approvals: approvable first, then by this console's receipt.
_ORDER = "ORDER BY approvable DESC, received_at_ms, intent_id"


class DecisionRefused(BeamAgentsError):
    """A decision the console will not record; `reason` is one word, the message says why."""

    def __init__(self, message: str, *, reason: str, intent_id: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.intent_id = intent_id


@dataclasses.dataclass(frozen=True)
class Approval:
    """An APPROVAL intent as the inbox keeps it."""

    intent: ToolIntent
    verification: str
    approvable: bool
    received_at_ms: int
    decision: Decision | None = None

    @property
    def intent_id(self) -> str:
        return self.intent.intent_id


@dataclasses.dataclass(frozen=True)
class Decision:
    intent_id: str
    entity_key: bytes
    approved: bool
    approver: str
    comment: str
    decided_at_ms: int
    address: str
    #: The serialized AgentEnvelope and TraceEvent, produced as recorded.
    envelope: bytes
    trace: bytes
    produced: bool


_DECISION_COLUMNS = (
    "intent_id, entity_key, approved, approver, comment, decided_at_ms, address, envelope, "
    "trace, produced"
)


def _decision(row) -> Decision:
    intent_id, key, approved, approver, comment, at, address, envelope, trace, produced = row
    return Decision(
        intent_id, key, bool(approved), approver, comment, at, address, envelope, trace,
        bool(produced),
    )  # fmt: skip


class Inbox:
    """Pending approvals and their decisions in the console's Database."""

    def __init__(
        self,
        db: Database,
        *,
        mode: VerifyMode,
        intent_keyring: Keyring | None,
        approvals_keyring: Keyring,
        inquiry_keyring: Keyring | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        max_refused: int = MAX_REFUSED,
    ) -> None:
        if mode is not VerifyMode.OFF and intent_keyring is None:
            raise ValueError(f"verify mode {mode.value} needs an intent keyring")
        if approvals_keyring.active is None:
            raise ValueError("the approvals keyring needs an active key to sign decisions")
        self._db = db
        self._mode = mode
        self._intent_keyring = intent_keyring
        self._inquiry_keyring = inquiry_keyring
        self._approvals_keyring = approvals_keyring
        self._clock = clock
        self._max_refused = max_refused
        self._judge_again()

    # -- receiving ------------------------------------------------------------------------

    def receive(self, data: bytes) -> tuple[Approval | None, bool]:
        """Keeps one record of the approvals topic: the approval as kept (None for bytes that
        are no ToolIntent) and whether this copy was kept (a new intent_id, or an admitted copy
        in place of a refused one)."""
        try:
            intent = ToolIntent.FromString(data)
        except DecodeError:
            return None, False
        outcome, admitted = self._judge(intent, data)
        now = self._clock()
        with self._db.transaction() as db:
            row = db.execute(
                "SELECT approvable FROM approvals WHERE intent_id = ?", (intent.intent_id,)
            ).fetchone()
            kept = row is None or (admitted and not row[0])
            if kept:
                db.execute(
                    "INSERT OR REPLACE INTO approvals VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        intent.intent_id, intent.entity_key, bytes(data), outcome, int(admitted),
                        intent.created_at_ms, intent.expires_at_ms, now,
                    ),
                )  # fmt: skip
            if not admitted:
                self._forget_refused(db, now)
        return self.get(intent.intent_id), kept

    def _forget_refused(self, db, now: int) -> None:
        """Bounds the refused copies by age and count (module docstring). A refused copy has
        no decision: `decide` refuses it, and only undecided copies are judged again."""
        db.execute(
            "DELETE FROM approvals WHERE approvable = 0 AND received_at_ms < ?",
            (now - REFUSED_KEEP_MS,),
        )
        db.execute(
            "DELETE FROM approvals WHERE rowid IN (SELECT rowid FROM approvals "
            "WHERE approvable = 0 ORDER BY received_at_ms DESC, rowid DESC LIMIT -1 OFFSET ?)",
            (self._max_refused,),
        )

    def _judge(self, intent: ToolIntent, data: bytes) -> tuple[str, bool]:
        """The verification outcome of a copy and whether the mode admits it."""
        if self._mode is VerifyMode.OFF:
            outcome, admitted = "not verified", True
        else:
            inquiry = intent.tool_name == INQUIRY_TOOL or intent.intent_id.endswith(INQUIRY_SUFFIX)
            ring = self._inquiry_keyring if inquiry else self._intent_keyring
            if ring is not None:
                verification = verify(intent, ring, wire=data)
            else:  # an inquiry, and no inquiry keyring: only an unsigned one can be admitted
                verification = (
                    Verification.UNSIGNED if is_unsigned(intent) else Verification.UNKNOWN_KEY
                )
            outcome, admitted = verification.value, self._mode.admits(verification)
            if inquiry and not admitted:
                outcome = f"{outcome}; an inquiry of the effector, verified by the inquiry keyring"
        if effective_kind(intent) != ToolIntent.APPROVAL:
            outcome, admitted = f"{outcome}; not an APPROVAL intent", False
        return outcome, admitted

    def _judge_again(self) -> None:
        """Judges every undecided copy kept by this process's mode and keyring: a copy refused
        for a key the console lacked becomes approvable once its keyring has the key (its
        record was read and committed, so it is never read again), one admitted under a key
        since removed is refused."""
        # The ids first, then one copy at a time: refused copies, anyone's, are kept for ever,
        # and all of them at once could be more than the process can hold.
        ids = self._db.read(
            "SELECT intent_id FROM approvals a WHERE NOT EXISTS "
            "(SELECT 1 FROM decisions d WHERE d.intent_id = a.intent_id)"
        )
        for (intent_id,) in ids:
            ((data, verification, approvable),) = self._db.read(
                "SELECT intent, verification, approvable FROM approvals WHERE intent_id = ?",
                (intent_id,),
            )
            outcome, admitted = self._judge(ToolIntent.FromString(data), data)
            if (outcome, admitted) != (verification, bool(approvable)):
                with self._db.transaction() as db:
                    db.execute(
                        # The copy judged, not one another process kept since.
                        "UPDATE approvals SET verification = ?, approvable = ? "
                        "WHERE intent_id = ? AND intent = ?",
                        (outcome, int(admitted), intent_id, data),
                    )

    # -- reading --------------------------------------------------------------------------

    def get(self, intent_id: str) -> Approval | None:
        rows = self._db.read(
            "SELECT intent, verification, approvable, received_at_ms FROM approvals "
            "WHERE intent_id = ?",
            (intent_id,),
        )
        if not rows:
            return None
        return self._approval(rows[0], self.decision(intent_id))

    def decision(self, intent_id: str) -> Decision | None:
        rows = self._db.read(
            f"SELECT {_DECISION_COLUMNS} FROM decisions WHERE intent_id = ?", (intent_id,)
        )
        return _decision(rows[0]) if rows else None

    def pending(self, *, offset: int = 0, limit: int = 20) -> tuple[list[Approval], int]:
        """Undecided approvals, approvable first, each part in the order received, and how
        many there are in all."""
        where = "FROM approvals a WHERE NOT EXISTS (SELECT 1 FROM decisions d WHERE d.intent_id = a.intent_id)"  # noqa: E501
        (total,) = self._db.read(f"SELECT count(*) {where}")[0]
        rows = self._db.read(
            f"SELECT intent, verification, approvable, received_at_ms {where} "
            f"{_ORDER} LIMIT ? OFFSET ?",
            (limit, offset),
        )
        return [self._approval(row, None) for row in rows], total

    def decided(self, *, offset: int = 0, limit: int = 20) -> tuple[list[Decision], int]:
        """Decisions, newest first, and how many there are in all."""
        (total,) = self._db.read("SELECT count(*) FROM decisions")[0]
        rows = self._db.read(
            f"SELECT {_DECISION_COLUMNS} FROM decisions ORDER BY decided_at_ms DESC, intent_id "
            "LIMIT ? OFFSET ?",
            (limit, offset),
        )
        return [_decision(row) for row in rows], total

    def for_key(
        self, entity_key: bytes, *, offset: int = 0, limit: int = 20
    ) -> tuple[list[Approval], int]:
        """The key's approvals, decided or not, in the order of `pending`, and how many there
        are in all."""
        (total,) = self._db.read(
            "SELECT count(*) FROM approvals WHERE entity_key = ?", (entity_key,)
        )[0]
        rows = self._db.read(
            "SELECT intent, verification, approvable, received_at_ms, intent_id FROM approvals "
            f"WHERE entity_key = ? {_ORDER} LIMIT ? OFFSET ?",
            (entity_key, limit, offset),
        )
        return [self._approval(row[:4], self.decision(row[4])) for row in rows], total

    @staticmethod
    def _approval(row, decision: Decision | None) -> Approval:
        data, verification, approvable, received = row
        intent = ToolIntent.FromString(data)
        return Approval(intent, verification, bool(approvable), received, decision)

    # -- deciding -------------------------------------------------------------------------

    def decide(
        self, intent_id: str, *, approved: bool, user: str, comment: str, address: str
    ) -> tuple[Decision, bool]:
        """Records the one decision of `intent_id` (module docstring). Returns it and whether
        this call made it; raises DecisionRefused."""
        comment = comment[:MAX_COMMENT_CHARS]
        with self._db.transaction() as db:
            known = db.execute(
                f"SELECT {_DECISION_COLUMNS} FROM decisions WHERE intent_id = ?", (intent_id,)
            ).fetchone()
            if known is not None:
                return _decision(known), False
            row = db.execute(
                "SELECT intent, approvable, verification FROM approvals WHERE intent_id = ?",
                (intent_id,),
            ).fetchone()
            if row is None:
                raise DecisionRefused(
                    f"no approval {intent_id} is known", reason="unknown", intent_id=intent_id
                )
            data, approvable, verification = row
            if not approvable:
                raise DecisionRefused(
                    f"approval {intent_id} cannot be decided: its intent is {verification}",
                    reason="unverified",
                    intent_id=intent_id,
                )
            intent = ToolIntent.FromString(data)
            now = self._clock()
            self._check_time(db, intent, now)
            envelope = AgentEnvelope(entity_key=intent.entity_key, event_time_ms=now)
            answer = AgentEnvelope.Approval(
                intent_id=intent_id,
                approved=approved,
                approver=user,
                decided_at_ms=now,
                intent_digest=content_digest(data),
            )
            envelope.approval.CopyFrom(sign(answer, self._approvals_keyring))
            trace = _trace(intent, approved, user, comment, address, now)
            decision = Decision(
                intent_id, intent.entity_key, approved, user, comment, now, address,
                envelope.SerializeToString(deterministic=True),
                trace.SerializeToString(deterministic=True), False,
            )  # fmt: skip
            db.execute(
                f"INSERT INTO decisions ({_DECISION_COLUMNS}) VALUES ({', '.join('?' * 10)})",
                (
                    intent_id, intent.entity_key, int(approved), user, comment, now, address,
                    decision.envelope, decision.trace, 0,
                ),
            )  # fmt: skip
            db.execute(
                "INSERT INTO audit (at_ms, user, action, intent_id, detail, address) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    now, user, "approve" if approved else "decline", intent_id,
                    f"{intent.tool_name} {intent.args_json}; comment: {comment}", address,
                ),
            )  # fmt: skip
        return decision, True

    def _check_time(self, db, intent: ToolIntent, now: int) -> None:
        if intent.expires_at_ms <= now:
            raise DecisionRefused(
                f"approval {intent.intent_id} expired at {intent.expires_at_ms} ms; "
                "a decision now would not be taken",
                reason="expired",
                intent_id=intent.intent_id,
            )
        # Only a snapshot answering this console's own export request (observed.py): anyone
        # may write a snapshot, and one claiming the deadline passed refused every decision.
        row = db.execute(
            "SELECT snapshot FROM snapshots WHERE entity_key = ? AND trusted = 1",
            (intent.entity_key,),
        ).fetchone()
        if row is None:
            return
        continuation = StateSnapshot.FromString(row[0]).continuation
        if intent.intent_id in continuation.pending_intent_ids and continuation.deadline_ms < now:
            raise DecisionRefused(
                f"the agent stopped waiting for approval {intent.intent_id} at "
                f"{continuation.deadline_ms} ms (its suspension's deadline)",
                reason="after_deadline",
                intent_id=intent.intent_id,
            )

    def unproduced(self) -> list[Decision]:
        """Decisions recorded but not yet acknowledged by the broker, oldest first."""
        rows = self._db.read(
            f"SELECT {_DECISION_COLUMNS} FROM decisions WHERE produced = 0 ORDER BY decided_at_ms"
        )
        return [_decision(row) for row in rows]

    def undelivered(self) -> tuple[int, int | None]:
        """How many decisions are recorded but not yet acknowledged, and when the oldest was
        made (None when there is none)."""
        ((count, oldest),) = self._db.read(
            "SELECT count(*), min(decided_at_ms) FROM decisions WHERE produced = 0"
        )
        return count, oldest

    def mark_produced(self, intent_id: str) -> None:
        with self._db.transaction() as db:
            db.execute("UPDATE decisions SET produced = 1 WHERE intent_id = ?", (intent_id,))

    def audit(self, *, offset: int = 0, limit: int = 50) -> tuple[list[tuple], int]:
        """(at_ms, user, action, intent_id, detail, address) rows, newest first, and the total."""
        (total,) = self._db.read("SELECT count(*) FROM audit")[0]
        rows = self._db.read(
            "SELECT at_ms, user, action, intent_id, detail, address FROM audit "
            "ORDER BY id DESC LIMIT ? OFFSET ?",
            (limit, offset),
        )
        return rows, total


def _trace(
    intent: ToolIntent, approved: bool, user: str, comment: str, address: str, now: int
) -> TraceEvent:
    """The decision as a span of the activation that asked (same trace id). Its span id comes
    from the intent id, so a copy produced again is the same event."""
    return TraceEvent(
        trace_id=intent.trace_id,
        span_id=hashlib.sha256(f"console-decision|{intent.intent_id}".encode()).digest()[:8],
        entity_key=intent.entity_key,
        seq=intent.seq,
        step_index=intent.step_index,
        event_type=TraceEvent.TOOL_CALL,
        attributes={
            "gen_ai.tool.name": intent.tool_name,
            "beam_agents.intent_id": intent.intent_id,
            "beam_agents.approval.approved": "true" if approved else "false",
            "beam_agents.approval.approver": user,
            "beam_agents.approval.address": address,
            "beam_agents.approval.comment": comment,
            "beam_agents.source": "console",
        },
        start_ms=now,
        end_ms=now,
    )
