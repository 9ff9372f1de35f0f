"""`python examples/support_triage.py` runs the example pipeline with Beam options."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().with_name("support_triage.py")


def test_the_example_runs_as_a_script_with_pipeline_options(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--runner=DirectRunner", "--direct_num_workers=1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert '"outcome": "refunded"' in result.stdout
