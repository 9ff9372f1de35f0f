"""The main job: the demo tells the whole conversation on local pipelines and exits 0, run
directly and as `beam-agents demo`."""

from __future__ import annotations

import io
import re
import subprocess
import sys

from beam_agents.ops.demo import run_demo


def test_the_demo_runs_the_conversation_end_to_end_and_tells_it(tmp_path):
    out = io.StringIO()
    assert run_demo(out=out, workdir=str(tmp_path)) == 0
    account = out.getvalue()
    expected_in_order = [
        "ticket t-1 from customer c-1",
        "started on a new event",
        "intent crm.lookup",
        "suspended, waiting for 1 answer(s)",
        "effector ran crm.lookup: OK",
        "exported snapshot round-1",
        "resumed with its answers",
        "llm triage-model: model called",
        "intent human.approval",
        "approver ops@example.com approved: Refund 42.00 to Ada Lovelace (gold)?",
        "llm triage-model: replayed from the cache, no model call",
        "intent payments.refund",
        "effector ran payments.refund: OK",
        '"outcome": "refunded"',
        "trace ",
        "activation span",
        "  resume span",
        # It ends by backtesting a changed triage prompt over what it recorded: the requests
        # depart at the model call after the lookup, and the calls the recording answers stay.
        "backtest: the triage prompt changed (examples.support_triage/v2), over the 4 recorded",
        "first divergence at activation 1: model_request",
        "ran 4 activations against the recording's 4",
        "tool calls: unchanged; no tool ran",
    ]
    position = 0
    for line in expected_in_order:
        found = account.find(line, position)
        assert found >= 0, f"{line!r} missing after position {position}:\n{account}"
        position = found
    assert "DEAD LETTER" not in account
    assert len(re.findall(r"signed demo-key", account)) == 3


def test_the_demo_is_the_console_scripts_main_job(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "beam_agents.ops.cli", "demo"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert '"outcome": "refunded"' in result.stdout
