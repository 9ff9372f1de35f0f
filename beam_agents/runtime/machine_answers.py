"""Answers to a suspended key's intents, for `machine.KeyMachine`: checked, then recorded.

`AnswerChecks`, a mixin of KeyMachine, owns `_answer`. An answer is checked before it is
recorded: the key must be suspended on that intent, the answer in time and of the intent's
kind and entity (an Approval's edited arguments ones its request allows), signed by a key of
the answer keyring when one is configured (ToolResults by the effectors' ring, Approvals by the
approvals channel's), and computed for the pending intent's content (`intent_digest`). Each
refusal is a dead letter carrying the refused envelope, and the key keeps waiting; a copy of an
answer already recorded is counted and dropped. An accepted answer is recorded in a copy of the
Continuation before anything can fail with it; the agent resumes when the last of its own
intents is answered, and answers to the runtime's own questions (escalations, budgets) go to
the runtime, never the agent.

The helpers here read answers in the Continuation's intent order (`ordered_answers`,
`unanswered_intents`), never the order a bag, an export or a restore returns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from beam_agents._protos import AgentEnvelope, Continuation, ToolIntent, ToolResult
from beam_agents.errors import ApprovalEditError, with_article
from beam_agents.intents.approval_edits import parse_edits
from beam_agents.intents.identity import content_digest
from beam_agents.intents.signing import Verification, verify
from beam_agents.runtime import dead_letters as dl
from beam_agents.runtime.budget import BUDGET_TOOL
from beam_agents.runtime.context import ESCALATION_TOOL, RUNTIME_TOOLS, Answer
from beam_agents.runtime.machine_state import Work, due_at, past_every_expiry

__all__ = [
    "AnswerChecks",
    "answered_intent_id",
    "budget_asked",
    "made_here",
    "ordered_answers",
    "unanswered_intents",
]


class AnswerChecks:
    """KeyMachine's checks and records of answers; see the module docstring."""

    def _answer(self, work: Work, envelope: AgentEnvelope, payload: str) -> None:
        now = envelope.event_time_ms
        answered_id = answered_intent_id(envelope)
        suspended = work.state.continuation

        def refuse(reason: str, detail: str) -> None:
            work.dead(reason, detail, now, input=envelope)

        if suspended is None and work.state.empty:
            # Most often a restore that lost a race: nothing orders a key's snapshot before its
            # answers (Prism hands a key's inputs over in event-time order, not as sent).
            refuse(
                dl.NO_SUSPENSION,
                f"an answer to {answered_id} at {now}, but the key has no state: if a "
                "StateSnapshot is to restore it, the answer came first (a runner may take a "
                "key's inputs in event-time order, so an answer stamped before the snapshot's "
                "snapshot_at_ms can overtake it). Restore the key, then send this answer (the "
                "record's input) again, stamped at or after the snapshot",
            )
            return
        if suspended is None:
            refuse(dl.NO_SUSPENSION, f"an answer to {answered_id}, but the key is not suspended")
            return
        # An EXPIRED the runtime made is still recorded only while the resume it was made for
        # awaits its retry: the agent has seen nothing yet, so a genuine answer on time takes
        # its place.
        stand_in = next(
            (a for a in suspended.answers if answered_intent_id(a) == answered_id and made_here(a)),
            None,
        )
        if stand_in is None and any(
            answered_intent_id(a) == answered_id for a in suspended.answers
        ):
            # A copy of an answer already recorded (a redelivery): the recorded one stands.
            if _same_answer(envelope, suspended.answers, answered_id):
                work.count("duplicate_answers")
                return
            refuse(dl.UNKNOWN_INTENT, f"{answered_id} has another answer recorded already")
            return
        # A suspension restored from before deadlines were bounded by their intents' expiry
        # keeps waiting until then (`DueTimes._deadline`): so does an answer.
        if now > past_every_expiry(suspended.deadline_ms, work.state.pending):
            refuse(
                dl.AFTER_DEADLINE,
                f"the answer to {answered_id} at {now} came after the deadline "
                f"{suspended.deadline_ms}",
            )
            return
        intent = next((i for i in work.state.pending if i.intent_id == answered_id), None)
        if intent is None or answered_id not in suspended.pending_intent_ids:
            refuse(
                dl.UNKNOWN_INTENT,
                f"{answered_id} is pending but its intent is missing"  # a partial restore
                if answered_id in suspended.pending_intent_ids
                else f"{answered_id} is not pending ({list(suspended.pending_intent_ids)})",
            )
            return
        mismatch = _mismatch(work.key, intent, envelope, payload)
        if mismatch:
            refuse(dl.ANSWER_MISMATCH, mismatch)
            return
        answer = getattr(envelope, payload)
        ring = self._answer_keyrings[payload]
        if ring is not None:
            outcome = verify(answer, ring)
            if outcome is not Verification.VALID:
                refuse(
                    dl.BAD_ANSWER_SIGNATURE,
                    f"the {payload} for {answered_id} is {outcome.value} "
                    f"(key id {answer.signing_key_id!r})",
                )
                return
        if answer.intent_digest or ring is not None:
            want = content_digest(intent.SerializeToString(deterministic=True))
            if answer.intent_digest != want:
                refuse(
                    dl.ANSWER_FOR_OTHER_CONTENT,
                    f"the {payload} for {answered_id} was computed for content "
                    f"{answer.intent_digest.hex() or '(none)'}, the pending intent is "
                    f"{want.hex()}",
                )
                return
        recorded = self._copy(suspended)
        if stand_in is not None:
            recorded.answers.remove(stand_in)
            # On time by its own stamp, but it came after the agent was resumed (with the
            # stand-in, at the deadline, and maybe on retries since): resumed again no earlier,
            # or its new intents would be born expired. A restored time is held to the retry's.
            tried = min(suspended.attempted_at_ms, due_at(suspended))
            now = max(now, stand_in.event_time_ms, tried)
        recorded.answers.append(envelope)
        if intent.tool_name == BUDGET_TOOL:
            self._budget_answered(work, recorded, envelope, now)
            return
        if intent.tool_name == ESCALATION_TOOL:
            if not envelope.approval.approved and not budget_asked(recorded, work.state.pending):
                # The human declined to keep waiting: resume now, the rest expired (unless
                # the resume their EXPIRED ran waits on a budget question already).
                self._expire_and_resume(work, recorded, now)
            else:
                work.commit(dataclasses.replace(work.state, continuation=recorded))
            return
        if unanswered_intents(recorded, work.state.pending) or budget_asked(
            recorded, work.state.pending
        ):
            # A genuine answer that took an EXPIRED's place while the resume the EXPIRED ran
            # waits on a budget question: the resume runs again on it when a person decides,
            # not now (it would ask the same question again, under the same id).
            work.commit(dataclasses.replace(work.state, continuation=recorded))
            return
        self._resume(work, recorded, now)


def budget_asked(suspended: Continuation, pending) -> bool:
    """A budget question is pending with no answer."""
    answered = {answered_intent_id(a) for a in suspended.answers}
    return any(i.tool_name == BUDGET_TOOL and i.intent_id not in answered for i in pending)


def answered_intent_id(envelope: AgentEnvelope) -> str:
    if envelope.WhichOneof("payload") == "approval":
        return envelope.approval.intent_id
    return envelope.tool_result.intent_id


def made_here(answer: AgentEnvelope) -> bool:
    """An EXPIRED result `_expire_and_resume` made (unsigned, bound to no content)."""
    result = answer.tool_result
    return (
        answer.WhichOneof("payload") == "tool_result"
        and result.status == ToolResult.EXPIRED
        and not result.signature
        and not result.intent_digest
    )


def _same_answer(envelope: AgentEnvelope, answers, answered_id: str) -> bool:
    payload = envelope.WhichOneof("payload")
    for recorded in answers:
        if answered_intent_id(recorded) == answered_id:
            return recorded.WhichOneof("payload") == payload and getattr(
                recorded, payload
            ) == getattr(envelope, payload)
    return False


def _mismatch(key: bytes, intent: ToolIntent, envelope: AgentEnvelope, payload: str) -> str:
    approval = intent.kind == ToolIntent.APPROVAL
    if approval != (payload == "approval"):
        want = "an approval" if approval else "a tool result"
        return f"{intent.intent_id} ({intent.tool_name}) wants {want}, got {with_article(payload)}"
    if payload == "tool_result" and envelope.tool_result.entity_key not in (b"", key):
        return f"the result of {intent.intent_id} names another entity"
    if payload == "approval":
        try:
            parse_edits(intent, envelope.approval)
        except ApprovalEditError as e:
            return (
                f"the approval of {intent.intent_id} edits its arguments as its request does "
                f"not allow: {e}"
            )
    return ""


def unanswered_intents(suspended: Continuation, pending: Iterable[ToolIntent]) -> list[ToolIntent]:
    """The agent's own pending intents (not the runtime's escalations) with no answer yet, in
    the Continuation's intent order."""
    answered = {answered_intent_id(a) for a in suspended.answers}
    by_id = {i.intent_id: i for i in pending}
    return [
        by_id[i]
        for i in suspended.pending_intent_ids
        if i not in answered and i in by_id and by_id[i].tool_name not in RUNTIME_TOOLS
    ]


def ordered_answers(suspended: Continuation, pending: Iterable[ToolIntent]) -> list[Answer]:
    """The answers to the agent's own intents (escalations are the runtime's), in the
    Continuation's intent order: never the order a bag, an export or a restore returns. Each
    holds copies, the agent's to change."""
    by_id = {answered_intent_id(a): a for a in suspended.answers}
    intents = {i.intent_id: i for i in pending}
    return [
        Answer.from_envelope(_copied(intents[i]), _copied(by_id[i]))
        for i in suspended.pending_intent_ids
        if i in by_id and i in intents and intents[i].tool_name not in RUNTIME_TOOLS
    ]


def _copied(message):
    """A copy for the agent, whose edits must reach neither the key's state (the pending
    intents read, which a portable runner hands back as the objects stored) nor the answers
    the Continuation keeps for a retry."""
    copied = type(message)()
    copied.CopyFrom(message)
    return copied
