"""RunAgent: one agent per entity key, driven through activations inside a stateful DoFn.

See the package docstring (beam_agents.runtime) for the design; this module holds the
transform, its state and timer specs, and the activation loop.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterable, Iterator

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.coders.coders import DeterministicProtoCoder
from apache_beam.transforms import window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.typehints import Tuple
from google.protobuf.message import DecodeError, Message

from beam_agents._protos import (
    ActivationErrorRecord,
    AgentEnvelope,
    Continuation,
    LlmCacheBlob,
    MemoryBlob,
    StateSnapshot,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.beam_support import timer_timestamp, typed
from beam_agents.core.migration import (
    CURRENT_STATE_SCHEMA_VERSION,
    MigrationRegistry,
    migrate_to_current,
)
from beam_agents.core.signing import Keyring
from beam_agents.errors import (
    AgentContractError,
    CheckpointRejectedError,
    LlmCallError,
    MemoryBudgetError,
)
from beam_agents.runtime.context import (
    ESCALATION_TOOL,
    ActivationContext,
    Agent,
    Answer,
    Completion,
    LlmClient,
    Suspension,
)
from beam_agents.runtime.dead_letters import (
    AFTER_DEADLINE,
    AGENT_CONTRACT,
    AGENT_RAISED,
    ANSWER_MISMATCH,
    CHECKPOINT_REJECTED,
    DEADLINE_EXCEEDED,
    EMPTY_ENVELOPE,
    KEY_SUSPENDED,
    LLM_FAILED,
    MEMORY_BUDGET,
    NO_ENTITY_KEY,
    NO_SUSPENSION,
    RESTORE_CONFLICT,
    STALE_TIMER,
    TTL_WIPED_SUSPENDED,
    UNDECODABLE,
    UNKNOWN_INTENT,
    error_record,
)
from beam_agents.runtime.memory import Memory, ReplayCache

__all__ = [
    "COMPLETIONS",
    "ERRORS",
    "INTENTS",
    "SNAPSHOTS",
    "TRACES",
    "AtDeadline",
    "DeadlinePolicy",
    "RunAgent",
    "RuntimeConfig",
]

COMPLETIONS = "completions"
INTENTS = "intents"
TRACES = "traces"
ERRORS = "errors"
SNAPSHOTS = "snapshots"

_ENVELOPE, _SNAPSHOT = b"E", b"S"
_INT64_MAX = 2**63 - 1
_SEQ_PER_MS = 1000


class AtDeadline(enum.Enum):
    #: Resume the agent with EXPIRED results for the intents still unanswered.
    EXPIRE = "expire"
    #: Put an APPROVAL intent before a human and extend the deadline, up to max_escalations
    #: times; then EXPIRE.
    ESCALATE = "escalate"
    #: End the suspension (its state cleared) and dead-letter it.
    DEAD_LETTER = "dead_letter"


@dataclasses.dataclass(frozen=True)
class DeadlinePolicy:
    action: AtDeadline = AtDeadline.EXPIRE
    max_escalations: int = 1
    #: How far each escalation moves the deadline.
    extension_ms: int = 24 * 60 * 60 * 1000


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    #: Bytes of memory values a key may hold; LRU entries beyond it are evicted.
    memory_budget_bytes: int | None = 1024 * 1024
    cache_max_entries: int = 256
    cache_max_bytes: int = 4 * 1024 * 1024
    cache_max_response_bytes: int = 256 * 1024
    #: expires_at_ms of an intent = its activation's event time + this.
    intent_ttl_ms: int = 60 * 60 * 1000
    #: A suspension's deadline unless the agent names one.
    suspend_deadline_ms: int = 24 * 60 * 60 * 1000
    #: An idle key's state is cleared this long after its last activity (after its deadline,
    #: when suspended). Its seq is kept, so it never re-issues an intent_id.
    ttl_ms: int = 30 * 24 * 60 * 60 * 1000
    deadline_policy: DeadlinePolicy = DeadlinePolicy()


@dataclasses.dataclass
class _Reads:
    """A key's state as read, every blob through migrate_to_current (the raw blobs kept for
    export, which carries them verbatim)."""

    seq: int | None
    memory: MemoryBlob | None
    cache: LlmCacheBlob | None
    continuation: Continuation | None
    pending: list[ToolIntent]
    raw: dict[str, Message | None]

    @property
    def empty(self) -> bool:
        return not self.pending and all(v is None for v in self.raw.values())


@dataclasses.dataclass
class _Outcome:
    """What an element or timer produces: outputs, and the writes to commit (None: write
    nothing)."""

    outputs: list = dataclasses.field(default_factory=list)
    commit: Callable[[], None] | None = None


class _KeyAndTag(beam.DoFn):
    """AgentEnvelopes or StateSnapshots (`kind`), as messages or bytes, in; (entity_key,
    tag + bytes) out, the tag saying which of the two it is. Bytes that do not parse as `kind`
    are dead letters."""

    def __init__(self, kind: bytes) -> None:
        self._kind = kind
        self._type = AgentEnvelope if kind == _ENVELOPE else StateSnapshot

    def process(self, element, timestamp=beam.DoFn.TimestampParam) -> Iterator:
        if isinstance(element, self._type):
            message, element = element, element.SerializeToString(deterministic=True)
        else:
            try:
                message = self._type.FromString(element)
            except (DecodeError, TypeError) as e:
                size = len(element) if isinstance(element, bytes | bytearray) else 0
                name = self._type.__name__
                detail = f"{type(element).__name__} of {size} bytes is no {name}: {e}"
                record = error_record(b"", UNDECODABLE, detail, timestamp.micros // 1000)
                yield beam.pvalue.TaggedOutput(ERRORS, (b"", record))
                return
        if not message.entity_key:
            detail = f"a {self._type.__name__} with no entity_key; an agent needs a key"
            record = error_record(b"", NO_ENTITY_KEY, detail, timestamp.micros // 1000)
            yield beam.pvalue.TaggedOutput(ERRORS, (b"", record))
            return
        yield (message.entity_key, self._kind + bytes(element))


class _AgentDoFn(beam.DoFn):
    """The activation loop of the package docstring."""

    # Frozen (runtime/state_manifest.json): a renamed spec, another coder or another timer
    # domain breaks Dataflow --update's state restore for every key.
    MEMORY = ReadModifyWriteStateSpec("memory", DeterministicProtoCoder(MemoryBlob))
    CONTINUATION = ReadModifyWriteStateSpec("continuation", DeterministicProtoCoder(Continuation))
    LLM_CACHE = ReadModifyWriteStateSpec("llm_cache", DeterministicProtoCoder(LlmCacheBlob))
    SEQ = ReadModifyWriteStateSpec("seq", VarIntCoder())
    PENDING = BagStateSpec("pending", DeterministicProtoCoder(ToolIntent))
    DEADLINE = TimerSpec("deadline", TimeDomain.WATERMARK)
    TTL = TimerSpec("ttl", TimeDomain.WATERMARK)

    def __init__(self, agent: Agent, llm_client, keyring_loader, config, registry) -> None:
        self._agent = agent
        self._llm_client = llm_client
        self._keyring_loader = keyring_loader
        self._config = config
        self._registry = registry
        self._keyring: Keyring | None = None
        self._activations = beam.metrics.Metrics.counter("beam_agents.runtime", "activations")
        self._failures = beam.metrics.Metrics.counter("beam_agents.runtime", "failed_activations")
        self._duplicates = beam.metrics.Metrics.counter("beam_agents.runtime", "duplicate_answers")
        self._resolved_deadlines = beam.metrics.Metrics.counter(
            "beam_agents.runtime", "deadline_timers_after_resolution"
        )

    def setup(self) -> None:
        self._keyring = None if self._keyring_loader is None else self._keyring_loader()

    # -- state ----------------------------------------------------------------------------

    def _migrate(self, blob):
        return None if blob is None else migrate_to_current(blob, self._registry)

    def _read(self, seq, memory, cache, continuation, pending) -> _Reads:
        raw = {
            "memory": memory.read(),
            "llm_cache": cache.read(),
            "continuation": continuation.read(),
        }
        # StateSchemaFromFutureError propagates from here on purpose: the bundle fails and the
        # key waits, untouched, for the binary that wrote it (never a dead letter).
        return _Reads(
            seq=seq.read(),
            memory=self._migrate(raw["memory"]),
            cache=self._migrate(raw["llm_cache"]),
            continuation=self._migrate(raw["continuation"]),
            pending=list(pending.read()),
            raw=raw,
        )

    def _stamp(self, blob):
        blob.state_schema_version = self._current_version()
        return blob

    def _current_version(self) -> int:
        if self._registry is not None:
            return self._registry.current_version
        return CURRENT_STATE_SCHEMA_VERSION

    # -- the element path -----------------------------------------------------------------

    def process(
        self,
        element: tuple[bytes, bytes],
        seq=beam.DoFn.StateParam(SEQ),
        memory=beam.DoFn.StateParam(MEMORY),
        cache=beam.DoFn.StateParam(LLM_CACHE),
        continuation=beam.DoFn.StateParam(CONTINUATION),
        pending=beam.DoFn.StateParam(PENDING),
        deadline=beam.DoFn.TimerParam(DEADLINE),
        ttl=beam.DoFn.TimerParam(TTL),
    ) -> Iterable:
        key, tagged = element
        states = (seq, memory, cache, continuation, pending)
        timers = (deadline, ttl)
        if tagged[:1] == _SNAPSHOT:
            outcome = self._restore(key, StateSnapshot.FromString(tagged[1:]), states, timers)
        else:
            envelope = AgentEnvelope.FromString(tagged[1:])
            outcome = self._envelope(key, envelope, states, timers)
        if outcome.commit is not None:
            outcome.commit()
        yield from outcome.outputs

    def _envelope(self, key, envelope: AgentEnvelope, states, timers) -> _Outcome:
        now = envelope.event_time_ms
        payload = envelope.WhichOneof("payload")
        if payload is None:
            return _dead(key, EMPTY_ENVELOPE, "the envelope carries no payload", now)
        reads = self._read(*states)
        if payload == "export_request":
            return _Outcome([_snapshot_output(key, reads, envelope, self._current_version())])
        if payload == "external_event":
            if reads.continuation is not None:
                return _dead(
                    key,
                    KEY_SUSPENDED,
                    "the key is suspended, waiting for "
                    f"{list(reads.continuation.pending_intent_ids)}; the event was not "
                    "processed",
                    now,
                )
            seq = _next_seq(reads.seq, now)
            return self._activate(
                key,
                now,
                seq,
                reads,
                states,
                timers,
                lambda ctx: self._agent.start(ctx, envelope.external_event),
            )
        return self._answer(key, envelope, payload, reads, states, timers)

    def _answer(self, key, envelope, payload, reads, states, timers) -> _Outcome:
        now = envelope.event_time_ms
        answered_id = (
            envelope.tool_result.intent_id
            if payload == "tool_result"
            else envelope.approval.intent_id
        )
        suspended = reads.continuation
        if suspended is None:
            return _dead(
                key, NO_SUSPENSION, f"an answer to {answered_id}, but the key is not suspended", now
            )
        if answered_id not in suspended.pending_intent_ids:
            return _dead(
                key,
                UNKNOWN_INTENT,
                f"{answered_id} is not pending ({list(suspended.pending_intent_ids)})",
                now,
            )
        if now > suspended.deadline_ms:
            return _dead(
                key,
                AFTER_DEADLINE,
                f"the answer to {answered_id} at {now} came after "
                f"the deadline {suspended.deadline_ms}",
                now,
            )
        intent = next((i for i in reads.pending if i.intent_id == answered_id), None)
        if intent is None:  # a continuation whose pending intents were not all restored
            return _dead(
                key, UNKNOWN_INTENT, f"{answered_id} is pending but its intent is missing", now
            )
        mismatch = _mismatch(key, intent, envelope, payload)
        if mismatch:
            return _dead(key, ANSWER_MISMATCH, mismatch, now)
        if any(_answered_id(a) == answered_id for a in suspended.answers):
            self._duplicates.inc()
            return _Outcome()
        suspended.answers.append(envelope)
        if intent.tool_name == ESCALATION_TOOL and not envelope.approval.approved:
            # The human declined to keep waiting: resume now, the rest expired.
            return self._expire_and_resume(key, now, suspended, reads, states, timers)
        if len(suspended.answers) < len(suspended.pending_intent_ids):
            continuation_state = states[3]

            def record_answer():
                continuation_state.write(self._stamp(suspended))

            return _Outcome(commit=record_answer)
        answers = _ordered_answers(suspended, reads.pending)
        return self._activate(
            key,
            now,
            suspended.seq,
            reads,
            states,
            timers,
            lambda ctx: self._agent.resume(ctx, answers),
            resume_of=suspended,
        )

    # -- activations ----------------------------------------------------------------------

    def _activate(self, key, now, seq, reads, states, timers, run, resume_of=None) -> _Outcome:
        config = self._config
        memory = Memory.from_blob(
            reads.memory or MemoryBlob(), budget_bytes=config.memory_budget_bytes, now_ms=now
        )
        cache = ReplayCache.from_blob(
            reads.cache or LlmCacheBlob(),
            max_entries=config.cache_max_entries,
            max_bytes=config.cache_max_bytes,
            max_response_bytes=config.cache_max_response_bytes,
            now_ms=now,
        )
        ctx = ActivationContext(
            entity_key=key,
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
        )
        ctx.trace_activation(
            TraceEvent.ACTIVATION_START,
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": self._agent.adapter,
                "beam_agents.resume": "true" if resume_of else "false",
            },
        )
        try:
            result = run(ctx)
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
            memory_blob, cache_blob = memory.to_blob(), cache.to_blob()
        except Exception as e:  # the agent's failure is a dead letter, never the bundle's
            self._failures.inc()
            return self._failed(ctx, e)
        self._activations.inc()
        if isinstance(result, Suspension):
            next_continuation = result.continuation
            ctx.trace_child(
                TraceEvent.SUSPENDED,
                "suspended",
                {
                    "beam_agents.pending": ",".join(next_continuation.pending_intent_ids),
                    "beam_agents.deadline_ms": str(next_continuation.deadline_ms),
                },
            )
        else:
            next_continuation = None
        ctx.trace_activation(
            TraceEvent.ACTIVATION_END,
            {"beam_agents.outcome": "suspended" if next_continuation else "completed"},
        )
        outputs = [beam.pvalue.TaggedOutput(INTENTS, (key, i)) for i in ctx.intents]
        outputs += [beam.pvalue.TaggedOutput(TRACES, (key, t)) for t in ctx.traces]
        if isinstance(result, Completion):
            outputs.append((key, result.output))

        def commit():
            seq_state, memory_state, cache_state, continuation_state, pending_state = states
            deadline, ttl = timers
            seq_state.write(max(seq, reads.seq or 0))
            memory_state.write(self._stamp(memory_blob))
            cache_state.write(self._stamp(cache_blob))
            pending_state.clear()
            if next_continuation is None:
                continuation_state.clear()
                deadline.clear()
                ttl.set(timer_timestamp(_saturating_add(now, self._config.ttl_ms)))
            else:
                continuation_state.write(self._stamp(next_continuation))
                for intent in ctx.intents:
                    pending_state.add(intent)
                deadline.set(timer_timestamp(next_continuation.deadline_ms))
                ttl.set(
                    timer_timestamp(
                        _saturating_add(next_continuation.deadline_ms, self._config.ttl_ms)
                    )
                )

        return _Outcome(outputs, commit)

    def _failed(self, ctx: ActivationContext, error: Exception) -> _Outcome:
        reason = {
            MemoryBudgetError: MEMORY_BUDGET,
            AgentContractError: AGENT_CONTRACT,
            LlmCallError: LLM_FAILED,
            CheckpointRejectedError: CHECKPOINT_REJECTED,
        }.get(type(error), AGENT_RAISED)
        detail = f"seq {ctx.seq}: {type(error).__name__}: {error}"
        ctx.traces.clear()
        ctx.trace_child(
            TraceEvent.ERROR,
            "error",
            {"error.type": type(error).__name__, "beam_agents.reason": reason},
        )
        outcome = _dead(ctx.entity_key, reason, detail, ctx.now_ms)
        outcome.outputs += [
            beam.pvalue.TaggedOutput(TRACES, (ctx.entity_key, t)) for t in ctx.traces
        ]
        return outcome

    # -- restore --------------------------------------------------------------------------

    def _restore(self, key, snapshot: StateSnapshot, states, timers) -> _Outcome:
        now = snapshot.snapshot_at_ms
        reads = self._read(*states)
        if not reads.empty:
            return _dead(
                key,
                RESTORE_CONFLICT,
                "the key already has state; a snapshot "
                f"(request {snapshot.request_id!r}) is restored only onto an empty key",
                now,
            )
        # The deadline is read through migration; the blobs are written verbatim and migrate
        # on their first read, like state restored by --update.
        suspended = self._migrate(
            snapshot.continuation if snapshot.HasField("continuation") else None
        )

        def commit():
            seq_state, memory_state, cache_state, continuation_state, pending_state = states
            deadline, ttl = timers
            seq_state.write(max(snapshot.seq, reads.seq or 0))
            if snapshot.HasField("memory"):
                memory_state.write(snapshot.memory)
            if snapshot.HasField("llm_cache"):
                cache_state.write(snapshot.llm_cache)
            for intent in snapshot.pending:
                pending_state.add(intent)
            if suspended is not None:
                continuation_state.write(snapshot.continuation)
                deadline.set(timer_timestamp(suspended.deadline_ms))
                ttl.set(
                    timer_timestamp(_saturating_add(suspended.deadline_ms, self._config.ttl_ms))
                )
            else:
                ttl.set(timer_timestamp(_saturating_add(now, self._config.ttl_ms)))

        return _Outcome(commit=commit)

    # -- timers ---------------------------------------------------------------------------

    @on_timer(DEADLINE)
    def at_deadline(
        self,
        key=beam.DoFn.KeyParam,
        fired=beam.DoFn.TimestampParam,
        seq=beam.DoFn.StateParam(SEQ),
        memory=beam.DoFn.StateParam(MEMORY),
        cache=beam.DoFn.StateParam(LLM_CACHE),
        continuation=beam.DoFn.StateParam(CONTINUATION),
        pending=beam.DoFn.StateParam(PENDING),
        deadline=beam.DoFn.TimerParam(DEADLINE),
        ttl=beam.DoFn.TimerParam(TTL),
    ) -> Iterable:
        states = (seq, memory, cache, continuation, pending)
        timers = (deadline, ttl)
        reads = self._read(*states)
        now = _ms(fired)
        suspended = reads.continuation
        if suspended is None:
            # Resolved already (runners may still fire a timer they were told to clear, and a
            # watermark past both lets the TTL resolve a due deadline first): nothing to do,
            # and nothing for anyone to act on.
            self._resolved_deadlines.inc()
            return
        if _ms(timer_timestamp(suspended.deadline_ms)) != now:
            outcome = _dead(
                key,
                STALE_TIMER,
                f"a deadline timer at {now} found the suspension due at "
                f"{suspended.deadline_ms}; nothing changed",
                now,
            )
        else:
            outcome = self._deadline(key, now, suspended, reads, states, timers)
        if outcome.commit is not None:
            outcome.commit()
        yield from outcome.outputs

    def _deadline(self, key, now, suspended, reads, states, timers) -> _Outcome:
        policy = self._config.deadline_policy
        answered = {_answered_id(a) for a in suspended.answers}
        unanswered = [
            i
            for i in reads.pending
            if i.intent_id not in answered and i.tool_name != ESCALATION_TOOL
        ]
        if policy.action is AtDeadline.DEAD_LETTER:
            outcome = _dead(
                key,
                DEADLINE_EXCEEDED,
                f"no answer to {[i.intent_id for i in unanswered]} by {suspended.deadline_ms}",
                now,
            )

            def end_suspension():
                _, _, _, continuation_state, pending_state = states
                continuation_state.clear()
                pending_state.clear()
                timers[1].set(timer_timestamp(_saturating_add(now, self._config.ttl_ms)))

            outcome.commit = end_suspension
            return outcome
        if policy.action is AtDeadline.ESCALATE and suspended.escalations < policy.max_escalations:
            return self._escalate(key, now, suspended, unanswered, reads, states, timers)
        suspended.escalations += 1
        return self._expire_and_resume(key, now, suspended, reads, states, timers)

    def _expire_and_resume(self, key, now, suspended, reads, states, timers) -> _Outcome:
        """Resumes the agent with EXPIRED results for its intents still unanswered."""
        answered = {_answered_id(a) for a in suspended.answers}
        for intent in reads.pending:
            if intent.intent_id in answered or intent.tool_name == ESCALATION_TOOL:
                continue
            suspended.answers.append(
                AgentEnvelope(
                    entity_key=key,
                    event_time_ms=now,
                    tool_result=ToolResult(
                        intent_id=intent.intent_id,
                        entity_key=key,
                        seq=intent.seq,
                        status=ToolResult.EXPIRED,
                        error_message=f"no answer by {suspended.deadline_ms}",
                        completed_at_ms=now,
                    ),
                )
            )
        answers = _ordered_answers(suspended, reads.pending)
        return self._activate(
            key,
            now,
            suspended.seq,
            reads,
            states,
            timers,
            lambda ctx: self._agent.resume(ctx, answers),
            resume_of=suspended,
        )

    def _escalate(self, key, now, suspended, unanswered, reads, states, timers) -> _Outcome:
        step = suspended.step_index
        ctx = ActivationContext(
            entity_key=key,
            seq=suspended.seq,
            now_ms=now,
            memory=Memory(),
            cache=ReplayCache(),
            llm_client=None,
            adapter=self._agent.adapter,
            first_step=step,
            resume_of=suspended,
            keyring=self._keyring,
            intent_ttl_ms=self._config.deadline_policy.extension_ms,
        )
        (escalation,) = ctx.escalate(
            "These intents got no answer by their deadline; approve to keep waiting, decline "
            "to let the agent go on without them.",
            unanswered=[i.intent_id for i in unanswered],
            deadline_ms=suspended.deadline_ms,
        )
        suspended.escalations += 1
        suspended.step_index = ctx.next_step
        suspended.pending_intent_ids.append(escalation.intent_id)
        suspended.deadline_ms = _saturating_add(now, self._config.deadline_policy.extension_ms)
        outputs = [beam.pvalue.TaggedOutput(INTENTS, (key, escalation))]
        outputs += [beam.pvalue.TaggedOutput(TRACES, (key, t)) for t in ctx.traces]

        def commit():
            _, _, _, continuation_state, pending_state = states
            continuation_state.write(self._stamp(suspended))
            pending_state.add(escalation)
            timers[0].set(timer_timestamp(suspended.deadline_ms))
            timers[1].set(
                timer_timestamp(_saturating_add(suspended.deadline_ms, self._config.ttl_ms))
            )

        return _Outcome(outputs, commit)

    @on_timer(TTL)
    def at_ttl(
        self,
        key=beam.DoFn.KeyParam,
        fired=beam.DoFn.TimestampParam,
        seq=beam.DoFn.StateParam(SEQ),
        memory=beam.DoFn.StateParam(MEMORY),
        cache=beam.DoFn.StateParam(LLM_CACHE),
        continuation=beam.DoFn.StateParam(CONTINUATION),
        pending=beam.DoFn.StateParam(PENDING),
        deadline=beam.DoFn.TimerParam(DEADLINE),
        ttl=beam.DoFn.TimerParam(TTL),
    ) -> Iterable:
        states = (seq, memory, cache, continuation, pending)
        # Read through migration like every other read: a blob from a newer binary wedges the
        # key here too, rather than being wiped by a binary that cannot read it.
        reads = self._read(*states)
        now = _ms(fired)
        suspended = reads.continuation
        if suspended is not None and _ms(timer_timestamp(suspended.deadline_ms)) <= now:
            # The watermark passed the deadline too (a bounded run's end, a backlog) and timers
            # of two families need not fire in time order: the deadline comes first, as if
            # its timer had fired, and its commit sets the TTL anew.
            outcome = self._deadline(
                key, suspended.deadline_ms, suspended, reads, states, (deadline, ttl)
            )
            if outcome.commit is None:
                # The resume failed (again): nothing else will end this suspension.
                outcome.outputs += _dead(
                    key,
                    TTL_WIPED_SUSPENDED,
                    "idle past its TTL, suspended on an agent whose resume fails; state cleared",
                    now,
                ).outputs
                outcome.commit = lambda: _wipe(states, deadline)
            deadline.clear()
        elif suspended is not None:
            outcome = _dead(
                key,
                TTL_WIPED_SUSPENDED,
                "idle past its TTL while suspended on "
                f"{list(suspended.pending_intent_ids)}; state cleared",
                now,
            )
            outcome.commit = lambda: _wipe(states, deadline)
        else:
            outcome = _Outcome(commit=lambda: _wipe(states, deadline))
        if outcome.commit is not None:
            outcome.commit()
        yield from outcome.outputs


def _wipe(states, deadline) -> None:
    """Clears an idle key's state, all but its seq: it never re-issues an intent_id."""
    _, memory, cache, continuation, pending = states
    memory.clear()
    cache.clear()
    continuation.clear()
    pending.clear()
    deadline.clear()


def _dead(key: bytes, reason: str, detail: str, now: int) -> _Outcome:
    return _Outcome(
        [beam.pvalue.TaggedOutput(ERRORS, (key, error_record(key, reason, detail, now)))]
    )


def _ms(timestamp) -> int:
    # Portable runners keep timers to the millisecond: compare firing times in milliseconds.
    return timestamp.micros // 1000


def _saturating_add(a: int, b: int) -> int:
    return min(a + b, _INT64_MAX)


def _next_seq(stored: int | None, now_ms: int) -> int:
    # A key with no seq starts at its first event's time in microsecond steps, so a key that
    # starts over in a new job (no state restored) does not re-issue the ids of an earlier one.
    if stored is not None:
        return stored + 1
    return max(0, min(now_ms, _INT64_MAX // _SEQ_PER_MS - 1)) * _SEQ_PER_MS


def _answered_id(envelope: AgentEnvelope) -> str:
    if envelope.WhichOneof("payload") == "approval":
        return envelope.approval.intent_id
    return envelope.tool_result.intent_id


def _mismatch(key: bytes, intent: ToolIntent, envelope: AgentEnvelope, payload: str) -> str:
    approval = intent.kind == ToolIntent.APPROVAL
    if approval != (payload == "approval"):
        want = "an approval" if approval else "a tool result"
        return f"{intent.intent_id} ({intent.tool_name}) wants {want}, got a {payload}"
    if payload == "tool_result" and envelope.tool_result.entity_key not in (b"", key):
        return f"the result of {intent.intent_id} names another entity"
    return ""


def _ordered_answers(suspended: Continuation, pending: list[ToolIntent]) -> list[Answer]:
    """The answers to the agent's own intents (escalations are the runtime's), in intent
    order."""
    by_id = {_answered_id(a): a for a in suspended.answers}
    return [
        Answer.from_envelope(i, by_id[i.intent_id])
        for i in pending
        if i.intent_id in by_id and i.tool_name != ESCALATION_TOOL
    ]


def _snapshot_output(key, reads: _Reads, envelope: AgentEnvelope, version: int):
    snapshot = StateSnapshot(
        state_schema_version=version,
        entity_key=key,
        seq=reads.seq or 0,
        snapshot_at_ms=envelope.event_time_ms,
        pending=reads.pending,
        request_id=envelope.export_request.request_id,
    )
    for field, blob in reads.raw.items():
        if blob is not None:
            getattr(snapshot, field).CopyFrom(blob)
    return beam.pvalue.TaggedOutput(SNAPSHOTS, (key, snapshot))


class RunAgent(beam.PTransform):
    """Runs `agent` for every entity key.

    Input: a PCollection of AgentEnvelopes (messages or serialized bytes), or a dict
    {"envelopes": ..., "snapshots": ...} whose snapshots (StateSnapshot messages or bytes)
    restore keys before their envelopes arrive; any windowing. Output: a dict of keyed
    PCollections in the global window: COMPLETIONS (entity_key, bytes), INTENTS (entity_key,
    ToolIntent), TRACES (entity_key, TraceEvent), ERRORS (entity_key, ActivationErrorRecord),
    SNAPSHOTS (entity_key, StateSnapshot).

    `keyring_loader` is called on the worker (DoFn.setup) to sign intents; `registry` replaces
    the default migration registry (tests of a future schema version).
    """

    def __init__(
        self,
        agent: Agent,
        *,
        llm_client: LlmClient | None = None,
        keyring_loader: Callable[[], Keyring] | None = None,
        config: RuntimeConfig = RuntimeConfig(),
        registry: MigrationRegistry | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(agent, Agent):
            raise TypeError(f"{agent!r} has no adapter, start and resume: not an Agent")
        self._agent = agent
        self._llm_client = llm_client
        self._keyring_loader = keyring_loader
        self._config = config
        self._registry = registry

    def expand(self, inputs):
        if isinstance(inputs, dict):
            unknown = set(inputs) - {"envelopes", "snapshots"}
            if unknown:
                raise ValueError(f"RunAgent takes envelopes and snapshots, not {sorted(unknown)}")
            sources = [
                (kind, inputs[name])
                for kind, name in ((_ENVELOPE, "envelopes"), (_SNAPSHOT, "snapshots"))
                if name in inputs
            ]
        else:
            sources = [(_ENVELOPE, inputs)]
        keyed, errors = [], []
        for kind, source in sources:
            name = "Envelopes" if kind == _ENVELOPE else "Snapshots"
            # Keyed state is per window: one key's activations must share one state.
            tagged = (
                source
                | f"{name}GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
                | f"Key{name}" >> beam.ParDo(_KeyAndTag(kind)).with_outputs(ERRORS, main="keyed")
            )
            keyed.append(typed(tagged.keyed, Tuple[bytes, bytes]))
            errors.append(typed(tagged[ERRORS], Tuple[bytes, ActivationErrorRecord]))
        merged = keyed[0] if len(keyed) == 1 else tuple(keyed) | "Merge" >> beam.Flatten()
        outputs = typed(merged, Tuple[bytes, bytes]) | "Activate" >> beam.ParDo(
            _AgentDoFn(
                self._agent, self._llm_client, self._keyring_loader, self._config, self._registry
            )
        ).with_outputs(INTENTS, TRACES, ERRORS, SNAPSHOTS, main=COMPLETIONS)
        errors.append(typed(outputs[ERRORS], Tuple[bytes, ActivationErrorRecord]))
        return {
            COMPLETIONS: typed(outputs[COMPLETIONS], Tuple[bytes, bytes]),
            INTENTS: typed(outputs[INTENTS], Tuple[bytes, ToolIntent]),
            TRACES: typed(outputs[TRACES], Tuple[bytes, TraceEvent]),
            ERRORS: typed(
                tuple(errors) | "Errors" >> beam.Flatten(), Tuple[bytes, ActivationErrorRecord]
            ),
            SNAPSHOTS: typed(outputs[SNAPSHOTS], Tuple[bytes, StateSnapshot]),
        }
