"""The package layout's rules, read from the sources: the packages are layers, each importing
only itself and the layers below it, and test support is a leaf that only tests (and other test
support) import."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from beam_agents._moved import MOVED, new_path
from tools.workspace import source_root

ROOT = source_root()
PACKAGE = ROOT / "beam_agents"
TESTING = PACKAGE / "testing"


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


#: The packages of beam_agents, bottom up. A module may import its own package and the layers
#: below its own, never a layer above it or a package beside it in its layer: the data path
#: (bytes, coders, migrated state, intents, the runtime's context and commit, the effector, the
#: loop on a bus) reads upward. Tests (`*_test.py`) may import anything.
LAYERS = (
    ("errors", "_protos"),  # the one root error; the generated bindings
    ("wire",),
    ("state",),
    ("intents",),
    ("runtime",),
    ("integrations", "bus"),
    ("examples",),
    ("ops",),
    ("beam_agents",),  # the package root: the public API (__init__) and the moved paths (_moved)
    ("testing",),
)
_RANK = {package: rank for rank, layer in enumerate(LAYERS) for package in layer}


def _package_of(module: str) -> str:
    """The layer package of a module of beam_agents: its first component below beam_agents,
    or "beam_agents" for the package root's own modules other than errors and the bindings."""
    parts = module.split(".")
    if len(parts) == 1 or (parts[1] not in ("errors", "_protos") and _is_root_module(parts[1])):
        return "beam_agents"
    return parts[1]


def _is_root_module(name: str) -> bool:
    return (PACKAGE / f"{name}.py").is_file()


def _exists(module: str) -> bool:
    path = ROOT.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _names_module(name: str) -> bool:
    """Whether `name` is a module, here or at an old path (`from beam_agents import flink`)."""
    new = new_path(name)
    return _exists(name) or (name in MOVED and new is None) or (new is not None and _exists(new))


def _imports_of(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, module) for every module of beam_agents a file imports, at any depth, relative
    imports resolved; a string counts when it names an existing module (a `module:attribute`
    loader, importlib.import_module, a lazy-attribute table), not when it merely starts with
    the package's name (metric namespaces, trace attributes, tool names)."""
    tree = ast.parse(path.read_text() if source is None else source, filename=str(path))
    package = _module_of(path).rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names = [
                f"{base}.{a.name}" if _names_module(f"{base}.{a.name}") else base
                for a in node.names
            ]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            name = node.value.split(":", 1)[0]
            names = [name] if re.fullmatch(r"beam_agents(\.\w+)+", name) and _exists(name) else []
        else:
            continue
        found += [(node.lineno, n) for n in names if n.split(".")[0] == "beam_agents"]
    return found


def _layer_violations(path: Path, source: str | None = None) -> list[str]:
    own = _package_of(_module_of(path))
    found = []
    for line, module in _imports_of(path, source):
        where = f"{path.relative_to(ROOT)}:{line}: {own} imports"
        new = new_path(module)
        if new is not None or module in MOVED:
            advice = f"import {new}" if new else "it was split; import its modules' new paths"
            found.append(f"{where} the moved path {module}; {advice}")
        elif _package_of(module) != own and _RANK[_package_of(module)] >= _RANK[own]:
            found.append(
                f"{where} {module}, in layer {_RANK[_package_of(module)]} "
                f"({_package_of(module)}); {own} is in layer {_RANK[own]}"
            )
    return found


def _product_modules() -> list[Path]:
    return [path for path in PACKAGE.rglob("*.py") if not path.name.endswith("_test.py")]


def test_every_package_is_in_a_layer():
    packages = {_package_of(_module_of(path)) for path in _product_modules()}
    assert packages == set(_RANK)


def test_every_package_says_what_it_owns_and_what_it_may_import():
    """Subpackages too: each is a unit a reader meets on its own."""
    inits = [
        p for p in PACKAGE.rglob("__init__.py") if p.parent not in (PACKAGE, PACKAGE / "_protos")
    ]
    assert {"integrations/llm", "ops/console", "ops/demo", "intents/effector"} <= {
        str(init.parent.relative_to(PACKAGE)) for init in inits
    }
    missing = [
        str(init.relative_to(ROOT))
        for init in sorted(inits)
        if "may import" not in (ast.get_docstring(ast.parse(init.read_text())) or "")
    ]
    assert missing == []


def test_a_layer_violation_names_the_file_the_line_and_the_import():
    state = PACKAGE / "state" / "memory.py"
    upward = "import beam_agents.wire.fields\n\ndef f():\n    from beam_agents.runtime import X"
    assert _layer_violations(state, upward) == [
        "beam_agents/state/memory.py:4: state imports beam_agents.runtime, in layer 4 (runtime); "
        "state is in layer 2"
    ]
    beside = "load('beam_agents.integrations.telemetry:to_spans')"
    assert _layer_violations(PACKAGE / "bus" / "loop.py", beside) == [
        "beam_agents/bus/loop.py:1: bus imports beam_agents.integrations.telemetry, in layer 5 "
        "(integrations); bus is in layer 5"
    ]
    api = "from beam_agents import RunAgent, errors, _protos"
    assert _layer_violations(PACKAGE / "wire" / "fields.py", api) == [
        "beam_agents/wire/fields.py:1: wire imports beam_agents, in layer 8 (beam_agents); "
        "wire is in layer 1"
    ]
    not_modules = "COUNTER = 'beam_agents.effector'\nTOOL = 'beam_agents.budget'"
    assert _layer_violations(PACKAGE / "wire" / "fields.py", not_modules) == []


def test_an_import_of_a_moved_path_names_the_new_one():
    bus = PACKAGE / "ops" / "rounds.py"
    old = (
        "import beam_agents.kafka_bus\n"
        "from beam_agents.kafka_bus.loop import AgentLoop\n"
        "from beam_agents import flink\n"
        "from beam_agents.core import signing"
    )
    assert _layer_violations(bus, old) == [
        "beam_agents/ops/rounds.py:1: ops imports the moved path beam_agents.kafka_bus; "
        "import beam_agents.bus",
        "beam_agents/ops/rounds.py:2: ops imports the moved path beam_agents.kafka_bus.loop; "
        "import beam_agents.bus.loop",
        "beam_agents/ops/rounds.py:3: ops imports the moved path beam_agents.flink; "
        "import beam_agents.bus.flink",
        "beam_agents/ops/rounds.py:4: ops imports the moved path beam_agents.core.signing; "
        "import beam_agents.intents.signing",
    ]


def test_each_package_imports_only_itself_and_the_layers_below_it():
    violations = [v for path in sorted(_product_modules()) for v in _layer_violations(path)]
    assert violations == [], "\n".join(violations)


def _names_testing(path: Path, source: str | None = None) -> bool:
    return any(_package_of(module) == "testing" for _, module in _imports_of(path, source))


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
        assert _names_testing(here, source), source
    assert not _names_testing(here, "from beam_agents.ops import rounds")


def test_nothing_but_tests_imports_the_testing_package():
    product = [
        path
        for root in (PACKAGE, ROOT / "migrations")
        for path in root.rglob("*.py")
        if not path.name.endswith("_test.py") and TESTING not in path.parents
    ]
    assert len(product) > 40  # the walk found the package
    offenders = sorted(str(path.relative_to(ROOT)) for path in product if _names_testing(path))
    assert offenders == []
