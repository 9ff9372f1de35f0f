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
ERRORS, (entity_key, ActivationErrorRecord), the backtest's dead letters. A history that is
incomplete only so far (records can arrive out of their order) waits for its missing records.

Not yet: TraceEvents or OpenTelemetry spans of divergences (the records are the signal for now),
and a candidate that goes on past its divergence with a model of its own.
"""

from __future__ import annotations

from collections.abc import Iterator

import apache_beam as beam
from apache_beam.coders import BooleanCoder
from apache_beam.coders.coders import DeterministicProtoCoder
from apache_beam.transforms import window
from apache_beam.transforms.userstate import BagStateSpec, ReadModifyWriteStateSpec
from apache_beam.typehints import Tuple

from beam_agents._protos import ActivationErrorRecord, ActivationRecord, BacktestKeyReport
from beam_agents.ops.backtest import REPORTS, backtest_key, parse_record
from beam_agents.runtime.context import Agent
from beam_agents.runtime.dead_letters import HISTORY_INCOMPLETE, RECORDING_UNDECODABLE, error_record
from beam_agents.runtime.machine import ERRORS
from beam_agents.wire.beam_support import keep_each_key_in_one_bundle, typed

__all__ = ["REPORTS", "ShadowAgent"]


class _Shadow(beam.DoFn):
    HISTORY = BagStateSpec("history", DeterministicProtoCoder(ActivationRecord))
    DONE = ReadModifyWriteStateSpec("done", BooleanCoder())

    def __init__(self, candidate: Agent) -> None:
        self._candidate = candidate

    def process(
        self,
        element,
        history=beam.DoFn.StateParam(HISTORY),
        done=beam.DoFn.StateParam(DONE),
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
        if letters or report.HasField("divergence"):
            if report is not None:
                yield key, report
            done.write(True)
            history.clear()
            return
        history.add(record)


class ShadowAgent(beam.PTransform):
    """Runs `candidate` beside a live agent on its activation records; see the module
    docstring. Input: RunAgent's RECORDS output, (entity_key, ActivationRecord). Output: a
    dict of REPORTS (each key's first divergence) and ERRORS (dead letters)."""

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
            | "Run" >> beam.ParDo(_Shadow(self._candidate)).with_outputs(ERRORS, main=REPORTS)
        )
        return {
            REPORTS: typed(ran[REPORTS], Tuple[bytes, BacktestKeyReport]),
            ERRORS: typed(ran[ERRORS], Tuple[bytes, ActivationErrorRecord]),
        }
