"""tools/mutation.py on a fixture tree: a tested line's mutant is killed, an untested line's
mutant survives, a mutant that loops forever is killed by its timeout, and a rerun resumes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tools import mutation

_TOOL = Path(mutation.__file__)

_CALC = '''\
"""A fixture module: its docstring is never mutated."""

__all__ = ["add", "count_to", "untested"]


def add(a, b):
    return a + b


def count_to(n):
    i = 0
    while i < n:
        i += 1
    return i


def untested(x):
    return x * 2


def ignored(x):
    return x - 1  # pragma: no mutate
'''

_CALC_TEST = """\
from pkg.calc import add, count_to


def test_add():
    assert add(2, 3) == 5


def test_count_to():
    assert count_to(3) == 3
    assert count_to(0) == 0
"""


def _tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "calc.py").write_text(_CALC)
    (root / "pkg" / "calc_test.py").write_text(_CALC_TEST)
    return root / "pkg" / "calc.py"


def _run(root: Path, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            str(_TOOL),
            "--root",
            str(root),
            "--cache",
            str(cache),
            "--preload",
            "pytest",
            "--jobs",
            "2",
            "--min-timeout",
            "30",
            "--min-score",
            "100",
            str(root / "pkg" / "calc.py"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _statuses(cache: Path) -> dict[str, str]:
    found = json.loads(cache.read_text())["pkg/calc.py"]["mutants"]
    return {mutant_id: outcome["status"] for mutant_id, outcome in found.items()}


def test_a_tested_mutant_is_killed_an_untested_one_survives_and_a_rerun_resumes(tmp_path):
    calc = _tree(tmp_path / "tree")
    cache = tmp_path / "results.json"
    done = _run(tmp_path / "tree", cache)
    # Below --min-score: the untested function's mutants survive.
    assert done.returncode == 1, done.stdout + done.stderr
    statuses = _statuses(cache)
    assert statuses["7:11:binop"] == "killed"  # a + b -> a - b
    assert statuses["18:11:binop"] == "unreached"  # x * 2 -> x / 2: no test runs it
    assert "unreached pkg/calc.py:18 [18:11:binop] `*` -> `/`" in done.stdout
    # i += 1 -> i -= 1 never ends: the child is killed at its timeout, and that kills it.
    assert statuses["13:8:augassign"] == "timeout"
    assert not any(mutant_id.startswith("22:") for mutant_id in statuses)  # pragma: no mutate
    assert "mutation score:" in done.stdout

    again = _run(tmp_path / "tree", cache)
    assert "0 to run" in again.stdout, again.stdout
    # The missing test is written: only the survivors run again, and now they die.
    (calc.parent / "untested_test.py").write_text(
        "from pkg.calc import untested\n\n\ndef test_untested():\n    assert untested(3) == 6\n"
    )
    survivors = sum(status not in ("killed", "timeout") for status in statuses.values())
    fixed = _run(tmp_path / "tree", cache)
    assert f"{survivors} to run" in fixed.stdout, fixed.stdout
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert set(_statuses(cache).values()) <= {"killed", "timeout"}


def test_each_mutant_changes_one_span_and_keeps_the_rest_of_the_file():
    source = textwrap.dedent(
        """\
        def f(a, b):
            \"\"\"Docstring.\"\"\"
            if a < b and not a:
                return ["é", b > 1]
            raise ValueError(a)
        """
    )
    found = {m.description: mutation.apply(source, m) for m in mutation.mutants(source)}
    assert "Docstring." not in " ".join(found)  # no mutant of the docstring
    assert "    if (a <= b) and not a:\n" in found["`<` -> `<=`"]
    assert "    if (a < b or not a):\n" in found["`and` -> `or`"]
    # A column after a non-ASCII character is a byte offset: the span still lands right.
    assert '        return ["é", (b >= 1)]\n' in found["`>` -> `>=`"]
    assert "    pass\n" in found["`raise` removed"]
    assert all(text.count("\n") == source.count("\n") for text in found.values())
