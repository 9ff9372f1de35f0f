"""Budgets, for `machine.KeyMachine`: putting a key's exceeded budget before a person.

Under `OnBudget.ASK`, an activation stopped by one of the key's own limits (never an
activation's, nor a model without a price) does not end: `BudgetQuestions`, a mixin of
KeyMachine, suspends the key on an APPROVAL intent of BUDGET_TOOL (`_ask_budget`), with the
event first in its mailbox (a start) or with its answers (a resume). Approved, the key's
limits rise by the configured amounts and the activation runs again (`_budget_answered`);
declined or unanswered by its deadline, it ends in a `budget_exceeded` dead letter with the
event or the answers inside (`_budget_refused`). Each question has an id of its own, numbered
by the raises granted so far. The metering itself is `budget.BudgetMeter`'s.
"""

from __future__ import annotations

import dataclasses

from beam_agents._protos import ActivationRecord, Continuation, LlmCacheBlob
from beam_agents.errors import BudgetExceededError, error_text
from beam_agents.intents.identity import intent_id
from beam_agents.runtime import dead_letters as dl
from beam_agents.runtime.budget import BUDGET_TOOL, UINT32_MAX, Budget, BudgetMeter, OnBudget
from beam_agents.runtime.context import RUNTIME_TOOLS, ActivationContext
from beam_agents.runtime.machine_activations import Run
from beam_agents.runtime.machine_answers import budget_asked
from beam_agents.runtime.machine_state import INTENTS, TRACES, Work, saturating_add
from beam_agents.runtime.recording import RECORDS
from beam_agents.state.memory import Memory, ReplayCache
from beam_agents.state.migration import new_state_blob

__all__ = ["BudgetQuestions", "budget_asked", "budget_question_ids", "holds_a_start"]

#: The first step of the runtime's budget questions (uint32, beyond any agent's steps).
_BUDGET_STEP = 2**31


class BudgetQuestions:
    """KeyMachine's budget questions; see the module docstring."""

    def _asks(self, error: Exception | None) -> bool:
        budget = self._config.budget
        # Only a key's limits can be raised; an activation's or a missing price cannot.
        return (
            isinstance(error, BudgetExceededError)
            and isinstance(error.scope, str)
            and error.scope.startswith("key")
            and budget is not None
            and budget.on_exceed is OnBudget.ASK
        )

    def _ask_budget(
        self,
        work: Work,
        run: Run,
        now: int,
        *,
        event=None,
        digests=(),
        anchor=0,
        deferred=0,
        suspended: Continuation | None = None,
    ) -> None:
        """Puts the budget before a person: an APPROVAL intent of BUDGET_TOOL, on which the key
        waits with its event first in the mailbox (a start, `deferred` times on a busy model
        so far: a raise does not give it those retries again) or with its answers (a resume)."""
        work.count("budget_asks")
        config = self._config
        seq = suspended.seq if suspended is not None else run.ctx.seq
        # Numbered by the raises granted so far (kept in the key's cache blob): each question
        # of the key has an id of its own, whatever ran or waited in between.
        grants = work.state.cache.budget_grants if work.state.cache is not None else 0
        ctx = ActivationContext(
            entity_key=work.key,
            seq=seq,
            now_ms=now,
            memory=Memory(),
            cache=ReplayCache(),
            llm_client=None,
            adapter=self._agent.adapter,
            # Steps no agent reaches, so the question never shares an id with an intent of
            # the activation it holds up.
            first_step=_BUDGET_STEP + grants,
            resume_of=suspended,
            keyring=self._keyring,
            intent_ttl_ms=config.suspend_deadline_ms,
        )
        (question,) = ctx.escalate(
            "The agent's next model call would pass its budget; approve to raise the key's "
            "limits and let it go on, decline to end it.",
            tool=BUDGET_TOOL,
            reason=error_text(run.error),
            raise_tokens=config.budget.raise_tokens,
            raise_cost_micros=config.budget.raise_cost_micros,
        )
        deadline = saturating_add(now, config.suspend_deadline_ms)
        if suspended is None:
            waiting = new_state_blob(
                Continuation,
                seq=seq,
                adapter=self._agent.adapter,
                suspended_at_ms=now,
                deadline_ms=deadline,
                mailbox=[event],
                # The raises the start was granted before it asked again and the attempts
                # they let run: its record holds every one (`Run.waited`).
                answers=run.waited.answers if run.waited is not None else (),
                resume_failures=deferred,
                held_attempts=run.waited.held_attempts if run.waited is not None else 0,
                held_calls=run.waited.held_calls if run.waited is not None else (),
                held_failures=run.waited.held_failures if run.waited is not None else (),
            )
            waiting.state_schema_version = self._version
            memory = self._marked(work.state.memory, digests, anchor, owned=False)
            pending = (question,)
        else:
            waiting = self._copy(suspended)
            waiting.deadline_ms = max(waiting.deadline_ms, deadline)
            waiting.retry_at_ms = 0
            memory = work.state.memory
            pending = (*work.state.pending, question)
        if self._recording is not None:
            # What this attempt asked the model, answered or failed, numbered by attempt: the
            # record of the activation, however it ends, holds them, so that a backtest's
            # candidate is answered and failed in each attempt as the live one was.
            waiting.held_attempts = min(waiting.held_attempts + 1, UINT32_MAX)
            log, held = run.ctx.model_log, waiting.held_attempts
            waiting.held_calls.extend(self._recording.model_calls(log, held_attempt=held))
            waiting.held_failures.extend(self._recording.failures(log, held_attempt=held))
        waiting.pending_intent_ids.append(question.intent_id)
        work.commit(
            dataclasses.replace(work.state, memory=memory, continuation=waiting, pending=pending)
        )
        work.emit(INTENTS, question)
        for trace in ctx.traces:
            work.emit(TRACES, trace)

    def _budget_answered(self, work: Work, recorded: Continuation, envelope, now: int) -> None:
        """A person's answer on a budget: approved, the key's limits rise and the activation
        it held up runs again; declined, it ends as `budget_exceeded`."""
        if not envelope.approval.approved:
            self._budget_refused(
                work, recorded, now, f"{envelope.approval.approver} declined to raise it"
            )
            return
        meter = BudgetMeter(self._config.budget or Budget(), work.state.cache)
        meter.grant()
        cache = (
            self._copy(work.state.cache)
            if work.state.cache is not None
            else new_state_blob(LlmCacheBlob)
        )
        cache.state_schema_version = self._version
        meter.write(cache)
        work.commit(dataclasses.replace(work.state, cache=cache))
        if holds_a_start(recorded, work.state.pending):
            self._retry_start(work, recorded, now)
        else:
            self._resume(work, recorded, now)

    def _budget_refused(self, work: Work, suspended: Continuation, now: int, why: str) -> None:
        start = holds_a_start(suspended, work.state.pending)
        work.dead(
            dl.BUDGET_EXCEEDED,
            f"seq {suspended.seq}: {why}; the "
            + ("event is in the record" if start else "answers are in the record"),
            now,
            input=suspended.mailbox[0] if start else None,
            answers=() if start else suspended.answers,
        )
        if self._recording is not None:
            # The activation the budget held ended here: its record says so, so that a
            # backtest of the key sees it (a declined first start still began the key).
            record = self._recording.record(
                entity_key=work.key,
                seq=suspended.seq,
                first_step=0 if start else suspended.step_index,
                now_ms=now,
                adapter=self._agent.adapter,
                event=suspended.mailbox[0] if start else None,
                answers=suspended.answers,
                model_log=(),
                intents=(),
                outcome=ActivationRecord.OUTCOME_FAILED,
                reason=dl.BUDGET_EXCEEDED,
                attempt=0 if start else suspended.resume_failures,
            )
            # The attempt the declined question held up is the one recorded: its calls are
            # its own, those of the attempts a raise let run before it held.
            last = suspended.held_attempts
            record.held_attempts = max(last - 1, 0)
            _split(suspended.held_calls, last, own=record.model_calls, held=record.held_calls)
            _split(
                suspended.held_failures, last, own=record.model_failures, held=record.held_failures
            )
            if start:
                # The question was asked when its attempt ran: a backtest runs it then too.
                record.asked_at_ms = suspended.suspended_at_ms
            work.emit(RECORDS, record)
        if start:
            self._end_start(work, suspended.seq)
            rest = self._copy(suspended)
            del rest.mailbox[0]
            self._end_suspension(work, rest)
        else:
            self._end_suspension(work, suspended)


def _split(calls, last: int, *, own, held) -> None:
    """Puts the `calls` of held attempts in the declined attempt's (`last`, numbered 0 there)
    or in the earlier attempts' (`held`)."""
    for call in calls:
        if call.held_attempt != last:
            held.append(call)
            continue
        kept = own.add()
        kept.CopyFrom(call)
        kept.held_attempt = 0


def holds_a_start(suspended: Continuation, pending) -> bool:
    """The suspension holds up a start (its event first in the mailbox), not a resume: it
    waits on no intent of the agent's."""
    return bool(suspended.mailbox) and all(i.tool_name in RUNTIME_TOOLS for i in pending)


def budget_question_ids(entity_key: bytes, seq: int, grants: int) -> frozenset[str]:
    """The ids of the budget questions an activation of `seq` can ask once the key was granted
    fewer than `grants` raises: no record emits them, and the resume a raise let run again
    holds the answer to one."""
    return frozenset(intent_id(entity_key, seq, _BUDGET_STEP + n) for n in range(grants))
