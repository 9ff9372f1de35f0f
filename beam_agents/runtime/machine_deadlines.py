"""Due times, for `machine.KeyMachine`: a suspension's retry and its deadline.

A suspension's timer is due at its `retry_at_ms`, else its `deadline_ms`. `DueTimes`, a mixin
of KeyMachine, owns what a firing does (`_due`): a timer that finds no suspension or another
due time changes nothing and is only counted; a retry runs the deferred start or the failed
resume again; a deadline follows the RuntimeConfig's deadline policy for the intents still
unanswered: dead-letter them, escalate to a person (`_escalate`, an APPROVAL intent of
ESCALATION_TOOL that extends the deadline, up to `max_escalations` times), or resume the agent
with EXPIRED results for them (`_expire_and_resume`). An intent that has an answer is never
presented as EXPIRED, nor is one the effector may still run: a deadline never comes before its
unanswered intents' expires_at_ms (`past_every_expiry`).
The TTL timer is `machine.KeyMachine.on_ttl_timer`'s.
"""

from __future__ import annotations

import dataclasses

from beam_agents._protos import AgentEnvelope, Continuation, ToolResult
from beam_agents.intents.identity import MAX_SAFE_INTEGER
from beam_agents.runtime import dead_letters as dl
from beam_agents.runtime.config import AtDeadline
from beam_agents.runtime.context import ActivationContext
from beam_agents.runtime.machine_answers import unanswered_intents
from beam_agents.runtime.machine_budgets import budget_asked
from beam_agents.runtime.machine_state import (
    INTENTS,
    TRACES,
    Work,
    due_at,
    past_every_expiry,
    saturating_add,
    timer_ms,
)
from beam_agents.state.memory import Memory, ReplayCache

__all__ = ["DueTimes"]


class DueTimes:
    """KeyMachine's retries and deadlines; see the module docstring."""

    def _due(self, work: Work, fired_ms: int) -> None:
        suspended = work.state.continuation
        if suspended is None:
            # Resolved already (runners may still fire a timer they were told to clear):
            # nothing to do, and nothing for anyone to act on.
            work.count("deadline_timers_after_resolution")
            return
        if timer_ms(due_at(suspended)) != fired_ms:
            # A firing of a timer set for an earlier due time (a watermark jump fires the TTL
            # timer first, which runs the due suspension and sets this one anew): the timer
            # of the current due time is set, so nothing is refused or lost, nothing for a
            # person to act on.
            work.count("stale_deadline_timers")
            return
        work.anchor = max(work.anchor, fired_ms)
        if suspended.retry_at_ms and not suspended.pending_intent_ids:
            self._retry_start(work, suspended, fired_ms)
        elif suspended.retry_at_ms:
            retry = self._copy(suspended)
            retry.retry_at_ms = 0
            self._resume(work, retry, fired_ms)
        else:
            self._deadline(work, suspended, fired_ms)

    def _deadline(self, work: Work, suspended: Continuation, now: int) -> None:
        if budget_asked(suspended, work.state.pending):
            self._budget_refused(work, suspended, now, "no one raised the budget by its deadline")
            return
        policy = self._config.deadline_policy
        unanswered = unanswered_intents(suspended, work.state.pending)
        latest = past_every_expiry(now, unanswered)
        if timer_ms(latest) > now:
            # A suspension restored or written before deadlines were bounded by their intents'
            # expiry: the effector may still run one, so the key waits until it cannot (as
            # far as a timer reaches: one past the end of the window's time fires at its end).
            waiting = self._copy(suspended)
            waiting.deadline_ms = latest
            work.commit(dataclasses.replace(work.state, continuation=waiting))
        elif not unanswered:
            self._resume(work, self._copy(suspended), now)
        elif policy.action is AtDeadline.DEAD_LETTER:
            work.dead(
                dl.DEADLINE_EXCEEDED,
                f"no answer to {[i.intent_id for i in unanswered]} by {suspended.deadline_ms}",
                now,
                answers=suspended.answers,
            )
            self._end_suspension(work, suspended)
        elif policy.action is AtDeadline.ESCALATE and suspended.escalations < (
            policy.max_escalations
        ):
            self._escalate(work, suspended, unanswered, now)
        else:
            self._expire_and_resume(work, self._copy(suspended), now)

    def _expire_and_resume(self, work: Work, suspended: Continuation, now: int) -> None:
        """Resumes the agent with EXPIRED results for its intents still unanswered
        (`suspended` is a new blob, changed here)."""
        for intent in unanswered_intents(suspended, work.state.pending):
            suspended.answers.append(
                AgentEnvelope(
                    entity_key=work.key,
                    event_time_ms=now,
                    tool_result=ToolResult(
                        intent_id=intent.intent_id,
                        entity_key=work.key,
                        seq=intent.seq,
                        status=ToolResult.EXPIRED,
                        error_message=f"no answer by {suspended.deadline_ms}",
                        completed_at_ms=now,
                    ),
                )
            )
        self._resume(work, suspended, now)

    def _escalate(self, work: Work, suspended: Continuation, unanswered, now: int) -> None:
        ctx = ActivationContext(
            entity_key=work.key,
            seq=suspended.seq,
            now_ms=now,
            memory=Memory(),
            cache=ReplayCache(),
            llm_client=None,
            adapter=self._agent.adapter,
            first_step=suspended.step_index,
            resume_of=suspended,
            keyring=self._keyring,
            intent_ttl_ms=self._config.deadline_policy.extension_ms,
        )
        (escalation,) = ctx.escalate(
            "These intents got no answer by their deadline; approve to keep waiting, decline "
            "to let the agent go on without them.",
            unanswered=[i.intent_id for i in unanswered],
            # Canonical JSON holds integers up to 2**53 - 1 (about 285,000 years of ms): a
            # deadline past that (a huge suspend_deadline_ms, an event time near int64's end)
            # is shown as that end of time rather than failing the timer's bundle for good.
            deadline_ms=max(-MAX_SAFE_INTEGER, min(suspended.deadline_ms, MAX_SAFE_INTEGER)),
        )
        escalated = self._copy(suspended)
        escalated.escalations += 1
        escalated.step_index = ctx.next_step
        escalated.pending_intent_ids.append(escalation.intent_id)
        escalated.deadline_ms = saturating_add(now, self._config.deadline_policy.extension_ms)
        work.commit(
            dataclasses.replace(
                work.state, continuation=escalated, pending=(*work.state.pending, escalation)
            )
        )
        work.emit(INTENTS, escalation)
        for trace in ctx.traces:
            work.emit(TRACES, trace)
