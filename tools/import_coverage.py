"""Each py_test, and each py_library's sources, import only what its declared deps put in its
runfiles.

Bazel runs a py_test with the sources of its transitive py_library deps and the wheels of its
transitive @pypi deps on the path, nothing else; pytest on the pip path sees the whole .venv, so
a missing dep only shows under Bazel. This module rebuilds that path from the installed
distributions: each @pypi//name maps to the installed distribution of that normalized name and
the distributions it requires (its METADATA), whose files (RECORD) are linked into a folder of
their own; the workspace sources of the deps into another. Each test module is then imported
with only those folders after the standard library, in an interpreter with no site-packages and
no PYTHONPATH (`-S -E -s`): a child forked, per target, from one interpreter per closure of
distributions that imported the closure's heavy packages first (a third of the time of a fresh
interpreter per target).

Tests that collect every test file (bump_drill_test runs `pytest --collect-only` over the tree)
or import every test module (this module's test) need the @pypi packages of every py_test.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from tools.build_files import Target, Workspace, _normalize, _parse_label
from tools.distributions import installed_distributions, link_distribution, pypi_closure

__all__ = ["check", "pypi_closure", "runfiles"]

_PYTEST_MACRO = "//tools:pytest.bzl"
_WHOLE_TREE = re.compile(r"--collect-only|tools\.import_coverage|from tools import import_coverage")


def runfiles(ws: Workspace, target: Target) -> tuple[set[str], set[str]]:
    """(workspace files, normalized @pypi names) that `target`'s deps bring, transitively."""
    files: set[str] = set()
    pypi: set[str] = set()
    seen: set[tuple[str, str]] = set()

    def visit(package: str, attrs: dict, origin: str | None) -> None:
        srcs = list(attrs.get("srcs", []))
        deps = list(attrs.get("deps", []))
        if origin == _PYTEST_MACRO:
            srcs.append("//tools:pytest_main.py")
            deps.append("@pypi//pytest")
        for src in srcs:
            _, src_package, name = _parse_label(src, package)
            files.add(f"{src_package}/{name}" if src_package else name)
        for dep in deps:
            repo, dep_package, name = _parse_label(dep, package)
            if repo == "pypi":
                pypi.add(_normalize(dep_package))
            elif repo is None and (dep_package, name) not in seen:
                seen.add((dep_package, name))
                dep_target = ws.packages.get(dep_package, {}).get(name)
                if dep_target is not None:
                    visit(dep_package, dep_target.attrs, dep_target.origin)

    visit(target.package, target.attrs, target.origin)
    return files, pypi


def _module_name(test_file: str) -> str:
    return test_file.removesuffix(".py").replace("/", ".")


#: Imported once by each closure's interpreter before it forks a child per target: most of a
#: target's import time, paid once per closure instead of once per target. One not in the
#: closure fails there and is left to the target's own import to report.
_PRELOAD = ("google.protobuf", "grpc", "apache_beam", "pytest", "hypothesis")

# An interpreter with no site-packages and no PYTHONPATH: the standard library, then a
# closure's distributions. For each request (a target's workspace folder and modules) it forks
# a child that puts the folder first and imports them, as `python -S -E -s -c` would.
_SERVER = """
import importlib, json, os, sys, traceback
stdlib = [p for p in sys.path if p]
pypi = json.loads(sys.argv[1])
sys.path[:] = stdlib + pypi
for name in json.loads(sys.argv[2]):
    try:
        importlib.import_module(name)
    except Exception:
        pass
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.chdir(request["folder"])
        sys.path[:] = stdlib + [request["folder"]] + pypi
        try:
            for module in request["modules"]:
                importlib.import_module(module)
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
"""


class _Importers:
    """One interpreter per closure of distributions, each importing a target's modules in a
    child forked after the closure's heavy imports."""

    def __init__(self, logs: Path) -> None:
        self._logs = logs
        self._servers: dict[tuple[str, ...], tuple[subprocess.Popen, threading.Lock]] = {}
        self._lock = threading.Lock()
        self._count = itertools.count()

    def __enter__(self) -> _Importers:
        return self

    def __exit__(self, *exc) -> None:
        for server, _ in self._servers.values():
            server.stdin.close()
            server.wait(timeout=60)

    def run(self, folder: Path, pypi: list[Path], modules: list[str]) -> str | None:
        """None when `modules` import with `folder` then `pypi` on the path, else the last
        line of what the import printed (the error)."""
        key = tuple(map(str, pypi))
        with self._lock:
            if key not in self._servers:
                server = subprocess.Popen(
                    [
                        sys.executable,
                        "-S",
                        "-E",
                        "-s",
                        "-c",
                        _SERVER,
                        *map(json.dumps, (key, _PRELOAD)),
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    cwd=self._logs,
                )
                self._servers[key] = server, threading.Lock()
            server, lock = self._servers[key]
            log = self._logs / f"import-{next(self._count)}.log"
        with lock:
            request = {"folder": str(folder), "modules": modules, "log": str(log)}
            server.stdin.write(json.dumps(request) + "\n")
            server.stdin.flush()
            answer = server.stdout.readline().strip()
        if answer == "0":
            return None
        lines = [line for line in log.read_text().strip().splitlines() if line.strip()]
        return lines[-1] if lines else f"exit {answer or 'of the importer'}"


def check(ws: Workspace, names: list[str] | None = None) -> list[str]:
    """Problems of the py_tests and py_libraries named `names` (every one by default), each
    naming the target."""
    installed = installed_distributions()
    tests = [
        target
        for targets in ws.packages.values()
        for target in targets.values()
        if target.rule in ("py_test", "py_library") and (names is None or target.name in names)
    ]
    every_test_pypi = set()
    closures = {}
    for target in tests:
        closures[target.package, target.name] = runfiles(ws, target)
    for package, targets in ws.packages.items():
        for target in targets.values():
            if target.rule == "py_test":
                every_test_pypi |= (closures.get((package, target.name)) or runfiles(ws, target))[1]
    problems = []
    with tempfile.TemporaryDirectory(prefix="import_coverage") as tmp:
        linked: dict[str, Path] = {}

        def job(target: Target) -> list[str]:
            where = f"{target.package}/BUILD.bazel {target.name}"
            files, pypi = closures[target.package, target.name]
            found = []
            sources = [
                f"{target.package}/{src}" if target.package else src
                for src in target.attrs.get("srcs", [])
                # A __main__ runs when imported; a py_binary's test is to run it.
                if src.endswith(".py") and not src.endswith("__main__.py")
            ]
            if not sources:  # a library of deps only
                return found
            test_file = sources[0]
            if target.rule == "py_test" and _WHOLE_TREE.search((ws.root / test_file).read_text()):
                lacking = sorted(every_test_pypi - pypi)
                if lacking:
                    found.append(
                        f"{where}: runs or imports every test, but its deps lack the packages "
                        f"other py_tests declare: {', '.join('@pypi//' + n for n in lacking)}"
                    )
            closure, missing = pypi_closure(pypi, installed)
            for name in sorted(missing):
                found.append(f"{where}: @pypi//{name}: no installed distribution to check against")
            local = Path(tmp) / "tests" / target.package / target.name
            for file in files:
                (local / file).parent.mkdir(parents=True, exist_ok=True)
                (local / file).symlink_to((ws.root / file).resolve())
            if target.rule == "py_test":
                sources = sources[:1]
            error = importers.run(
                local,
                [linked[n] for n in sorted(closure)],
                [_module_name(source) for source in sources],
            )
            if error:
                found.append(f"{where}: importing {', '.join(sources)} with only its deps: {error}")
            return found

        for name in sorted(set().union(*(closures[k][1] for k in closures))):
            closure, _ = pypi_closure({name}, installed)
            for dist in closure - linked.keys():
                linked[dist] = Path(tmp) / "pypi" / dist
                link_distribution(installed[dist], linked[dist])
        logs = Path(tmp) / "logs"
        logs.mkdir()
        with (
            _Importers(logs) as importers,
            concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool,
        ):
            for found in pool.map(job, tests):
                problems.extend(found)
    return problems
