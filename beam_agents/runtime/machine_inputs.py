"""Continuations and restored usage, for `machine.KeyMachine`: checked where they come in, so
that no decision meets one it cannot act on.

A Continuation reaches the machine three ways: in a StateSnapshot to restore, as the key's stored
state, and from the agent, which suspends on one. Each is checked once, where it comes in, by
`continuation_problem` (a negative seq, which no intent id takes; a step past an agent's, whose
escalation would overflow its uint32; a retry of a deferred start with no event to start), and
an agent's also by `built_problem` (the runtime's own fields set, another seq, a wait on nothing
or on intents it did not emit). What fails is refused where it came from: a snapshot whole, as
`invalid_snapshot` (`snapshot_problem`, which also refuses negative usage, which would let a key
spend what it has used, and more budget grants than its questions have ids for); an agent's as
AgentContractError, its `agent_contract` dead letter; a stored one, which a binary that did not
check it may have written, by ending the suspension before the input (`Checks._end_invalid`),
its answers and each queued event in `invalid_state` dead letters; stored usage out of range,
likewise, is set to the nearest valid value with an `invalid_state` dead letter
(`Checks._checked`). Either way the key goes on.

The other inputs are checked where they arrive too: a model's reported usage in
`ActivationContext.llm` (`budget.reported_tokens`), a transport's idempotency key in RunAgent's
`_KeyAndTag`, and a key's dedupe marks in `machine_events`.
"""

from __future__ import annotations

import dataclasses

from beam_agents._protos import Continuation, LlmCacheBlob, StateSnapshot
from beam_agents.runtime import dead_letters as dl
from beam_agents.runtime.machine_state import Work

__all__ = [
    "MAX_GRANTS",
    "MAX_STEP",
    "USAGE_FIELDS",
    "Checks",
    "built_problem",
    "continuation_problem",
    "snapshot_problem",
]

#: The last step of an agent's own intents: a suspension's escalations follow its step, and the
#: runtime's budget questions start at 2**31 (`machine_budgets`), all within a uint32.
MAX_STEP = 2**30
#: The most budget raises a restored key may have been granted: each numbers a question at step
#: 2**31 + grants, which must stay a uint32 for a billion grants more.
MAX_GRANTS = 2**30


def continuation_problem(suspended: Continuation) -> str:
    """Why the machine cannot act on `suspended` ("" when it can)."""
    if suspended.seq < 0:
        return f"seq {suspended.seq} is negative: no intent id takes it"
    if suspended.step_index > MAX_STEP:
        return f"step_index {suspended.step_index} is past an agent's steps (0 to {MAX_STEP})"
    if suspended.retry_at_ms and not suspended.pending_intent_ids and not suspended.mailbox:
        return "it retries a deferred start (retry_at_ms, no intent pending) with no event"
    # Held calls are numbered 1 to held_attempts (0: a binary before the numbering wrote it).
    held = suspended.held_attempts
    for call in (*suspended.held_calls, *suspended.held_failures):
        if call.held_attempt > held:
            return f"a held call numbers attempt {call.held_attempt} of {held} held attempts"
    return ""


def built_problem(suspended: Continuation, *, seq: int, next_step: int, emitted) -> str:
    """Why the Continuation an agent suspended on is none the runtime takes ("" when it is):
    `seq`, `next_step` and the intents `emitted` are its activation's."""
    problem = continuation_problem(suspended)
    if problem:
        return problem
    runtimes = [
        name
        for name in (
            "retry_at_ms",
            "resume_failures",
            "escalations",
            "answers",
            "mailbox",
            "held_calls",
            "held_attempts",
            "held_failures",
            "attempted_at_ms",
        )
        if getattr(suspended, name)
    ]
    if runtimes:
        return f"it sets the runtime's own {', '.join(runtimes)}"
    if suspended.seq != seq:
        return f"seq {suspended.seq} is not its activation's, {seq}"
    if suspended.step_index < next_step:
        return (
            f"step_index {suspended.step_index} is before its next step, {next_step}: its "
            "intents' ids would be issued again"
        )
    if not suspended.pending_intent_ids:
        return "it waits on no intent"
    ids = {intent.intent_id for intent in emitted}
    strangers = [i for i in suspended.pending_intent_ids if i not in ids]
    if strangers:
        return f"it waits on intents it did not emit: {strangers}"
    return ""


def snapshot_problem(snapshot: StateSnapshot, continuation: Continuation | None) -> str:
    """Why a snapshot is not restored ("" when it may be); `continuation` is its migrated
    view."""
    if continuation is not None:
        problem = continuation_problem(continuation)
        if problem:
            return f"its continuation: {problem}"
    if snapshot.HasField("llm_cache"):
        return _usage_problem(snapshot.llm_cache)
    return ""


#: A key's usage and allowance fields (LlmCacheBlob): counters that only grow.
USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cost_micros",
    "token_allowance",
    "cost_allowance_micros",
)


def _usage_problem(cache: LlmCacheBlob) -> str:
    negative = [name for name in USAGE_FIELDS if getattr(cache, name) < 0]
    if negative:
        return f"its llm_cache holds negative {', '.join(negative)}: usage only grows"
    if cache.budget_grants > MAX_GRANTS:
        return f"its llm_cache holds {cache.budget_grants} budget grants (0 to {MAX_GRANTS})"
    return ""


class Checks:
    """KeyMachine's checks of the state it read; see the module docstring."""

    def _checked(self, work: Work, now: int) -> None:
        """Brings the key's state as read into a shape the machine can act on, before the
        input: a stored suspension it cannot act on ends (`_end_invalid`), and stored usage out
        of range is set to the nearest valid value."""
        self._end_invalid(work, now)
        cache = work.state.cache
        problem = "" if cache is None else _usage_problem(cache)
        if not problem:
            return
        repaired = self._copy(cache)
        for name in USAGE_FIELDS:
            setattr(repaired, name, max(0, getattr(cache, name)))
        repaired.budget_grants = min(cache.budget_grants, MAX_GRANTS)
        work.dead(
            dl.INVALID_STATE,
            f"the key's usage could not be counted on ({problem}); each value out of range "
            "was set to the nearest one in range",
            now,
        )
        work.commit(dataclasses.replace(work.state, cache=repaired))

    def _end_invalid(self, work: Work, now: int) -> None:
        """Ends a stored suspension the machine cannot act on, before the input: its answers
        in one `invalid_state` dead letter, each queued event in one of its own."""
        suspended = work.state.continuation
        problem = "" if suspended is None else continuation_problem(suspended)
        if not problem:
            return
        work.dead_suspension(
            dl.INVALID_STATE,
            suspended,
            now,
            detail=f"the key's Continuation cannot be acted on ({problem}); the suspension on "
            f"{list(suspended.pending_intent_ids)} ended, its answers are in the record",
            queued="queued while the key was suspended on a Continuation that could not be "
            "acted on; the suspension ended first",
        )
        work.commit(dataclasses.replace(work.state, continuation=None, pending=()))
