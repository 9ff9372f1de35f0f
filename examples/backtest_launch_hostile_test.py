"""The backtest launcher on record files a crashed or foreign writer left (issue 42):
bad input is a dead letter or a clear error, never a failed job."""

from __future__ import annotations

import sys
from pathlib import Path

from beam_agents.testing.recorded_history import (
    triage_history,
)
from beam_agents.wire.fields import join_delimited

sys.path.insert(0, str(Path(__file__).resolve().parent))
import backtest_launch

CANDIDATE = "beam_agents.testing.recorded_history:gold_only_refunds"


def test_a_file_cut_in_the_middle_of_a_record_is_no_failed_job(tmp_path):
    history = triage_history(4)
    (tmp_path / "records").mkdir()
    # A writer that died mid-record: the last frame says more bytes than the file holds.
    (tmp_path / "records" / "a.binpb").write_bytes(join_delimited(history)[:-3])
    arguments = [
        "--runner=DirectRunner",
        f"--records={tmp_path / 'records' / '*.binpb'}",
        f"--agent={CANDIDATE}",
        f"--output={tmp_path / 'out' / 'run'}",
    ]
    # The cut tail is one undecodable record; the whole records before it run.
    assert backtest_launch.main(arguments) == 0
    assert "recording_undecodable" in (tmp_path / "out" / "run-summary.md").read_text()
