"""The wheel installs anywhere and imports its bindings with no sys.path help.

Under pytest the wheel is built from pyproject.toml (`pip wheel`); under Bazel the test is
given //:wheel through BEAM_AGENTS_WHEEL. Either way it is installed into a fresh virtual
environment outside the source tree, next to the pinned protobuf and rfc8785 only (importing
the messages and the CLI needs nothing else), and exercised from there in isolation.

Bazel's Python launcher exports PYTHONPATH with every runfiles entry (the @pypi packages
among them), PYTHONSAFEPATH and RUNFILES_*. Inherited by pip in the fresh environment, they
make it see protobuf as installed already and skip it. So pip and the installed console script
run isolated (-I, and none of those variables in their environment), and the pytest run first
sets the same variables the launcher would, so that both paths prove the isolation.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from beam_agents._protos import __all__ as MESSAGE_NAMES
from tools.distributions import installed_closure, link_closure
from tools.workspace import build_wheel, data_root

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((data_root() / "pyproject.toml").read_text())["project"]
#: The interpreter variables Bazel's launcher sets; none may reach the fresh environment.
LAUNCHER_VARIABLES = ("PYTHONPATH", "PYTHONSAFEPATH", "PYTHONHOME", "PYTHONUSERBASE")
#: Wheels installed beside ours, at the versions pinned here: what importing needs.
RUNTIME = ("protobuf", "rfc8785")


@pytest.fixture(scope="module", autouse=True)
def launcher_environment(tmp_path_factory):
    """The environment of a py_test under Bazel, reproduced when pytest runs this file."""
    with pytest.MonkeyPatch.context() as patch:
        if "RUNFILES_DIR" not in os.environ:
            patch.setenv("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
            patch.setenv("PYTHONSAFEPATH", "1")
            patch.setenv("RUNFILES_DIR", str(tmp_path_factory.mktemp("runfiles")))
        yield


def _isolated_env() -> dict[str, str]:
    return {
        name: value
        for name, value in os.environ.items()
        if name not in LAUNCHER_VARIABLES
        and not name.startswith("RUNFILES_")
        and name not in ("PYTHON_RUNFILES", "VIRTUAL_ENV")
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    given = os.environ.get("BEAM_AGENTS_WHEEL")
    if given:
        return Path(given).resolve()
    return build_wheel(REPO, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("fresh-venv")
    venv.create(home, with_pip=True)
    python = home / "bin" / "python"
    pinned = [f"{name}=={importlib.metadata.version(name)}" for name in RUNTIME]
    pip = [str(python), "-I", "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for args in (["--no-deps", str(wheel)], ["--no-deps", "--only-binary=:all:", *pinned]):
        subprocess.run([*pip, *args], check=True, cwd=home, env=_isolated_env())
    return python


def _run_isolated(python: Path, code: str) -> subprocess.CompletedProcess:
    """Runs `code` in the fresh environment, outside the source tree, in isolated mode."""
    return subprocess.run(
        [str(python), "-I", "-c", code],
        cwd=python.parent.parent,
        capture_output=True,
        text=True,
        env=_isolated_env(),
    )


def test_the_launcher_environment_is_in_force():
    # What makes the isolation below necessary, under Bazel and under pytest alike.
    assert os.environ.get("PYTHONPATH") and "RUNFILES_DIR" in os.environ


def test_the_runtime_is_installed_in_the_fresh_environment_itself(installed):
    code = (
        "import google.protobuf, rfc8785, sys\n"
        "for module in (google.protobuf, rfc8785):\n"
        "    assert module.__file__.startswith(sys.prefix), module.__file__\n"
        "print(sys.prefix)\n"
    )
    result = _run_isolated(installed, code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(installed.parent.parent)


def _wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {n for n in archive.namelist() if ".dist-info/" not in n}


def test_every_message_class_imports_from_the_installed_wheel(installed):
    """Scenario: Bindings are importable from the installed package."""
    names = ", ".join(MESSAGE_NAMES)
    code = (
        f"from beam_agents._protos import {names}\n"
        "import beam_agents\n"
        "assert 'site-packages' in beam_agents.__file__, beam_agents.__file__\n"
        f"for cls in ({names}):\n"
        "    assert cls.FromString(cls().SerializeToString()) == cls()\n"
        "print(beam_agents.__file__)\n"
    )
    result = _run_isolated(installed, code)
    assert result.returncode == 0, result.stderr
    assert str(REPO) not in result.stdout


def test_migration_steps_import_from_the_installed_wheel_by_the_bazel_path(installed):
    code = (
        "import beam_agents_migrations\n"
        "from beam_agents.state.migration import default_registry\n"
        "assert 'site-packages' in beam_agents_migrations.__file__\n"
        "assert default_registry().missing_steps() == []\n"
        "print(*(step.__name__ for step in beam_agents_migrations.STEP_MODULES))\n"
    )
    result = _run_isolated(installed, code)
    assert result.returncode == 0, result.stderr
    assert "beam_agents_migrations.memory_blob_v1_to_v2" in result.stdout.split()


def test_the_console_script_runs_from_the_installed_wheel(installed, tmp_path):
    from beam_agents._protos import ToolIntent

    blob = tmp_path / "intent.binpb"
    blob.write_bytes(ToolIntent(intent_id="i-1", tool_name="search").SerializeToString())
    script = installed.parent / "beam-agents"
    result = subprocess.run(
        [str(script), "inspect", str(blob), "--type", "ToolIntent"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=_isolated_env(),
    )
    assert result.returncode == 0, result.stderr
    assert 'intent_id: "i-1"' in result.stdout


def test_the_wheel_holds_the_packages_and_no_plain_migrations_package(wheel):
    files = _wheel_files(wheel)
    top_level = {name.split("/", 1)[0] for name in files}
    assert top_level == {"beam_agents", "beam_agents_migrations"}
    assert "beam_agents/_protos/beam_agents_pb2.pyi" in files
    assert "beam_agents/py.typed" in files
    assert "beam_agents/ops/state_manifest.json" in files
    assert not [name for name in files if name.endswith("_test.py")]


@pytest.mark.skipif("BEAM_AGENTS_WHEEL" in os.environ, reason="the source tree is not in a sandbox")
def test_the_wheel_holds_every_non_test_module_of_the_source_tree(wheel):
    sources = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "beam_agents").rglob("*.py")
        if not path.name.endswith("_test.py") and "testing" not in path.relative_to(REPO).parts
    } | {
        path.relative_to(REPO / "migrations").as_posix()
        for path in (REPO / "migrations" / "beam_agents_migrations").rglob("*.py")
        if not path.name.endswith("_test.py")
    }
    modules = {name for name in _wheel_files(wheel) if name.endswith(".py")}
    assert modules == sources


def _metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name).decode()


def test_the_wheel_metadata_names_the_project_and_its_licence(wheel):
    lines = _metadata(wheel).splitlines()
    assert "Name: beam-agents" in lines
    assert {"License-Expression: Apache-2.0", "License: Apache-2.0"} & set(lines)
    requires = {
        str(Requirement(line.removeprefix("Requires-Dist: ")))
        for line in lines
        if line.startswith("Requires-Dist: ")
    }
    extras = {
        f'{line}; extra == "{extra}"'
        for extra, lines in PROJECT["optional-dependencies"].items()
        for line in lines
    }
    assert requires == {str(Requirement(line)) for line in [*PROJECT["dependencies"], *extras]}
    assert {
        line.removeprefix("Provides-Extra: ")
        for line in lines
        if line.startswith("Provides-Extra: ")
    } == set(PROJECT["optional-dependencies"])


#: The packages a Dataflow worker running RunAgent or ExecuteIntents imports: the layers below
#: bus/integrations/ops, the worked example's agent, and the migration steps restore runs.
WORKER_PACKAGES = (
    "beam_agents._protos",
    "beam_agents.wire",
    "beam_agents.state",
    "beam_agents.intents",
    "beam_agents.runtime",
    "beam_agents.examples",
    "beam_agents_migrations",
)


def _is_worker_module(name: str) -> bool:
    return name in ("beam_agents", "beam_agents.errors", "beam_agents._moved") or any(
        name == package or name.startswith(package + ".") for package in WORKER_PACKAGES
    )


def _wheel_modules(wheel: Path) -> dict[str, str]:
    """Module name -> source, of every module in the wheel."""
    with zipfile.ZipFile(wheel) as archive:
        return {
            name.removesuffix(".py").removesuffix("/__init__").replace("/", "."): archive.read(
                name
            ).decode()
            for name in archive.namelist()
            if name.endswith(".py")
        }


def _imported(source: str) -> set[str]:
    """Every module a module's source imports by absolute name, function bodies included (a
    deferred import is one the module needs when it runs); `from a import b` counts a.b too."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _third_party_imports(source: str) -> set[str]:
    """The modules a module imports (their first two names), stdlib and beam_agents left out."""
    return {
        ".".join(name.split(".")[:2])
        for name in _imported(source)
        if name.split(".")[0] not in sys.stdlib_module_names
        and name.split(".")[0] not in ("beam_agents", "beam_agents_migrations", "__future__")
    }


@functools.cache
def _packages() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


@functools.cache
def _distributions(module: str) -> frozenset[str]:
    """The distributions (normalized names) installed here that provide `module`. Of a
    namespace package several do (google: protobuf, google-auth, ...): those whose files hold
    the module's own package."""
    top = module.split(".")[0]
    names = _packages().get(top, [])
    if len(names) > 1 and "." in module:
        package = "/".join(module.split(".")[:2])
        names = [
            name
            for name in names
            if any(
                str(f).startswith(package + "/") or str(f) == package + ".py"
                for f in importlib.metadata.distribution(name).files or []
            )
        ]
    return frozenset(canonicalize_name(name) for name in names)


def _requires(wheel: Path) -> dict[str | None, set[str]]:
    """The wheel's Requires-Dist: extra (None: the runtime) -> distribution names."""
    found: dict[str | None, set[str]] = {}
    for line in _metadata(wheel).splitlines():
        if line.startswith("Requires-Dist: "):
            requirement = Requirement(line.removeprefix("Requires-Dist: "))
            marker = str(requirement.marker or "")
            extra = marker.split('"')[1] if "extra ==" in marker else None
            found.setdefault(extra, set()).add(canonicalize_name(requirement.name))
    return found


def test_the_wheel_holds_no_test_support(wheel):
    """A worker installs the wheel: test modules and the test-support package stay out, and no
    module in it imports them (a DoFn pickled from one would drag it along)."""
    modules = _wheel_modules(wheel)
    assert not [m for m in modules if m.endswith("_test") or m.startswith("beam_agents.testing")]
    importing = [
        module
        for module, source in modules.items()
        if any(name.startswith("beam_agents.testing") for name in _imported(source))
    ]
    assert not importing


def test_the_runtime_dependencies_are_what_the_worker_modules_import(wheel):
    """Requires-Dist without an extra is exactly the distributions the worker's modules import;
    everything any other module of the wheel imports is declared, by an extra at least (or is
    what a declared distribution requires)."""
    requires = _requires(wheel)
    modules = _wheel_modules(wheel)
    worker = set().union(
        *(_third_party_imports(s) for m, s in modules.items() if _is_worker_module(m))
    )
    assert set().union(*map(_distributions, worker)) == requires[None]
    everything = set().union(*(_third_party_imports(s) for s in modules.values()))
    # A module may import what a declared distribution brings (jinja2's markupsafe).
    declared = {canonicalize_name(n) for n in installed_closure(set().union(*requires.values()))}
    undeclared = {name for name in everything if not _distributions(name) & declared}
    assert not undeclared, f"imported by the wheel's modules, declared by no extra: {undeclared}"


def test_the_worker_modules_import_from_the_wheel_and_its_declared_dependencies(wheel, tmp_path):
    """Every worker module imports from the unpacked wheel with only the wheel's runtime
    dependencies and theirs beside it (the installed files of those distributions linked into a
    site-packages of their own, as pip puts them on a worker), no source tree, no editable
    finder, no other package: an undeclared import fails here as on the worker."""
    unpacked, site = tmp_path / "wheel", tmp_path / "site-packages"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(unpacked)
    link_closure(_requires(wheel)[None], site)
    worker = sorted(m for m in _wheel_modules(wheel) if _is_worker_module(m))
    code = (
        "import importlib, json, sys\n"
        f"sys.path[:] = [p for p in sys.path if p] + {[str(unpacked), str(site)]!r}\n"
        f"for name in {worker!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps({n: getattr(m, '__file__', None) for n, m in sys.modules.items()}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-E", "-s", "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=_isolated_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ours = {
        name: path
        for name, path in json.loads(done.stdout).items()
        if name.split(".")[0] in ("beam_agents", "beam_agents_migrations")
    }
    assert set(worker) <= set(ours)
    assert all(path is None or path.startswith(str(unpacked)) for path in ours.values()), ours


#: The guide's build (docs/dataflow.md), in the checkout: `pip wheel --no-deps -w dist .`.
GUIDE = ("-w", "dist", ".")


@pytest.mark.skipif("BEAM_AGENTS_WHEEL" in os.environ, reason="the source tree is not in a sandbox")
def test_the_guides_in_tree_build_ships_only_the_source_tree(tmp_path):
    """The guide's `pip wheel --no-deps -w dist .` builds in the checkout, where an earlier
    build left build/lib behind: a module deleted or moved since, or a package once listed,
    must not ship to the workers (build_wheel copies the tree without build/, so the worker
    test would never see it)."""
    tree = tmp_path / "checkout"
    shutil.copytree(
        REPO,
        tree,
        ignore=shutil.ignore_patterns(".*", "node_modules", "build", "dist", "*.egg-info"),
    )
    # What an earlier in-tree build left: a module since removed, and a test-support package.
    stale = tree / "build" / "lib" / "beam_agents"
    (stale / "testing").mkdir(parents=True)
    (stale / "testing" / "__init__.py").write_text("")
    (stale / "removed_since.py").write_text("")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", *GUIDE],
        cwd=tree,
        check=True,
        env=_isolated_env(),
    )
    (built,) = (tree / "dist").glob("beam_agents-*.whl")
    shipped = _wheel_files(built)
    assert not {"beam_agents/testing/__init__.py", "beam_agents/removed_since.py"} & shipped
