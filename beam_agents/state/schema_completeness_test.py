"""The bump checklist, enforced: after CURRENT_STATE_SCHEMA_VERSION moves from n to n + 1,
this fails until every step, the frozen v<n> corpus and the new v<n+1> corpus exist, naming
exactly what is missing. beam_agents/state/bump_drill_test.py proves it on a copy of the
workspace with the version raised."""

from __future__ import annotations

from beam_agents.state.migration import default_registry
from tools import golden
from tools.workspace import source_root


def test_the_bump_checklist_is_complete():
    problems = golden.completeness_problems(source_root(), default_registry())
    assert problems == [], "bump checklist incomplete:\n" + "\n".join(problems)
