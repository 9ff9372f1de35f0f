"""The README says what the code does: its RunAgent example runs as printed, and its tables
of dead-letter reasons list exactly the reasons the code emits."""

from __future__ import annotations

import re
import subprocess
import sys

from beam_agents import effector
from beam_agents.core.signing import Verification
from beam_agents.runtime.dead_letters import REASONS
from tools.workspace import data_root

README = (data_root() / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end]


def test_the_run_agent_example_runs_as_printed(tmp_path):
    (code,) = re.findall(r"```python\n(.*?)```", _section("Running an agent"), re.DOTALL)
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        "user-1 Hello, Ada! (visit 1)",
        "user-1 Hello, Ada! (visit 2)",
    ]


def _table_reasons(section: str) -> set[str]:
    return {
        reason
        for row in re.findall(r"^\| (.+?) \|", section, re.MULTILINE)
        for reason in re.findall(r"`([a-z_]+)`", row)
    }


def test_the_runtime_dead_letter_table_lists_every_reason():
    assert _table_reasons(_section("Running an agent")) == set(REASONS)


def test_the_effector_dead_letter_table_lists_every_reason():
    signature = {"signature_" + outcome.name.lower() for outcome in Verification}
    signature.discard("signature_valid")
    expected = {effector.REASON_UNDECODABLE} | signature
    assert _table_reasons(_section("Tool intents, signatures and the effector")) == expected
