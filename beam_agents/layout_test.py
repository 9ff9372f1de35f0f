"""The package layout's rules, read from the sources: test support is a leaf that only tests
(and other test support) import."""

from __future__ import annotations

import ast
from pathlib import Path

from tools.workspace import source_root

PACKAGE = source_root() / "beam_agents"
TESTING = PACKAGE / "testing"


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (a function's imports too)."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def test_nothing_but_tests_imports_the_testing_package():
    product = [
        path
        for path in PACKAGE.rglob("*.py")
        if not path.name.endswith("_test.py") and TESTING not in path.parents
    ]
    assert len(product) > 40  # the walk found the package
    offenders = sorted(
        str(path.relative_to(PACKAGE.parent))
        for path in product
        if any(
            m == "beam_agents.testing" or m.startswith("beam_agents.testing.")
            for m in _imported_modules(path)
        )
    )
    assert offenders == []
