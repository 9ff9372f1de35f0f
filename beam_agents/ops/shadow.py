"""Shadow mode: a candidate agent run live beside the agent in production, acting on nothing.

    live = envelopes | RunAgent(agent, recording=Recording())
    shadow = live[RECORDS] | "Shadow" >> ShadowAgent(candidate)

`ShadowAgent` takes the live agent's activation records (RunAgent's RECORDS output) as they
come and, per key, runs the candidate one live activation at a time, as the backtest does
(`backtest.backtest_key`: the runtime's own machine, model answers from the live agent's for
the same request, tool results and approvals from the live agent's for the same call). So its
divergence records are the backtest's for the same events. It emits no intent at all: nothing
it does can reach an effector.

State of its own, bounded per key. The transform keeps, per key and under its own names
(whatever label it is applied under), the candidate's state (the five cells RunAgent keeps),
the last live record compared (whose calls the next one's answers are matched to), the key's
counts so far, and the records that came ahead of their turn; RunAgent's state is untouched. So
a long-lived key costs one activation of the candidate per live activation, never its history
again. The candidate's TTL fires as RunAgent's does (`config.ttl_ms` of event time idle): its
state is wiped but for its seq, as the live key's is, and the shadow of a key that ended keeps
that seq, its counts and the last record's place. A key the shadow stopped on (diverged, or a
dead letter) keeps only a mark that it did. Adding a shadow to a job adds transforms and state,
which `--update` takes (the live RunAgent gains the RECORDS output, which it takes too).

Order. A key's records can reach the shadow in any order and more than once. It runs each in
the order the live key ran them: a key's first activation (a start under the first seq of a
key, `machine_events.first_seq`), then, while the candidate is suspended, the resume of its
suspension (the same seq and step), else the next seq's start. A record that failed live and
that the runtime runs again at its place (a retried resume) is not compared: its model answers
go to the retry. A resume that ended its suspension on a failure (`resume_failed`, a declined
raise's `budget_exceeded`) can come before those attempts: where the candidate, run on what
came, departs from it or fails more often, it waits for them (`_attempts_missing`) until the
watermark is `wait_ms` past it. A copy of a record already compared is dropped. A record that
came ahead of its turn waits; if its turn has not come once the watermark is `wait_ms` past it,
the key is not shadowed further, with a `history_incomplete` dead letter (a record lost; a key
that began before the shadow was added to the job). A suspension the live runtime ended at its
deadline with no record ends the candidate's too (`_past_deadline`, as the backtest's): one a
DeadlinePolicy escalated (its step moved on) when the resume at that step comes; one it
dead-lettered when a later seq's start, after the deadline, has waited `wait_ms` (the watermark
past it: no record before it can still come, so the resume it may be ahead of never ran).
Records wait `wait_ms` (two hours of event time by default): more than the live job's longest
resume backoff, for a failed resume waits for its retry.

Outputs: REPORTS, (entity_key, BacktestKeyReport), once per key, at its first divergence (or
where the backtest's run would stop: a resume the model failed both live and in the candidate,
`stopped` with no divergence);
TRACES, (entity_key, TraceEvent), one SHADOW_ACTIVATION span per live activation the candidate
was compared on, up to and including the divergent one; ERRORS, (entity_key,
ActivationErrorRecord), the backtest's dead letters and `history_incomplete`.

Spans, for a dashboard's live divergence rate. Each span is a child of the live activation's
own span, in its trace (the ids are the runtime's pure functions of the key and seq, so no id
travels with the record), named by the candidate (`gen_ai.agent.name`) and saying
`beam_agents.shadow.diverged` ("true" on the divergent activation, with its kind and detail).
The rate is the diverged spans over all spans of a candidate; RunAgent's TRACES and these go to
the same exporter (`beam_agents.integrations.telemetry`). A record is spanned when it is
compared, and each is compared once.

Not yet: a candidate that goes on past its divergence with a model of its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import apache_beam as beam
from apache_beam.coders import BooleanCoder, VarIntCoder
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

from beam_agents._protos import (
    ActivationErrorRecord,
    ActivationRecord,
    BacktestKeyReport,
    Continuation,
    LlmCacheBlob,
    MemoryBlob,
    ToolIntent,
    TraceEvent,
)
from beam_agents.ops.backtest import (
    REPORTS,
    _addressed,
    _count,
    _divergence,
    _matched,
    _model_failed_both,
    _not_run,
    _RecordedModel,
    _sort_tools,
    budget_decision,
    deferrals,
    fired_by,
    kind_name,
    parse_record,
    retried,
    retries,
    taken_in,
)
from beam_agents.runtime.budget import BUDGET_TOOL
from beam_agents.runtime.config import RuntimeConfig
from beam_agents.runtime.context import ESCALATION_TOOL, Agent
from beam_agents.runtime.dead_letters import (
    BUDGET_EXCEEDED,
    HISTORY_INCOMPLETE,
    HISTORY_OUT_OF_ORDER,
    RECORDED_ANSWER_WITHHELD,
    RECORDING_UNDECODABLE,
    RESUME_FAILED,
    error_record,
)
from beam_agents.runtime.key_driver import KeyDriver, recording_machine
from beam_agents.runtime.machine import ERRORS, INTENTS, TRACES, KeyState
from beam_agents.runtime.machine_answers import answered_intent_id, made_here
from beam_agents.runtime.machine_budgets import budget_asked
from beam_agents.runtime.machine_events import first_seq
from beam_agents.runtime.machine_state import due_at, timer_ms
from beam_agents.runtime.recording import RECORDS
from beam_agents.runtime.trace_ids import span_id, trace_id
from beam_agents.wire.beam_support import keep_each_key_in_one_bundle, timer_timestamp, typed

__all__ = ["DEFAULT_WAIT_MS", "REPORTS", "TRACES", "ShadowAgent", "shadow_span"]

#: How long (event time) records ahead of their turn wait for the records before them: past the
#: longest resume backoff of a default RuntimeConfig (an hour), which a failed resume waits.
DEFAULT_WAIT_MS = 2 * 60 * 60 * 1000

Divergence = BacktestKeyReport.Divergence
Outcome = ActivationRecord.Outcome


def shadow_span(
    record: ActivationRecord, candidate: str, divergence: Divergence | None
) -> TraceEvent:
    """The span of `candidate` run on the live activation `record`, a child of its span;
    `divergence` when the candidate departed there."""
    key, seq = record.entity_key, record.seq
    attributes = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": candidate,
        "beam_agents.shadow.live_agent": record.adapter,
        "beam_agents.shadow.diverged": "true" if divergence else "false",
    }
    if divergence:
        attributes["beam_agents.shadow.divergence.kind"] = kind_name(divergence.kind)
        attributes["beam_agents.shadow.divergence.detail"] = divergence.detail
    return TraceEvent(
        trace_id=trace_id(key, seq),
        span_id=span_id(key, seq, "shadow", candidate, record.first_step),
        parent_span_id=span_id(key, seq, "activation", record.first_step),
        entity_key=key,
        seq=seq,
        step_index=record.first_step,
        event_type=TraceEvent.SHADOW_ACTIVATION,
        attributes=attributes,
        start_ms=record.now_ms,
        end_ms=record.now_ms,
    )


def _place(record: ActivationRecord) -> tuple[int, int]:
    return record.seq, record.first_step


def _due(record: ActivationRecord, state: KeyState) -> bool:
    """Whether the live key ran `record` next, the candidate (in step with it) now in `state`:
    the key's first start, its suspension's resume, or the next start."""
    if state.continuation is not None:
        return _place(record) == (state.continuation.seq, state.continuation.step_index)
    if record.first_step != 0 or not record.HasField("event"):
        return False
    if state.seq is None:
        return record.seq == first_seq(record.event.event_time_ms)
    return record.seq == state.seq + 1


def _expected(state: KeyState) -> str:
    if state.continuation is not None:
        waiting = state.continuation
        return f"the resume of seq {waiting.seq} at step {waiting.step_index}"
    if state.seq is None:
        return "the key's first start"
    return f"the start of seq {state.seq + 1}"


@dataclasses.dataclass
class _Turn:
    """What the records whose turn came did: the outputs, what still waits, and whether the
    key is done (diverged, or a dead letter)."""

    outputs: list = dataclasses.field(default_factory=list)
    waiting: list[ActivationRecord] = dataclasses.field(default_factory=list)
    progressed: bool = False
    #: A failed attempt came at the place the key waits on: its retry is due a backoff later.
    attempted: bool = False
    done: bool = False
    #: The candidate's TTL timer, as its last activation set it (`KeyDriver.ttl_set`).
    ttl: tuple[bool, int | None] = (False, None)


class _Shadow(beam.DoFn):
    # The candidate's state, as RunAgent keeps a key's.
    SEQ = ReadModifyWriteStateSpec("candidate_seq", VarIntCoder())
    MEMORY = ReadModifyWriteStateSpec("candidate_memory", DeterministicProtoCoder(MemoryBlob))
    CACHE = ReadModifyWriteStateSpec("candidate_llm_cache", DeterministicProtoCoder(LlmCacheBlob))
    CONTINUATION = ReadModifyWriteStateSpec(
        "candidate_continuation", DeterministicProtoCoder(Continuation)
    )
    PENDING = BagStateSpec("candidate_pending", DeterministicProtoCoder(ToolIntent))
    # The last live record compared, and the key's report so far (its counts).
    LAST = ReadModifyWriteStateSpec("last", DeterministicProtoCoder(ActivationRecord))
    REPORT = ReadModifyWriteStateSpec("report", DeterministicProtoCoder(BacktestKeyReport))
    # Records not compared yet: ahead of their turn, or failed attempts awaiting their retry;
    # and since when (ms of event time) nothing moved while some waited.
    WAITING = BagStateSpec("waiting", DeterministicProtoCoder(ActivationRecord))
    WAITING_SINCE = ReadModifyWriteStateSpec("waiting_since", VarIntCoder())
    DONE = ReadModifyWriteStateSpec("done", BooleanCoder())
    GIVE_UP = TimerSpec("give_up", TimeDomain.WATERMARK)
    # The candidate's TTL, as RunAgent's: a key idle that long is wiped (its seq kept), so the
    # shadow of a key that ended holds no more than the live key does.
    TTL = TimerSpec("candidate_ttl", TimeDomain.WATERMARK)

    def __init__(self, candidate: Agent, wait_ms: int, config: RuntimeConfig) -> None:
        self._candidate = candidate
        self._wait_ms = wait_ms
        self._config = config

    def process(
        self,
        element,
        timestamp=beam.DoFn.TimestampParam,
        seq=beam.DoFn.StateParam(SEQ),
        memory=beam.DoFn.StateParam(MEMORY),
        cache=beam.DoFn.StateParam(CACHE),
        continuation=beam.DoFn.StateParam(CONTINUATION),
        pending=beam.DoFn.StateParam(PENDING),
        last=beam.DoFn.StateParam(LAST),
        report=beam.DoFn.StateParam(REPORT),
        waiting=beam.DoFn.StateParam(WAITING),
        waiting_since=beam.DoFn.StateParam(WAITING_SINCE),
        done=beam.DoFn.StateParam(DONE),
        give_up=beam.DoFn.TimerParam(GIVE_UP),
        ttl=beam.DoFn.TimerParam(TTL),
    ) -> Iterator:
        key, value = element
        record = parse_record(value)
        if not isinstance(record, str) and record.entity_key != key:
            # Re-keyed input: run as this key's history, records of other keys would make a
            # divergence no candidate made. Only this record is skipped.
            record = (
                f"a record of key {record.entity_key!r} keyed {key!r}: the shadow takes "
                "RunAgent's RECORDS as they come, keyed by each record's entity_key"
            )
        if isinstance(record, str):
            letter = error_record(key, RECORDING_UNDECODABLE, record, 0)
            yield beam.pvalue.TaggedOutput(ERRORS, (key, letter))
            return
        if done.read():
            return
        candidate = (seq, memory, cache, continuation, pending)
        held = list(waiting.read())
        turn = self._turns(key, [*held, record], candidate, last, report)
        yield from turn.outputs
        self._settle(turn, timestamp.micros // 1000, candidate, last, report, waiting,
                     waiting_since, done, give_up, ttl)  # fmt: skip

    def _settle(
        self, turn, now, candidate, last, report, waiting, waiting_since, done, give_up, ttl
    ) -> None:
        """Writes what `turn` left: the key done, or its TTL, the records still waiting and
        the time to give up on them (`wait_ms` after `now`, when something moved)."""
        if turn.done:
            _clear(*candidate, last, report, waiting, waiting_since)
            give_up.clear()
            ttl.clear()
            done.write(True)
            return
        _set(ttl, turn.ttl)
        waiting.clear()
        for kept in turn.waiting:
            waiting.add(kept)
        if not turn.waiting:
            waiting_since.clear()
            give_up.clear()
        elif turn.progressed or turn.attempted or waiting_since.read() is None:
            # Nothing has moved since this element: give up wait_ms after it.
            waiting_since.write(now)
            give_up.set(timer_timestamp(now + self._wait_ms))

    @on_timer(GIVE_UP)
    def at_give_up(
        self,
        key=beam.DoFn.KeyParam,
        fired=beam.DoFn.TimestampParam,
        seq=beam.DoFn.StateParam(SEQ),
        memory=beam.DoFn.StateParam(MEMORY),
        cache=beam.DoFn.StateParam(CACHE),
        continuation=beam.DoFn.StateParam(CONTINUATION),
        pending=beam.DoFn.StateParam(PENDING),
        last=beam.DoFn.StateParam(LAST),
        report=beam.DoFn.StateParam(REPORT),
        waiting=beam.DoFn.StateParam(WAITING),
        waiting_since=beam.DoFn.StateParam(WAITING_SINCE),
        done=beam.DoFn.StateParam(DONE),
        give_up=beam.DoFn.TimerParam(GIVE_UP),
        ttl=beam.DoFn.TimerParam(TTL),
    ) -> Iterator:
        held = list(waiting.read())
        if not held or done.read():
            return
        # The watermark is wait_ms past the records waiting: any record before them has come.
        # So a suspension of the candidate the live key went on from with no record of it (a
        # DeadlinePolicy that dead-letters) ended at its deadline: fired now, their turn comes.
        candidate = (seq, memory, cache, continuation, pending)
        turn = self._turns(key, held, candidate, last, report, timely=True)
        if turn.progressed or turn.done:
            yield from turn.outputs
            self._settle(turn, fired.micros // 1000, candidate, last, report, waiting,
                         waiting_since, done, give_up, ttl)  # fmt: skip
            return
        state = _read(seq, memory, cache, continuation, pending)
        first = min(held, key=_place)
        detail = (
            f"{len(held)} record(s) (seq {first.seq} step {first.first_step} first) waited "
            f"{self._wait_ms} ms for {_expected(state)}, which never came: a record "
            "lost, or a key that began before the shadow was added; the key is no longer "
            "shadowed"
        )
        letter = error_record(key, HISTORY_INCOMPLETE, detail, fired.micros // 1000)
        yield beam.pvalue.TaggedOutput(ERRORS, (key, letter))
        _clear(seq, memory, cache, continuation, pending, last, report, waiting, waiting_since)
        done.write(True)

    @on_timer(TTL)
    def at_ttl(
        self,
        key=beam.DoFn.KeyParam,
        fired=beam.DoFn.TimestampParam,
        seq=beam.DoFn.StateParam(SEQ),
        memory=beam.DoFn.StateParam(MEMORY),
        cache=beam.DoFn.StateParam(CACHE),
        continuation=beam.DoFn.StateParam(CONTINUATION),
        pending=beam.DoFn.StateParam(PENDING),
        last=beam.DoFn.StateParam(LAST),
        ttl=beam.DoFn.TimerParam(TTL),
    ) -> None:
        candidate = (seq, memory, cache, continuation, pending)
        machine = recording_machine(self._candidate, None, self._config)
        driver = KeyDriver(machine, key, _read(*candidate))
        driver.fire_ttl(fired.micros // 1000)  # the live key's TTL dead letter is the live's
        _write(candidate, driver.state)
        previous = last.read()
        if driver.state.empty and previous is not None:
            # A wiped key resumes nothing: of the last record only its place is needed (what
            # comes at or before it is a copy).
            last.write(ActivationRecord(seq=previous.seq, first_step=previous.first_step))
        _set(ttl, (driver.ttl_set, driver.ttl_at))

    def _turns(self, key: bytes, records, candidate, last, report, *, timely=False) -> _Turn:
        """Compares each record whose turn has come, in the order the live key ran them, and
        writes the candidate's state after them; the rest wait. `timely`: the watermark has
        passed them all by wait_ms (`_past_deadline`)."""
        turn = _Turn()
        previous, state = last.read(), _read(*candidate)
        # A copy: what a read hands back is the state's own object (Beam's portable harness).
        counts = BacktestKeyReport(entity_key=key)
        if (stored := report.read()) is not None:
            counts.CopyFrom(stored)
        # A copy (an at-least-once sink, a retried bundle) is one record.
        left = list({r.SerializeToString(deterministic=True): r for r in records}.values())
        moved = False  # the candidate's deadline fired (`_past_deadline`)
        while True:
            if previous is not None:
                # What was compared, its failed attempts, and copies that come late are done.
                left = [r for r in left if _place(r) > _place(previous)]
            due = sorted((r for r in left if _due(r, state)), key=lambda r: (r.attempt, r.now_ms))
            final = [r for r in due if not retried(r)]
            if not final:
                fired = self._past_deadline(key, state, left, turn, timely)
                if fired is not None:
                    state, moved = fired, True
                    continue
                # A failed attempt waits for its retry, at its place.
                turn.attempted = any(r is records[-1] for r in due)
                break
            if len(final) > 1:
                detail = (
                    f"{len(final)} different records of seq {final[0].seq} step "
                    f"{final[0].first_step}: records of two histories of the key mixed"
                )
                letter = error_record(key, HISTORY_OUT_OF_ORDER, detail, final[0].now_ms)
                turn.outputs.append(beam.pvalue.TaggedOutput(ERRORS, (key, letter)))
                turn.done = True
                return turn
            (live,) = final
            compared = self._compare(key, previous, live, due, state, counts, turn, timely)
            if compared is None:
                # A failed attempt before it has not come: it waits, and its give-up counts
                # from it, when the watermark has passed every record before it.
                turn.attempted = turn.attempted or any(r is records[-1] for r in due)
                break
            state = compared
            if turn.done:
                return turn
            previous, turn.progressed = live, True
        if turn.progressed or moved:
            _write(candidate, state)
            last.write(previous)
            report.write(counts)
        turn.waiting = left
        return turn

    def _past_deadline(
        self, key: bytes, state: KeyState, left, turn: _Turn, timely: bool
    ) -> KeyState | None:
        """The candidate's state after its deadline timer fired where the live key's fired with
        no record of it (as `backtest._past_deadline`): it is suspended and a live record after
        its suspension's place, which is not its resume, shows the live key went on past its
        deadline: the resume of that very suspension at an escalated step (`fired_by`), or,
        once `timely` (no record before it can still come), a later seq's start after its due
        time (a DeadlinePolicy that dead-letters). None when nothing fires, when the firing
        would run an activation (its record is still to come, and is compared then), or when
        that record's turn would not come of it."""
        waiting = state.continuation
        suspended = (waiting.seq, waiting.step_index) if waiting is not None else None
        later = [r for r in left if suspended is not None and _place(r) > suspended]
        if not later or waiting.retry_at_ms or budget_asked(waiting, state.pending):
            return None
        if min(later, key=_place).seq != waiting.seq and not timely:
            return None
        driver = KeyDriver(recording_machine(self._candidate, None, self._config), key, state)
        following = min(later, key=_place)
        outputs = driver.fire_due(fired_by(following, state), short_of=_place(following))
        # Only if that record's turn comes then: else records before it are still on their way.
        if not outputs or any(tag == RECORDS for tag, _ in outputs):
            return None
        if not _due(following, driver.state):
            return None
        turn.ttl = (driver.ttl_set, driver.ttl_at) if driver.ttl_set else turn.ttl
        return driver.state

    def _compare(
        self, key, previous, live, due, state, counts, turn, timely=False
    ) -> KeyState | None:
        """Runs the candidate on `live`'s input (its event, or the answers it resumed with to
        the calls the candidate made too), compares, spans and counts; the candidate's state
        after it. `due` holds `live` and the failed attempts before it at its place. None, and
        nothing done, when `live` ended its suspension after failed attempts of which some may
        not have come (`_attempts_missing`): it is compared when they have, or once `timely`."""
        model = _RecordedModel(due, None, 0, state)
        driver = KeyDriver(recording_machine(self._candidate, model, self._config), key, state)
        answers = {answered_intent_id(a): a for a in live.answers}
        if live.HasField("event"):
            if state.continuation is None and not state.empty:
                # The live key sat idle past its TTL before this start if it ran after the
                # TTL's time (a start before it is stamped no later, on the key's clock): the
                # candidate's TTL fires then, as the backtest's `_idle_past_ttl`, even where no
                # watermark fired the timer between the two records (they came reversed). A
                # start the live key took in earlier (queued while it was suspended, drained
                # when a failure ended the suspension) ran with no idle time before it: only
                # a TTL due before its event's own time fired first, and only one a TTL after
                # the live key's previous activation (its retries ran on after the memory's
                # mark, which they do not move).
                at = min(live.now_ms, live.event.event_time_ms) - 1
                if previous is None or previous.now_ms + self._config.ttl_ms <= at:
                    driver.fire_ttl(at)
            driver.schedule(
                live.event, taken_in_ms=taken_in(live), deferred=deferrals(live, self._config)
            )
        else:
            expired, late = None, None
            due_ms = timer_ms(due_at(state.continuation)) if state.continuation else None
            for intent, match in _matched(state.pending, previous.intents):
                if match is not None and match.intent_id in answers:
                    answer = answers[match.intent_id]
                    if made_here(answer):
                        # No one answered: the deadline fired then (as the backtest's).
                        expired = answer.event_time_ms
                    else:
                        driver.schedule(_addressed(answer, intent))
                        if due_ms is not None and answer.event_time_ms > due_ms:
                            late = min(late or answer.event_time_ms, answer.event_time_ms)
            if late is not None:
                # Taken live after the deadline, whose timer had fired first (as the
                # backtest's `_answer`).
                driver.schedule_deadline(at=late - 1, until=late - 1)
            for intent in state.pending:
                # The runtime's escalation at the candidate's deadline has the live one's id.
                if intent.tool_name == ESCALATION_TOOL and intent.intent_id in answers:
                    driver.schedule(_addressed(answers[intent.intent_id], intent))
            if expired is not None:
                driver.schedule_deadline(at=live.now_ms, until=expired)
        ran, attempts = [], []
        while driver:
            for tag, value in driver.step():
                if tag == RECORDS and retries(driver, value, model, due, attempts):
                    attempts.append(value)  # run again, as the live key's was
                elif tag == RECORDS:
                    ran.append(value)
                elif tag == INTENTS and value.tool_name == BUDGET_TOOL:
                    decision = budget_decision(value, live, answers.get(value.intent_id))
                    if decision is not None:
                        driver.schedule(decision)
                        model.next_held(driver.state)
        index = counts.baseline_activations
        missed = model.misses
        withheld = [digest for digest, held in missed if held]
        # Not comparable past a resume the model failed both live and here (the request it
        # failed on is in no record): the key's shadowing ends there, its report saying it
        # stopped, as the backtest's run stops there (`backtest._judge`).
        stopped = False
        if len(ran) == 1:
            found = _divergence(index, live, ran[0], missed, due)
            stopped = bool(missed) and _model_failed_both(live, ran[0], due)
            stopped = stopped and found is None and not live.HasField("event")
        else:
            detail = f"the candidate ran {len(ran)} activations where the live agent ran one"
            found = _not_run(index, live, driver.state, detail)
        if not timely and _attempts_missing(
            live, due, attempts, bool(withheld or found or stopped)
        ):
            return None
        for attempt in due:
            _count(counts, "baseline", attempt)
        for activation in [*attempts, *ran]:
            _count(counts, "candidate", activation)
        counts.baseline_activations += 1
        counts.candidate_activations += len(ran)
        if withheld:
            detail = (
                f"activation {index} (seq {live.seq}) needs the recorded answer to request "
                f"{withheld[0].hex()[:16]}, kept as a digest only: raise the recording's "
                "max_answer_bytes to shadow this key"
            )
            letter = error_record(key, RECORDED_ANSWER_WITHHELD, detail, live.now_ms)
            turn.outputs.append(beam.pvalue.TaggedOutput(ERRORS, (key, letter)))
            turn.done = True
            return state
        turn.ttl = (driver.ttl_set, driver.ttl_at) if driver.ttl_set else turn.ttl
        span = shadow_span(live, self._candidate.adapter, found)
        turn.outputs.append(beam.pvalue.TaggedOutput(TRACES, (key, span)))
        if found is not None or stopped:
            if found is not None:
                counts.divergence.CopyFrom(found)
            # The shadow stops at the key's first divergence, and the live key may go on: its
            # counts are what it saw so far (a backtest of the whole history knows more).
            counts.stopped = True
            _sort_tools(counts)
            turn.outputs.append((key, counts))
            turn.done = True
        return driver.state


def _attempts_missing(live: ActivationRecord, due, attempts, departed: bool) -> bool:
    """Whether failed attempts of the live key before `live` may not have come yet. Its
    records can come in any order: compared now, the candidate would miss the answers of an
    attempt still on its way and diverge where it does not (the backtest, holding them all,
    does not). They have not where `live` says it was a later attempt than the records that
    came (`due`) hold; with no attempt said (a binary older than `attempt`), where `live`
    ended its suspension on a failure (its retries spent, `resume_failed`, or a raise its
    budget needed declined, `budget_exceeded`), which the runtime may have run after any
    number of failed attempts at its place, and the candidate run on the records that came
    departed from it or failed more often than the live attempts that came (`attempts`)."""
    if live.attempt:
        return len({r.attempt for r in due}) <= live.attempt
    ended = live.outcome == Outcome.OUTCOME_FAILED and not live.HasField("event")
    ended = ended and live.reason in (RESUME_FAILED, BUDGET_EXCEEDED)
    return ended and (departed or len(attempts) != len(due) - 1)


def _read(seq, memory, cache, continuation, pending) -> KeyState:
    waiting = continuation.read()
    return KeyState(
        seq=seq.read(),
        memory=memory.read(),
        cache=cache.read(),
        continuation=waiting,
        pending=() if waiting is None else tuple(pending.read()),
    )


def _write(candidate, state: KeyState) -> None:
    seq, memory, cache, continuation, pending = candidate
    for cell, value in ((seq, state.seq), (memory, state.memory), (cache, state.cache),
                        (continuation, state.continuation)):  # fmt: skip
        if value is None:
            cell.clear()
        else:
            cell.write(value)
    pending.clear()
    for intent in state.pending:
        pending.add(intent)


def _set(timer, ttl: tuple[bool, int | None]) -> None:
    changed, at = ttl
    if changed:
        if at is None:
            timer.clear()
        else:
            timer.set(timer_timestamp(at))


def _clear(*states) -> None:
    for state in states:
        state.clear()


class ShadowAgent(beam.PTransform):
    """Runs `candidate` beside a live agent on its activation records; see the module
    docstring. Input: RunAgent's RECORDS output, (entity_key, ActivationRecord). Output: a
    dict of REPORTS (each key's first divergence), TRACES (a span per live activation
    compared) and ERRORS (dead letters). A record ahead of its turn waits `wait_ms` of event
    time for the records before it: more than the live job's longest resume backoff
    (`RuntimeConfig.resume_backoff_max_ms`, an hour by default), since a failed resume waits
    for its retry. `config` is the candidate's runtime configuration (the live job's, as a
    rule)."""

    def __init__(
        self,
        candidate: Agent,
        *,
        wait_ms: int = DEFAULT_WAIT_MS,
        config: RuntimeConfig | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(candidate, Agent):
            raise TypeError(f"{candidate!r} has no adapter, start and resume: not an Agent")
        if isinstance(wait_ms, bool) or not isinstance(wait_ms, int) or wait_ms < 0:
            raise ValueError(f"wait_ms must be an int of at least 0, not {wait_ms!r}")
        self._candidate = candidate
        self._wait_ms = wait_ms
        self._config = config or RuntimeConfig()

    def expand(self, records):
        keep_each_key_in_one_bundle(records.pipeline)
        shadow = _Shadow(self._candidate, self._wait_ms, self._config)
        ran = (
            records
            | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
            | "Run" >> beam.ParDo(shadow).with_outputs(ERRORS, TRACES, main=REPORTS)
        )
        return {
            REPORTS: typed(ran[REPORTS], Tuple[bytes, BacktestKeyReport]),
            TRACES: typed(ran[TRACES], Tuple[bytes, TraceEvent]),
            ERRORS: typed(ran[ERRORS], Tuple[bytes, ActivationErrorRecord]),
        }
