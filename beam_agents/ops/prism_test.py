"""Prism pipelines run on the Prism they name, whatever ran before them in the process."""

from __future__ import annotations

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from beam_agents.ops import prism
from beam_agents.ops.backtest import run_backtest
from beam_agents.testing.recorded_history import gold_only_refunds, triage_history

#: Refused at once on any machine, online or not (port 9 is discard, nothing listens there).
_UNREACHABLE = "http://127.0.0.1:9/apache_beam-prism.zip"


def _prism_at(location: str) -> PipelineOptions:
    return PipelineOptions(["--runner=PrismRunner", f"--prism_location={location}"])


def test_pipelines_naming_the_same_prism_share_its_job_server_and_others_get_their_own(tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    for binary in (first, second):
        binary.write_text("#!/bin/sh\n")
    runner = prism.LocalPrismRunner()
    server = runner.default_job_server(_prism_at(str(first)))
    assert runner.default_job_server(_prism_at(str(first))) is server
    assert prism.LocalPrismRunner().default_job_server(_prism_at(str(first))) is server
    assert runner.default_job_server(_prism_at(str(second))) is not server


def test_only_a_prism_pipeline_runs_on_the_local_prism_runner(tmp_path):
    binary = tmp_path / "prism"
    binary.write_text("#!/bin/sh\n")
    for spelling in ("PrismRunner", "prism", "apache_beam.runners.portability.PrismRunner"):
        options = PipelineOptions([f"--runner={spelling}", f"--prism_location={binary}"])
        assert isinstance(prism.pipeline(options).runner, prism.LocalPrismRunner), spelling
    direct = prism.pipeline(PipelineOptions(["--runner=DirectRunner"])).runner
    assert not isinstance(direct, prism.LocalPrismRunner)


@pytest.mark.engines
def test_a_backtest_on_prism_after_one_on_the_direct_runner_runs_on_the_built_prism():
    """Beam's DirectRunner first tries a batch pipeline on Prism and, failing, runs it itself;
    Beam's PrismRunner then reused that failed job server (downloading Prism from where the
    DirectRunner's options said) for every later Prism pipeline of the process."""
    history = triage_history(3)
    direct, _ = run_backtest(
        history,
        gold_only_refunds,
        pipeline_options=PipelineOptions(
            ["--runner=DirectRunner", f"--prism_location={_UNREACHABLE}"]
        ),
    )
    on_prism, letters = run_backtest(
        history,
        gold_only_refunds,
        pipeline_options=PipelineOptions(["--runner=PrismRunner", "--environment_type=LOOPBACK"]),
    )
    assert letters == []
    assert [r.SerializeToString(deterministic=True) for r in on_prism] == [
        r.SerializeToString(deterministic=True) for r in direct
    ]
