"""The README says what the code does: its RunAgent example runs as printed, and its tables
of dead-letter reasons list exactly the reasons the code emits."""

from __future__ import annotations

import re
import subprocess
import sys

from beam_agents.intents import effector
from beam_agents.intents.signing import Verification
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


#: The modules a README snippet may import from: the package's API, and the integrations that
#: need an optional extra.
_EXTRAS = (
    "beam_agents.ops.console",
    "beam_agents.integrations.langgraph",
    "beam_agents.integrations.llm.anthropic_messages",
    "beam_agents.integrations.llm.gemini",
    "beam_agents.integrations.llm.openai_chat",
    "beam_agents.integrations.mcp_tools",
    "beam_agents.integrations.telemetry",
)


def test_readme_snippets_import_only_the_public_api_and_the_extras_modules():
    import beam_agents

    imports = re.findall(r"^\s*from (beam_agents[\w.]*) import ([^\n]+)$", README, re.MULTILINE)
    assert imports, "the README shows no import"
    for module, names in imports:
        assert module == "beam_agents" or module in _EXTRAS, f"README imports from {module}"
        if module == "beam_agents":
            for name in (n.strip() for n in names.split(",")):
                assert name in beam_agents.__all__, f"{name} is not in beam_agents.__all__"


def test_the_public_api_section_lists_exactly_the_packages_names():
    import beam_agents

    listed = {
        name
        for line in _section("The public API").splitlines()
        if line.startswith(("- ", "  "))
        for name in re.findall(r"`([A-Za-z_]+)`", line)
    }
    assert listed - {"beam_agents"} >= set(beam_agents.__all__)
    for name in beam_agents.__all__:
        assert getattr(beam_agents, name) is not None
