"""`python examples/first_agent.py` runs the first agent end to end: a model call, a tool, an
approval and memory across its two events, in at most 40 lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().with_name("first_agent.py")


def test_the_first_agent_orders_twice_and_remembers_the_first_order(tmp_path):
    assert len(SCRIPT.read_text().splitlines()) <= 40
    result = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "intent: human.approval" in result.stdout
    assert '"outcome": "ordered", "orders": 1}' in result.stdout
    assert '"outcome": "ordered", "orders": 2}' in result.stdout  # memory across the events
