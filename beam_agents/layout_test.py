"""The package layout's rules, read from the sources: test support is a leaf that only tests
(and other test support) import."""

from __future__ import annotations

import ast
from pathlib import Path

from tools.workspace import source_root

ROOT = source_root()
PACKAGE = ROOT / "beam_agents"
TESTING = PACKAGE / "testing"


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _imported_modules(path: Path, source: str | None = None) -> set[str]:
    """Every module a file names: imports at any depth (a function's too), relative ones
    resolved, and strings that name a module (importlib.import_module, lazy-attribute tables,
    `module:attribute` loaders)."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    package = _module_of(path).rsplit(".", 1)[0]
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            modules.add(base)
            modules.update(f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            modules.add(node.value.split(":", 1)[0])
    return modules


def _names_testing(modules: set[str]) -> bool:
    return any(m == "beam_agents.testing" or m.startswith("beam_agents.testing.") for m in modules)


def test_every_way_of_naming_a_module_is_seen():
    here = PACKAGE / "errors.py"
    for source in [
        "import beam_agents.testing.samples",
        "import beam_agents.testing as t",
        "from beam_agents import testing",
        "from beam_agents.testing import samples",
        "from .testing import samples",
        "from . import testing",
        "def f():\n    from beam_agents.testing.engines import Engines",
        "importlib.import_module('beam_agents.testing.engines')",
        "_OWNERS = {'Engines': 'beam_agents.testing.engines'}",
        "load('beam_agents.testing.chaos:triage')",
    ]:
        assert _names_testing(_imported_modules(here, source)), source
    assert not _names_testing(_imported_modules(here, "from beam_agents.ops import rounds"))


def test_nothing_but_tests_imports_the_testing_package():
    product = [
        path
        for root in (PACKAGE, ROOT / "migrations")
        for path in root.rglob("*.py")
        if not path.name.endswith("_test.py") and TESTING not in path.parents
    ]
    assert len(product) > 40  # the walk found the package
    offenders = sorted(
        str(path.relative_to(ROOT)) for path in product if _names_testing(_imported_modules(path))
    )
    assert offenders == []
