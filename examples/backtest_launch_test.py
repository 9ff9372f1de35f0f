"""The backtest launcher reads record files by pattern, runs the Backtest transform and writes
each key's report, the dead letters and the summary, as the same reports `run_backtest` makes."""

from __future__ import annotations

import sys
from pathlib import Path

from beam_agents._protos import ActivationErrorRecord, BacktestKeyReport
from beam_agents.ops.backtest import run_backtest
from beam_agents.testing.recorded_history import (
    expected_refund_changes,
    gold_only_refunds,
    triage_history,
)
from beam_agents.wire.beam_support import HexLinesCoder
from beam_agents.wire.fields import join_delimited

sys.path.insert(0, str(Path(__file__).resolve().parent))
import backtest_launch

CANDIDATE = "beam_agents.testing.recorded_history:gold_only_refunds"


def _read(prefix: Path, message):
    shards = sorted(prefix.parent.glob(f"{prefix.name}-*"))
    lines = [line for shard in shards for line in shard.read_text().splitlines()]
    return [message.FromString(HexLinesCoder().decode(line.encode())) for line in lines]


def test_the_launcher_writes_the_reports_run_backtest_makes_and_a_summary(tmp_path):
    count = 48
    history = triage_history(count)
    # Two files, as a job writing RECORDS in shards would, and bytes that are no record.
    (tmp_path / "records").mkdir()
    half = len(history) // 2
    (tmp_path / "records" / "a.binpb").write_bytes(join_delimited(history[:half]))
    (tmp_path / "records" / "b.binpb").write_bytes(join_delimited(history[half:]) + b"\x03abc")
    out = tmp_path / "out" / "run"
    assert (
        backtest_launch.main(
            [
                "--runner=DirectRunner",
                f"--records={tmp_path / 'records' / '*.binpb'}",
                f"--agent={CANDIDATE}",
                f"--output={out}",
            ]
        )
        == 0
    )
    reports = sorted(
        _read(out.with_name("run-reports"), BacktestKeyReport), key=lambda r: r.entity_key
    )
    expected, _ = run_backtest(history, gold_only_refunds)
    assert [r.SerializeToString(deterministic=True) for r in reports] == [
        r.SerializeToString(deterministic=True) for r in expected
    ]
    _, asked = expected_refund_changes(count)
    assert {r.entity_key for r in reports if r.HasField("divergence")} == asked
    (letter,) = _read(out.with_name("run-errors"), ActivationErrorRecord)
    assert letter.reason == "recording_undecodable"
    summary = (tmp_path / "out" / "run-summary.md").read_text()
    assert f"| {count + 1} | {count} | {len(asked)} | 0 | 1 |" in summary
    assert (tmp_path / "out" / "run-summary.html").read_text().count("<svg") >= 3


def test_a_launch_without_its_inputs_or_with_no_agent_is_a_usage_error(tmp_path, capsys):
    assert backtest_launch.main(["--runner=DirectRunner"]) == 2
    assert "--records PATTERN" in capsys.readouterr().err
    arguments = [f"--records={tmp_path}/*", f"--output={tmp_path}/o", "--agent=json:dumps"]
    assert backtest_launch.main(arguments) == 2
    assert "--agent:" in capsys.readouterr().err
