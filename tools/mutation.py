"""Mutation testing: does a test fail when the code is changed a little?

    .venv/bin/python tools/mutation.py [--jobs N] [--min-score PCT] PATHS...
    bash tools/dev.sh mutation PATHS...

PATHS are modules (`beam_agents/state/memory.py`) or folders (every non-test module under
them). Each module is parsed with `ast`, and each mutant is one small change of it:

  - an arithmetic, bitwise or augmented-assignment operator swapped (`+` -> `-`, `//` -> `*`),
  - a comparison moved across its boundary or negated (`<` -> `<=`, `==` -> `!=`, `in` ->
    `not in`, `is` -> `is not`),
  - `and` <-> `or`, a `not` or a unary minus dropped,
  - a constant changed (`n` -> `n + 1`, `True` <-> `False`, `"s"` -> `"XXsXX"`),
  - a `return EXPR` made `return None`, a call statement or a `raise` replaced by `pass`,
    `break` <-> `continue`.

Docstrings, annotations, `__all__`, f-strings (whose inner positions Python 3.11 does not
report) and lines ending in `# pragma: no mutate` are left alone.

Which tests, and how fast. A mutant runs only the tests that may fail on it. One baseline
run collects, under a line tracer restricted to the mutated modules' files, which lines each
test executes; the candidates are the test files that import the module through any chain of
the repository's modules (read statically with `ast`: a package's `__init__`, an import inside
a function and a folder's `conftest.py` count), those beside it, and those that name it (an
agent loaded as `MODULE:NAME`); or only the `--tests` given (faster, and the score is then
that of those tests). The session applies the suite's own options (`-m 'not engines and not
browser'`).
A mutant's tests are those that execute a line of it or of its innermost statement (a
compound statement's header: CPython puts a folded tuple of constants, or a multi-line
expression, on one of the statement's lines), fastest first: the first failure kills it. A
mutant that runs at import (a constant, a default value, a class attribute) also runs the tests
that execute the lines using what it defines, the module's own test files (`foo_test.py` and
`foo_*_test.py`, where defaults are pinned) and the test functions that import what it
defines (a test that compares a table with the docs executes none of the module's lines); if
none does, every test that executed the module. A mutant on a line no test executes is
reported as a survivor without being run (a line only a subprocess of a test executes counts
as unreached: the score is conservative, never inflated).

Two ways to run a mutant, both in children forked from this process after the heavy
third-party imports (`--preload`):

  - In place, for a mutant inside a function's body (most of them) whose lines no import or
    collection ran (a function building a constant or a test's parameters has made what it
    makes before the swap: it takes the fresh import). One pytest session per run, forked
    from the tool, collects the candidate test files of every module given (pooled) once; the
    baseline runs in a child of it and traces every mutated file at once.
    For each mutant the session compiles the mutated module, takes the code object
    of the outermost function holding the change (by qualified name and first line), and forks
    a child that assigns it to the `__code__` of every live function object made from the
    original: every reference (imports by name, bound methods, properties, decorator wrappers)
    then runs the mutant. The child runs only the selected, already collected items through
    pytest's runtestprotocol and stops at the first failure, so a mutant costs its tests, not
    a collection. Children are forked after collection but before any test ran in the
    session, so each starts from the state a fresh run would have after collecting.
  - Fresh import, for a mutant that runs at import (a constant, a class attribute, a default,
    a decorator), for a function that ran at import or collection or the session holds no
    live object of, and to confirm a timeout of the in-place path: a child runs pytest on the
    selected test functions with `-x`, and serves the mutant's source in place of the module
    through an import hook.

Both put the hook (tools/mutation_hook.py) on the children's PYTHONPATH as `sitecustomize`,
with the mutant's source named in the environment, so a Python process a test starts runs the
mutant too; the tree is never written. A child that outlives `--timeout-factor` times its
tests' baseline time (at least `--min-timeout` seconds; a fresh import adds the session's
start-up and collection time) is killed with its process group, and the mutant counts as
killed (an infinite loop is detected). `--jobs` children run at once.

Results are resumable: .cache/mutation/results.json holds each module's mutants by a stable id
(position, operator, alternative) under the module's source hash. A killed mutant stays killed
while the module is unchanged; a survivor is rerun when the candidate test files change, so
adding the missing test and rerunning costs only the survivors.

The score is killed / (killed + survived + unreached), per module and in total; a mutant whose
tests could not run (`error`) is reported and left out. A mutant under which a test module
fails to import is killed (its test fails at collection). A kill is checked: a child runs only
the mutant's selected tests, where a test module may fail to import alone (an import cycle
that works in one order only) or a test fail without the test run before it in the baseline;
so the tests the child ran are run again in that order without the mutant (once per such
list), and if they fail there too (no earlier), the mutant is an `error`, not a kill.

Sampling. `--sample F` runs a uniform random sample of the mutants, each kept with
probability F by a hash of its module, id and `--seed`: the same mutants on every run and
machine, so a sampled run resumes and its survivors can be fixed and rerun like a whole
run's. The total is then an estimate of the whole run's score, printed with its 95% Wilson
interval: a run of all 2,500 mutants of the three packages takes hours on 2 cores, a sample of
a few hundred a fraction of that.

`--min-score` makes the exit status 1 below it. benchmarks/results/mutation-<date>.md records
each measured run: the score per module and every survivor, with why it is equivalent,
accepted, or which test now kills it.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import gc
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from _pytest.runner import runtestprotocol

__all__ = ["Mutant", "Outcome", "Sample", "apply", "main", "mutants", "run", "wilson"]

_ROOT = Path(__file__).resolve().parent.parent
_PRAGMA = "# pragma: no mutate"
_HOOK = Path(__file__).resolve().with_name("mutation_hook.py")
_PRELOAD = "pytest,google.protobuf,hypothesis,apache_beam"

_BINOPS: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Mult,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
    ast.LShift: ast.RShift,
    ast.RShift: ast.LShift,
    ast.BitAnd: ast.BitOr,
    ast.BitOr: ast.BitAnd,
    ast.BitXor: ast.BitAnd,
}
_COMPARES: dict[type, type] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mutant:
    """One change of a module: the source span it replaces and the text it puts there."""

    id: str
    line: int
    end_line: int
    col: int
    end_col: int
    description: str
    replacement: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """What the tests did to one mutant: `killed`, `timeout`, `survived`, `unreached` or `error`."""

    status: str
    seconds: float
    tests_sha: str
    detail: str = ""


def _op_text(op: ast.AST) -> str:
    return ast.unparse(ast.BinOp(ast.Name("a"), op, ast.Name("b")))[2:-2]


def _cmp_text(op: ast.AST) -> str:
    return ast.unparse(ast.Compare(ast.Name("a"), [op], [ast.Name("b")]))[2:-2]


class _Collector(ast.NodeVisitor):
    def __init__(self, source: str) -> None:
        self.found: list[Mutant] = []
        self._lines = source.splitlines()

    def _add(self, node: ast.AST, kind: str, description: str, replacement: str) -> None:
        line = node.lineno
        if any(self._lines[n - 1].rstrip().endswith(_PRAGMA) for n in (line, node.end_lineno)):
            return
        self.found.append(
            Mutant(
                id=f"{line}:{node.col_offset}:{kind}",
                line=line,
                end_line=node.end_lineno,
                col=node.col_offset,
                end_col=node.end_col_offset,
                description=description,
                replacement=replacement,
            )
        )

    def _expr(self, node: ast.AST, kind: str, description: str, new: ast.AST) -> None:
        self._add(node, kind, description, f"({ast.unparse(new)})")

    # What is never mutated: docstrings, annotations, __all__, f-strings.
    def _body(self, body: list[ast.stmt]) -> None:
        start = 0
        first = body[0] if body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            start = int(isinstance(first.value.value, str))
        for stmt in body[start:]:
            self.visit(stmt)

    def visit_Module(self, node: ast.Module) -> None:
        self._body(node.body)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for item in [*node.decorator_list, *node.bases, *node.keywords]:
            self.visit(item)
        self._body(node.body)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for item in node.decorator_list:
            self.visit(item)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        self._body(node.body)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_Assign(self, node: ast.Assign) -> None:
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return
        self.visit(node.value)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return

    def visit_If(self, node: ast.If) -> None:
        if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return
        self.generic_visit(node)

    # The mutations.
    def visit_BinOp(self, node: ast.BinOp) -> None:
        new = _BINOPS.get(type(node.op))
        if new is not None:
            self._expr(
                node,
                "binop",
                f"`{_op_text(node.op)}` -> `{_op_text(new())}`",
                ast.BinOp(node.left, new(), node.right),
            )
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        new = _BINOPS.get(type(node.op))
        if new is not None:
            self._add(
                node,
                "augassign",
                f"`{_op_text(node.op)}=` -> `{_op_text(new())}=`",
                ast.unparse(ast.AugAssign(node.target, new(), node.value)),
            )
        self.visit(node.value)

    def visit_Compare(self, node: ast.Compare) -> None:
        for i, op in enumerate(node.ops):
            new = _COMPARES[type(op)]
            ops = list(node.ops)
            ops[i] = new()
            self._expr(
                node,
                f"compare{i}",
                f"`{_cmp_text(op)}` -> `{_cmp_text(new())}`",
                ast.Compare(node.left, ops, node.comparators),
            )
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        new, text = (
            (ast.Or(), "`and` -> `or`")
            if isinstance(node.op, ast.And)
            else (ast.And(), "`or` -> `and`")
        )
        self._expr(node, "boolop", text, ast.BoolOp(new, node.values))
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not):
            self._expr(node, "not", "`not` dropped", node.operand)
        elif isinstance(node.op, ast.USub) and not isinstance(node.operand, ast.Constant):
            self._expr(node, "neg", "unary `-` dropped", node.operand)
        elif isinstance(node.op, ast.USub):
            # `-1` is one constant to a reader: mutate it as one.
            self._constant(node, -node.operand.value)
            return
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        self._constant(node, node.value)

    def _constant(self, node: ast.AST, value: object) -> None:
        if isinstance(value, bool):
            new: object = not value
        elif isinstance(value, int | float):
            new = value + 1
        elif isinstance(value, str | bytes):
            new = value * 0 + ("XX" if isinstance(value, str) else b"XX") + value
            new = new + new[:2]
        else:
            return
        self._add(node, "const", f"`{value!r}` -> `{new!r}`", f"({new!r})")

    def visit_Return(self, node: ast.Return) -> None:
        if node.value is not None and not (
            isinstance(node.value, ast.Constant) and node.value.value is None
        ):
            self._add(node, "return", "`return …` -> `return None`", "return None")
            self.visit(node.value)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Call | ast.Await):
            self._add(node, "stmt", "call statement removed", "pass")
        self.visit(node.value)

    def visit_Raise(self, node: ast.Raise) -> None:
        self._add(node, "raise", "`raise` removed", "pass")
        self.generic_visit(node)

    def visit_Break(self, node: ast.Break) -> None:
        self._add(node, "break", "`break` -> `continue`", "continue")

    def visit_Continue(self, node: ast.Continue) -> None:
        self._add(node, "continue", "`continue` -> `break`", "break")


def mutants(source: str) -> list[Mutant]:
    """Every mutant of `source` that compiles, in source order."""
    collector = _Collector(source)
    collector.visit(ast.parse(source))
    valid = []
    seen: set[str] = set()
    for mutant in collector.found:
        try:
            compile(apply(source, mutant), "<mutant>", "exec", dont_inherit=True)
        except SyntaxError:
            continue
        if mutant.id in seen:
            # Nested operators that start at one column (`4 * 1024 * 1024`): the inner one,
            # found second, gains its end, so that each mutant keeps an id of its own.
            mutant = dataclasses.replace(
                mutant, id=f"{mutant.id}@{mutant.end_line}:{mutant.end_col}"
            )
        seen.add(mutant.id)
        valid.append(mutant)
    return valid


def apply(source: str, mutant: Mutant) -> str:
    """`source` with `mutant`'s span replaced (ast columns are UTF-8 byte offsets)."""
    lines = source.splitlines(keepends=True)

    def offset(line: int, col: int) -> int:
        before = sum(len(text) for text in lines[: line - 1])
        return before + len(lines[line - 1].encode("utf-8")[:col].decode("utf-8"))

    start = offset(mutant.line, mutant.col)
    end = offset(mutant.end_line, mutant.end_col)
    return source[:start] + mutant.replacement + source[end:]


# Which tests run a module's lines.


def _dotted(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


_SKIPPED = {"node_modules", "build", "dist"}


def _sources(root: Path) -> dict[str, Path]:
    """The repository's Python modules by dotted name (packages by their `__init__`)."""
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if parts[0].startswith(".") or parts[0] in _SKIPPED:
            continue
        found[_dotted(path, root)] = path
    return found


def _package(path: Path, root: Path) -> str:
    """The package a relative import in `path` starts from."""
    dotted = _dotted(path, root)
    return dotted if path.name == "__init__.py" else dotted.rpartition(".")[0]


def _from(node: ast.ImportFrom, package: str) -> str:
    """The absolute name of the module a `from ... import` statement in `package` reads."""
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    return base


def _imported(path: Path, root: Path, known: dict[str, Path]) -> set[str]:
    """The repository modules `path` imports anywhere in its body (a function's import too).

    Importing `a.b.c` runs `a` and `a.b` first, so a package's `__init__` counts as imported,
    and `from a.b import c` imports the module `a.b.c` when there is one.
    """
    package = _package(path, root)
    names: set[str] = set()
    try:
        # Bytes: `ast` reads a file's coding declaration as Python does.
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        return set()  # data, not a module (a syntax error a linter's test reads)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _from(node, package)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    found = set()
    for name in names:
        parts = name.split(".")
        found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return found & known.keys()


@functools.cache
def _import_graph(root: Path) -> tuple[dict[str, Path], dict[str, set[str]]]:
    """The repository's modules, and for each the modules that import it directly."""
    known = _sources(root)
    users: dict[str, set[str]] = {}
    for name, path in known.items():
        for imported in _imported(path, root, known):
            users.setdefault(imported, set()).add(name)
    return known, users


def _importers(target: str, root: Path) -> set[Path]:
    """The test files that import `target`, through any chain of the repository's modules
    (their folders' `conftest.py` included)."""
    known, users = _import_graph(root)
    reached, todo = {target}, [target]
    while todo:
        for user in users.get(todo.pop(), ()):
            if user not in reached:
                reached.add(user)
                todo.append(user)
    found = set()
    for name, path in known.items():
        if not path.name.endswith("_test.py"):
            continue
        conftests = {
            _dotted(root / folder / "conftest.py", root)
            for folder in path.relative_to(root).parents
            if (root / folder / "conftest.py").is_file()
        }
        if name in reached or conftests & reached:
            found.add(path)
    return found


def _candidates(path: Path, root: Path, chosen: list[Path]) -> list[Path]:
    """The test files that may run `path`: those importing it through any chain of modules,
    those beside it, and those naming it (an agent loaded as `MODULE:NAME`)."""
    if chosen:
        return sorted(chosen)
    dotted = _dotted(path, root)
    package, _, name = dotted.rpartition(".")
    names = re.compile(
        rf"\b{re.escape(dotted)}\b|from\s+{re.escape(package)}\s+import\s+[^\n]*\b{re.escape(name)}\b"
    )
    found = set(path.parent.glob("*_test.py")) | _importers(dotted, root)
    for test in root.rglob("*_test.py"):
        parts = test.relative_to(root).parts
        if parts[0].startswith(".") or parts[0] in _SKIPPED:
            continue
        if test not in found and names.search(test.read_text(encoding="utf-8", errors="replace")):
            found.add(test)
    return sorted(found)


class _Tracer:
    """Per mutated file and test id, the lines it executes (a pytest plugin for the baseline)."""

    def __init__(self, filenames: list[str], out: Path) -> None:
        self.out = out
        self.current = "<import>"
        self.lines: dict[str, dict[str, set[int]]] = {name: {} for name in filenames}
        self.seconds: dict[str, float] = {}
        self.failed: set[str] = set()

    def _local(self, frame, event, arg):
        if event in ("line", "call"):
            found = self.lines[frame.f_code.co_filename]
            found.setdefault(self.current, set()).add(frame.f_lineno)
        return self._local

    def _global(self, frame, event, arg):
        if frame.f_code.co_filename in self.lines:
            return self._local(frame, event, arg)
        return None

    def start(self) -> None:
        threading.settrace(self._global)
        sys.settrace(self._global)

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        self.current = nodeid

    def pytest_runtest_logreport(self, report) -> None:
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        if report.failed:
            self.failed.add(report.nodeid)

    def pytest_runtest_logfinish(self, nodeid, location) -> None:
        self.current = "<import>"

    def write(self) -> None:
        # The tracer lives in a forked child: its findings go back through a file.
        sys.settrace(None)
        threading.settrace(None)
        found = {
            "lines": {
                name: {test: sorted(lines) for test, lines in tests.items()}
                for name, tests in self.lines.items()
            },
            "seconds": self.seconds,
            "failed": sorted(self.failed),
        }
        self.out.write_text(json.dumps(found))


def _sha(paths: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


# Running children.


def _hook():
    """tools/mutation_hook.py, loaded by its path: the tool also runs on a fixture tree."""
    spec = importlib.util.spec_from_file_location("mutation_hook", _HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _kill(pid: int) -> None:
    """Kill a child and every process it started (its own process group), and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


class _Cache:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.data = json.loads(path.read_text()) if path.exists() else {}

    def module(self, name: str, source_sha: str) -> dict:
        entry = self.data.get(name)
        if not entry or entry.get("source_sha") != source_sha:
            entry = self.data[name] = {"source_sha": source_sha, "mutants": {}}
        return entry

    def reload(self) -> None:
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {}

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, sort_keys=True))
        tmp.replace(self.path)


def _defined(tree: ast.Module, line: int) -> tuple[ast.stmt | None, set[str]]:
    """The module- or class-level statement at `line`, and the names it binds."""
    body = tree.body
    while True:
        stmt = next((s for s in body if s.lineno <= line <= s.end_lineno), None)
        if isinstance(stmt, ast.ClassDef) and stmt.body[0].lineno <= line:
            body = stmt.body
            continue
        break
    if isinstance(stmt, ast.Assign | ast.AnnAssign):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return stmt, {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return stmt, set()


def _users(tree: ast.Module, line: int) -> set[int]:
    """The lines where what a module- or class-level statement at `line` defines is used.

    Such a statement runs once, at import, inside no test: a mutant of a constant or of a
    default value matters where the name is read, or where the function runs.
    """
    stmt, names = _defined(tree, line)
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
        return set(range(stmt.body[0].lineno, stmt.end_lineno + 1))
    return {
        node.lineno
        for node in ast.walk(tree)
        if (isinstance(node, ast.Name) and node.id in names and node.lineno != stmt.lineno)
        or (isinstance(node, ast.Attribute) and node.attr in names)
    }


def _span(tree: ast.Module, mutant: Mutant) -> set[int]:
    """The lines a tracer may report for `mutant`: its own and its innermost statement's (a
    compound statement's header only).

    CPython puts a folded constant (a tuple of literals over several lines) and the parts of a
    multi-line expression on one of the statement's lines, not always the mutant's.
    """
    inner = None
    for node in ast.walk(tree):  # outer statements come before the statements they hold
        if isinstance(node, ast.stmt) and node.lineno <= mutant.line <= node.end_lineno:
            inner = node
    span = set(range(mutant.line, mutant.end_line + 1))
    if inner is not None:
        body = getattr(inner, "body", None)
        end = body[0].lineno - 1 if isinstance(body, list) and body else inner.end_lineno
        span.update(range(inner.lineno, max(inner.lineno, end) + 1))
    return span


def _readers(job: _Job, names: set[str]) -> set[str]:
    """The test functions (`file::name`, or `file::Class::name`) of the module's candidate
    files that read one of `names` from it: imported by name (`from pkg.limits import LIMIT`,
    relative or renamed too) and used, or read as an attribute of the module (`from pkg import
    limits`, `import pkg.limits as lim`, `import pkg.limits`). A test that reads a constant
    directly executes none of the module's lines."""
    found: set[str] = set()
    if not names:
        return found
    for path in job.tests:
        tree = ast.parse(path.read_bytes())
        package = _package(path, job.root)
        local: set[str] = set()  # the test module's names for `names`
        modules: set[str] = set()  # its names for the module, or for a package above it
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _from(node, package)
                for alias in node.names:
                    if base == job.dotted and alias.name in names:
                        local.add(alias.asname or alias.name)
                    elif f"{base}.{alias.name}" == job.dotted:
                        modules.add(alias.asname or alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if f"{job.dotted}.".startswith(f"{alias.name}."):
                        modules.add(alias.asname or alias.name.partition(".")[0])
        if not local and not modules:
            continue
        rel = path.relative_to(job.root).as_posix()
        functions = ast.FunctionDef | ast.AsyncFunctionDef
        tests = [(f"{rel}::{f.name}", f) for f in tree.body if isinstance(f, functions)]
        tests += [
            (f"{rel}::{c.name}::{f.name}", f)
            for c in tree.body
            if isinstance(c, ast.ClassDef)
            for f in c.body
            if isinstance(f, functions)
        ]
        for nodeid, function in tests:
            nodes = list(ast.walk(function))
            used = {n.id for n in nodes if isinstance(n, ast.Name)}
            used |= {n.asname or n.name for n in nodes if isinstance(n, ast.alias)}
            attrs = {n.attr for n in nodes if isinstance(n, ast.Attribute)}
            if function.name.startswith("test") and (
                local & used or (modules & used and names & attrs)
            ):
                found.add(nodeid)
    return found


def _select(mutant: Mutant, job: _Job, base: dict, *, by_function: bool) -> list[str]:
    """The tests that may fail on `mutant`, cheapest first: node ids, or test functions.

    Those that execute its lines; for a mutant that runs at import (a constant, a default, a
    class attribute), also those that execute the lines reading what it defines, the module's
    own test files (`foo_test.py`, `foo_*_test.py`: where defaults are pinned), and the test
    functions that import what it defines.
    A fresh-import child selects by function, not parameter id: an id may name a value of the
    process that collected it (a pid, a temporary path), which that child does not reproduce;
    but a function one of whose parameters fails without a mutant is given by its passing ids.
    """
    lines: dict[str, list[int]] = base.get("lines", {})
    seconds: dict[str, float] = base.get("seconds", {})
    failed = set(base.get("failed", []))
    span = _span(job.tree, mutant)
    tests = {t for t, hit in lines.items() if t != "<import>" and span & set(hit)}
    users = _users(job.tree, mutant.line)
    if _target(job.tree, mutant) is None:
        own = {p.relative_to(job.root).as_posix() for p in job.own_tests}
        readers = _readers(job, _defined(job.tree, mutant.line)[1])
        tests.update(t for t, hit in lines.items() if t != "<import>" and users & set(hit))
        tests.update(
            t for t in seconds if t.split("::", 1)[0] in own or t.split("[", 1)[0] in readers
        )
    if not tests and span & set(lines.get("<import>", [])):
        # Run at import only (a helper building a constant): the tests that reach the lines
        # using it, else every test that runs this module, which is slow but never calls a
        # mutant unreached that is not.
        tests = {t for t, hit in lines.items() if t != "<import>" and users & set(hit)}
        tests = tests or {t for t in lines if t != "<import>"}
    # A fresh-import child runs every parameter of a function it is given: of a function one
    # of whose parameters fails without a mutant it is given the passing parameters by id (an
    # id it does not reproduce is its error, never a kill).
    broken = {test.split("[", 1)[0] for test in failed}
    cost: dict[str, float] = {}
    for test in tests:
        if test not in failed:
            key = test.split("[", 1)[0]
            key = key if by_function and key not in broken else test
            cost[key] = cost.get(key, 0.0) + seconds.get(test, 0.0)
    return sorted(cost, key=lambda key: (cost[key], key))


_KILLED = {"killed", "timeout"}
# The detail of a kill by a test module's failed import: `_reimport` checks that the same tests
# collect without the mutant.
_COLLECTION = "a test module failed to import"


def _outcome(code: int | None, seconds: float, tests_sha: str, log: Path) -> Outcome:
    if code is None:
        return Outcome(status="timeout", seconds=seconds, tests_sha=tests_sha)
    if code == 0:
        return Outcome(status="survived", seconds=seconds, tests_sha=tests_sha)
    # 1: a test failed.
    if code == 1:
        return Outcome(status="killed", seconds=seconds, tests_sha=tests_sha)
    text = log.read_text(errors="replace") if log.exists() else ""
    # 2: collection failed (the mutant broke an import); 4 with a collection error: a test
    # module named by id failed to import under the mutant (a constant a test module's own
    # constant is built from); 4 alone is a bad test id.
    if code == 2 or (code == 4 and "ERROR collecting" in text):
        return Outcome(status="killed", seconds=seconds, tests_sha=tests_sha, detail=_COLLECTION)
    tail = text[-2000:]
    return Outcome(
        status="error",
        seconds=seconds,
        tests_sha=tests_sha,
        detail=f"exit {code}: {tail}",
    )


def _module_paths(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found.extend(
                p
                for p in sorted(path.rglob("*.py"))
                if not p.name.endswith("_test.py") and "_protos" not in p.parts
            )
        else:
            found.append(path)
    return found


def run(
    paths: list[Path],
    *,
    root: Path,
    jobs: int = 1,
    timeout_factor: float = 3.0,
    min_timeout: float = 20.0,
    chosen_tests: list[Path] = (),
    cache_path: Path | None = None,
    fresh: bool = False,
    report_only: bool = False,
    sample: Sample | None = None,
    out=print,
) -> dict[str, dict[str, tuple[Mutant, Outcome]]]:
    """Run every mutant (or `sample`'s) of every module under `paths`; returns module -> id ->
    result."""
    root = root.resolve()
    cache = _Cache(cache_path or root / ".cache" / "mutation" / "results.json")
    work = Path(tempfile.mkdtemp(prefix="mutation-"))
    hookdir = work / "hook"
    hookdir.mkdir()
    shutil.copy(_HOOK, hookdir / "sitecustomize.py")
    pythonpath = os.pathsep.join(
        p for p in (str(hookdir), str(root), os.environ.get("PYTHONPATH", "")) if p
    )
    results: dict[str, dict[str, tuple[Mutant, Outcome]]] = {}
    try:
        modules = []
        for path in _module_paths([p.resolve() for p in paths]):
            module = _module(
                path,
                root=root,
                cache=cache,
                chosen_tests=[p.resolve() for p in chosen_tests],
                work=work,
                pythonpath=pythonpath,
                jobs=jobs,
                timeout_factor=timeout_factor,
                min_timeout=min_timeout,
                fresh=fresh,
                report_only=report_only,
                sample=sample,
            )
            out(
                f"{module.name}: {len(module.found)} mutants, {len(module.pending)} to run"
                f" ({len(module.in_place)} in place), {len(module.tests)} test files"
            )
            modules.append(module)
        active = [m for m in modules if m.pending]
        if active:
            # One session for every module: their candidate test files, pooled, are collected
            # and traced once.
            pooled = sorted({test for m in active for test in m.tests})
            pooled_sha = _sha(pooled)
            baseline = any(m.entry.get("baseline_tests_sha") != pooled_sha for m in active)
            left: dict[str, list[str]] = {}
            if baseline or any(m.in_place for m in active):
                left = _session(active, pooled, pooled_sha, baseline=baseline, cache=cache)
            # The session wrote its results to the cache file from its own process.
            cache.reload()
            for m in active:
                entry = cache.module(m.name, m.source_sha)
                again = [
                    x for x in m.pending if x not in m.in_place or x.id in left.get(m.name, [])
                ]
                _reimport(
                    m.job,
                    again,
                    entry["baseline"],
                    functools.partial(_record, cache, entry),
                )
        for m in modules:
            entry = cache.module(m.name, m.source_sha)
            results[m.name] = {
                x.id: (x, Outcome(**entry["mutants"][x.id]))
                for x in m.found
                if x.id in entry["mutants"]
            }
            _report(m.name, m.job.source, results[m.name], out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Module:
    """One module of a run: its mutants, those to run, and its candidate test files."""

    name: str
    source_sha: str
    entry: dict
    tests: list[Path]
    found: list[Mutant]
    pending: list[Mutant]
    in_place: list[Mutant]
    job: _Job


def _module(
    path: Path,
    *,
    root: Path,
    cache: _Cache,
    chosen_tests: list[Path],
    fresh: bool,
    report_only: bool,
    sample: Sample | None,
    **job,
) -> _Module:
    name = str(path.relative_to(root))
    source = path.read_text(encoding="utf-8")
    source_sha = hashlib.sha256(source.encode()).hexdigest()[:16]
    entry = cache.module(name, source_sha)
    if fresh:
        entry["mutants"] = {}
    tests = _candidates(path, root, chosen_tests)
    tests_sha = _sha(tests)
    found = [m for m in mutants(source) if sample is None or sample.keeps(name, m)]
    done = entry["mutants"]
    pending = [
        m
        for m in found
        if m.id not in done
        or done[m.id]["status"] == "error"
        or (done[m.id]["status"] not in _KILLED and done[m.id]["tests_sha"] != tests_sha)
    ]
    if report_only:
        pending = []
    mutated = _Job(
        path=path,
        source=source,
        tree=ast.parse(source),
        dotted=_dotted(path, root),
        tests=tuple(tests),
        own_tests=tuple(
            test
            for test in tests
            if test.parent == path.parent
            and (test.name == f"{path.stem}_test.py" or test.name.startswith(f"{path.stem}_"))
        ),
        tests_sha=tests_sha,
        root=root,
        **job,
    )
    return _Module(
        name=name,
        source_sha=source_sha,
        entry=entry,
        tests=tests,
        found=found,
        pending=pending,
        in_place=[m for m in pending if _target(mutated.tree, m) is not None],
        job=mutated,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sample:
    """A uniform random sample of mutants, the same for every run with the same seed."""

    fraction: float
    seed: int = 0

    def keeps(self, module: str, mutant: Mutant) -> bool:
        digest = hashlib.sha256(f"{self.seed}\0{module}\0{mutant.id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") < self.fraction * 2**64


def wilson(killed: int, scored: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion `killed` of `scored` (as fractions)."""
    if not scored:
        return 0.0, 1.0
    p = killed / scored
    centre = (p + z * z / (2 * scored)) / (1 + z * z / scored)
    half = z / (1 + z * z / scored) * (p * (1 - p) / scored + z * z / (4 * scored**2)) ** 0.5
    return max(0.0, centre - half), min(1.0, centre + half)


def _record(cache: _Cache, entry: dict, mutant: Mutant, outcome: Outcome) -> None:
    # Saved at once: an interrupted run resumes from here.
    entry["mutants"][mutant.id] = dataclasses.asdict(outcome)
    cache.save()


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Job:
    """One module's run: what every child of it needs."""

    path: Path
    source: str
    tree: ast.Module
    dotted: str
    tests: tuple[Path, ...]
    own_tests: tuple[Path, ...]
    tests_sha: str
    root: Path
    work: Path
    pythonpath: str
    jobs: int
    timeout_factor: float
    min_timeout: float

    def mutant_env(self, mutant: Mutant) -> dict[str, str]:
        """The mutant's source in a file, named to the import hook of a test's subprocess."""
        file = self.work / f"mutant-{os.getpid()}-{time.monotonic_ns()}.py"
        file.write_text(apply(self.source, mutant), encoding="utf-8")
        return {
            "PYTHONPATH": self.pythonpath,
            "BEAM_AGENTS_MUTANT_MODULE": self.dotted,
            "BEAM_AGENTS_MUTANT_SOURCE": str(file),
        }

    def budget(self, seconds: float) -> float:
        return max(self.min_timeout, self.timeout_factor * seconds)


def _target(tree: ast.Module, mutant: Mutant) -> tuple[str, int] | None:
    """The function whose body holds `mutant`: its qualified name and its code's first line.

    The outermost function only (a module's or a class's, at any depth of classes): replacing
    its code replaces the code of every function nested in it too. None for a mutant that runs
    at import (a module constant, a class attribute, a default value, a decorator).
    """

    def find(body: list[ast.stmt], prefix: str) -> tuple[str, int] | None:
        for stmt in body:
            if not stmt.lineno <= mutant.line <= stmt.end_lineno:
                continue
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                first = stmt.body[0]
                if (mutant.line, mutant.col) < (first.lineno, first.col_offset):
                    return None
                # A decorated function's code starts at its first decorator.
                start = min([d.lineno for d in stmt.decorator_list] + [stmt.lineno])
                return prefix + stmt.name, start
            if isinstance(stmt, ast.ClassDef):
                return find(stmt.body, f"{prefix}{stmt.name}.")
            # A def under a module-level `if`, `try` or `with` is still the module's.
            bodies = [getattr(stmt, f, None) or [] for f in ("body", "orelse", "finalbody")]
            bodies += [h.body for h in getattr(stmt, "handlers", [])]
            for inner in bodies:
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    found = find(inner, prefix)
                    if found is not None:
                        return found
        return None

    return find(tree.body, "")


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _live_functions(filename: str) -> dict[tuple[str, int], list[types.FunctionType]]:
    """Every function object of the module at `filename` in this process, by name and line."""
    real = os.path.realpath(filename)
    ours: dict[str, bool] = {}
    found: dict[tuple[str, int], list[types.FunctionType]] = {}
    for obj in gc.get_objects():
        if isinstance(obj, types.FunctionType):
            code = obj.__code__
            if code.co_filename not in ours:
                ours[code.co_filename] = os.path.realpath(code.co_filename) == real
            if ours[code.co_filename]:
                found.setdefault((code.co_qualname, code.co_firstlineno), []).append(obj)
    return found


def _fork(body, log: Path) -> int:
    """Run `body()` in a child in its own process group, its output in `log`; its pid.

    The child exits with what `body` returns, or 99 (with the traceback in `log`) if it raised.
    """
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setpgid(0, 0)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        code = body()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(99)


def _fork_pytest(
    args: list[str],
    *,
    root: Path,
    log: Path,
    env: dict[str, str],
    plugin=None,
    tracer=None,
) -> int:
    def body() -> int:
        os.environ.update(env)
        os.chdir(root)
        sys.path[:0] = [
            str(root),
            *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p),
        ]
        _hook().install()
        if tracer is not None:
            tracer.start()
        return pytest.main(
            ["-q", "-p", "no:cacheprovider", "--no-header", "-rN", *args],
            plugins=[plugin] if plugin is not None else [],
        )

    return _fork(body, log)


def _wait(pid: int) -> int:
    try:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    except BaseException:
        # Interrupted: a SIGTERM lets the child kill its own children first.
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and os.waitpid(pid, os.WNOHANG)[0] == 0:
            time.sleep(0.1)
        _kill(pid)
        raise


def _session(
    modules: list[_Module],
    tests: list[Path],
    tests_sha: str,
    *,
    baseline: bool,
    cache: _Cache,
) -> dict[str, list[str]]:
    """Collect `tests` once, and run there the baseline (if `baseline`) and each module's
    in-place mutants.

    Returns, per module, the ids of the mutants left to the fresh-import path: those whose
    function the session holds no object of, and those that timed out in place (confirmed
    there from scratch).
    """
    job = modules[0].job
    left = job.work / "left.json"
    log = job.work / "session.log"
    tracer = None
    if baseline:
        tracer = _Tracer([str(m.job.path) for m in modules], job.work / "baseline.json")

    def save_baseline(found: dict) -> None:
        for m in modules:
            m.entry["baseline"] = {**found, "lines": found["lines"][str(m.job.path)]}
            m.entry["baseline_tests_sha"] = tests_sha
        cache.save()

    plugin = _Session(
        modules,
        tracer=tracer,
        save_baseline=save_baseline,
        record=lambda m: functools.partial(_record, cache, m.entry),
        left=left,
    )
    # -s: a child's test output goes to its log, not to a capture file every child shares.
    pid = _fork_pytest(
        ["-s", *map(str, tests)],
        root=job.root,
        log=log,
        env={"PYTHONPATH": job.pythonpath},
        plugin=plugin,
        tracer=tracer,
    )
    code = _wait(pid)
    if not left.exists():
        raise SystemExit(
            f"mutation: the test session failed (exit {code}):\n"
            f"{log.read_text(errors='replace')[-3000:]}"
        )
    return json.loads(left.read_text())


class _Session:
    """The pytest plugin of a run's session: collect once, fork a child per mutant.

    The session itself runs no test: the baseline and each mutant run in children forked
    after collection, so each starts from the same state a fresh pytest run would have.
    A mutant's child puts the mutated function's code into every function object made from
    the original (`__code__` is swapped in place, so every reference, bound method, property
    and decorator wrapper sees it) and runs its selected items, stopping at the first failure.
    """

    def __init__(self, modules: list[_Module], *, tracer, save_baseline, record, left):
        self.modules = modules
        self.tracer = tracer
        self.save_baseline = save_baseline
        self.record = record
        self.left = left
        self.created = time.monotonic()

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session) -> bool:
        if self.tracer is not None:
            sys.settrace(None)
            threading.settrace(None)
        if session.testsfailed:
            return True  # a collection error: no `left` file, the tool shows the log
        items = list(session.items)
        if self.tracer is not None:
            found = self._baseline(session.config, items, startup=time.monotonic() - self.created)
            self.save_baseline(found)
        left: dict[str, list[str]] = {}
        for module in self.modules:
            ids = left[module.name] = []
            verify: dict = {}
            _schedule(
                module.in_place,
                jobs=module.job.jobs,
                launch=self._plan(module.job, items, module.entry["baseline"], ids, verify),
                record=self._record(self.record(module), ids, verify),
                tests_sha=module.job.tests_sha,
            )
        self.left.write_text(json.dumps(left))
        return True

    def _baseline(self, config, items: list, *, startup: float) -> dict:
        tracer = self.tracer

        def body() -> int:
            config.pluginmanager.register(tracer)
            tracer.start()
            for i, item in enumerate(items):
                following = items[i + 1] if i + 1 < len(items) else None
                item.ihook.pytest_runtest_protocol(item=item, nextitem=following)
            tracer.write()
            return 0

        log = tracer.out.with_suffix(".log")
        code = _wait(_fork(body, log))
        if not tracer.out.exists():
            raise SystemExit(
                f"mutation: the baseline run failed (exit {code}):\n"
                f"{log.read_text(errors='replace')[-3000:]}"
            )
        found = json.loads(tracer.out.read_text())
        # What a fresh-import child spends before its tests (pytest start-up, collection).
        found["startup"] = startup
        if found["failed"]:
            failed = found["failed"]
            print(f"mutation: {len(failed)} tests fail without a mutant, not used: {failed[:5]}")
        return found

    @staticmethod
    def _plan(job: _Job, items: list, base: dict, left: list[str], verify: dict):
        by_id = {item.nodeid: item for item in items}
        by_function: dict[str, list] = {}
        for item in items:
            by_function.setdefault(item.nodeid.split("[", 1)[0], []).append(item)
        functions = _live_functions(str(job.path))
        filename = next((fs[0].__code__.co_filename for fs in functions.values()), str(job.path))
        seconds = base.get("seconds", {})
        imported = set(base.get("lines", {}).get("<import>", []))

        def launch(mutant: Mutant):
            if _span(job.tree, mutant) & imported:
                # The function ran at import or collection (it built a constant, or a test's
                # parameters): code swapped in after collection changes none of what it made.
                left.append(mutant.id)
                return None
            selected: list = []
            for test in _select(mutant, job, base, by_function=False):
                # A cached baseline from another process may name a parameter differently.
                for item in [by_id[test]] if test in by_id else by_function.get(test, []):
                    if item not in selected:
                        selected.append(item)
            if not selected:
                return Outcome(status="unreached", seconds=0.0, tests_sha=job.tests_sha)
            key = _target(job.tree, mutant)
            originals = functions.get(key, [])
            code = compile(apply(job.source, mutant), filename, "exec", dont_inherit=True)
            new = next(
                (c for c in _codes(code) if (c.co_qualname, c.co_firstlineno) == key),
                None,
            )
            if (
                new is None
                or not originals
                or any(len(f.__code__.co_freevars) != len(new.co_freevars) for f in originals)
            ):
                left.append(mutant.id)
                return None
            env = job.mutant_env(mutant)
            failed = _failed_file(job, mutant)

            def body() -> int:
                os.environ.update(env)
                for function in originals:
                    function.__code__ = new
                return _run_items(selected, failed)

            log = Path(env["BEAM_AGENTS_MUTANT_SOURCE"]).with_suffix(".log")
            spent = sum(seconds.get(item.nodeid, 0.0) for item in selected)
            verify[mutant.id] = functools.partial(passes, selected, failed)
            return _fork(body, log), job.budget(spent), log

        clean: dict[tuple[str, ...], bool] = {}

        def passes(selected: list, failed: Path) -> bool:
            # Whether the tests the mutant's child ran, up to the one that failed there, pass
            # in that order without the mutant: the child runs only its selected tests, and a
            # test may need one run before it in the baseline (state a test leaves behind).
            with contextlib.suppress(FileNotFoundError, ValueError):
                ran = selected[: int(failed.read_text()) + 1]
                failed.unlink()
                key = tuple(item.nodeid for item in ran)
                if key not in clean:
                    log = job.work / f"clean-{os.getpid()}-{time.monotonic_ns()}.log"
                    clean[key] = _wait(_fork(lambda: _run_items(ran, None), log)) == 0
                    log.unlink(missing_ok=True)
                return clean[key]
            return True  # no test failed (the child's own error)

        return launch

    @staticmethod
    def _record(keep, left: list[str], verify: dict):
        def record(mutant: Mutant, outcome: Outcome) -> None:
            passes = verify.pop(mutant.id, None)
            if outcome.status == "timeout":
                left.append(mutant.id)
                return
            if outcome.status == "killed" and passes is not None and not passes():
                detail = "the test that failed fails without the mutant after the tests before it"
                outcome = dataclasses.replace(outcome, status="error", detail=detail)
            keep(mutant, outcome)

        return record


def _run_items(items: list, failed: Path | None) -> int:
    """Run collected `items` in order (in a forked child), stopping at the first failure: 1
    and its position in `failed`, or 0."""
    for i, item in enumerate(items):
        following = items[i + 1] if i + 1 < len(items) else None
        reports = runtestprotocol(item, log=False, nextitem=following)
        if any(report.failed for report in reports):
            if failed is not None:
                failed.write_text(str(i))
            return 1
    return 0


def _reimport(job: _Job, pending: list[Mutant], base: dict, record) -> None:
    """Run each mutant in a fresh pytest run whose import hook serves the mutant's source.

    For what runs at import (constants, class bodies, defaults, decorators), and to confirm
    a timeout of the in-place path: a whole collection per mutant, so the slow path.
    """
    seconds = base.get("seconds", {})
    selected: dict[str, list[str]] = {}
    clean: dict[tuple[str, ...], tuple[int, float]] = {}

    def without_mutant(tests: list[str]) -> tuple[int, float]:
        # The baseline ran every candidate file in one session; a child collects and runs only
        # the selected ones, where a test module may fail to import (an import cycle that works
        # in one order only) or a test fail (it needs a test run before it) with no mutant.
        if tuple(tests) not in clean:
            log = job.work / f"clean-{os.getpid()}-{time.monotonic_ns()}.log"
            first = _FirstFailure(log.with_suffix(".failed"))
            env = {"PYTHONPATH": job.pythonpath}
            pid = _fork_pytest(["-x", *tests], root=job.root, log=log, env=env, plugin=first)
            clean[tuple(tests)] = _wait(pid), first.read()
            log.unlink(missing_ok=True)
        return clean[tuple(tests)]

    def checked(mutant: Mutant, outcome: Outcome) -> None:
        tests = selected.pop(mutant.id, [])
        failed = _FirstFailure(_failed_file(job, mutant)).read()
        if outcome.status == "killed":
            code, first = without_mutant(tests)
            # A kill is the mutant's if the tests pass without it, or fail there only later
            # (`-x`: the tests before the mutant's failure passed without it).
            if outcome.detail == _COLLECTION and code not in (0, 1):
                detail = f"the tests fail to collect without the mutant: {' '.join(tests)[:500]}"
                outcome = dataclasses.replace(outcome, status="error", detail=detail)
            elif outcome.detail != _COLLECTION and code != 0 and not failed < first:
                detail = f"the tests fail without the mutant: {' '.join(tests)[:500]}"
                outcome = dataclasses.replace(outcome, status="error", detail=detail)
        record(mutant, outcome)

    def launch(mutant: Mutant):
        tests = _select(mutant, job, base, by_function=True)
        if not tests:
            return Outcome(status="unreached", seconds=0.0, tests_sha=job.tests_sha)
        selected[mutant.id] = tests
        env = job.mutant_env(mutant)
        log = Path(env["BEAM_AGENTS_MUTANT_SOURCE"]).with_suffix(".log")
        first = _FirstFailure(_failed_file(job, mutant))
        pid = _fork_pytest(["-x", *tests], root=job.root, log=log, env=env, plugin=first)
        spent = sum(v for t, v in seconds.items() if {t, t.split("[", 1)[0]} & set(tests))
        return pid, job.budget(base.get("startup", 0.0) + spent), log

    _schedule(pending, jobs=job.jobs, launch=launch, record=checked, tests_sha=job.tests_sha)


class _FirstFailure:
    """A pytest plugin: the position, among the run's items, of the first test that fails."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.order: list[str] = []

    def pytest_collection_finish(self, session) -> None:
        self.order = [item.nodeid for item in session.items]

    def pytest_runtest_logreport(self, report) -> None:
        if report.failed and not self.out.exists() and report.nodeid in self.order:
            self.out.write_text(str(self.order.index(report.nodeid)))

    def read(self) -> float:
        """The position, or infinity when no test failed (or none ran)."""
        with contextlib.suppress(FileNotFoundError, ValueError):
            found = float(self.out.read_text())
            self.out.unlink()
            return found
        return float("inf")


def _failed_file(job: _Job, mutant: Mutant) -> Path:
    return job.work / f"failed-{job.dotted}-{mutant.id}.txt"


def _schedule(pending: list[Mutant], *, jobs: int, launch, record, tests_sha: str) -> None:
    """Run `launch(mutant)` children, `jobs` at once, and record each one's outcome.

    `launch` returns (pid, seconds allowed, log), an Outcome decided without running, or None
    for a mutant it hands elsewhere.
    """
    queue = list(pending)
    running: dict[int, tuple[Mutant, float, float, Path]] = {}
    try:
        while queue or running:
            while queue and len(running) < jobs:
                mutant = queue.pop(0)
                launched = launch(mutant)
                if isinstance(launched, Outcome):
                    record(mutant, launched)
                elif launched is not None:
                    pid, budget, log = launched
                    now = time.monotonic()
                    running[pid] = (mutant, now, now + budget, log)
            for pid in list(running):
                mutant, started, deadline, log = running[pid]
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    code: int | None = os.waitstatus_to_exitcode(status)
                elif time.monotonic() > deadline:
                    _kill(pid)
                    code = None
                else:
                    continue
                del running[pid]
                before = time.monotonic()
                record(mutant, _outcome(code, before - started, tests_sha, log))
                # Recording may run the tests again without the mutant, beside the children
                # still running: that time is not theirs, and does not count towards a timeout.
                waited = time.monotonic() - before
                for other, (m, start, end, path) in running.items():
                    running[other] = (m, start + waited, end + waited, path)
                log.unlink(missing_ok=True)
                log.with_suffix(".py").unlink(missing_ok=True)
            time.sleep(0.02)
    finally:
        # Interrupted (^C, SIGTERM, an error): no child outlives the tool.
        for pid in running:
            _kill(pid)


def _report(name: str, source: str, results: dict[str, tuple[Mutant, Outcome]], out) -> None:
    counts = {s: 0 for s in ("killed", "timeout", "survived", "unreached", "error")}
    for _, outcome in results.values():
        counts[outcome.status] += 1
    scored = counts["killed"] + counts["timeout"] + counts["survived"] + counts["unreached"]
    out(f"{name}: {sum(counts.values())} mutants measured")
    score = 100.0 * (counts["killed"] + counts["timeout"]) / scored if scored else 100.0
    out(f"{name}: score {score:.1f}% " + " ".join(f"{k}={v}" for k, v in counts.items()))
    lines = source.splitlines()
    for mutant, outcome in sorted(results.values(), key=lambda r: (r[0].line, r[0].col)):
        if outcome.status in ("survived", "unreached", "error"):
            out(
                f"  {outcome.status:9} {name}:{mutant.line} [{mutant.id}] {mutant.description}"
                f"  | {lines[mutant.line - 1].strip()[:100]}"
            )


def _totals(results: dict[str, dict[str, tuple[Mutant, Outcome]]]) -> tuple[int, int]:
    killed = scored = 0
    for module in results.values():
        for _, outcome in module.values():
            if outcome.status != "error":
                scored += 1
                killed += outcome.status in _KILLED
    return killed, scored


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="modules or folders to mutate")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--timeout-factor", type=float, default=3.0)
    parser.add_argument("--min-timeout", type=float, default=20.0, help="seconds")
    parser.add_argument(
        "--tests",
        type=Path,
        action="append",
        default=[],
        help="test files to use instead of those found beside and naming the module (repeatable)",
    )
    parser.add_argument("--root", type=Path, default=_ROOT, help="the tree the paths are in")
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="default ROOT/.cache/mutation/results.json",
    )
    parser.add_argument(
        "--fresh", action="store_true", help="forget cached results of these modules"
    )
    parser.add_argument(
        "--min-score", type=float, default=None, help="exit 1 below this percentage"
    )
    parser.add_argument(
        "--sample",
        type=float,
        default=None,
        metavar="F",
        help="run each mutant with probability F (0 < F <= 1), chosen by --seed",
    )
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    parser.add_argument("--preload", default=_PRELOAD, help="modules imported once before forking")
    parser.add_argument("--list", action="store_true", help="print the mutants, run nothing")
    parser.add_argument("--report", action="store_true", help="print the cached results only")
    args = parser.parse_args(argv)
    if args.sample is not None and not 0 < args.sample <= 1:
        parser.error("--sample must be above 0 and at most 1")
    sample = None if args.sample is None else Sample(fraction=args.sample, seed=args.seed)
    if args.list:
        for path in _module_paths(args.paths):
            source = path.read_text(encoding="utf-8")
            name = str(path.resolve().relative_to(args.root.resolve()))
            for m in mutants(source):
                if sample is None or sample.keeps(name, m):
                    print(f"{path}:{m.line}: {m.description}")
        return 0
    # A SIGTERM unwinds like ^C, so the children are killed too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    for name in filter(None, args.preload.split(",")):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    results = run(
        args.paths,
        root=args.root,
        jobs=args.jobs,
        timeout_factor=args.timeout_factor,
        min_timeout=args.min_timeout,
        chosen_tests=args.tests,
        cache_path=args.cache,
        fresh=args.fresh,
        report_only=args.report,
        sample=sample,
    )
    killed, scored = _totals(results)
    score = 100.0 * killed / scored if scored else 100.0
    print(f"mutation score: {score:.1f}% ({killed} of {scored} mutants killed)")
    if sample is not None:
        low, high = wilson(killed, scored)
        print(
            f"a sample of {args.sample:g} (seed {args.seed}): the whole run's score is"
            f" {100 * low:.1f}% to {100 * high:.1f}% (95% Wilson interval)"
        )
    return 1 if args.min_score is not None and score < args.min_score else 0


if __name__ == "__main__":
    sys.exit(main())
