"""The demo on local pipelines: each round one real Beam pipeline (`TriageRound`) on a manual
clock, chained through the key's exported StateSnapshot and the answers of the round before.

The rounds record every activation (RunAgent's RECORDS); once the agent completed, the demo
backtests a changed triage prompt over that recording (the Backtest transform, one more
pipeline on the same runner): the model's answers come from the recording while the requests
match, the changed prompt is answered by the scripted model, and no tool runs again."""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Sequence
from typing import TextIO

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.typehints import Tuple

from beam_agents._protos import AgentEnvelope
from beam_agents.examples.support_triage import TOOLS, scripted_model
from beam_agents.intents.effector import (
    APPROVALS,
    DEAD_LETTERS,
    RESULTS,
    ExecuteIntents,
    VerifyMode,
)
from beam_agents.ops.backtest import BacktestOptions, kind_name, run_backtest, tool_changes
from beam_agents.ops.demo.account import Account
from beam_agents.ops.demo.parts import (
    CUSTOMER,
    approve,
    candidate_triage,
    demo_effector_keyring,
    demo_keyring,
    triage_agent,
)
from beam_agents.ops.rounds import Advance, ManualClock, run_round
from beam_agents.runtime import COMPLETIONS, ERRORS, INTENTS, RECORDS, SNAPSHOTS, Recording
from beam_agents.wire.beam_support import typed

__all__ = ["ScriptedApprover", "TriageRound", "run_demo"]

_MAX_ROUNDS = 8


class ScriptedApprover(beam.DoFn):
    """A human stand-in: approves every approval intent (`approve`)."""

    def process(self, element):
        key, intent = element
        yield (key, approve(intent))


class TriageRound(beam.PTransform):
    """One round: RunAgent, then ExecuteIntents and the scripted approver on its intents.
    Outputs RunAgent's five, plus "results" (tool results) and "approved" (approval answers)
    as AgentEnvelopes for the next round, and the effector's dead letters."""

    def __init__(self, clock) -> None:
        super().__init__()
        self._clock = clock

    def expand(self, inputs):
        outputs = inputs | "RunAgent" >> triage_agent(Recording())
        effected = (
            outputs[INTENTS]
            | "Intents" >> beam.Values()
            | "ExecuteIntents"
            >> ExecuteIntents(
                TOOLS,
                mode=VerifyMode.REQUIRE,
                keyring_loader=demo_keyring,
                result_keyring_loader=demo_effector_keyring,
                clock=self._clock,
            )
        )
        approved = effected[APPROVALS] | "Approve" >> beam.ParDo(ScriptedApprover())
        return {
            **outputs,
            "results": effected[RESULTS],
            "approved": typed(approved, Tuple[bytes, AgentEnvelope]),
            "effector_errors": effected[DEAD_LETTERS],
        }


def run_demo(
    options: PipelineOptions | None = None, *, out: TextIO = sys.stdout, workdir: str | None = None
) -> int:
    """Runs the demo, printing its account to `out`; returns 0 when the agent completed."""
    t0 = int(time.time() * 1000)
    with tempfile.TemporaryDirectory(prefix="beam-agents-demo-") as scratch:
        return _LocalDemo(out, workdir or scratch, options, t0).run()


class _LocalDemo(Account):
    def run(self) -> int:
        runner = (self.options or PipelineOptions()).view_as(StandardOptions).runner
        event = self.introduce(f"on Apache Beam's {runner or 'DirectRunner'}")
        inputs: list = [event]
        records = []
        for number in range(1, _MAX_ROUNDS + 1):
            now = self.t0 + number * 1000
            outputs = self._round(number, inputs, now)
            completed = outputs.values(COMPLETIONS)
            records += outputs.values(RECORDS)
            self._account(outputs)
            if outputs.values(ERRORS) or outputs.values("effector_errors"):
                return 1
            if completed:
                self.say()
                self._trace_tree()
                return self._backtest(records)
            (snapshot,) = outputs.values(SNAPSHOTS)
            self._snapshot(snapshot)
            answers = outputs.values("results") + outputs.values("approved")
            for answer in answers:
                answer.event_time_ms = now + 10
            inputs = [snapshot, *answers]
        self.say(f"the agent did not complete in {_MAX_ROUNDS} rounds")
        return 1

    def _backtest(self, records) -> int:
        """Backtests the changed prompt over the recorded activations; 0 when it ran."""
        self.say()
        self.say(
            f"backtest: the triage prompt changed ({candidate_triage.adapter}), over the"
            f" {len(records)} recorded activations, in one more pipeline ..."
        )
        options = BacktestOptions(
            stop_at_divergence=False, continue_with=scripted_model(), max_tokens=10_000
        )
        reports, letters = run_backtest(
            records, candidate_triage, options, pipeline_options=self.options
        )
        if letters or len(reports) != 1:
            self.say(f"  the backtest could not run: {[letter.reason for letter in letters]}")
            return 1
        (report,) = reports
        found = report.divergence
        self.say(
            f"  first divergence at activation {found.activation}: {kind_name(found.kind)}"
            f" ({found.detail})"
        )
        self.say(
            "  the changed prompt, answered by the scripted model, then ran"
            f" {report.candidate_activations} activations against the recording's"
            f" {report.baseline_activations}"
        )
        changes = tool_changes(report)
        self.say(
            "  tool calls: "
            + (", ".join(f"{tool} {change}" for tool, change in changes.items()) or "unchanged")
            + "; no tool ran (every result came from the recording)"
        )
        return 0

    def _round(self, number: int, inputs: Sequence, now: int):
        self.say()
        self.say(
            f"round {number}: one pipeline run, {len(inputs)} input(s)"
            f"{' (the snapshot of the last round first)' if number > 1 else ''} ..."
        )
        started = time.perf_counter()
        export = AgentEnvelope(entity_key=CUSTOMER, event_time_ms=now)
        export.export_request.request_id = f"round-{number}"
        script = [*inputs, Advance(now), export, Advance(now + 1)]
        outputs = run_round(
            TriageRound(ManualClock(now)), script, self.workdir, options=self.options
        )
        self.say(f"  done in {time.perf_counter() - started:.1f} s")
        # The round ends at its clock (run_round releases the key there): everything it
        # emitted is the conversation, nothing ran after it.
        return outputs
