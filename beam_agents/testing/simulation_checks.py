"""The invariants of the deterministic simulation (`simulation`), checked against its reference
model after every input: what a resume is handed (`check_resume`), what an input may change
(`_check_input`), and that a genuine answer is never refused as forged or for other content
(`_refused`).

`Checks` is a mixin of `Simulation`: its methods read the simulation's state and model
(`Simulation.__init__`) and report a violation through its `fail`.
"""

from __future__ import annotations

from beam_agents._protos import AgentEnvelope, Continuation, LlmCacheBlob, MemoryBlob, ToolResult
from beam_agents.intents.identity import content_digest
from beam_agents.intents.signing import Verification, verify
from beam_agents.runtime import dead_letters as dl
from beam_agents.runtime import run_agent
from beam_agents.testing.simulation_state import message_bytes as _bytes
from beam_agents.testing.simulation_world import APPROVAL_RING, RESULT_RING, answer_bytes

__all__ = ["Checks"]

_FAILED = {dl.AGENT_RAISED, dl.AGENT_CONTRACT, dl.LLM_FAILED, dl.MEMORY_BUDGET}
#: What may end a suspension in an input whose activations all failed.
_ENDINGS = {dl.RESUME_FAILED, dl.DEADLINE_EXCEEDED}
_ANSWERS = ("tool_result", "approval")


def _marked_later(before: bytes | None, after: bytes | None) -> bool:
    """`after` is `before` (or no memory) with its activity mark moved forward, and the event
    marks that fell out of the dedupe window with it dropped."""
    old, new = (MemoryBlob.FromString(blob or b"") for blob in (before, after))
    if after is None or new.last_activity_ms < old.last_activity_ms:
        return False
    if not old.event_marks.endswith(new.event_marks):
        return False
    for blob in (old, new):
        for name in ("last_activity_ms", "state_schema_version", "event_marks"):
            blob.ClearField(name)
    return old == new


def _calls(cache: bytes | None) -> int:
    return len(LlmCacheBlob.FromString(cache or b"").entries)


def _tokens(cache: bytes | None) -> int:
    """The tokens a key's stored cache counts."""
    blob = LlmCacheBlob.FromString(cache or b"")
    return blob.input_tokens + blob.output_tokens


def _deferred(continuation: bytes) -> bool:
    suspended = Continuation.FromString(continuation)
    return (
        not suspended.pending_intent_ids
        and suspended.retry_at_ms > 0
        and len(suspended.mailbox) > 0
    )


def _answered_id(envelope: AgentEnvelope) -> str:
    if envelope.WhichOneof("payload") == "approval":
        return envelope.approval.intent_id
    return envelope.tool_result.intent_id


class Checks:
    """The invariants, read from the simulation's state and reference model."""

    def check_resume(self, ctx, answers) -> None:
        """What a resume is handed: each genuine answer signed and bound to its intent's
        content, never a forged one, one per intent, in the Continuation's intent order. Its
        time is checked when its bundle commits (`resumed_in_order`)."""
        suspended = ctx.resume_of
        self.note.resumed.append(((ctx.entity_key, ctx.seq, suspended.step_index), ctx.now_ms))
        recorded = [_answered_id(a) for a in suspended.answers]
        if len(recorded) != len(set(recorded)):
            self.fail(f"a Continuation records two answers for one intent: {recorded}")
        ids = [a.intent.intent_id for a in answers]
        if ids != [i for i in suspended.pending_intent_ids if i in ids]:
            self.fail(f"answers {ids} out of intent order {list(suspended.pending_intent_ids)}")
        for answer in answers:
            message = answer.result if answer.result is not None else answer.approval
            made_here = (
                answer.result is not None
                and answer.result.status == ToolResult.EXPIRED
                and not answer.result.signature
            )
            if made_here:
                continue
            if answer_bytes(answer.envelope()) in self.forged:
                self.fail(f"a forged answer to {answer.intent.intent_id} reached the agent")
            ring = APPROVAL_RING if answer.approval is not None else RESULT_RING
            if verify(message, ring) is not Verification.VALID:
                self.fail(f"an unsigned answer to {answer.intent.intent_id} reached the agent")
            if message.intent_digest != content_digest(_bytes(answer.intent)):
                self.fail(f"the answer to {answer.intent.intent_id} is for other content")

    def resumed_in_order(self, resumed) -> None:
        """A committed bundle's resumes, ((key, seq, step), now) in the order they ran: each no
        earlier than a committed resume of the same suspension before it (run again in the
        past, the agent's new intents would be born expired)."""
        for place, now in resumed:
            last = self.resumed_at.get(place, now)
            if now < last:
                self.fail(f"seq {place[1]} step {place[2]} resumed at {now}, after one at {last}")
            self.resumed_at[place] = max(last, now)

    def _check_input(self, item, before, after, outputs, counted, paid: int) -> None:
        """`paid`: the tokens the model was paid for during the input."""
        envelope = AgentEnvelope.FromString(item[1]) if item[0] == "E" else None
        if envelope is not None and envelope.HasField("export_request"):
            if before != after:
                self.fail("an export changed the key's state")
            return
        # A suspension with no pending intent is a start deferred while its model was busy:
        # its event waits first in the mailbox, on a retry.
        deferred = after[3] is not None and not after[4] and _deferred(after[3])
        if (after[3] is None) != (not after[4]) and not deferred:
            self.fail("pending intents without a suspension, or a suspension without them")
        reasons = {value.reason for tag, (_, value) in outputs if tag == run_agent.ERRORS}
        if before[1] is not None and after[1] is None:
            idle = MemoryBlob.FromString(before[1]).last_activity_ms + self.config.ttl_ms
            if item[0] not in ("T", "G") or item[2] < idle:
                self.fail(f"{item[:2]} wiped the key's memory before its TTL {idle}")
        if dl.AFTER_DEADLINE in reasons and before[3] is not None:
            deadline = Continuation.FromString(before[3]).deadline_ms
            if envelope.event_time_ms <= deadline:
                self.fail(f"an answer at {envelope.event_time_ms} refused as after {deadline}")
        # Only an input whose every activation failed is held to "changes nothing"; one that
        # also ran or deferred another (a drained mailbox) changed state on purpose.
        if "failed_activations" not in counted or {"activations", "deferred_activations"} & set(
            counted
        ):
            return
        # A failed activation changes nothing but its durable inputs (the answers, and the
        # model calls it paid for, counted in the cache, which is the key's activity: its
        # memory's mark moves, a key with no memory getting one holding the mark alone) and, for
        # a start that failed for good, the seq, which moves past it, and the cache's calls,
        # all dead then.
        ended = any(
            tag == run_agent.ERRORS and value.input.HasField("external_event")
            for tag, (_, value) in outputs
        )
        if before[1] != after[1] and not (paid and _marked_later(before[1], after[1])):
            self.fail(f"a failed activation ({item[:2]}) changed the key's memory")
        counted_before, counted_after = (_tokens(blob) for blob in (before[2], after[2]))
        if counted_after - counted_before != paid:
            self.fail(
                f"failed activations paid {paid} tokens and the key's usage rose "
                f"{counted_after - counted_before}"
            )
        if not paid and before[2] != after[2] and not (ended and not _calls(after[2])):
            self.fail(f"a failed activation ({item[:2]}) that paid nothing changed the cache")
        if before[0] != after[0] and not (ended and (before[0] or 0) < after[0]):
            self.fail(f"a failed activation ({item[:2]}) moved the seq, and no start ended")
        answer = envelope is not None and envelope.WhichOneof("payload") in _ANSWERS
        if answer and after[3] is not None:
            kept = {answer_bytes(a) for a in Continuation.FromString(after[3]).answers}
            if answer_bytes(envelope) not in kept:
                self.fail("a failed resume dropped the answer that started it")
        if not reasons & _FAILED and dl.RESUME_FAILED not in reasons:
            self.fail(f"a failed activation without its dead letter: {reasons}")
        if after[3] is None:
            # A deferred start that fails for good ends as the start's own failure.
            ended = before[3] is not None and not _deferred(before[3])
            if ended and not reasons & _ENDINGS:
                self.fail(
                    f"a failed activation ended a suspension without resume_failed: {reasons}"
                )
            return
        if before[3] is None:
            self.fail("a failed activation created a suspension")
        old, new = (Continuation.FromString(b) for b in (before[3], after[3]))
        answered = {_answered_id(a) for a in new.answers}
        for kept in old.answers:
            # Only an EXPIRED the runtime made may give way, to a genuine answer for its intent.
            result = kept.tool_result
            made_here = result.status == ToolResult.EXPIRED and not result.signature
            if kept not in new.answers and not (made_here and _answered_id(kept) in answered):
                self.fail("a failed activation lost an answer")
        for blob in (old, new):
            for name in (
                "answers",
                "resume_failures",
                "retry_at_ms",
                "attempted_at_ms",
                "state_schema_version",
            ):
                blob.ClearField(name)
        if old != new or before[4] != after[4]:
            self.fail("a failed activation changed its suspension beyond its answers")

    def _refused(self, letter) -> None:
        """A refused answer is carried by its letter; a genuine one is never refused as
        forged, nor as computed for other content when it was computed for the intent's."""
        answer = answer_bytes(letter.input)
        self.dead_lettered.add(answer)
        payload = letter.input.WhichOneof("payload")
        message = getattr(letter.input, payload)
        if letter.reason == dl.BAD_ANSWER_SIGNATURE and answer in self.produced:
            self.fail(f"a genuine {payload} for {message.intent_id} was refused as forged")
        committed = self.committed_content.get(message.intent_id)
        if letter.reason == dl.ANSWER_FOR_OTHER_CONTENT and message.intent_digest == committed:
            self.fail(f"the {payload} for {message.intent_id} was refused for its own content")
