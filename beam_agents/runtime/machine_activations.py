"""Activations, for `machine.KeyMachine`: running the agent, committing what it did, failures,
and resuming a suspension.

`Activations`, a mixin of KeyMachine, owns the agent's calls. `_run` builds the
ActivationContext over the key's Memory and ReplayCache and calls the agent, so that whatever
it raises or returns out of contract is a `Run` with an error, never the bundle's;
`_commit_run` commits a success (the new state, its intents, traces and completion; a
completion keeps the key's model usage but drops its seq's recorded calls, which can answer
nothing after it) and runs the mailbox of a suspension a completion ended; `_keep_paid` commits
what a failure paid the model for (its calls counted, and kept for its retry when the model or
the budget stopped it), and `_failed` dead-letters it with one ERROR trace event. `_resume`
resumes the agent with every answer accepted so far: a resume that fails keeps them,
dead-letters the failure (with the answers) and is tried again on the deadline timer with
backoff, until its retries are spent and the suspension ends (`_end_suspension`) with its
answers inside a `resume_failed` dead letter. With recording on (`beam_agents.runtime.recording`),
`_record` emits the ActivationRecord of each activation committed or dead-lettered; an attempt
deferred (a busy model) or put to a person (its budget) has none, its retry does.
"""

from __future__ import annotations

import dataclasses

from beam_agents._protos import AgentEnvelope, Continuation, LlmCacheBlob, MemoryBlob, TraceEvent
from beam_agents.errors import (
    AgentContractError,
    BudgetExceededError,
    CheckpointRejectedError,
    LlmCallError,
    MemoryBudgetError,
    error_text,
    said_retryable,
    with_article,
)
from beam_agents.runtime import dead_letters as dl
from beam_agents.runtime.budget import Budget, BudgetMeter
from beam_agents.runtime.context import RUNTIME_TOOLS, ActivationContext, Completion, Suspension
from beam_agents.runtime.machine_answers import ordered_answers
from beam_agents.runtime.machine_inputs import built_problem
from beam_agents.runtime.machine_state import (
    COMPLETIONS,
    INTENTS,
    TRACES,
    KeyState,
    Work,
    past_every_expiry,
    retry_at,
)
from beam_agents.runtime.recording import RECORDS, Outcome
from beam_agents.state.memory import Memory, ReplayCache, calls_dropped
from beam_agents.state.migration import new_state_blob

__all__ = ["Activations", "Run", "model_busy"]


@dataclasses.dataclass
class Run:
    """One agent call's outcome: `result` on success, `error` on failure."""

    ctx: ActivationContext
    result: Completion | Suspension | None = None
    error: Exception | None = None
    memory: MemoryBlob | None = None
    cache: LlmCacheBlob | None = None
    #: The external event a start ran on, for its ActivationRecord.
    event: AgentEnvelope | None = None
    #: What a start ran again after (the deferral or the budget question it waited on):
    #: the raises it was granted and the attempts they held, for its record.
    waited: Continuation | None = None


class Activations:
    """KeyMachine's calls of the agent and their outcomes; see the module docstring."""

    def _run(
        self,
        work: Work,
        now: int,
        seq: int,
        call,
        resume_of=None,
        event: AgentEnvelope | None = None,
        waited: Continuation | None = None,
    ) -> Run:
        """Calls the agent at `now`, a start on `event`; a start of an event that ran at
        another time than its own (one drained from a mailbox, or stamped past the key's
        clock) says so in its activation's trace."""
        event_time_ms = None if event is None else event.event_time_ms
        config = self._config
        state = work.state
        memory = Memory.from_blob(
            state.memory or MemoryBlob(), budget_bytes=config.memory_budget_bytes, now_ms=now
        )
        # A call's cache key holds its activation's seq, so the calls recorded under an earlier
        # seq can answer nothing: a start writes back only the calls it replays (a failed
        # attempt's under its own seq, `_keep_paid`) or makes, and so does an agent that runs
        # again from the top at each resume, making every call of its seq it can need.
        cache = ReplayCache.from_blob(
            state.cache or LlmCacheBlob(),
            only_touched=resume_of is None or getattr(self._agent, "replays_every_call", False),
            max_entries=config.cache_max_entries,
            max_bytes=config.cache_max_bytes,
            max_response_bytes=config.cache_max_response_bytes,
            now_ms=now,
        )
        ctx = ActivationContext(
            entity_key=work.key,
            seq=seq,
            now_ms=now,
            memory=memory,
            cache=cache,
            llm_client=self._llm_client,
            adapter=self._agent.adapter,
            first_step=resume_of.step_index if resume_of is not None else 0,
            resume_of=resume_of,
            keyring=self._keyring,
            intent_ttl_ms=config.intent_ttl_ms,
            suspend_deadline_ms=config.suspend_deadline_ms,
            llm_concurrency=config.llm_concurrency,
            meter=BudgetMeter(config.budget or Budget(), state.cache),
        )
        if self._recording is not None:
            ctx.model_log = []
        ctx.trace_activation(
            TraceEvent.ACTIVATION_START,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": self._agent.adapter,
                "beam_agents.resume": "true" if resume_of is not None else "false",
                **(
                    {"beam_agents.event_time_ms": str(event_time_ms)}
                    if event_time_ms not in (None, now)
                    else {}
                ),
            },
        )
        try:
            result = call(ctx)
            if not isinstance(result, Completion | Suspension):
                raise AgentContractError(
                    f"returned {type(result).__name__}, not a Completion or Suspension",
                    agent=self._agent.adapter,
                )
            if isinstance(result, Completion) and not isinstance(result.output, bytes):
                raise AgentContractError(
                    f"completed with {type(result.output).__name__}, not bytes",
                    agent=self._agent.adapter,
                )
            if isinstance(result, Suspension) and not isinstance(result.continuation, Continuation):
                raise AgentContractError(
                    f"suspended with {with_article(type(result.continuation).__name__)}, "
                    "not a Continuation",
                    agent=self._agent.adapter,
                )
            posed = next((i.tool_name for i in ctx.intents if i.tool_name in RUNTIME_TOOLS), "")
            if posed:
                # However emitted (call_tool, escalate): its answer would go to the runtime's
                # budget or deadline path, never to the agent.
                raise AgentContractError(
                    f"emitted {posed!r}, the name of the runtime's own questions to people "
                    "(request_approval asks a person)",
                    agent=self._agent.adapter,
                )
            if isinstance(result, Suspension):
                problem = built_problem(
                    result.continuation, seq=seq, next_step=ctx.next_step, emitted=ctx.intents
                )
                if problem:
                    raise AgentContractError(
                        f"suspended on a Continuation the runtime cannot take: {problem}",
                        agent=self._agent.adapter,
                    )
            # An adapter may replace ctx.memory (a function agent keeps its writes apart
            # until it completes): commit what the context holds at the end.
            # What nothing changed is the blob read (to_blob), or no cache at all.
            cache = ctx.cache.to_blob() if ctx.cache.changed else state.cache
            if ctx.model_calls and cache is state.cache:
                # Only refused answers (ctx.llm), which the agent got over: billed all the
                # same, their usage commits in a blob of its own.
                cache = (
                    self._copy(state.cache)
                    if state.cache is not None
                    else new_state_blob(LlmCacheBlob)
                )
            return Run(
                ctx, result, memory=ctx.memory.to_blob(), cache=cache, event=event, waited=waited
            )
        # The agent's failure is a dead letter, never the bundle's: SystemExit too (an agent,
        # or a library it calls, argparse or click, that ends the process would take the
        # worker and every key of its bundle down, retried for ever; a backtest's candidate).
        except (Exception, SystemExit) as e:
            return Run(ctx, error=e, event=event, waited=waited)

    def _commit_run(self, work: Work, run: Run, now: int, *, marks, anchor, mailbox) -> None:
        """Commits a successful activation and emits its outputs; a completion that ends a
        suspension runs its mailbox next."""
        ctx, result, state = run.ctx, run.result, work.state
        work.count("activations")
        if isinstance(result, Suspension):
            suspended = self._copy(result.continuation)
            suspended.mailbox.extend(mailbox)
            # A deadline the agent named (or built) before its intents expire is moved to
            # their expiry: EXPIRED must never answer a call the effector may still run.
            suspended.deadline_ms = past_every_expiry(suspended.deadline_ms, ctx.intents)
            ctx.trace_child(
                TraceEvent.SUSPENDED,
                "suspended",
                {
                    "beam_agents.pending": ",".join(suspended.pending_intent_ids),
                    "beam_agents.deadline_ms": str(suspended.deadline_ms),
                },
            )
        else:
            suspended = None
        ctx.trace_activation(
            TraceEvent.ACTIVATION_END,
            {"beam_agents.outcome": "suspended" if suspended is not None else "completed"},
        )
        # A blob the activation did not change is the one read: never stamped in place.
        memory = self._marked(run.memory, marks, anchor, owned=run.memory is not state.memory)
        cache = run.cache
        if (
            suspended is None
            and cache is not None
            and cache.entries
            and (cache is not state.cache or not self._readable_by_older(work))
        ):
            # A completed seq's calls can answer nothing: a later start runs under a later seq,
            # and a copy of an input finds the dedupe marks (in memory) or no suspension. A
            # retry of this bundle reads the state before it, calls included. So they go, and
            # the model's answer is not kept twice (memory and cache); the usage stays. A
            # cache an older binary still reads is left as it is, unless rewritten anyway.
            cache = calls_dropped(cache)
        if cache is not None and cache is not state.cache:
            cache.state_schema_version = self._version
            # The key's usage, this activation's included (only a model call changes it, and
            # a model call changes the cache).
            ctx.meter.write(cache)
        work.commit(
            KeyState(
                seq=max(ctx.seq, state.seq or 0),
                memory=memory,
                cache=cache,
                continuation=suspended,
                pending=tuple(ctx.intents) if suspended is not None else (),
            )
        )
        for intent in ctx.intents:
            work.emit(INTENTS, intent)
        for trace in ctx.traces:
            work.emit(TRACES, trace)
        if suspended is not None:
            self._record(work, run, Outcome.OUTCOME_SUSPENDED)
        else:
            self._record(work, run, Outcome.OUTCOME_COMPLETED, output=result.output)
            work.emit(COMPLETIONS, result.output)
            if mailbox:
                self._drain(work, mailbox, anchor)

    def _keep_paid(self, work: Work, run: Run, *, ended: bool) -> None:
        """Commits what a failed activation paid the model for: its calls count in the key's
        usage. A failure of the model's (busy, down) or the budget's keeps their answers in the
        cache too, as durable inputs, so the retry under the same seq (a resume's, a deferred
        start's, a start held up by its budget) replays them instead of paying again; a failure
        of the agent's (it raised, broke the contract) may have come from an answer, so its
        retry asks the model again. A start that `ended` is never run again (`_end_start`).

        What it records is the key's activity, as any commit of an event: the memory's
        activity mark moves (a key with no memory gets one holding that mark alone), and the
        TTL counts from it, so a key that keeps paying for failures keeps their count. Nothing
        else changes. A key that an older binary still reads is left untouched and goes
        uncounted until a commit migrates it: a failed activation must not make a key the
        binary before cannot read. So the caller commits first what the failure's path commits
        anyway (a deferral, a budget question, a retry), all written at this version."""
        ctx, state = run.ctx, work.state
        if ctx.model_calls and not self._readable_by_older(work):
            # A cache the failed run did not change is the blob read (`to_blob`): stamped
            # and counted in place, it would change state on a portable runner only, and,
            # being the blob read, never be written (a refused answer's usage lost).
            paid = (
                ctx.cache.to_blob()
                if isinstance(run.error, LlmCallError | BudgetExceededError)
                else None
            )
            if paid is not None and paid is not state.cache:
                cache = paid
            elif state.cache is not None:
                cache = self._copy(state.cache)
            else:
                cache = new_state_blob(LlmCacheBlob)
            cache.state_schema_version = self._version
            ctx.meter.write(cache)
            memory = self._marked(state.memory, (), work.anchor, owned=False)
            work.commit(dataclasses.replace(state, memory=memory, cache=cache))
        if ended:
            self._end_start(work, ctx.seq)

    def _failed(
        self,
        work: Work,
        run: Run,
        now: int,
        note: str = "",
        answers=(),
        reason: str = "",
        event: AgentEnvelope | None = None,
    ) -> None:
        """Dead-letters a failed activation (under `reason`, else the error's own) with one
        ERROR trace event."""
        ctx, error = run.ctx, run.error
        work.count("failed_activations")
        # By kind, not exact type: a provider client's own LlmCallError is a model failure.
        reason = reason or next(
            (named for kind, named in _REASONS if isinstance(error, kind)), dl.AGENT_RAISED
        )
        ctx.traces.clear()
        ctx.trace_child(
            TraceEvent.ERROR,
            "error",
            {"error.type": type(error).__name__, "beam_agents.reason": reason},
        )
        detail = f"seq {ctx.seq}: {type(error).__name__}: {error_text(error)}{note}"
        work.dead(reason, detail, now, answers=answers, input=event)
        for trace in ctx.traces:
            work.emit(TRACES, trace)
        self._record(work, run, Outcome.OUTCOME_FAILED, reason=reason)

    def _record(self, work: Work, run: Run, outcome: int, *, output=b"", reason="") -> None:
        """Emits the activation's ActivationRecord when the runtime records them."""
        if self._recording is None:
            return
        ctx = run.ctx
        resumed = ctx.resume_of
        # What the activation waited on: a resume's suspension, or what a start ran again after.
        waited = resumed if resumed is not None else run.waited
        work.emit(
            RECORDS,
            self._recording.record(
                entity_key=work.key,
                seq=ctx.seq,
                first_step=0 if resumed is None else resumed.step_index,
                now_ms=ctx.now_ms,
                adapter=self._agent.adapter,
                event=run.event,
                answers=waited.answers if waited is not None else (),
                model_log=ctx.model_log,
                intents=ctx.intents,
                outcome=outcome,
                output=output,
                reason=reason,
                attempt=0 if resumed is None else resumed.resume_failures,
                held=waited,
            ),
        )

    def _resume(self, work: Work, suspended: Continuation, now: int) -> None:
        """Resumes the agent with `suspended`'s answers (a new blob holding every answer
        accepted so far); a failure keeps them and schedules a retry."""
        answers = ordered_answers(suspended, work.state.pending)
        run = self._run(
            work,
            now,
            suspended.seq,
            lambda ctx: self._agent.resume(ctx, answers),
            # The agent's own copy: an edit of it must not reach the retry's.
            resume_of=self._copy(suspended),
        )
        if run.error is None:
            self._commit_run(
                work, run, now, marks=(), anchor=work.anchor, mailbox=list(suspended.mailbox)
            )
            return
        if self._asks(run.error):
            self._ask_budget(work, run, now, suspended=suspended)
            self._keep_paid(work, run, ended=False)
            return
        failures = suspended.resume_failures + 1
        limit = (
            self._config.retryable_resume_retries
            if model_busy(run.error)
            else self._config.resume_retries
        )
        if failures > limit:
            self._failed(
                work,
                run,
                now,
                f"; the resume failed {failures} times, so the suspension on "
                f"{list(suspended.pending_intent_ids)} ended; its answers are in the record",
                answers=suspended.answers,
                reason=dl.RESUME_FAILED,
            )
            # Before the mailbox runs: its starts count from the usage this one leaves.
            self._keep_paid(work, run, ended=False)
            self._end_suspension(work, suspended)
            return
        retry = self._copy(suspended)
        retry.resume_failures = failures
        retry.attempted_at_ms = now
        # This attempt's record holds the attempts a budget held up: the retry is a new one.
        retry.held_attempts = 0
        del retry.held_calls[:]
        del retry.held_failures[:]
        # From the later of the answer's time and the input's, so an answer stamped far behind
        # does not make its retries due at once.
        retry.retry_at_ms = retry_at(max(now, work.anchor), self._config.backoff_ms(failures))
        self._failed(
            work,
            run,
            now,
            f"; the resume keeps its {len(suspended.answers)} answers and is tried again at "
            f"{retry.retry_at_ms} (retry {failures} of {limit})",
            answers=suspended.answers,
        )
        work.commit(dataclasses.replace(work.state, continuation=retry))
        self._keep_paid(work, run, ended=False)

    def _end_suspension(self, work: Work, suspended: Continuation) -> None:
        work.commit(dataclasses.replace(work.state, continuation=None, pending=()))
        self._drain(work, list(suspended.mailbox), work.anchor)


#: The dead-letter reason of an activation that failed on each kind of error (else
#: `agent_raised`).
_REASONS = (
    (BudgetExceededError, dl.BUDGET_EXCEEDED),
    (CheckpointRejectedError, dl.CHECKPOINT_REJECTED),
    (MemoryBudgetError, dl.MEMORY_BUDGET),
    (AgentContractError, dl.AGENT_CONTRACT),
    (LlmCallError, dl.LLM_FAILED),
)


def model_busy(error: Exception) -> bool:
    """A model that stayed busy or unreachable past its client's own retries."""
    return said_retryable(error)
