"""Recording: an ActivationRecord for every activation RunAgent runs, on an output of its own.

`RunAgent(agent, recording=Recording())` adds the RECORDS output, (entity_key,
ActivationRecord): for each activation (a start, a resume, a failed attempt of either) the
event or answers it ran on, each model call with the answer it used (its replay-cache key and
the SHA-256 of its canonical request, so a later run can tell the same request from another),
each call the model's client failed (`model_failures`: where among the calls, busy or down,
what a refused answer was billed), the intents it emitted, its outcome and, for a resume,
which attempt at its place it was. An activation a person's declined budget raise ended has
one too (FAILED, `budget_exceeded`), holding the model calls of the attempt the question held
up, so a key's records start at its first activation and every answer a live attempt used is
in one. The calls the attempts a budget question held up made, answered or failed, are in the
record of their activation, however it ends, numbered by attempt (`held_calls`,
`held_failures`; kept meanwhile in the Continuation).
Writing the records to Kafka, files or BigQuery is ordinary Beam; `beam-agents backtest`
(beam_agents/ops/backtest.py) runs a candidate agent over them.

Off by default, and then nothing changes: RunAgent's graph has no RECORDS output, its state
specs are the same (beam_agents/ops/state_manifest.json) and the machine builds no record, so a
job started without recording updates to one with it (an output added) and back.

The size policy: a model answer over `max_answer_bytes` is kept as its SHA-256 only
(`digest_only`, as the replay cache keeps a response over its limit). A backtest whose
candidate needs such an answer cannot replay it and says so; the record stays small enough for
a topic's message limit (RunAgent's max_output_bytes still bounds the whole record).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence

from beam_agents._protos import ActivationRecord, AgentEnvelope, Continuation, ToolIntent

__all__ = ["RECORDS", "ModelCallLog", "Outcome", "Recording", "request_digest"]

#: RunAgent's output of ActivationRecords, when recording is on.
RECORDS = "records"

Outcome = ActivationRecord.Outcome


@dataclasses.dataclass(frozen=True)
class ModelCallLog:
    """One model call as the activation made it (ActivationContext.model_log): answered, or
    `failed` (then `response` is empty, the tokens are what it was billed, and `retryable`,
    `reason`, `model` and `text`, its str(), are the client's LlmCallError's, in plain
    types)."""

    cache_key: str
    canonical: str
    response: bytes
    replayed: bool
    model: str
    input_tokens: int
    output_tokens: int
    failed: bool = False
    retryable: bool = False
    reason: str = ""
    text: str = ""


@dataclasses.dataclass(frozen=True)
class Recording:
    """The recording's policy: answers over `max_answer_bytes` are kept as digests."""

    max_answer_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        size = self.max_answer_bytes
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"max_answer_bytes must be an int of at least 0, not {size!r}")

    def record(
        self,
        *,
        entity_key: bytes,
        seq: int,
        first_step: int,
        now_ms: int,
        adapter: str,
        event: AgentEnvelope | None,
        answers: Sequence[AgentEnvelope],
        model_log: Sequence[ModelCallLog],
        intents: Sequence[ToolIntent],
        outcome: int,
        output: bytes = b"",
        reason: str = "",
        attempt: int = 0,
        held: Continuation | None = None,
    ) -> ActivationRecord:
        record = ActivationRecord(
            entity_key=entity_key,
            seq=seq,
            first_step=first_step,
            now_ms=now_ms,
            adapter=adapter,
            answers=answers,
            model_calls=self.model_calls(model_log),
            model_failures=self.failures(model_log),
            intents=intents,
            outcome=outcome,
            output=output,
            reason=reason,
            attempt=attempt,
        )
        if held is not None:
            record.held_attempts = held.held_attempts
            record.held_calls.extend(held.held_calls)
            record.held_failures.extend(held.held_failures)
        if event is not None:
            record.event.CopyFrom(event)
        return record

    def model_calls(
        self, model_log: Sequence[ModelCallLog], *, held_attempt: int = 0
    ) -> list[ActivationRecord.ModelCall]:
        """The answered calls of `model_log` as a record holds them, under the size policy.
        For an attempt a budget question held up (`held_attempt`, from 1) only those the
        model answered: what it replayed, an attempt before it paid for and holds."""
        return [
            self._call(call, held_attempt)
            for call in model_log
            if not call.failed and not (held_attempt and call.replayed)
        ]

    def failures(
        self, model_log: Sequence[ModelCallLog], *, held_attempt: int = 0
    ) -> list[ActivationRecord.ModelFailure]:
        """The failed calls of `model_log`, each placed after the answered ones before it (as
        `model_calls` holds them), its reason cut to `max_answer_bytes`; numbered
        `held_attempt` when a budget question held the attempt up."""
        failures, answered = [], 0
        for call in model_log:
            if not call.failed:
                answered += not (held_attempt and call.replayed)
                continue
            failures.append(
                ActivationRecord.ModelFailure(
                    after_calls=answered,
                    cache_key=call.cache_key,
                    request_digest=request_digest(call.canonical),
                    model=_cut(call.model, self.max_answer_bytes),
                    retryable=call.retryable,
                    input_tokens=call.input_tokens,
                    output_tokens=call.output_tokens,
                    error=_cut(call.reason, self.max_answer_bytes),
                    held_attempt=held_attempt,
                    text=_cut(call.text, self.max_answer_bytes),
                )
            )
        return failures

    def _call(self, call: ModelCallLog, held_attempt: int) -> ActivationRecord.ModelCall:
        kept = len(call.response) <= self.max_answer_bytes
        return ActivationRecord.ModelCall(
            cache_key=call.cache_key,
            request_digest=request_digest(call.canonical),
            response=call.response if kept else b"",
            response_digest=hashlib.sha256(call.response).digest(),
            digest_only=not kept,
            replayed=call.replayed,
            model=call.model,
            input_tokens=call.input_tokens,
            output_tokens=call.output_tokens,
            held_attempt=held_attempt,
        )


def _cut(text: str, limit: int) -> str:
    """`text` as UTF-8 of at most `limit` bytes, cut on a character boundary (a lone
    surrogate, which a proto string cannot hold, made "?")."""
    return text.encode("utf-8", "replace")[:limit].decode("utf-8", "ignore")


def request_digest(canonical: str) -> bytes:
    """What tells one model request from another: the SHA-256 of its canonical JSON."""
    return hashlib.sha256(canonical.encode("utf-8")).digest()
