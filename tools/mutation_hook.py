"""The import hook that puts one mutant in place of one module (tools/mutation.py).

tools/mutation.py runs each mutant's tests in a forked child that imports this module and calls
`install()`; it also copies this file as `sitecustomize.py` into a folder it puts first on
PYTHONPATH, so a Python process a test starts (a CLI, a second effector) loads the same mutant.
The mutant's source is compiled under the original file's name, so `__file__`, tracebacks and
paths derived from them are those of the real module: no copy of the tree is needed, and the
workspace is never written. Standard library only: it runs before anything else is importable.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

__all__ = ["MODULE_ENV", "SOURCE_ENV", "install"]

# The dotted name of the module to replace, and the file holding its mutant's source.
MODULE_ENV = "BEAM_AGENTS_MUTANT_MODULE"
SOURCE_ENV = "BEAM_AGENTS_MUTANT_SOURCE"


class _MutantLoader(importlib.abc.Loader):
    def __init__(self, origin: str, mutant: str) -> None:
        self._origin = origin
        self._mutant = mutant

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        with open(self._mutant, encoding="utf-8") as f:
            code = compile(f.read(), self._origin, "exec", dont_inherit=True)
        exec(code, module.__dict__)


class _MutantFinder(importlib.abc.MetaPathFinder):
    def __init__(self, module: str, mutant: str) -> None:
        self._module = module
        self._mutant = mutant

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self._module:
            return None
        # The real module's spec, found by the finders after this one, names its file and
        # whether it is a package; only the loader changes.
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.origin:
                return importlib.util.spec_from_file_location(
                    fullname,
                    spec.origin,
                    loader=_MutantLoader(spec.origin, self._mutant),
                    submodule_search_locations=spec.submodule_search_locations,
                )
        return None


def install() -> None:
    """Serve the mutant named by the environment, if any, in place of its module."""
    module = os.environ.get(MODULE_ENV)
    mutant = os.environ.get(SOURCE_ENV)
    if module and mutant and not any(isinstance(f, _MutantFinder) for f in sys.meta_path):
        sys.dont_write_bytecode = True
        sys.meta_path.insert(0, _MutantFinder(module, mutant))


install()
