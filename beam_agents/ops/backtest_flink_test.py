"""The Backtest transform on Flink (issue 42 item 5): the same reports, byte for byte, as on
the DirectRunner, for a recorded triage history run as a batch job on the Flink cluster
tools/engines.sh starts."""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_agents.ops.backtest import run_backtest
from beam_agents.testing.engines import Engines
from beam_agents.testing.recorded_history import (
    expected_refund_changes,
    gold_only_refunds,
    triage_history,
)

pytestmark = pytest.mark.engines

#: The cluster's options that make a streaming job; a backtest is a batch one.
_STREAMING = ("--streaming", "--checkpointing_interval", "--finish_bundle_before_checkpointing")


def _batch_on_flink() -> PipelineOptions:
    options = Engines().up(["flink"]).flink_options()
    return PipelineOptions([o for o in options if not o.startswith(_STREAMING)])


def test_a_backtest_on_flink_reports_what_it_does_on_the_direct_runner():
    count = 200
    history = triage_history(count)
    on_flink, letters = run_backtest(history, gold_only_refunds, pipeline_options=_batch_on_flink())
    assert letters == []
    _, asked = expected_refund_changes(count)
    assert {r.entity_key for r in on_flink if r.HasField("divergence")} == asked
    direct, _ = run_backtest(
        history, gold_only_refunds, pipeline_options=PipelineOptions(["--runner=DirectRunner"])
    )
    assert [r.SerializeToString(deterministic=True) for r in on_flink] == [
        r.SerializeToString(deterministic=True) for r in direct
    ]
