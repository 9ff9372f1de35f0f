"""The old module paths of beam_agents, importable after its packages were cut by concept.

A user's `import beam_agents.kafka_bus`, a service started with `--tools
beam_agents.demo:demo_keyring` or as `python -m beam_agents.cli`, or a pickle naming a class at
an old path still finds it: a finder first on `sys.meta_path` answers each path in `MOVED`, and
every module under it, with the module at its new path (the same object, so classes stay
identical), warning with a DeprecationWarning that names the new path. A package that was split
has no new home; its old modules each have theirs (`None` in the table), and importing it gives
an empty package.

Only paths users were told of are here; docs/development.md names the new ones.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
import warnings

#: Each moved module or package and its new path; a package's modules follow it.
MOVED: dict[str, str | None] = {
    "beam_agents.adapters": None,
    "beam_agents.adapters.langgraph": "beam_agents.integrations.langgraph",
    "beam_agents.beam_support": "beam_agents.wire.beam_support",
    "beam_agents.cli": "beam_agents.ops.cli",
    "beam_agents.console": "beam_agents.ops.console",
    "beam_agents.core": None,
    "beam_agents.core.intent": "beam_agents.intents.identity",
    "beam_agents.core.migration": "beam_agents.state.migration",
    "beam_agents.core.signing": "beam_agents.intents.signing",
    "beam_agents.core.wire": "beam_agents.wire.fields",
    "beam_agents.decoding": "beam_agents.wire.decoding",
    "beam_agents.demo": "beam_agents.ops.demo",
    "beam_agents.effector": "beam_agents.intents.effector",
    "beam_agents.flink": "beam_agents.bus.flink",
    "beam_agents.kafka_bus": "beam_agents.bus",
    "beam_agents.llm": "beam_agents.integrations.llm",
    "beam_agents.loading": "beam_agents.ops.loading",
    "beam_agents.mcp_tools": "beam_agents.integrations.mcp_tools",
    "beam_agents.preflight": "beam_agents.ops.preflight",
    "beam_agents.processes": "beam_agents.ops.processes",
    "beam_agents.replay": "beam_agents.ops.replay",
    "beam_agents.rounds": "beam_agents.ops.rounds",
    # Pickled Memory and ReplayCache objects name it.
    "beam_agents.runtime.memory": "beam_agents.state.memory",
    "beam_agents.state_manifest": "beam_agents.ops.state_manifest",
    "beam_agents.telemetry": "beam_agents.integrations.telemetry",
    "beam_agents.update_check": "beam_agents.ops.update_check",
}


def new_path(name: str) -> str | None:
    """Where the module `name` is now, if it moved."""
    if name in MOVED:
        return MOVED[name]
    package = name.rpartition(".")[0]
    while package:
        if MOVED.get(package):
            return MOVED[package] + name[len(package) :]
        package = package.rpartition(".")[0]
    return None


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self) -> None:
        self._own_specs: dict[str, importlib.machinery.ModuleSpec] = {}

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("beam_agents."):
            return None
        new = new_path(fullname)
        if new is None:  # not moved, or a split package
            if fullname not in MOVED:
                return None
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        own = importlib.util.find_spec(new)
        if own is None:
            return None
        is_package = own.submodule_search_locations is not None
        # The origin is the new module's file: runpy gives it to `python -m OLD` as sys.argv[0].
        return importlib.machinery.ModuleSpec(
            fullname, self, origin=own.origin, is_package=is_package
        )

    def create_module(self, spec):
        new = new_path(spec.name)
        if new is None:  # a split package: only its moved modules import
            return types.ModuleType(spec.name, f"{spec.name} was split; see beam_agents._moved")
        _warn(spec.name, new, "import it from there")
        module = importlib.import_module(new)
        self._own_specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module):
        # The import system stamped the alias's spec on the module; it gets its own back.
        own = self._own_specs.pop(module.__spec__.name, None)
        if own is not None:
            module.__spec__ = own

    def get_code(self, fullname):
        """The new module's code, for `python -m OLD` (runpy runs it as __main__)."""
        new = new_path(fullname)
        _warn(fullname, new, f"run python -m {new.removesuffix('.__main__')}")
        return importlib.util.find_spec(new).loader.get_code(new)


_MACHINERY = (__file__, os.path.dirname(importlib.__file__) + os.sep)


def _warn(old: str, new: str, advice: str) -> None:
    """Warns at the first frame outside this finder and the import system: the `import`
    statement, or whoever called importlib.import_module. warnings.warn skips only the frozen
    bootstrap's frames, so a stacklevel would land in importlib/__init__.py, where the default
    filters (a DeprecationWarning shows where __main__ caused it) hide it."""
    frame = sys._getframe(1)
    while frame.f_back is not None and (
        frame.f_code.co_filename.startswith(("<frozen ", *_MACHINERY))
    ):
        frame = frame.f_back
    warnings.warn_explicit(
        f"{old} is now {new}; {advice}",
        DeprecationWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=frame.f_globals.get("__name__", "<string>"),
        registry=frame.f_globals.setdefault("__warningregistry__", {}),
    )


_FINDER = _Finder()


def install() -> None:
    """Puts the finder first on sys.meta_path, once: an old path must not be found as a
    leftover folder (a namespace package) before it is redirected."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
