"""The gate: steps 1 to 6 of the package docstring over any ExecutionStore (`Gate`), and
`Effector`, the gate as a plain callable over a store of its own.

A claim in a store holds its claimant's lease (`leases`), renewed while the tool runs, so a
copy can tell a call still in flight from one whose effector stopped mid-call (its lease
expired); the latter's outcome is settled by the tool's ToolSpec, or by a person answering an
inquiry (`resolve`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Mapping

from google.protobuf.message import DecodeError

from beam_agents._protos import (
    ActivationErrorRecord,
    AgentEnvelope,
    ExecutionRecord,
    ToolIntent,
    ToolResult,
)
from beam_agents.errors import CanonicalJsonError, error_text
from beam_agents.intents.effector.leases import Leases, settle
from beam_agents.intents.effector.spec import (
    DEFAULT_LEASE_MS,
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_RETENTION_MS,
    INQUIRY_SUFFIX,
    INQUIRY_TOOL,
    REASON_CONFLICT,
    REASON_UNDECODABLE,
    EffectorOutput,
    Route,
    Tool,
    ToolSpec,
    VerifyMode,
    check_max_result_bytes,
    check_retention,
    wall_clock_ms,
)
from beam_agents.intents.effector.stores import ExecutionStore, SqliteExecutionStore
from beam_agents.intents.identity import (
    canonical_args_json,
    content_digest,
    effective_kind,
    parse_args_json,
)
from beam_agents.intents.signing import Keyring, Verification, sign, verify

__all__ = ["Effector", "Gate", "dead_letter"]


#: What to do about a refused signature, on the dead letter's line: who signs what.
_SIGNATURE_FIXES = {
    Verification.UNSIGNED: (
        "; RunAgent signs intents only when given RunAgent(keyring_loader=...), the keys this "
        "effector verifies with; for a local run, give the effector VerifyMode.OFF"
    ),
    Verification.UNKNOWN_KEY: (
        "; RunAgent's keyring_loader= and the effector's keyring must hold the same intent "
        "keys (during a rotation, add the new key to every ring before making it active)"
    ),
}
#: How many tool names an unknown tool's rejection lists.
_TOOLS_LISTED = 20


def _spec(tool: Tool | ToolSpec) -> ToolSpec:
    return tool if isinstance(tool, ToolSpec) else ToolSpec(tool)


_INT64_MAX = 2**63 - 1
#: Longest error_message kept from a failing tool; exception texts can be unbounded.
_MAX_ERROR_CHARS = 4096


class Gate:
    """Steps 1 to 6 of the package docstring over any ExecutionStore. `leases` are those of
    the effector instance deciding; None where no other process shares the store (Beam keyed
    state, which commits a claim only with its bundle's result): a claim read back there is a
    lost call."""

    def __init__(
        self,
        tools: Mapping[str, Tool],
        mode: VerifyMode,
        keyring: Keyring | None,
        retention_ms: int,
        result_keyring: Keyring | None = None,
        approval_keyring: Keyring | None = None,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        leases: Leases | None = None,
        inquiry_keyring: Keyring | None = None,
    ) -> None:
        if mode is not VerifyMode.OFF and keyring is None:
            raise ValueError(
                f"VerifyMode.{mode.name} needs a keyring to verify intents with: pass keyring=, "
                "or for a local run mode=VerifyMode.OFF"
            )
        if result_keyring is not None and result_keyring.active is None:
            raise ValueError("result_keyring needs an active key to sign results with")
        if inquiry_keyring is not None and inquiry_keyring.active is None:
            raise ValueError("inquiry_keyring needs an active key to sign inquiries with")
        check_retention(retention_ms)
        self.tools = {name: _spec(tool) for name, tool in tools.items()}
        self.mode = mode
        self.keyring = keyring
        self.retention_ms = retention_ms
        self.result_keyring = result_keyring
        self.approval_keyring = approval_keyring
        #: Signs the inquiries about lost calls; the result keyring when not given.
        self.inquiry_keyring = result_keyring if inquiry_keyring is None else inquiry_keyring
        self.max_result_bytes = check_max_result_bytes(max_result_bytes)
        self.leases = leases

    def keep_until(self, record: ExecutionRecord, now: int) -> int:
        if record.outcome == ExecutionRecord.OUTCOME_RUNNING or _awaits_answer(record):
            # Until the call's result replaces it: a tool may run, and a person may take, past
            # any retention, and a copy that found no record would be decided again (EXPIRED,
            # for a call that may have acted), an answer that found none would be dropped.
            return _INT64_MAX
        return min(max(record.latest_expires_at_ms, now) + self.retention_ms, _INT64_MAX)

    def decide(
        self,
        data: bytes,
        *,
        now: Callable[[], int],
        store: ExecutionStore,
    ) -> EffectorOutput:
        """The gate's output for one serialized intent; runs its tool at most once."""
        try:
            intent = ToolIntent.FromString(data)
        except DecodeError as e:
            detail = f"{len(data)} bytes are not a ToolIntent: {e}"
            return dead_letter(b"", REASON_UNDECODABLE, detail, now())
        return self._decide(data, intent, now, store)

    def _decide(self, data, intent, now, store) -> EffectorOutput:
        at = now()
        if self.mode is not VerifyMode.OFF:
            # The legacy scheme's window is measured on the effector's clock, as expiry is.
            outcome = verify(intent, self.keyring, wire=data, now_ms=at)
            if not self.mode.admits(outcome):
                detail = (
                    f"intent {intent.intent_id} ({intent.tool_name}) refused in "
                    f"{self.mode.value} mode: {outcome.value} (key id {intent.signing_key_id!r})"
                    f"{_SIGNATURE_FIXES.get(outcome, '')}"
                )
                reason = "signature_" + outcome.name.lower()
                return dead_letter(intent.entity_key, reason, detail, at)
        record = ExecutionRecord(
            intent_id=intent.intent_id,
            entity_key=intent.entity_key,
            content_digest=content_digest(data),
            latest_expires_at_ms=intent.expires_at_ms,
        )
        known = store.get(intent.intent_id)
        if known is not None:
            return self._again(known, intent, record, now, store)
        decided = self._refusal(intent, record.content_digest, at)
        if decided is None:
            record.outcome = ExecutionRecord.OUTCOME_RUNNING
            self._claim(record, at)
        else:
            record.outcome, result = decided
            if result is not None:
                record.result.CopyFrom(result)
        known = store.claim(record, self.keep_until(record, at))
        if known is not None:  # another caller decided this intent first
            return self._again(known, intent, record, now, store)
        if record.outcome != ExecutionRecord.OUTCOME_RUNNING:
            return self._first_output(record, intent)
        return self._run_claimed(record, intent, now, store)

    def _run_claimed(
        self, claim: ExecutionRecord, intent: ToolIntent, now: Callable[[], int], store
    ) -> EffectorOutput:
        """Runs the tool of `claim`, a RUNNING claim this caller holds (as written: never
        changed, since a Beam state may keep that very object), and records its result,
        renewing the claim's lease until then."""
        record = ExecutionRecord()
        record.CopyFrom(claim)
        holding = contextlib.nullcontext()
        if self.leases is not None:
            holding = self.leases.holding(
                intent.intent_id, store, lambda renewed: self.keep_until(renewed, now())
            )
        with holding:
            record.result.CopyFrom(self._run(intent, record.content_digest, now))
            record.outcome = ExecutionRecord.OUTCOME_RESULT
            settle(record)
            # A copy may extend the claim's expiry while the tool runs, up to this write: the
            # result keeps the latest, written only over the record it read, or it is pruned
            # before that copy expires and a redelivery runs the tool again.
            while True:
                held = store.get(intent.intent_id)
                if held is None:  # a claim is kept until its result replaces it: a store emptied
                    store.put(record, self.keep_until(record, now()))
                    break
                if held.outcome != ExecutionRecord.OUTCOME_RUNNING and not _awaits_answer(held):
                    # The lease lapsed while the tool ran (a frozen process) and another
                    # effector settled the call meanwhile (`leases`): its one result stands.
                    return dataclasses.replace(self._recorded(held, intent), ran_tool=True)
                if held.latest_expires_at_ms > record.latest_expires_at_ms:
                    record.latest_expires_at_ms = held.latest_expires_at_ms
                if store.replace(record, held, self.keep_until(record, now())):
                    break
        return dataclasses.replace(self._first_output(record, intent), ran_tool=True)

    def _claim(self, record: ExecutionRecord, now: int) -> None:
        """Makes `record`, a RUNNING claim about to be written, this effector instance's."""
        if self.leases is not None:
            self.leases.grant(record, now)

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

    def _unknown_tool(self, intent: ToolIntent) -> str:
        """The rejection of a tool this effector lacks, naming the tools it has (a typo, or
        an effector given another agent's tools)."""
        names = sorted(self.tools)
        listed = ", ".join(repr(name) for name in names[:_TOOLS_LISTED])
        more = f" and {len(names) - _TOOLS_LISTED} more" if len(names) > _TOOLS_LISTED else ""
        return (
            f"unknown tool {intent.tool_name!r}; the effector's tools are {listed or 'none'}{more}"
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
                intent, digest, ToolResult.REJECTED, now, error=self._unknown_tool(intent)
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
                intent,
                digest,
                ToolResult.ERROR,
                now(),
                error=f"{type(e).__name__}: {error_text(e)}",
            )
        return self._acted(intent, digest, now(), payload)

    def _acted(self, intent: ToolIntent, digest: bytes, now: int, payload: bytes) -> ToolResult:
        """The OK result of a call that took effect. A payload over `max_result_bytes` is not
        kept: every copy would send it again, and past the bus's record limit (1 MB by default
        in Kafka) none could be sent, wedging the intents behind it. The call did act, so the
        result stays OK, its error_message saying what was dropped."""
        if len(payload) <= self.max_result_bytes:
            return _result(intent, digest, ToolResult.OK, now, payload=payload)
        error = (
            f"the tool took effect; its result of {len(payload)} bytes is over the effector's "
            f"max_result_bytes ({self.max_result_bytes}) and was not kept"
        )
        return _result(intent, digest, ToolResult.OK, now, error=error)

    def _again(
        self,
        known: ExecutionRecord,
        intent: ToolIntent,
        record: ExecutionRecord,
        clock: Callable[[], int],
        store: ExecutionStore,
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
        if known.outcome == ExecutionRecord.OUTCOME_RUNNING:
            if self.leases is None or self.leases.expired(known, now):
                return self._unknown_outcome(known, intent, clock, store)
            if self.leases.legacy(known):  # written before leases: migrated on read (`leases`)
                updated = self.leases.stamped(known, now)
        if intent.expires_at_ms > known.latest_expires_at_ms:
            updated.latest_expires_at_ms = intent.expires_at_ms
        if updated != known:
            # Only over the record as read: since, its call may have stored its result, a
            # person answered its inquiry, another copy moved the expiry further, or the
            # claimant renewed its lease, which a write of the record read would undo.
            written = store.replace(updated, known, self.keep_until(updated, now))
            current = None if written else store.get(intent.intent_id)
            if current is not None:
                return self._again(current, intent, record, clock, store)
            # Written, or pruned since the read (past its retention): the decision read stands.
        return self._recorded(known, intent)

    def _recorded(self, known: ExecutionRecord, intent: ToolIntent) -> EffectorOutput:
        """What a copy of a decided intent gets: the recorded result or approval request
        again, or nothing yet for a claim in flight."""
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
    ) -> EffectorOutput:
        """The claimant of `known` stopped mid-call (its lease expired): the tool may or may not
        have acted. What the tool's ToolSpec allows decides: run it again (idempotent), ask its
        reconciler, or ask a person. Every path takes the expired claim over first, written
        only over the claim as read (a renewal since, or another taker, makes the write fail),
        so one caller acts, and never while the claimant renews its lease."""
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
                    settle(updated)
                    updated.outcome = ExecutionRecord.OUTCOME_RESULT
                    updated.result.CopyFrom(self._acted(intent, known.content_digest, now, payload))
                    return self._take_over(known, updated, intent, clock, store)
                run_again = True  # it did not act: running it is the first effect
        if run_again:
            self._claim(updated, now)
            if not store.replace(updated, known, self.keep_until(updated, now)):
                return self._again(store.get(intent.intent_id), intent, updated, clock, store)
            return self._run_claimed(updated, intent, clock, store)
        settle(updated)
        updated.outcome = ExecutionRecord.OUTCOME_APPROVAL
        inquiry = _inquiry(intent, now)
        if self.inquiry_keyring is not None:
            inquiry = sign(inquiry, self.inquiry_keyring)
        # The record keeps the inquiry, so a copy re-sends the very same one.
        updated.result.CopyFrom(
            ToolResult(
                intent_id=inquiry.intent_id, payload=inquiry.SerializeToString(deterministic=True)
            )
        )
        return self._take_over(known, updated, intent, clock, store)

    def resolve(
        self, answer: AgentEnvelope, *, now: int, store: ExecutionStore
    ) -> EffectorOutput | None:
        """A person's answer to an inquiry (`_inquiry`) as the result of the call it asked
        about: approved, it took effect (OK, with no payload and an error_message saying its
        payload is unknown: `Answer.payload_unknown`); denied, it did not (ERROR saying so, not
        run: the agent may ask again). None when `answer` answers no inquiry of this store."""
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
            return dead_letter(inquiry.entity_key, refusal, detail, now)
        original = ToolIntent(
            intent_id=known.intent_id, entity_key=known.entity_key, seq=inquiry.seq
        )
        if approval.approved:
            # The person knows that it acted, not what the tool answered: the result says so,
            # as an OK result whose payload was not kept does (`_acted`), and carries no payload
            # an agent could mistake for the tool's.
            error = (
                f"the tool took effect, as {approval.approver} confirmed after its effector "
                "stopped mid-call; its result is unknown"
            )
            result = _result(original, known.content_digest, ToolResult.OK, now, error=error)
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
        if not store.replace(updated, known, self.keep_until(updated, now)):
            # Another answer, or a copy's later expiry, came first: judge against the record
            # as it is now, so the agent gets one result for the call, never two.
            return self.resolve(answer, now=now, store=store)
        return EffectorOutput(Route.RESULT, result=self._envelope(result))

    def _take_over(self, known, updated, intent, clock, store) -> EffectorOutput:
        if not store.replace(updated, known, self.keep_until(updated, clock())):
            return self._again(store.get(intent.intent_id), intent, updated, clock, store)
        return self._first_output(updated, intent)


def _awaits_answer(record: ExecutionRecord) -> bool:
    """Whether `record` holds an inquiry about a lost call (`_inquiry`) still unanswered."""
    return record.outcome == ExecutionRecord.OUTCOME_APPROVAL and bool(record.result.payload)


def _approval_of(record: ExecutionRecord, intent: ToolIntent) -> ToolIntent:
    """What goes before a person for an APPROVAL record: the intent itself, or for a tool call
    whose outcome was unknown, the inquiry the record keeps."""
    if record.result.payload:
        return ToolIntent.FromString(record.result.payload)
    return intent


def _inquiry(intent: ToolIntent, now: int) -> ToolIntent:
    """The APPROVAL intent asking whether `intent`'s call took effect; deterministic but for
    its creation time."""
    # The args are quoted in part: escaped again inside the question's JSON string, all of
    # them could double an intent that fit the bus into an inquiry the approvals topic refuses.
    args = intent.args_json
    if len(args) > _MAX_ERROR_CHARS:
        args = args[:_MAX_ERROR_CHARS] + f"... ({len(intent.args_json)} characters)"
    question = (
        f"The effector stopped while running {intent.tool_name} {args} "
        f"(intent {intent.intent_id}). Did it take effect? Approve if it did; deny if it did "
        "not: it is not run again, the agent is told it was not done."
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
        # Answerable as long as the effector waits for the answer: until it comes (the record
        # is kept until then, `Gate.keep_until`). The call's own expiry, often past by the time
        # its copy finds the claim dead, made a console refuse every answer, and the agent was
        # never told what became of a call that may have acted.
        expires_at_ms=_INT64_MAX,
        kind=ToolIntent.APPROVAL,
        trace_id=intent.trace_id,
    )


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


def dead_letter(entity_key: bytes, reason: str, detail: str, now: int) -> EffectorOutput:
    record = ActivationErrorRecord(
        entity_key=entity_key, reason=reason, detail=_printable(detail), event_time_ms=now
    )
    return EffectorOutput(Route.DEAD_LETTER, dead_letter=record)


class Effector:
    """The gate (steps 1 to 6 of the package docstring) as a plain callable:
    `effector(intent_or_bytes)`.

    `tools` maps names to callables or `ToolSpec`s. `store` is an ExecutionStore, or a path for
    a SqliteExecutionStore (":memory:" keeps nothing across restarts: tests only). `keyring`
    verifies intents; `result_keyring`, with an active key, signs every ToolResult (RunAgent
    verifies them with its answer keyring); `inquiry_keyring`, with an active key, signs the
    inquiries about lost calls (default: the result keyring) for a console to verify, a ring of
    their own so a console never holds a key that signs results; `approval_keyring` verifies
    the answers to inquiries (`resolve`). A tool's payload over `max_result_bytes` is not kept: its
    result is OK with an error_message saying so (`Gate._acted`). Each claim it writes holds a
    lease of `lease_ms` on `clock`, renewed while the tool runs (`leases`): a call whose effector
    died is a lost call this long after its last renewal. Give every effector sharing a store
    the same clock (the wall clock) and a lease longer than any stall of their processes.
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
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
        lease_ms: int = DEFAULT_LEASE_MS,
        inquiry_keyring: Keyring | None = None,
    ) -> None:
        self._gate = Gate(
            tools,
            mode,
            keyring,
            retention_ms,
            result_keyring,
            approval_keyring,
            max_result_bytes=max_result_bytes,
            leases=Leases(lease_ms, clock),
            inquiry_keyring=inquiry_keyring,
        )
        if isinstance(store, str | os.PathLike):
            store = SqliteExecutionStore(store)
        self.store = store
        self._clock = clock

    @property
    def instance_id(self) -> str:
        """Names this instance in the claims it writes, as their claimant and lease owner."""
        return self._gate.leases.owner

    def __call__(self, intent: ToolIntent | bytes) -> EffectorOutput:
        if isinstance(intent, ToolIntent):
            intent = intent.SerializeToString(deterministic=True)
        prune = getattr(self.store, "prune", None)
        if prune is not None:
            prune(self._clock())
        return self._gate.decide(intent, now=self._clock, store=self.store)

    def resolve(self, answer: AgentEnvelope) -> EffectorOutput | None:
        """A person's answer (an AgentEnvelope with an approval) to an inquiry this effector
        sent about a call whose outcome was unknown: the call's result (RESULT, or DUPLICATE
        for a copy of an answer), a dead letter for an answer whose signature or content does
        not hold, or None when it answers no inquiry of this store."""
        return self._gate.resolve(answer, now=self._clock(), store=self.store)
