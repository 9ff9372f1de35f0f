"""RunAgent's inputs from outside, through the real DoFn in real Beam pipelines (the
DirectRunner, or the runner $BEAM_AGENTS_PIPELINE_OPTIONS names): budget questions under
OnBudget.ASK, restored and agent-built Continuations, an agent's exception that cannot print
itself, a model's reported usage, a transport's idempotency key. Each was a crashed bundle that
wedged its key; each is now a result or a named dead letter."""

from __future__ import annotations

import ast
from pathlib import Path

from beam_agents._protos import ToolIntent
from beam_agents.intents.identity import intent_id
from beam_agents.ops.rounds import Advance, run_round
from beam_agents.runtime import (
    RuntimeConfig,
)
from beam_agents.runtime.budget import BUDGET_TOOL, Budget, OnBudget
from beam_agents.runtime.machine_state import COUNTERS
from beam_agents.runtime.run_agent import _AgentDoFn
from beam_agents.testing.probe import (
    KEY,
    SEQ,
    T0,
    Probe,
    approval,
    command,
    export,
    probe,
)

_RUNTIME = Path(__file__).parent


def _reasons(outputs) -> list[str]:
    return [record.reason for record in outputs.values("errors")]


# Item 4: every counter the machine counts is one the DoFn declares ---------------------------


def _counted_names() -> set[str]:
    """Every name the runtime's modules pass to `count(...)`, read from their source."""
    names = set()
    for path in _RUNTIME.glob("*.py"):
        if path.name.endswith("_test.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "count"
            ):
                (name,) = node.args
                assert isinstance(name, ast.Constant), f"{path.name}: count() of a non-literal"
                names.add(name.value)
    return names


def test_every_counter_the_machine_counts_is_declared_by_the_dofn_from_one_list():
    dofn = _AgentDoFn(Probe(), None, {}, RuntimeConfig(), None)
    assert _counted_names() == set(COUNTERS) == set(dofn._counters)


def test_on_budget_ask_puts_the_budget_before_a_person_whose_approval_lets_the_key_go_on(
    tmp_path,
):
    config = RuntimeConfig(budget=Budget(key_tokens=1, on_exceed=OnBudget.ASK, raise_tokens=10_000))
    question = ToolIntent(intent_id=intent_id(KEY, SEQ, 2**31), entity_key=KEY)
    outputs = run_round(
        probe(config),
        [
            command(T0, llm="a question that costs more than one token"),
            Advance(T0 + 10),
            approval(T0 + 20, question),
            Advance(T0 + 30),
            export(T0 + 40, "end"),
        ],
        tmp_path,
    )
    assert _reasons(outputs) == []
    (asked,) = outputs.values("intents")
    assert (asked.intent_id, asked.tool_name) == (question.intent_id, BUDGET_TOOL)
    assert outputs.values("completions") == [b"done"]
    (snapshot,) = outputs.values("snapshots")
    assert (snapshot.llm_cache.budget_grants, snapshot.llm_cache.token_allowance) == (1, 10_000)
