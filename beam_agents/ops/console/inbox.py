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
inbox: lists (`approvals`, filtered by state, tool and key) show the approvable copies first,
by urgency: those a person can still decide soonest to expire first (an approvable copy's
expires_at_ms is signed), then those nobody can decide; refused copies after them in the order
this console received them (its own clock, never a time they claim). Refused copies are kept for
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

Approving with changes. A person may approve with some arguments changed, those the request
names editable, each to a value of its asked JSON type (intents/approval_edits.py judges it;
anything else is refused as "edit_refused" before anything is recorded). The changes are
signed in the Approval (edited_args_json), kept with the decision and in its audit row and
TraceEvent; a decline carries none.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping

from google.protobuf.message import DecodeError

from beam_agents._protos import AgentEnvelope, StateSnapshot, ToolIntent, TraceEvent
from beam_agents.errors import ApprovalEditError, BeamAgentsError
from beam_agents.intents.approval_edits import check_edits, edits_json
from beam_agents.intents.effector import INQUIRY_SUFFIX, INQUIRY_TOOL, VerifyMode, wall_clock_ms
from beam_agents.intents.identity import content_digest, effective_kind
from beam_agents.intents.signing import Keyring, Verification, is_unsigned, sign, verify
from beam_agents.ops.console.db import Database

__all__ = [
    "MAX_REFUSED",
    "REFUSED_KEEP_MS",
    "STATES",
    "Approval",
    "Decision",
    "DecisionRefused",
    "Inbox",
]

#: Longest comment kept; a form field is otherwise unbounded.
MAX_COMMENT_CHARS = 2000
#: How long and how many refused copies are kept (module docstring).
REFUSED_KEEP_MS = 24 * 60 * 60 * 1000
MAX_REFUSED = 1000
#: What a list of approvals can show (`Inbox.approvals`): the undecided ones (approvable first),
#: the approvable undecided ones, the decided ones, those refused at receipt, or all.
STATES = ("undecided", "pending", "decided", "refused", "all")
_WHERE = {
    "undecided": "d.intent_id IS NULL",
    "pending": "d.intent_id IS NULL AND a.approvable = 1",
    "decided": "d.intent_id IS NOT NULL",
    "refused": "a.approvable = 0",
    "all": "1",
}
#: The order of a list of approvals by urgency: approvable first, those a person can still
#: decide first among them, soonest to expire first (a signed time: only approvable copies
#: are ordered by it), then by this console's receipt. Decided ones: newest decision first.
_URGENCY = (
    "ORDER BY a.approvable DESC, (a.approvable = 1 AND a.expires_at_ms > :now) DESC, "
    "CASE WHEN a.approvable = 1 THEN a.expires_at_ms END, a.received_at_ms, a.intent_id"
)
_NEWEST_DECISION = "ORDER BY d.decided_at_ms DESC, a.intent_id"


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
    #: The arguments the approver changed, as the Approval's edited_args_json ("" for none).
    edits: str = ""


_DECISION_COLUMNS = (
    "intent_id, entity_key, approved, approver, comment, decided_at_ms, address, envelope, "
    "trace, produced, edits"
)


def _decision(row) -> Decision:
    intent_id, key, approved, approver, comment, at, address, envelope, trace, produced, edits = row
    return Decision(
        intent_id, key, bool(approved), approver, comment, at, address, envelope, trace,
        bool(produced), edits,
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
        self._name_tools()
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
                    "INSERT OR REPLACE INTO approvals (intent_id, entity_key, intent, "
                    "verification, approvable, created_at_ms, expires_at_ms, received_at_ms, "
                    "tool_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        intent.intent_id, intent.entity_key, bytes(data), outcome, int(admitted),
                        intent.created_at_ms, intent.expires_at_ms, now, intent.tool_name,
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

    def _name_tools(self) -> None:
        """Fills the tool name of the copies a console kept before it had the column (the
        inbox filters by it), one copy at a time as `_judge_again` reads them."""
        for (intent_id,) in self._db.read("SELECT intent_id FROM approvals WHERE tool_name = ''"):
            ((data,),) = self._db.read(
                "SELECT intent FROM approvals WHERE intent_id = ?", (intent_id,)
            )
            name = ToolIntent.FromString(data).tool_name
            if name:
                with self._db.transaction() as db:
                    db.execute(
                        "UPDATE approvals SET tool_name = ? WHERE intent_id = ? AND intent = ?",
                        (name, intent_id, data),
                    )

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

    def approvals(
        self,
        *,
        state: str = "undecided",
        tool: str = "",
        key: bytes | None = None,
        offset: int = 0,
        limit: int = 20,
    ) -> tuple[list[Approval], int]:
        """One page of the approvals in `state` (one of STATES), of the tool `tool` and the key
        `key` when given, each with its decision, and how many there are in all. Undecided
        ones come by urgency (`_URGENCY`), decided ones newest decision first."""
        where, params = [_WHERE[state]], {"now": self._clock(), "limit": limit, "offset": offset}
        if tool:
            where.append("a.tool_name = :tool")
            params["tool"] = tool
        if key is not None:
            where.append("a.entity_key = :key")
            params["key"] = key
        source = (
            "FROM approvals a LEFT JOIN decisions d ON d.intent_id = a.intent_id "
            f"WHERE {' AND '.join(where)}"
        )
        (total,) = self._db.read(f"SELECT count(*) {source}", params)[0]
        order = _NEWEST_DECISION if state == "decided" else _URGENCY
        rows = self._db.read(
            f"SELECT a.intent, a.verification, a.approvable, a.received_at_ms, "
            f"{', '.join('d.' + c for c in _DECISION_COLUMNS.split(', '))} "
            f"{source} {order} LIMIT :limit OFFSET :offset",
            params,
        )
        return [
            self._approval(row[:4], _decision(row[4:]) if row[4] is not None else None)
            for row in rows
        ], total

    def tools(self) -> list[str]:
        """The tool names of the approvable copies kept (a filter's choices: anyone may write a
        refused copy under any name)."""
        rows = self._db.read(
            "SELECT DISTINCT tool_name FROM approvals WHERE approvable = 1 ORDER BY 1"
        )
        return [name for (name,) in rows]

    @staticmethod
    def _approval(row, decision: Decision | None) -> Approval:
        data, verification, approvable, received = row
        intent = ToolIntent.FromString(data)
        return Approval(intent, verification, bool(approvable), received, decision)

    # -- deciding -------------------------------------------------------------------------

    def decide(
        self,
        intent_id: str,
        *,
        approved: bool,
        user: str,
        comment: str,
        address: str,
        edits: Mapping[str, object] | None = None,
    ) -> tuple[Decision, bool]:
        """Records the one decision of `intent_id` (module docstring), approving it with the
        arguments in `edits` changed (values of their JSON types, as a person may change them:
        `approval_edits.check_edits`). Returns it and whether this call made it; raises
        DecisionRefused."""
        comment = comment[:MAX_COMMENT_CHARS]
        if edits and not approved:
            raise DecisionRefused(
                f"approval {intent_id} is declined with edited arguments: only an approval "
                "carries them",
                reason="edit_refused",
                intent_id=intent_id,
            )
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
            try:
                edited = edits_json(check_edits(intent, edits or {}))
            except ApprovalEditError as e:
                raise DecisionRefused(
                    f"approval {intent_id}: {e}", reason="edit_refused", intent_id=intent_id
                ) from None
            now = self._clock()
            self._check_time(db, intent, now)
            envelope = AgentEnvelope(entity_key=intent.entity_key, event_time_ms=now)
            answer = AgentEnvelope.Approval(
                intent_id=intent_id,
                approved=approved,
                approver=user,
                decided_at_ms=now,
                intent_digest=content_digest(data),
                edited_args_json=edited,
            )
            envelope.approval.CopyFrom(sign(answer, self._approvals_keyring))
            trace = _trace(intent, approved, user, comment, address, now, edited)
            decision = Decision(
                intent_id, intent.entity_key, approved, user, comment, now, address,
                envelope.SerializeToString(deterministic=True),
                trace.SerializeToString(deterministic=True), False, edited,
            )  # fmt: skip
            db.execute(
                f"INSERT INTO decisions ({_DECISION_COLUMNS}) VALUES ({', '.join('?' * 11)})",
                (
                    intent_id, intent.entity_key, int(approved), user, comment, now, address,
                    decision.envelope, decision.trace, 0, edited,
                ),
            )  # fmt: skip
            action = ("approve edited" if edited else "approve") if approved else "decline"
            changed = f"; edited: {edited}" if edited else ""
            db.execute(
                "INSERT INTO audit (at_ms, user, action, intent_id, detail, address) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (
                    now, user, action, intent_id,
                    f"{intent.tool_name} {intent.args_json}{changed}; comment: {comment}", address,
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
    intent: ToolIntent,
    approved: bool,
    user: str,
    comment: str,
    address: str,
    now: int,
    edited: str,
) -> TraceEvent:
    """The decision as a span of the activation that asked (same trace id), from the moment it
    asked to the decision: the wait for a person. Its span id comes from the intent id, so a
    copy produced again is the same event."""
    edits = {"beam_agents.approval.edited_args": edited} if edited else {}
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
            **edits,
        },
        # The intent's created_at_ms is signed (only an approvable copy is decided); a clock
        # behind the agent's leaves an instant, never a negative span.
        start_ms=min(intent.created_at_ms, now),
        end_ms=now,
    )
