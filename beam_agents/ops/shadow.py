"""Shadow mode: a candidate agent run live beside the agent in production, acting on nothing.

    live = envelopes | RunAgent(agent, recording=Recording())
    shadow = live[RECORDS] | "Shadow" >> ShadowAgent(candidate)

`ShadowAgent` takes the live agent's activation records (RunAgent's RECORDS output) as they
come and, per key, runs the candidate over the key's history so far exactly as the backtest
does (`backtest.backtest_key`: the runtime's own machine, model answers from the live agent's
for the same request, tool results and approvals from the live agent's for the same call).
So its divergence records are the backtest's for the same events. It emits no intent at all:
nothing it does can reach an effector.

State of its own. The transform keeps each key's records so far in a bag under its own name
(whatever label it is applied under), and a mark once the key has diverged; RunAgent's state is
untouched. Adding a shadow to a job adds transforms and state, which `--update` takes (the
live RunAgent gains the RECORDS output, which it takes too). A key's history is run again from
the start on each record (histories are short; a key stops being shadowed, and its bag is
cleared, at its first divergence or dead letter).

Outputs: REPORTS, (entity_key, BacktestKeyReport), once per key, at its first divergence;
TRACES, (entity_key, TraceEvent), one SHADOW_ACTIVATION span per live activation the
candidate was compared on, up to and including the divergent one; ERRORS, (entity_key,
ActivationErrorRecord), the backtest's dead letters. A history that is incomplete only so far
(records can arrive out of their order) waits for its missing records.

Spans, for a dashboard's live divergence rate. Each span is a child of the live activation's
own span, in its trace (the ids are the runtime's pure functions of the key and seq, so no id
travels with the record), named by the candidate (`gen_ai.agent.name`) and saying
`beam_agents.shadow.diverged` ("true" on the divergent activation, with its kind and detail).
The rate is the diverged spans over all spans of a candidate; RunAgent's TRACES and these go
to the same exporter (`beam_agents.integrations.telemetry`). A count of the records already
compared is kept per key, so a record is spanned once however many times the history is run.

Not yet: a candidate that goes on past its divergence with a model of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
from apache_beam.coders import BooleanCoder, VarIntCoder
from apache_beam.coders.coders import DeterministicProtoCoder
from apache_beam.transforms import window
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec
from apache_beam.typehints import Tuple

from beam_agents._protos import (
    ActivationErrorRecord,
    ActivationRecord,
    BacktestKeyReport,
    TraceEvent,
)
from beam_agents.ops.backtest import (
    REPORTS,
    backtest_key,
    in_history_order,
    kind_name,
    parse_record,
)
from beam_agents.runtime.context import Agent
from beam_agents.runtime.dead_letters import HISTORY_INCOMPLETE, RECORDING_UNDECODABLE, error_record
from beam_agents.runtime.machine import ERRORS, TRACES
from beam_agents.runtime.trace_ids import span_id, trace_id
from beam_agents.wire.beam_support import keep_each_key_in_one_bundle, typed

__all__ = ["REPORTS", "TRACES", "ShadowAgent", "shadow_span"]


def shadow_span(
    record: ActivationRecord, candidate: str, divergence: BacktestKeyReport.Divergence | None
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


class _Shadow(beam.DoFn):
    HISTORY = BagStateSpec("history", DeterministicProtoCoder(ActivationRecord))
    DONE = ReadModifyWriteStateSpec("done", BooleanCoder())
    # How many of the key's records (in history order) are spanned already.
    SPANNED = ReadModifyWriteStateSpec("spanned", VarIntCoder())

    def __init__(self, candidate: Agent) -> None:
        self._candidate = candidate

    def process(
        self,
        element,
        history=beam.DoFn.StateParam(HISTORY),
        done=beam.DoFn.StateParam(DONE),
        spanned=beam.DoFn.StateParam(SPANNED),
    ) -> Iterator:
        key, value = element
        record = parse_record(value)
        if isinstance(record, str):
            letter = error_record(key, RECORDING_UNDECODABLE, record, 0)
            yield beam.pvalue.TaggedOutput(ERRORS, (key, letter))
            return
        if done.read():
            return
        records = [*history.read(), record]
        report, letters = backtest_key(key, records, self._candidate)
        if letters and all(letter.reason == HISTORY_INCOMPLETE for letter in letters):
            history.add(record)  # a record still to come may complete it
            return
        for letter in letters:
            yield beam.pvalue.TaggedOutput(ERRORS, (key, letter))
        if report is not None:
            yield from self._spans(report, records, spanned)
        if letters or report.HasField("divergence"):
            if report is not None:
                yield key, report
            done.write(True)
            history.clear()
            spanned.clear()
            return
        history.add(record)

    def _spans(self, report: BacktestKeyReport, records, spanned) -> Iterator:
        """A span for each record compared since the last run, up to the divergent one."""
        divergence = report.divergence if report.HasField("divergence") else None
        compared = in_history_order(records)[: divergence.activation + 1 if divergence else None]
        start = spanned.read() or 0
        for index, record in enumerate(compared[start:], start):
            diverged = divergence if divergence and index == divergence.activation else None
            span = shadow_span(record, self._candidate.adapter, diverged)
            yield beam.pvalue.TaggedOutput(TRACES, (record.entity_key, span))
        spanned.write(max(start, len(compared)))


class ShadowAgent(beam.PTransform):
    """Runs `candidate` beside a live agent on its activation records; see the module
    docstring. Input: RunAgent's RECORDS output, (entity_key, ActivationRecord). Output: a
    dict of REPORTS (each key's first divergence), TRACES (a span per live activation
    compared) and ERRORS (dead letters)."""

    def __init__(self, candidate: Agent) -> None:
        super().__init__()
        if not isinstance(candidate, Agent):
            raise TypeError(f"{candidate!r} has no adapter, start and resume: not an Agent")
        self._candidate = candidate

    def expand(self, records):
        keep_each_key_in_one_bundle(records.pipeline)
        ran = (
            records
            | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
            | "Run"
            >> beam.ParDo(_Shadow(self._candidate)).with_outputs(ERRORS, TRACES, main=REPORTS)
        )
        return {
            REPORTS: typed(ran[REPORTS], Tuple[bytes, BacktestKeyReport]),
            TRACES: typed(ran[TRACES], Tuple[bytes, TraceEvent]),
            ERRORS: typed(ran[ERRORS], Tuple[bytes, ActivationErrorRecord]),
        }
