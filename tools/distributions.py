"""The distributions installed here, as sets that bring their requirements: for tests that
rebuild a path of some of them alone (tools/import_coverage.py, tools/wheel_test.py)."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

from tools.build_files import _normalize

__all__ = [
    "installed_closure",
    "installed_distributions",
    "link_closure",
    "link_distribution",
    "pypi_closure",
]


def installed_distributions() -> dict[str, importlib.metadata.Distribution]:
    found: dict[str, importlib.metadata.Distribution] = {}
    for dist in importlib.metadata.distributions():
        found.setdefault(_normalize(dist.metadata["Name"]), dist)
    return found


def pypi_closure(names: set[str], installed: dict) -> tuple[set[str], set[str]]:
    """(distributions `names` bring with their requirements, names not installed here).

    Requirements behind an extra are left out, as the hub's wheels leave them out; markers on
    the platform are kept (a wheel absent here is simply skipped)."""
    closure: set[str] = set()
    missing = {name for name in names if name not in installed}
    todo = [name for name in names if name in installed]
    while todo:
        name = todo.pop()
        if name in closure:
            continue
        closure.add(name)
        for requirement in installed[name].requires or []:
            requirement_name, _, marker = requirement.partition(";")
            if "extra" in marker:
                continue
            match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement_name)
            dependency = _normalize(match.group(1))
            if dependency in installed:
                todo.append(dependency)
    return closure, missing


def installed_closure(names: set[str]) -> set[str]:
    """The installed distributions `names` (any spelling) bring (pypi_closure), normalized."""
    closure, _ = pypi_closure({_normalize(name) for name in names}, installed_distributions())
    return closure


def link_closure(names: set[str], folder: Path) -> set[str]:
    """Links the files of the installed distributions `names` (any spelling) bring into
    `folder`, a site-packages of those alone; returns their names."""
    installed = installed_distributions()
    closure = installed_closure(names)
    for name in closure:
        link_distribution(installed[name], folder)
    return closure


def link_distribution(dist: importlib.metadata.Distribution, folder: Path) -> None:
    for file in dist.files or []:
        if file.parts and file.parts[0] == "..":
            continue  # scripts and data outside site-packages
        source = Path(dist.locate_file(file))
        if source.exists():
            target = folder / file
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                target.symlink_to(source)
