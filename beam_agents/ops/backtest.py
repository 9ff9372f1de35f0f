"""Backtest: what would a changed agent have done on the recorded history of every key?

    beam-agents backtest RECORDS --agent MODULE:NAME [--report FILE] [--continue-with MODULE:NAME
        --max-tokens N] [BEAM PIPELINE OPTIONS]

RECORDS is a file of ActivationRecords (length-delimited), as RunAgent writes them with
recording on (`beam_agents.runtime.recording`); the candidate is named as `replay` names one.

How a key is run. The candidate runs through the runtime's own per-key machine (`KeyMachine`,
every decision RunAgent makes), with recording on, from an empty key, its inputs in the order
the live key ran them (seq, then step: an event that reached its key late ran after one stamped
later, and a suspension's queued events ran when it ended): the key's recorded external events,
and each intent the candidate emits is answered from the recording when the recorded activation
at the same place emitted the same call (the same tool, kind and canonical arguments, RFC 8785
as every intent's): the recorded ToolResult or Approval, addressed to the candidate's intent,
where the recording's resume took it in. The model is a client that answers a request from the
recording when the recording made the same request (the SHA-256 of its canonical JSON,
`recording.request_digest`), each recorded answer once, in order. Nothing here has an effector:
no intent ever reaches a tool (`Backtest` builds no ExecuteIntents, and its test asserts the
graph holds none).

Divergence. The candidate's activation records are compared, one by one in order, with the
recording's (an attempt that failed live and that the runtime ran again at its place is not
one of them: the candidate's attempt there is answered with that attempt's recorded calls, and
then the model is busy where the live one was, so it fails there too; an agent that raised
there raises again; either way its runtime runs it again as often, on its timer, and its tokens
count, as they were billed: `retries`): a model request the
recording does not answer (`KIND_MODEL_REQUEST`), other intents (`KIND_APPROVAL` when an
approval is asked or no longer asked, else `KIND_TOOL_CALL`), or the same calls with another
outcome or output (`KIND_OUTCOME`). The key's report holds its first divergence. By default the
key's run stops there (`stop_at_divergence`); with a `continue_with` model the run goes on, the
requests the recording lacks answered by that model within `max_tokens` for the whole key, tools
still answered only from the recording (a call it does not hold stays unanswered: the run ends
there, `stopped`).

Bad input is a dead letter on ERRORS, never a failed pipeline: bytes that are no
ActivationRecord, or one of another message type (`recording_undecodable`); a key's history
that does not start with the key's first activation (a resume, or a start under a seq that is
not the first seq of a key, which the runtime numbers from the key's first event time: the
recording began after the key did), or resumes with answers its intents never asked
(`history_incomplete`); a history holding two different records at one place (seq and step)
other than a failed attempt and its retry: records of two histories of one key mixed
(`history_out_of_order`); a recorded answer the candidate needs that was kept as a digest only
(`recorded_answer_withheld`, the key's run stopped). A candidate that raises is the runtime's
own failure (`agent_raised`) and, against a recording that completed, a divergence of outcome.

Timers are fired where the live key's were: the candidate's deadline timer where the recorded
resume holds EXPIRED results the runtime made (after the answers that came; an EXPIRED made for
an approval is not even of its intent's kind, so it is never fed as an answer), its TTL where
the live key's next start ran after it (`_idle_past_ttl`). A key must be recorded from its
first event (no snapshot restore yet).
"""

from __future__ import annotations

import collections
import dataclasses
import html
import itertools
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet

from beam_agents._protos import (
    ActivationErrorRecord,
    ActivationRecord,
    AgentEnvelope,
    BacktestKeyReport,
    ToolIntent,
)
from beam_agents.errors import LlmCallError
from beam_agents.intents.identity import content_digest, intent_id
from beam_agents.intents.signing import SIGNATURE_FIELDS
from beam_agents.ops import prism
from beam_agents.ops.rounds import _AppendLines, _read, env_options
from beam_agents.runtime.budget import BUDGET_TOOL, Price
from beam_agents.runtime.config import RuntimeConfig
from beam_agents.runtime.context import (
    ESCALATION_TOOL,
    RUNTIME_TOOLS,
    Agent,
    LlmClient,
    LlmRequest,
    LlmResponse,
)
from beam_agents.runtime.dead_letters import (
    BUDGET_EXCEEDED,
    HISTORY_INCOMPLETE,
    HISTORY_OUT_OF_ORDER,
    LLM_FAILED,
    RECORDED_ANSWER_WITHHELD,
    RECORDING_UNDECODABLE,
    RESUME_FAILED,
    error_record,
)
from beam_agents.runtime.key_driver import KeyDriver, recording_machine
from beam_agents.runtime.machine import ERRORS, INTENTS, KeyState
from beam_agents.runtime.machine_answers import answered_intent_id, made_here
from beam_agents.runtime.machine_budgets import budget_asked, budget_question_ids
from beam_agents.runtime.machine_events import first_seq
from beam_agents.runtime.machine_state import INT64_MAX, due_at, timer_ms
from beam_agents.runtime.recording import RECORDS, request_digest
from beam_agents.wire.beam_support import typed

__all__ = [
    "FEWER",
    "MORE",
    "NOW",
    "NO_LONGER",
    "REPORTS",
    "UNKNOWN",
    "Backtest",
    "BacktestOptions",
    "Summary",
    "backtest_html",
    "backtest_key",
    "backtest_markdown",
    "backtest_summary",
    "budget_decision",
    "escalation_ids",
    "fired_by",
    "in_history_order",
    "kind_name",
    "parse_record",
    "retried",
    "retries",
    "run_backtest",
    "taken_in",
    "tool_changes",
]

#: Backtest's main output: (entity_key, BacktestKeyReport).
REPORTS = "reports"

Divergence = BacktestKeyReport.Divergence
Outcome = ActivationRecord.Outcome


@dataclasses.dataclass(frozen=True)
class BacktestOptions:
    """How a key's run goes on past its first divergence (see the module docstring)."""

    stop_at_divergence: bool = True
    #: The model that answers what the recording does not, when the run goes on.
    continue_with: LlmClient | None = None
    #: Tokens `continue_with` may spend on one key (input and output together).
    max_tokens: int = 0
    config: RuntimeConfig = dataclasses.field(default_factory=RuntimeConfig)

    def __post_init__(self) -> None:
        if not self.stop_at_divergence and self.continue_with is None:
            raise ValueError("going on past a divergence needs a model: continue_with")
        if self.continue_with is not None and self.stop_at_divergence:
            raise ValueError("continue_with is for runs that go on: stop_at_divergence=False")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValueError(f"max_tokens must be an int, not {self.max_tokens!r}")


# -- reading a recording --------------------------------------------------------------------


def parse_record(value) -> ActivationRecord | str:
    """`value` (an ActivationRecord, its bytes, or a (key, either) pair) as a record, or what
    is wrong with it: bytes that do not parse, or parse as another message (a field of a
    number this schema knows, sent with another wire type; no key, adapter or outcome)."""
    if isinstance(value, tuple) and len(value) == 2:
        value = value[1]
    if isinstance(value, ActivationRecord):
        record = value
    elif isinstance(value, bytes | bytearray):
        try:
            record = ActivationRecord.FromString(bytes(value))
        except DecodeError as e:
            return f"{len(value)} bytes are no ActivationRecord: {e}"
    else:
        return f"{type(value).__name__} is no ActivationRecord"
    known = {field.number for field in ActivationRecord.DESCRIPTOR.fields}
    mistyped = sorted({number for number in _unknown_numbers(record) if number in known})
    if mistyped:
        return f"fields {mistyped} are not of ActivationRecord's types: another message"
    missing = [
        name
        for name, present in (
            ("entity_key", record.entity_key),
            ("adapter", record.adapter),
            ("outcome", record.outcome),
        )
        if not present
    ]
    if missing:
        return f"an ActivationRecord without {', '.join(missing)}: not one RunAgent wrote"
    # Validated here, once, so that what runs the history never meets a shape it cannot
    # handle: an outcome of a newer writer (or a flipped byte), an answer with no payload.
    if record.outcome not in Outcome.values():
        return f"an outcome numbered {record.outcome}, which this binary does not know"
    for answer in record.answers:
        which = answer.WhichOneof("payload")
        if which not in ("tool_result", "approval") or not getattr(answer, which).intent_id:
            return f"an answer that is no tool result or approval to an intent ({which})"
    return record


def _unknown_numbers(message) -> Iterator[int]:
    for field in UnknownFieldSet(message):
        yield field.field_number


def in_history_order(records: Iterable[ActivationRecord]) -> list[ActivationRecord]:
    """A key's records in the order they ran: seq, then step, then time, then attempt (a
    resume retried without backoff runs again at the same time; the order a divergence's
    `activation` index counts in)."""
    return sorted(records, key=lambda r: (r.seq, r.first_step, r.attempt, r.now_ms))


def _place(record: ActivationRecord) -> tuple[int, int]:
    return record.seq, record.first_step


def taken_in(record: ActivationRecord) -> int | None:
    """When the live key ran the start `record` later than its event's own time: it took the
    event in earlier (queued in a suspension's mailbox, deferred on a busy model, or held for
    a budget raise) and ran it when drained, retried or raised. The candidate runs it then
    too, or what it stamps with the time, and the deadlines its answers must meet, would not
    be the live key's. A start a person declined to raise the budget of ran when its last
    question was asked (its record's time is the decline's; a record written before it held
    that time says nothing)."""
    if not record.HasField("event"):
        return None
    ran = record.asked_at_ms if record.reason == BUDGET_EXCEEDED else record.now_ms
    return ran if ran > record.event.event_time_ms else None


def deferrals(record: ActivationRecord, config: RuntimeConfig) -> int:
    """How often the candidate counts the start `record` as deferred on a busy model already:
    its runtime defers a start the model failed busy until `retryable_resume_retries`, and
    those attempts are in no record. Where the live start failed on the model (`llm_failed`)
    with the model busy, it had spent them all, or it would have been deferred again; so the
    candidate's start fails at once too, as that attempt's record did, its error as it was.
    (Where the model was down, the count changes nothing.)"""
    if record.HasField("event") and record.reason == LLM_FAILED:
        return config.retryable_resume_retries
    return 0


@dataclasses.dataclass
class _History:
    """A key's history, checked: every record once in the order it ran, the activations a
    candidate's are compared with, and where each recorded input went in among those."""

    records: list[ActivationRecord]
    compared: list[ActivationRecord]
    #: The index in `compared` of the activation each record's place belongs to.
    positions: dict[tuple[int, int], int]
    #: Each compared activation's records: the failed attempts before it at its place, then it.
    attempts: list[list[ActivationRecord]] = dataclasses.field(default_factory=list)


def retried(record: ActivationRecord) -> bool:
    """A failed resume the runtime runs again at its place, on its timer (a failed start never
    is; a resume that failed on its last retry is `resume_failed`, one a person declined to
    raise the budget of `budget_exceeded`: both end the suspension)."""
    return (
        record.outcome == Outcome.OUTCOME_FAILED
        and not record.HasField("event")
        and record.reason not in (RESUME_FAILED, BUDGET_EXCEEDED)
    )


def _history(records: Sequence[ActivationRecord]) -> tuple[_History, str, str]:
    """The key's history, and a dead-letter reason with its detail when it cannot be run."""
    # A record written twice (an at-least-once sink, a retried export) is one activation: the
    # runtime is deterministic, so a copy has the very same bytes.
    once = {r.SerializeToString(deterministic=True): r for r in records}
    ordered = in_history_order(once.values())
    compared, positions, attempts, before = [], {}, [], []
    for record, after in itertools.zip_longest(ordered, ordered[1:]):
        if after is not None and _place(after) == _place(record):
            if record.outcome != Outcome.OUTCOME_FAILED:
                return (
                    _History(ordered, [], {}),
                    HISTORY_OUT_OF_ORDER,
                    (
                        f"two different records of seq {record.seq} step {record.first_step}, the "
                        "first not a failed attempt the runtime ran again: two histories mixed"
                    ),
                )
            before.append(record)  # a failed attempt, run again at its place: the retry is
            continue  # compared, with the answers the attempt paid for
        if after is None and retried(record):
            break  # the recording ends before the retry: the key was still waiting on it
        positions[_place(record)] = len(compared)
        compared.append(record)
        attempts.append([*before, record])
        before = []
    checked = _History(ordered, compared, positions, attempts)
    if ordered and not ordered[0].HasField("event"):
        first = ordered[0]
        return (
            checked,
            HISTORY_INCOMPLETE,
            (
                f"the first record (seq {first.seq}, step {first.first_step}) is a resume: the "
                "key's start is not in the recording"
            ),
        )
    if ordered and ordered[0].seq != first_seq(ordered[0].event.event_time_ms):
        first = ordered[0]
        return (
            checked,
            HISTORY_INCOMPLETE,
            (
                f"the first record is a start of seq {first.seq}, not of a key's first seq "
                f"({first_seq(first.event.event_time_ms)} for its event time): the key ran before "
                "the recording began"
            ),
        )
    for suspended, after in itertools.pairwise(compared):
        # A key runs a later seq only once its suspension ended: by a resume (its record), or
        # at the deadline, never before its intents expire. A later start before then means
        # the resume's record is lost (over RunAgent's max_output_bytes: record_too_large).
        if (
            suspended.outcome == Outcome.OUTCOME_SUSPENDED
            and suspended.intents
            and after.seq != suspended.seq
            and after.now_ms < max(i.expires_at_ms for i in suspended.intents)
        ):
            return (
                checked,
                HISTORY_INCOMPLETE,
                (
                    f"the resume of seq {suspended.seq} is not in the recording, yet the key "
                    f"started seq {after.seq} at {after.now_ms}, before that suspension's intents "
                    "expired: a record lost (one over RunAgent's max_output_bytes is a "
                    "record_too_large dead letter instead)"
                ),
            )
    asked = {i.intent_id for r in ordered for i in r.intents}
    unanswered = [(r, a) for r in ordered for a in r.answers if answered_intent_id(a) not in asked]
    # The activation whose suspension each record resumed: the last one before its place.
    before_it = {}
    for record, after in itertools.pairwise(ordered):
        if _place(after) != _place(record):
            before_it[_place(after)] = record
    # An approval may answer the runtime's own budget question, which no record holds. A key
    # recorded from its start was granted at most one raise per approval or start recorded.
    grants = 1 + sum(r.HasField("event") for r in ordered)
    grants += len(
        {answered_intent_id(a) for r in ordered for a in r.answers if a.approval.approved}
    )
    questions: dict[int, frozenset[str]] = {}
    unasked = sorted(
        answered_intent_id(a)
        for r, a in unanswered
        if a.HasField("tool_result")
        or (
            answered_intent_id(a)
            not in questions.setdefault(r.seq, budget_question_ids(r.entity_key, r.seq, grants))
            and answered_intent_id(a) not in escalation_ids(r, before_it.get(_place(r)))
        )
    )
    if unasked:
        return checked, HISTORY_INCOMPLETE, f"answers to intents no record emitted: {unasked}"
    return checked, "", ""


# -- the model the recording answers --------------------------------------------------------


class _RecordedModel:
    """Answers a request from the records of the activation the candidate runs (`answer_from`)
    when they made the same one, each answer once, in the order the live agent made them;
    else `fallback` within `max_tokens`, else refuses. Notes why it refused. Where the live
    model failed a request (a record's `model_failures`), the same request fails here, with
    the live failure's retryability and billed usage, in its place among the answers.

    Those records are the recorded activation at the candidate's place and the failed attempts
    the runtime ran before it there: what the live agent asked, at the same point, including
    what it replayed from its cache after paying for it in an attempt no record holds (a start
    deferred on a busy model, or held for a budget), which the candidate, run once, asks
    afresh. A call the candidate's own cache holds (the same cache key: key, seq, position and
    request) it replays itself, as the live agent did, so it is not offered: two answers to one
    request at two positions each go to their own place.

    The candidate's attempts keep in step with the live ones where the records number them
    and hold every model failure (`in_step`), and where the live key's retries there were all
    spent (`resume_failed`: they share their retries and limits): each attempt is offered its
    own live attempt's calls and failures (`next_attempt`). Records of an older binary say
    neither: the answers of every attempt there are offered at once, with the failures of the
    compared one only (those its agent caught)."""

    def __init__(
        self,
        records: Sequence[ActivationRecord],
        fallback,
        max_tokens: int,
        state: KeyState | None = None,
    ) -> None:
        self.answer_from(records, state)
        self._fallback = fallback
        self._left = max_tokens
        #: (request digest, withheld) of each request the recording did not answer.
        self.misses: list[tuple[bytes, bool]] = []

    def answer_from(self, records: Sequence[ActivationRecord], state: KeyState | None) -> None:
        """Offers the calls of `records` the candidate, in `state`, cannot replay itself: of
        the first attempt if its retries are to keep in step, else of all."""
        #: The live attempts at the candidate's place, in the order they ran.
        self.attempts = list(records)
        #: Each record's held attempts' calls, by attempt (grouped once: a record may hold
        #: many, and a count it claims is not a number of steps to take).
        self._held_in = {id(record): _held_attempts(record) for record in records}
        self._in_step = bool(records) and (records[-1].reason == RESUME_FAILED or in_step(records))
        self._attempt = -1
        self.next_attempt(state)

    def next_attempt(self, state: KeyState | None) -> None:
        """The candidate's runtime runs its failed attempt again: offers the live key's next
        attempt's calls if they keep in step (none past the last)."""
        self._attempt += 1
        self._held = 1
        if not self._in_step and self._attempt:
            return
        self._offer(state)

    def next_held(self, state: KeyState | None) -> None:
        """The candidate's attempt asked a person to raise its budget, as a live one did: its
        next attempt is offered what the live one's next attempt asked (`held_calls`,
        `held_failures`)."""
        self._held += 1
        self._offer(state)

    def _offer(self, state: KeyState | None) -> None:
        """Offers the calls of the live attempt at the candidate's turn, in the order they were
        made; and, for a request it did not make, those of the attempts after it at the place
        (`_later`: the candidate may ask a person fewer times than the live key did, having
        not paid for what an attempt no record holds paid)."""
        offer = self.attempts[self._attempt : self._attempt + 1] if self._in_step else self.attempts
        cache = state.cache if state is not None else None
        cached = {e.cache_key for e in cache.entries if not e.digest_only} if cache else set()
        offered: set[str] = set()
        attempts = (
            self._made_in(record, self._held)
            if self._in_step or record is offer[-1]
            else (record.model_calls, ())
            for record in offer
        )
        self._answers = _queued(attempts, cached, offered)
        later = []
        if offer:
            last, held = offer[-1], self._held
            later = [made for n, made in self._held_in[id(last)].items() if n > held]
            if held <= last.held_attempts:
                later.append((last.model_calls, last.model_failures))
        self._later = _queued(later, cached, offered)

    def _made_in(self, record: ActivationRecord, held: int) -> tuple[Sequence, Sequence]:
        """The calls, answered and failed, of the `held`-th attempt of `record`'s activation:
        one a budget question held up (`held_calls`, `held_failures`), else the recorded
        attempt."""
        if held <= record.held_attempts:
            return self._held_in[id(record)].get(held, ((), ()))
        return record.model_calls, record.model_failures

    def complete(self, request: LlmRequest) -> LlmResponse:
        digest = request_digest(request.canonical())
        queue = self._answers.get(digest) or self._later.get(digest)
        if queue:
            call = queue.popleft()
            if isinstance(call, ActivationRecord.ModelFailure):
                error = LlmCallError(
                    call.error,
                    model=call.model,
                    retryable=call.retryable,
                    input_tokens=call.input_tokens,
                    output_tokens=call.output_tokens,
                )
                if call.text:
                    # Worded as the live client's was, for an agent that quotes it.
                    error.args = (call.text,)
                raise error
            if not call.digest_only:
                return LlmResponse.from_bytes(call.response)
            self.misses.append((digest, True))
            raise LlmCallError(
                "the recorded answer was kept as a digest only",
                model=request.model,
                retryable=False,
            )
        self.misses.append((digest, False))
        if self._fallback is not None and self._left > 0:
            response = self._fallback.complete(request)
            self._left -= response.input_tokens + response.output_tokens
            return response
        raise LlmCallError(
            "the recording has no answer to this request", model=request.model, retryable=False
        )


def in_step(records: Sequence[ActivationRecord]) -> bool:
    """Whether the live attempts at a place, `records` in the order they ran, say all the
    candidate's attempts there need to keep in step with them: each its `attempt`, and each
    failure of the model's (`llm_failed`) with the request it failed on (a binary older than
    `attempt` and `model_failures` wrote neither)."""
    return [r.attempt for r in records] == list(range(len(records))) and not any(
        r.reason == LLM_FAILED and not r.model_failures for r in records
    )


def _queued(attempts, cached: set[str], offered: set[str]) -> dict[bytes, collections.deque]:
    """The (calls, failures) of `attempts` queued by request, in call order, but for the calls
    the candidate's cache holds (`cached`) or that were `offered` already."""
    answers: dict[bytes, collections.deque] = collections.defaultdict(collections.deque)
    for calls, failures in attempts:
        for call in _in_call_order(calls, failures):
            if isinstance(call, ActivationRecord.ModelFailure):
                answers[call.request_digest].append(call)
                continue
            # A call replayed from the live cache was paid for before (by an attempt the model
            # or the budget stopped, kept for its retry): offered once. One the model answered
            # again is offered again: an attempt the agent failed kept nothing, so its retry
            # asked afresh, and may have been answered otherwise.
            if call.cache_key in cached or (call.replayed and call.cache_key in offered):
                continue
            offered.add(call.cache_key)
            answers[call.request_digest].append(call)
    return answers


def _held_attempts(record: ActivationRecord) -> dict[int, tuple[list, list]]:
    """(calls, failures) of each attempt of `record`'s activation a budget question held up,
    by its number, in order; calls numbered outside 1..held_attempts belong to none."""
    held: dict[int, tuple[list, list]] = {}
    for calls, index in ((record.held_calls, 0), (record.held_failures, 1)):
        for call in calls:
            if 0 < call.held_attempt <= record.held_attempts:
                held.setdefault(call.held_attempt, ([], []))[index].append(call)
    return dict(sorted(held.items()))


def _in_call_order(calls, failures) -> Iterator:
    """The answered `calls` and the `failures` of one record, in the order they were made."""
    placed = sorted(failures, key=lambda failure: failure.after_calls)
    for index, call in enumerate(calls):
        while placed and placed[0].after_calls <= index:
            yield placed.pop(0)
        yield call
    yield from placed


# -- one key --------------------------------------------------------------------------------


def _call(intent: ToolIntent) -> tuple:
    return (intent.kind, intent.tool_name, intent.args_json)


def _addressed(answer: AgentEnvelope, intent: ToolIntent) -> AgentEnvelope:
    """The recorded `answer` to a call the candidate made under its own intent."""
    readdressed = AgentEnvelope()
    readdressed.CopyFrom(answer)
    which = readdressed.WhichOneof("payload")
    body = getattr(readdressed, which)
    body.intent_id = intent.intent_id
    for name in SIGNATURE_FIELDS:
        body.ClearField(name)
    if body.intent_digest:
        body.intent_digest = content_digest(intent.SerializeToString(deterministic=True))
    return readdressed


def _divergence(
    index: int,
    baseline: ActivationRecord | None,
    candidate: ActivationRecord,
    missed: list,
    attempts: Sequence[ActivationRecord] = (),
) -> Divergence | None:
    recorded = baseline or ActivationRecord()
    kind, detail = 0, ""
    model_failed = _model_failed_both(baseline, candidate, attempts)
    if any(not withheld for _, withheld in missed) and not model_failed:
        kind = Divergence.KIND_MODEL_REQUEST
        detail = "a model request the recording has no answer to: " + ", ".join(
            digest.hex()[:16] for digest, withheld in missed if not withheld
        )
    elif baseline is not None and (recorded.outcome == Outcome.OUTCOME_FAILED) != (
        candidate.outcome == Outcome.OUTCOME_FAILED
    ):
        # A failure is what departs, whatever calls the failed activation made first.
        kind = Divergence.KIND_OUTCOME
        detail = _outcomes(recorded, candidate)
    elif [_call(i) for i in recorded.intents] != [_call(i) for i in candidate.intents]:
        before = collections.Counter(_call(i) for i in recorded.intents)
        after = collections.Counter(_call(i) for i in candidate.intents)
        changed = (before - after) + (after - before)
        approval = any(call[0] == ToolIntent.APPROVAL for call in changed)
        kind = Divergence.KIND_APPROVAL if approval else Divergence.KIND_TOOL_CALL
        detail = "; ".join(
            [f"no longer {c[1]} {c[2]}" for c in (before - after)]
            + [f"now {c[1]} {c[2]}" for c in (after - before)]
        )
    elif (
        baseline is None
        or (recorded.outcome, recorded.output)
        != (
            candidate.outcome,
            candidate.output,
        )
        or (recorded.reason != candidate.reason and not model_failed)
    ):
        kind = Divergence.KIND_OUTCOME
        detail = (
            _outcomes(recorded, candidate)
            if baseline is not None
            else "an activation the recording does not have"
        )
    if not kind:
        return None
    return Divergence(
        kind=kind,
        activation=index,
        seq=candidate.seq,
        now_ms=candidate.now_ms,
        detail=detail,
        baseline_intents=recorded.intents,
        candidate_intents=candidate.intents,
        baseline_outcome=recorded.outcome,
        candidate_outcome=candidate.outcome,
        baseline_output=recorded.output,
        candidate_output=candidate.output,
    )


def _model_failed_both(
    baseline: ActivationRecord | None,
    candidate: ActivationRecord,
    attempts: Sequence[ActivationRecord] = (),
) -> bool:
    """The model failed both live and here (here on its last retry too: `resume_failed`),
    and a request it failed on live at this place (`baseline`, or a failed attempt before it
    among `attempts`) is in no record (one written before records held failed calls, or an
    LlmCallError the agent raised itself), so the candidate's, unanswered, may be the same
    one or not: not a divergence, and nothing after it can be compared (`_judge` stops the
    run there). Where the records hold them, the candidate's same requests failed as they
    did, and another request is a divergence."""
    return (
        baseline is not None
        and any(
            r.reason in (LLM_FAILED, RESUME_FAILED) and not r.model_failures
            for r in (*attempts, baseline)
        )
        and baseline.outcome == candidate.outcome == Outcome.OUTCOME_FAILED
        and baseline.reason in (LLM_FAILED, RESUME_FAILED)
        and candidate.reason in (LLM_FAILED, RESUME_FAILED)
    )


def _outcomes(recorded: ActivationRecord, candidate: ActivationRecord) -> str:
    return " -> ".join(
        f"{Outcome.Name(r.outcome).removeprefix('OUTCOME_').lower()} {r.reason}".rstrip()
        for r in (recorded, candidate)
    )


def backtest_key(
    key: bytes,
    records: Iterable[ActivationRecord],
    candidate: Agent,
    options: BacktestOptions | None = None,
) -> tuple[BacktestKeyReport | None, list[ActivationErrorRecord]]:
    """Runs `candidate` over one key's recorded history (see the module docstring): its
    report, or None with the dead letter that says why the history cannot be run."""
    options = options or BacktestOptions()
    history, reason, detail = _history(list(records))
    at = history.records[0].now_ms if history.records else 0
    if reason:
        return None, [error_record(key, reason, detail, at)]
    baseline = history.compared
    model = _RecordedModel((), options.continue_with, options.max_tokens)
    driver = KeyDriver(recording_machine(candidate, model, options.config), key)
    # Each input goes in where the live key took it in: (its activation's index, the answer).
    answers = {}
    for record in reversed(history.records):
        if _place(record) in history.positions:
            for answer in record.answers:
                answers[answered_intent_id(answer)] = (history.positions[_place(record)], answer)
    # One event per place (its start's), however many records there hold it: an event the
    # live key ran twice (sent again after its start failed for good, which marks nothing as
    # seen) is two starts, two places, and runs twice here too.
    for at, record in enumerate(history.compared):
        if record.HasField("event"):
            driver.schedule(
                record.event,
                at=at,
                taken_in_ms=taken_in(record),
                deferred=deferrals(record, options.config),
            )
    report = BacktestKeyReport(entity_key=key, baseline_activations=len(baseline))
    ran: list[ActivationRecord] = []
    #: The candidate's failed attempts its runtime ran again (not compared; their tokens count).
    attempts: list[ActivationRecord] = []
    letters: list[ActivationErrorRecord] = []
    halted = False
    answering = None
    while not halted:
        outputs = []
        if answering != len(ran):
            # The model answers what the live agent was asked at the candidate's next place.
            answering = len(ran)
            recorded = history.attempts[answering] if answering < len(baseline) else ()
            model.answer_from(recorded, driver.state)
            following = baseline[answering] if answering < len(baseline) else None
            _idle_past_ttl(driver, following)
            outputs = _past_deadline(driver, following)
        if not outputs:
            if not driver:
                break
            outputs = driver.step()
        for tag, value in outputs:
            live = history.attempts[len(ran)] if len(ran) < len(baseline) else ()
            if tag == RECORDS and retries(driver, value, model, live, attempts):
                attempts.append(value)
            elif tag == RECORDS:
                ran.append(value)
                halted = _judge(report, baseline, ran, model, driver, answers, options, letters)
                if halted:
                    break
            elif tag == INTENTS and value.tool_name == ESCALATION_TOOL:
                # The runtime's question at the candidate's deadline, as the live key's (the
                # same key, seq and step: the same id): answered as it was, if it was.
                if value.intent_id in answers:
                    position, answer = answers[value.intent_id]
                    driver.schedule(_addressed(answer, value), at=position)
            elif tag == INTENTS and value.tool_name == BUDGET_TOOL:
                recorded = baseline[len(ran)] if len(ran) < len(baseline) else None
                # Answered only as the live activation at this place was: a question is
                # numbered by key, seq and raises so far, so a raise granted to a later
                # activation of the seq has its id too, and must not answer this one.
                here = history.attempts[len(ran)] if recorded is not None else ()
                found = next(
                    (
                        a
                        for r in here
                        for a in r.answers
                        if answered_intent_id(a) == value.intent_id
                    ),
                    None,
                )
                decision = budget_decision(value, recorded, found)
                if decision is not None:
                    driver.schedule(decision, at=len(ran))
                    model.next_held(driver.state)
    if not report.stopped and not report.HasField("divergence") and len(ran) < len(baseline):
        detail = f"the candidate ran {len(ran)} activations, the recording {len(baseline)}"
        report.divergence.CopyFrom(_not_run(len(ran), baseline[len(ran)], driver.state, detail))
    _account(report, history.records, ran)
    for attempt in attempts:
        _count(report, "candidate", attempt)
    return report, letters


def retries(
    driver: KeyDriver,
    record: ActivationRecord,
    model: _RecordedModel,
    live: Sequence[ActivationRecord],
    attempts: Sequence[ActivationRecord],
) -> bool:
    """Whether the candidate's `record` is a failed resume its runtime runs again on its timer
    as the live key's was, and if so fires that timer next, `model` answering it as the live
    key's next attempt was answered. `live` holds the live key's
    attempts at the candidate's place, its failed ones and then the one compared
    (`_History`); while the candidate's failed `attempts` there are fewer (or the live key's
    retries were all spent: `resume_failed`), and its failure is
    its own (the recording answered every request it made), its last is compared too. An agent
    that raises on an answer raises on every retry, live and here; where the live key did not
    fail, the candidate's first failure is the divergence. Where the live key's next attempt
    ran on a genuine answer that took the place of an EXPIRED the runtime made (it came on
    time, before the retry), that answer goes in next instead of the timer."""
    waiting = driver.state.continuation
    here = sum(_place(a) == _place(record) for a in attempts)
    # A live resume_failed was run again until its retries were spent (under the same config:
    # the candidate's too), however many of its attempts have come yet (a shadow's may not).
    exhausted = bool(live) and live[-1].reason == RESUME_FAILED
    if (
        model.misses
        or (here >= len(live) - 1 and not exhausted)
        or not retried(record)
        or waiting is None
        or not waiting.retry_at_ms
    ):
        return False
    replaced = False
    for answer in _replacing(record, live[here + 1]) if here + 1 < len(live) else ():
        wanted = answered_intent_id(answer)
        intent = next((i for i in driver.state.pending if i.intent_id == wanted), None)
        if intent is not None:
            driver.schedule(_addressed(answer, intent), at=-1)
            replaced = True
    if not replaced:
        driver.schedule_deadline(at=-1)  # before anything else waiting: the retry is due first
    model.next_attempt(driver.state)
    return True


def _replacing(failed: ActivationRecord, following: ActivationRecord) -> list[AgentEnvelope]:
    """The genuine answers `following` (the live key's next attempt at the place) ran on that
    took the place of EXPIRED results the runtime made, which the candidate's `failed`
    attempt ran on."""
    stood_in = {answered_intent_id(a) for a in failed.answers if made_here(a)}
    return [a for a in following.answers if answered_intent_id(a) in stood_in and not made_here(a)]


def _not_run(index: int, missing: ActivationRecord, state: KeyState, detail: str) -> Divergence:
    """The divergence of a candidate that did not run the recorded activation `missing`: it
    waits on a budget question the live key was not asked (`KIND_APPROVAL`), or else
    (`detail`, `KIND_OUTCOME`)."""
    asking = [i for i in state.pending if i.tool_name == BUDGET_TOOL]
    if asking:
        detail = "now asks a person to raise its budget, where the live key was not asked"
    return Divergence(
        kind=Divergence.KIND_APPROVAL if asking else Divergence.KIND_OUTCOME,
        activation=index,
        seq=missing.seq,
        now_ms=missing.now_ms,
        detail=detail,
        baseline_intents=missing.intents,
        candidate_intents=asking,
        baseline_outcome=missing.outcome,
    )


def budget_decision(
    question: ToolIntent, recorded: ActivationRecord | None, answer: AgentEnvelope | None
) -> AgentEnvelope | None:
    """The answer to the candidate's budget `question` (asked under the live job's config) as
    the live key's was answered: its recorded `answer` (the same id: a budget question is
    numbered by its key, seq and the raises granted so far; a start or resume a raise let run
    holds it among its answers), else declined where the recorded activation at the
    candidate's place ended on the budget. None where the live key was not asked: the
    candidate waits, and diverges."""
    if answer is not None:
        return answer
    if recorded is None:
        return None
    declined = recorded.outcome == Outcome.OUTCOME_FAILED and recorded.reason == BUDGET_EXCEEDED
    if not declined:
        return None  # a raise granted is among the recorded answers: the live key was not asked
    # No one answered the live question (a person's "no" is among the recorded answers): it
    # was declined at its deadline, which the candidate's question, asked earlier (the live
    # retry waited on a busy model), may pass first; an answer after it is refused.
    at = min(recorded.now_ms, question.expires_at_ms)
    decision = AgentEnvelope(entity_key=question.entity_key, event_time_ms=at)
    decision.approval.intent_id = question.intent_id
    decision.approval.approved = not declined
    decision.approval.approver = "the recording: the live key " + (
        "ended on its budget" if declined else "went on"
    )
    decision.approval.decided_at_ms = at
    return decision


def _idle_past_ttl(driver: KeyDriver, recorded: ActivationRecord | None) -> None:
    """Fires the candidate's TTL when the live key's next start ran after it: the live key sat
    idle that long, and its TTL timer wiped it first (its seq kept), as the shadow's does. A
    start the live key took in earlier (queued while it was suspended, run when the
    suspension ended) had no idle time before it: only a TTL due before its event's own time
    fired first."""
    if (
        recorded is not None
        and recorded.HasField("event")
        and driver.ttl_at is not None
        and driver.state.continuation is None
        and driver.ttl_at < min(recorded.now_ms, recorded.event.event_time_ms)
    ):
        driver.fire_ttl(driver.ttl_at)


def _judge(report, baseline, ran, model, driver, answers, options, letters) -> bool:
    """Compares the candidate's latest activation with the recording's at its place, notes a
    divergence in `report` and answers its calls; True when the key's run ends here."""
    index, value = len(ran) - 1, ran[-1]
    missed, model.misses = model.misses, []
    withheld = [digest for digest, held in missed if held]
    if withheld:
        letters.append(
            error_record(
                report.entity_key,
                RECORDED_ANSWER_WITHHELD,
                f"activation {index} (seq {value.seq}) needs the recorded answer to request "
                f"{withheld[0].hex()[:16]}, kept as a digest only: raise the recording's "
                "max_answer_bytes to backtest this key",
                value.now_ms,
            )
        )
        report.stopped = True
        return True
    recorded = baseline[index] if index < len(baseline) else None
    found = _divergence(index, recorded, value, missed, model.attempts)
    # The same failure, perhaps of another request: what the resume would have done is not
    # comparable. A start that failed left the key as it was on both sides: the run goes on.
    if (
        found is None
        and missed
        and _model_failed_both(recorded, value, model.attempts)
        and not value.HasField("event")
    ):
        report.stopped = True
        return True
    if found is not None and not report.HasField("divergence"):
        report.divergence.CopyFrom(found)
    if found is not None and options.stop_at_divergence:
        # Cut short only if the candidate had more to do: a run that ended at its divergence
        # (completed, nothing left to run) is whole.
        report.stopped = value.outcome == Outcome.OUTCOME_SUSPENDED or bool(driver)
        return True
    if value.outcome == Outcome.OUTCOME_SUSPENDED and not _answer(driver, value, recorded, answers):
        report.stopped = True
        return True
    return False


def _matched(
    candidate: Iterable[ToolIntent], recorded: Iterable[ToolIntent]
) -> Iterator[tuple[ToolIntent, ToolIntent | None]]:
    """Each of the candidate's intents with the recorded intent of the same call (the same
    tool, kind and canonical arguments), each recorded one matched once; None: the recording
    made no such call, and nothing can answer it."""
    unused = collections.defaultdict(list)
    for intent in recorded:
        unused[_call(intent)].append(intent)
    for intent in candidate:
        matches = unused.get(_call(intent))
        yield intent, matches.pop(0) if matches else None


def _answer(driver: KeyDriver, ran: ActivationRecord, recorded, answers) -> bool:
    """Schedules the recorded answer of each call the suspended activation `ran` made that
    the `recorded` one made too (one the recording never got an answer to waits, as it did);
    False when the candidate made a call the recording did not: nothing can answer it."""
    answerable, expired, came = True, None, []
    for intent, match in _matched(ran.intents, recorded.intents if recorded is not None else ()):
        found = answers.get(match.intent_id) if match is not None else None
        answerable = answerable and match is not None
        if found is not None:
            position, answer = found
            if made_here(answer):
                expired = position, answer.event_time_ms
            else:
                came.append((position, answer.event_time_ms, _addressed(answer, intent)))
    # At each place in the order they came, not the calls' order: the last to come resumes
    # the candidate, at its time, as it resumed the live key.
    waiting = driver.state.continuation
    due = timer_ms(due_at(waiting)) if waiting is not None else None
    for position, at, answer in sorted(came, key=lambda c: c[:2]):
        if due is not None and at > due:
            # Taken live after the deadline: the live key's timer had fired (its EXPIRED
            # resumed the agent, which asked a person to raise its budget and so waited on),
            # and the answer took the EXPIRED's place; no record holds that attempt.
            driver.schedule_deadline(at=position, until=at - 1)
            due = None
        driver.schedule(answer, at=position)
    if expired is not None:
        # No one answered by the deadline: the live key's timer fired (when it made the
        # EXPIRED), and the candidate's does, after the answers that came (an EXPIRED the
        # runtime made is no answer to feed: to an approval it is not even of its kind).
        position, fired = expired
        driver.schedule_deadline(at=position, until=fired)
    return answerable


def escalation_ids(record: ActivationRecord, suspended: ActivationRecord | None) -> frozenset[str]:
    """The ids the runtime's escalations can have had between the activation `suspended` and
    the resume `record` of its suspension: each asks at the suspension's step (`ctx.escalate`)
    and moves it on by one, so they are the steps from the one after `suspended`'s last intent
    to the record's first (at most `_ESCALATIONS`). None unless the record resumed that
    suspension: it answers every intent `suspended` emitted (else a record between is lost)."""
    if (
        record.HasField("event")
        or suspended is None
        or suspended.seq != record.seq
        or not suspended.intents
        or {i.intent_id for i in suspended.intents}
        - {answered_intent_id(a) for a in record.answers}
    ):
        return frozenset()
    first = max(i.step_index for i in suspended.intents) + 1
    steps = range(max(first, record.first_step - _ESCALATIONS), record.first_step)
    return frozenset(intent_id(record.entity_key, record.seq, step) for step in steps)


#: Escalations of one suspension a history may answer (a DeadlinePolicy's max_escalations).
_ESCALATIONS = 64


def _past_deadline(driver: KeyDriver, recorded: ActivationRecord | None) -> list:
    """The outputs of the candidate's deadline timer fired where the live key's fired with no
    record of it: the candidate is suspended and the live key's next activation is not the
    resume of that suspension but came after its due time (a DeadlinePolicy that dead-letters
    the suspension, or escalates and moves its step on: `fired_by`). A budget question waits for its
    decision; a retry is `retries`'."""
    waiting = driver.state.continuation
    if (
        recorded is None
        or waiting is None
        or budget_asked(waiting, driver.state.pending)
        or _place(recorded) == (waiting.seq, waiting.step_index)
    ):
        return []
    return driver.fire_due(fired_by(recorded, driver.state), short_of=_place(recorded))


def fired_by(recorded: ActivationRecord, state: KeyState) -> int:
    """The time the live key's deadline timer had fired by, before the record `recorded`, for
    a key suspended in `state`: the record's time when it is of a later seq; whenever, when it
    is the resume of that very suspension at a later step (it answers every intent the key
    waits on: only an escalation moves a suspension's step with no record of it), as a
    backlog's answer can be stamped before the deadline it came after; never (-1) for another
    record of the seq: the resume of a later suspension, whose records before it may still be
    on their way (a shadow's)."""
    waiting = state.continuation
    if waiting is None or recorded.seq != waiting.seq:
        return recorded.now_ms
    own = {i.intent_id for i in state.pending if i.tool_name not in RUNTIME_TOOLS}
    answered = {answered_intent_id(a) for a in recorded.answers}
    return INT64_MAX if own and own <= answered else -1


def _count(report: BacktestKeyReport, side: str, record: ActivationRecord) -> None:
    """Adds one activation of `side` ("baseline" or "candidate") to the report's tool counts
    and token totals: every attempt's tokens (a failed one was billed too, as was an answer
    the model's client refused), the intents of one that did not fail (a failed one's never
    left it). `_sort_tools` then orders them."""
    if record.outcome != Outcome.OUTCOME_FAILED:
        for intent in record.intents:
            calls = next((c for c in report.tool_calls if c.tool_name == intent.tool_name), None)
            if calls is None:
                calls = report.tool_calls.add(tool_name=intent.tool_name)
            setattr(calls, side, getattr(calls, side) + 1)
    # A start's replayed answers were paid for by an attempt of it (deferred on a busy model,
    # or held for a budget: `held_calls` holds the latter's); a resume's, by an activation
    # before it or an attempt a budget held.
    start = record.first_step == 0 and record.HasField("event")
    held = [c for c in record.held_calls if not c.replayed]
    paid = {c.cache_key for c in held}
    billed = [
        c for c in record.model_calls if not c.replayed or (start and c.cache_key not in paid)
    ]
    for call in itertools.chain(billed, held, record.model_failures, record.held_failures):
        name = f"{side}_input_tokens"
        setattr(report, name, getattr(report, name) + call.input_tokens)
        name = f"{side}_output_tokens"
        setattr(report, name, getattr(report, name) + call.output_tokens)


def _sort_tools(report: BacktestKeyReport) -> None:
    ordered = sorted(report.tool_calls, key=lambda calls: calls.tool_name)
    kept = [BacktestKeyReport.ToolCalls(tool_name=c.tool_name, baseline=c.baseline,
                                        candidate=c.candidate) for c in ordered]  # fmt: skip
    del report.tool_calls[:]
    report.tool_calls.extend(kept)


def _account(report: BacktestKeyReport, baseline, ran) -> None:
    """The tool counts and token totals of both runs (`_count`)."""
    for side, records in (("baseline", baseline), ("candidate", ran)):
        for record in records:
            _count(report, side, record)
    report.candidate_activations = len(ran)
    _sort_tools(report)


# -- the transform --------------------------------------------------------------------------


class _Parse(beam.DoFn):
    def process(self, element) -> Iterator:
        record = parse_record(element)
        if isinstance(record, str):
            # Bytes that are no record have no key and no time of their own.
            letter = error_record(b"", RECORDING_UNDECODABLE, record, 0)
            yield beam.pvalue.TaggedOutput(ERRORS, (b"", letter))
            return
        yield record.entity_key, record


class _RunKey(beam.DoFn):
    def __init__(self, candidate: Agent, options: BacktestOptions) -> None:
        self._candidate = candidate
        self._options = options

    def process(self, element) -> Iterator:
        key, records = element
        report, letters = backtest_key(key, records, self._candidate, self._options)
        for letter in letters:
            yield beam.pvalue.TaggedOutput(ERRORS, (key, letter))
        if report is not None:
            yield key, report


class Backtest(beam.PTransform):
    """Runs `candidate` over a recorded history; see the module docstring.

    Input: a PCollection of ActivationRecords (messages, their bytes, or (entity_key, either)
    pairs as RunAgent's RECORDS output holds them), in any order and windowing. Output: a dict
    of REPORTS, (entity_key, BacktestKeyReport) for every key whose history could be run, and
    ERRORS, (entity_key, ActivationErrorRecord) dead letters. There is no effector: nothing
    reaches a tool."""

    def __init__(self, candidate: Agent, options: BacktestOptions | None = None) -> None:
        super().__init__()
        if not isinstance(candidate, Agent):
            raise TypeError(f"{candidate!r} has no adapter, start and resume: not an Agent")
        self._candidate = candidate
        self._options = options or BacktestOptions()

    def expand(self, records):
        parsed = (
            records
            | "GlobalWindow" >> beam.WindowInto(beam.window.GlobalWindows())
            | "Parse" >> beam.ParDo(_Parse()).with_outputs(ERRORS, main="records")
        )
        ran = (
            typed(parsed.records, beam.typehints.Tuple[bytes, ActivationRecord])
            | "ByKey" >> beam.GroupByKey()
            | "Run"
            >> beam.ParDo(_RunKey(self._candidate, self._options)).with_outputs(
                ERRORS, main=REPORTS
            )
        )
        errors = (parsed[ERRORS], ran[ERRORS]) | "Errors" >> beam.Flatten()
        return {
            REPORTS: typed(ran[REPORTS], beam.typehints.Tuple[bytes, BacktestKeyReport]),
            ERRORS: typed(errors, beam.typehints.Tuple[bytes, ActivationErrorRecord]),
        }


# -- the report -----------------------------------------------------------------------------

#: How a tool's calls changed on one key (`tool_changes`).
NOW, NO_LONGER, MORE, FEWER, UNKNOWN = "now", "no longer", "more", "fewer", "unknown"
_CHANGES = (NOW, NO_LONGER, MORE, FEWER, UNKNOWN)
_HEADINGS = {
    NOW: "now called",
    NO_LONGER: "no longer called",
    MORE: "called more",
    FEWER: "called fewer times",
    UNKNOWN: "unknown (stopped)",
}


def tool_changes(report: BacktestKeyReport) -> dict[str, str]:
    """How each tool's calls changed on the key: called NOW (never before), NO_LONGER
    called, called MORE or FEWER times, or UNKNOWN (fewer so far, but the candidate's run
    stopped before its end). Tools called as often are left out. The approval tool's entry says
    whether an approval is now asked, or no longer."""
    changes = {}
    for calls in report.tool_calls:
        if calls.candidate == calls.baseline:
            continue
        if calls.candidate > calls.baseline:
            changes[calls.tool_name] = NOW if calls.baseline == 0 else MORE
        elif report.stopped:
            changes[calls.tool_name] = UNKNOWN
        else:
            changes[calls.tool_name] = NO_LONGER if calls.candidate == 0 else FEWER
    return changes


@dataclasses.dataclass
class Summary:
    """A backtest's run in numbers (`backtest_summary`); `backtest_markdown` renders it."""

    keys: int = 0
    diverged: int = 0
    stopped: int = 0
    #: Keys by the kind of their first divergence ("approval", "tool_call", ...).
    by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    #: Per tool, keys by change (`tool_changes`).
    tools: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    #: Dead letters by reason: histories that could not be backtested.
    dead_letters: dict[str, int] = dataclasses.field(default_factory=dict)
    baseline_tokens: tuple[int, int] = (0, 0)
    candidate_tokens: tuple[int, int] = (0, 0)
    #: The cost of each run's tokens at `price`, when one was given.
    baseline_cost_micros: int | None = None
    candidate_cost_micros: int | None = None
    #: The diverged keys' reports, in key order.
    divergences: list[BacktestKeyReport] = dataclasses.field(default_factory=list)


def kind_name(kind: int) -> str:
    return Divergence.Kind.Name(kind).removeprefix("KIND_").lower()


def backtest_summary(
    reports: Iterable[BacktestKeyReport],
    dead_letters: Iterable[ActivationErrorRecord] = (),
    *,
    price: Price | None = None,
) -> Summary:
    """The run's counts: keys, divergences by kind, tool changes, tokens (and their cost at
    `price` per token of either run), dead letters by reason."""
    summary = Summary()
    tokens = {"baseline": [0, 0], "candidate": [0, 0]}
    for report in sorted(reports, key=lambda r: r.entity_key):
        summary.keys += 1
        summary.stopped += report.stopped
        if report.HasField("divergence"):
            summary.diverged += 1
            kind = kind_name(report.divergence.kind)
            summary.by_kind[kind] = summary.by_kind.get(kind, 0) + 1
            summary.divergences.append(report)
        for tool, change in tool_changes(report).items():
            counts = summary.tools.setdefault(tool, dict.fromkeys(_CHANGES, 0))
            counts[change] += 1
        for side, totals in tokens.items():
            totals[0] += getattr(report, f"{side}_input_tokens")
            totals[1] += getattr(report, f"{side}_output_tokens")
    for letter in dead_letters:
        summary.dead_letters[letter.reason] = summary.dead_letters.get(letter.reason, 0) + 1
    summary.baseline_tokens = tuple(tokens["baseline"])
    summary.candidate_tokens = tuple(tokens["candidate"])
    if price is not None:
        summary.baseline_cost_micros = price.of(*summary.baseline_tokens)
        summary.candidate_cost_micros = price.of(*summary.candidate_tokens)
    return summary


def backtest_markdown(summary: Summary, *, max_keys: int = 20) -> str:
    """The summary as Markdown tables a person reads, the first `max_keys` diverged keys
    listed with their first divergence."""
    lines = [
        "| keys | backtested | diverged | stopped early | not backtested |",
        "|---|---|---|---|---|",
        f"| {summary.keys + sum(summary.dead_letters.values())} | {summary.keys} | "
        f"{summary.diverged} | {summary.stopped} | {sum(summary.dead_letters.values())} |",
    ]
    if summary.by_kind:
        lines += ["", "| first divergence | keys |", "|---|---|"]
        lines += [f"| {kind} | {n} |" for kind, n in sorted(summary.by_kind.items())]
    if summary.tools:
        lines += [
            "",
            "| tool | " + " | ".join(_HEADINGS[c] for c in _CHANGES) + " |",
            "|---" * (len(_CHANGES) + 1) + "|",
        ]
        for tool, counts in sorted(summary.tools.items()):
            lines.append(f"| {tool} | " + " | ".join(str(counts[c]) for c in _CHANGES) + " |")
    lines += ["", "| usage | recording | candidate | difference |", "|---|---|---|---|"]
    rows = [
        ("input tokens", summary.baseline_tokens[0], summary.candidate_tokens[0]),
        ("output tokens", summary.baseline_tokens[1], summary.candidate_tokens[1]),
    ]
    if summary.baseline_cost_micros is not None:
        rows.append(("cost (micros)", summary.baseline_cost_micros, summary.candidate_cost_micros))
    lines += [f"| {name} | {a} | {b} | {b - a:+d} |" for name, a, b in rows]
    if summary.dead_letters:
        lines += ["", "| not backtested | keys |", "|---|---|"]
        lines += [f"| {reason} | {n} |" for reason, n in sorted(summary.dead_letters.items())]
    if summary.divergences:
        lines += ["", "| key | activation | kind | detail |", "|---|---|---|---|"]
        for report in summary.divergences[:max_keys]:
            found = report.divergence
            key = report.entity_key.decode("utf-8", "backslashreplace")
            detail = found.detail.replace("|", "\\|")
            lines.append(f"| {key} | {found.activation} | {kind_name(found.kind)} | {detail} |")
        if len(summary.divergences) > max_keys:
            lines.append(f"\n({len(summary.divergences) - max_keys} more diverged keys)")
    return "\n".join(lines) + "\n"


def backtest_html(summary: Summary, *, max_keys: int = 20) -> str:
    """The summary as one self-contained HTML page: bar charts of the keys by first
    divergence, of each tool's changes and of the tokens, then `backtest_markdown`'s tables."""
    keys = [("unchanged", summary.keys - summary.diverged)]
    keys += [(f"diverged: {kind}", n) for kind, n in sorted(summary.by_kind.items())]
    keys += [(f"not backtested: {r}", n) for r, n in sorted(summary.dead_letters.items())]
    charts = [_bars("Keys", keys)]
    for tool, counts in sorted(summary.tools.items()):
        rows = [(_HEADINGS[change], counts[change]) for change in _CHANGES if counts[change]]
        charts.append(_bars(f"Keys where {tool} is", rows))
    tokens = [
        ("input tokens, recording", summary.baseline_tokens[0]),
        ("input tokens, candidate", summary.candidate_tokens[0]),
        ("output tokens, recording", summary.baseline_tokens[1]),
        ("output tokens, candidate", summary.candidate_tokens[1]),
    ]
    charts.append(_bars("Tokens", tokens))
    tables = html.escape(backtest_markdown(summary, max_keys=max_keys))
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8"><title>Backtest</title></head>'
        '<body style="font-family: sans-serif">\n<h1>Backtest</h1>\n'
        + "\n".join(charts)
        + f"\n<pre>{tables}</pre>\n</body></html>\n"
    )


_BAR_ROW = 22
_BAR_WIDTH = 360
_LABEL_WIDTH = 240


def _bars(title: str, rows: Sequence[tuple[str, int]]) -> str:
    """An SVG chart of one horizontal bar per row, scaled to the largest value."""
    top = max((value for _, value in rows), default=0) or 1
    height = _BAR_ROW * len(rows) + 8
    width = _LABEL_WIDTH + _BAR_WIDTH + 80
    parts = [f"<h2>{html.escape(title)}</h2>", f'<svg width="{width}" height="{height}">']
    for index, (label, value) in enumerate(rows):
        y = index * _BAR_ROW + 4
        bar = round(_BAR_WIDTH * value / top)
        parts += [
            f'<text x="0" y="{y + 14}" font-size="13">{html.escape(label)}</text>',
            f'<rect x="{_LABEL_WIDTH}" y="{y}" width="{bar}" height="16" fill="#4a78b5"'
            f' data-value="{value}"/>',
            f'<text x="{_LABEL_WIDTH + bar + 6}" y="{y + 14}" font-size="13">{value}</text>',
        ]
    parts.append("</svg>")
    return "\n".join(parts)


def run_backtest(
    records: Iterable,
    candidate: Agent,
    options: BacktestOptions | None = None,
    *,
    pipeline_options: PipelineOptions | None = None,
) -> tuple[list[BacktestKeyReport], list[ActivationErrorRecord]]:
    """Runs the Backtest transform over `records` (ActivationRecords or their bytes) in a batch
    pipeline (`pipeline_options`, default: $BEAM_AGENTS_PIPELINE_OPTIONS or the DirectRunner);
    returns its reports and dead letters."""
    with tempfile.TemporaryDirectory(prefix="beam-agents-backtest-") as folder:
        paths = {tag: str(Path(folder) / tag) for tag in (REPORTS, ERRORS)}
        with prism.pipeline(pipeline_options or env_options()) as pipeline:
            outputs = pipeline | beam.Create(list(records)) | Backtest(candidate, options)
            for tag, path in paths.items():
                _ = outputs[tag] | f"Write{tag}" >> beam.ParDo(_AppendLines(path))
        reports, letters = ([value for _, _, value in _read(Path(paths[tag]))] for tag in paths)
    return sorted(reports, key=lambda r: r.entity_key), letters
