"""Activations backtested per second per core, beside the driver's rate for the same agent.

The history: the support-triage agent on tickets (beam_agents/testing/recorded_history.py),
recorded by the runtime's per-key machine with its intents answered at once, until it holds
`--activations` activation records. The driver's rate is that recording's: activations per
second of KeyMachine running the agent (recording on, the only way this benchmark can get a
history). The backtest's rates: `backtest_key` over every key in this process (no runner), and
the `Backtest` transform on the DirectRunner in batch (the FnApiRunner in process,
`--direct_num_workers=1`: one core), an unchanged candidate, so every key runs to its end.
Goal (issue 42): the pipeline's rate at least 0.3 of the driver's.

    python benchmarks/backtest_benchmark.py [--activations N]
"""

from __future__ import annotations

import argparse
import collections
import time

from apache_beam.options.pipeline_options import PipelineOptions

from beam_agents.examples.support_triage import TOOLS, scripted_model, triage
from beam_agents.ops.backtest import backtest_key, run_backtest
from beam_agents.testing.recorded_history import record_history, triage_approver, triage_tickets

GOAL = 0.3
#: Activations per 12 tickets of the triage history (its texts cycle by 4, its customers by
#: 6): 4 approved refunds of 4 activations, 2 declined of 3, 6 other tickets of 2.
_PER_12_TICKETS = 34


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--activations", type=int, default=100_000)
    args = parser.parse_args()
    tickets = triage_tickets(-(-args.activations * 12 // _PER_12_TICKETS))
    began = time.perf_counter()
    history = record_history(
        triage, tickets, tools=TOOLS, approver=triage_approver, llm_client=scripted_model()
    )
    driver = len(history) / (time.perf_counter() - began)
    by_key = collections.defaultdict(list)
    for record in history:
        by_key[record.entity_key].append(record)
    began = time.perf_counter()
    for key, records in by_key.items():
        backtest_key(key, records, triage)
    in_process = len(history) / (time.perf_counter() - began)
    began = time.perf_counter()
    reports, _ = run_backtest(
        history, triage, pipeline_options=PipelineOptions(["--direct_num_workers=1"])
    )
    pipeline = len(history) / (time.perf_counter() - began)
    assert not [r for r in reports if r.HasField("divergence")]
    print(f"{len(history)} activations of {len(by_key)} keys")
    print(f"driver (KeyMachine, recording)    {driver:10.0f} activations/s")
    print(f"backtest_key, in process          {in_process:10.0f} activations/s")
    print(f"Backtest on the FnApiRunner       {pipeline:10.0f} activations/s")
    print(f"pipeline / driver                 {pipeline / driver:10.2f} (goal >= {GOAL})")


if __name__ == "__main__":
    main()
