"""tools/mutation.py on a fixture tree: a tested line's mutant is killed, an untested line's
mutant survives, a mutant that loops forever is killed by its timeout, and a rerun resumes."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tools import mutation

_TOOL = Path(mutation.__file__)

_CALC = '''\
"""A fixture module: its docstring is never mutated."""

__all__ = ["Box", "add", "clamp", "count_to", "nonnegative", "untested"]

LIMIT = 10


def add(a, b):
    return a + b


def count_to(n):
    i = 0
    while i < n:
        i += 1
    return i


def clamp(n):
    return min(n, LIMIT)


def nonnegative(x):
    return x if x >= 0 else 0


class Box:
    def __init__(self, n):
        self.n = n

    @property
    def double(self):
        return self.n * 2


def untested(x):
    return x * 2


def ignored(x):
    return x - 1  # pragma: no mutate
'''

_CALC_TEST = """\
from pkg.calc import Box, add, clamp, count_to, nonnegative


def test_add():
    assert add(2, 3) == 5


def test_count_to():
    assert count_to(3) == 3
    assert count_to(0) == 0


def test_clamp():
    assert clamp(20) == 10


def test_nonnegative():
    assert nonnegative(-1) == 0
    assert nonnegative(0) == 0
    assert nonnegative(2) == 2


def test_box():
    assert Box(3).double == 6
"""


def _tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "calc.py").write_text(_CALC)
    (root / "pkg" / "calc_test.py").write_text(_CALC_TEST)
    return root / "pkg" / "calc.py"


def _tool(root: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    """tools/mutation.py over the tree at `root`, its results in `cache`."""
    return subprocess.run(
        [
            *(sys.executable, str(_TOOL), "--root", str(root), "--cache", str(cache)),
            *("--preload", "pytest", *args),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _run(root: Path, cache: Path, *, min_score: int = 100) -> subprocess.CompletedProcess:
    calc = str(root / "pkg" / "calc.py")
    return _tool(
        root, cache, "--jobs", "2", "--min-timeout", "10", "--min-score", str(min_score), calc
    )


def _statuses(cache: Path) -> dict[str, str]:
    found = json.loads(cache.read_text())["pkg/calc.py"]["mutants"]
    return {mutant_id: outcome["status"] for mutant_id, outcome in found.items()}


def test_a_tested_mutant_is_killed_an_untested_one_survives_and_a_rerun_resumes(
    tmp_path,
):
    calc = _tree(tmp_path / "tree")
    cache = tmp_path / "results.json"
    done = _run(tmp_path / "tree", cache)
    # Below --min-score: the untested function's mutants survive.
    assert done.returncode == 1, done.stdout + done.stderr
    statuses = _statuses(cache)
    assert statuses["9:11:binop"] == "killed"  # a + b -> a - b, in place
    assert statuses["33:15:binop"] == "killed"  # a property's body, in place
    # LIMIT = 10 -> 11 runs at import: a fresh import of the mutant kills it.
    assert statuses["5:8:const"] == "killed"
    # x >= 0 -> x > 0 is equivalent (0 takes the other branch to the same 0): it survives.
    assert statuses["24:16:compare0"] == "survived"
    assert statuses["37:11:binop"] == "unreached"  # x * 2 -> x / 2: no test runs it
    assert "unreached pkg/calc.py:37 [37:11:binop] `*` -> `/`" in done.stdout
    # i += 1 -> i -= 1 never ends: the child is killed at its timeout, and that kills it.
    assert statuses["15:8:augassign"] == "timeout"
    assert not any(mutant_id.startswith("41:") for mutant_id in statuses)  # pragma: no mutate
    # Every function-body mutant ran in place; the constant's and the class's did not.
    in_place = sum(
        mutation._target(ast.parse(_CALC), m) is not None for m in mutation.mutants(_CALC)
    )
    assert f"({in_place} in place)" in done.stdout, done.stdout
    assert "mutation score:" in done.stdout

    again = _run(tmp_path / "tree", cache)
    assert "0 to run" in again.stdout, again.stdout
    # The missing test is written: only the survivors run again, and the untested ones die.
    (calc.parent / "untested_test.py").write_text(
        "from pkg.calc import untested\n\n\ndef test_untested():\n    assert untested(3) == 6\n"
    )
    survivors = sum(status not in ("killed", "timeout") for status in statuses.values())
    fixed = _run(tmp_path / "tree", cache, min_score=80)
    assert f"{survivors} to run" in fixed.stdout, fixed.stdout
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    after = _statuses(cache)
    assert after["37:11:binop"] == "killed"
    assert after["24:16:compare0"] == "survived"


def test_a_mutant_in_a_function_body_is_swapped_into_its_outermost_function():
    tree = ast.parse(_CALC)
    by_id = {m.id: m for m in mutation.mutants(_CALC)}
    assert mutation._target(tree, by_id["9:11:binop"]) == ("add", 8)
    # A decorated method's code object starts at its first decorator.
    assert mutation._target(tree, by_id["33:15:binop"]) == ("Box.double", 31)
    # What runs at import has no function to swap: a module constant, a default value.
    assert mutation._target(tree, by_id["5:8:const"]) is None
    source = "def f(a=1):\n    def g():\n        return a + 2\n    return g\n"
    found = {m.id: m for m in mutation.mutants(source)}
    assert mutation._target(ast.parse(source), found["1:8:const"]) is None
    assert mutation._target(ast.parse(source), found["3:19:const"]) == ("f", 1)


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
    # Nested operators that start at one column still have ids of their own.
    nested = mutation.mutants("x = 4 * 1024 * 1024\n")
    assert len({m.id for m in nested}) == len(nested) == 5


def test_modules_run_together_share_one_session_and_keep_results_of_their_own(tmp_path):
    root = tmp_path / "tree"
    _tree(root)
    (root / "pkg" / "other.py").write_text("def sub(a, b):\n    return a - b\n")
    (root / "pkg" / "other_test.py").write_text(
        "from pkg.other import sub\n\n\ndef test_sub():\n    assert sub(3, 2) == 1\n"
    )
    (root / "pkg" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "pkg" / "calc_test.py").write_text(
        "from pkg.calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    cache = tmp_path / "results.json"
    done = _tool(root, cache, "--min-score", "100", str(root / "pkg"))
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(cache.read_text())
    assert found["pkg/calc.py"]["mutants"]["2:11:binop"]["status"] == "killed"
    assert found["pkg/other.py"]["mutants"]["2:11:binop"]["status"] == "killed"
    # Each module's baseline holds its own lines, from the one traced run of both files.
    assert found["pkg/calc.py"]["baseline"]["lines"]["pkg/calc_test.py::test_add"] == [
        1,
        2,
    ]
    assert "pkg/other_test.py::test_sub" not in found["pkg/calc.py"]["baseline"]["lines"]


def test_a_sample_keeps_the_same_mutants_for_a_seed_and_about_its_fraction():
    found = [m for m in mutation.mutants(_CALC)] * 1
    modules = [f"pkg/m{i}.py" for i in range(40)]
    pairs = [(name, m) for name in modules for m in found]
    tenth = mutation.Sample(fraction=0.1, seed=7)
    kept = [(name, m.id) for name, m in pairs if tenth.keeps(name, m)]
    assert kept == [(name, m.id) for name, m in pairs if tenth.keeps(name, m)]
    assert 0.06 * len(pairs) < len(kept) < 0.14 * len(pairs)
    other = {
        (name, m.id) for name, m in pairs if mutation.Sample(fraction=0.1, seed=8).keeps(name, m)
    }
    assert other != set(kept)
    every = mutation.Sample(fraction=1.0)
    assert all(every.keeps(name, m) for name, m in pairs)


def test_the_wilson_interval_brackets_the_sampled_score():
    low, high = mutation.wilson(90, 100)
    # Known values of the 95% Wilson interval for 90 of 100.
    assert round(low, 4) == 0.8256 and round(high, 4) == 0.9448
    assert mutation.wilson(0, 0) == (0.0, 1.0)
    low, high = mutation.wilson(10, 10)
    assert high == 1.0 and 0.72 < low < 0.73


def test_a_sampled_run_measures_only_its_sample_and_prints_the_interval(tmp_path):
    root = tmp_path / "tree"
    _tree(root)
    seed = 3
    sample = mutation.Sample(fraction=0.5, seed=seed)
    wanted = {m.id for m in mutation.mutants(_CALC) if sample.keeps("pkg/calc.py", m)}
    cache = tmp_path / "results.json"
    done = _tool(
        root,
        cache,
        *("--jobs", "2", "--min-timeout", "10", "--sample", "0.5", "--seed", str(seed)),
        str(root / "pkg" / "calc.py"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(_statuses(cache)) == wanted
    assert f"{len(wanted)} mutants, {len(wanted)} to run" in done.stdout, done.stdout
    assert "(95% Wilson interval)" in done.stdout


_LIMITS = '''\
"""A fixture module whose mutants only a test through another module, a test of its own or a
test reading a constant kills."""

REASONS = {"lost": "a record was lost"}


class Config:
    retries = 3


def attempts(config):
    return config.retries + 1


def allowed(name):
    return name in (
        "alpha",
        "beta",
    )
'''


def test_tests_reaching_a_module_through_others_its_own_tests_and_its_readers_are_selected(
    tmp_path,
):
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "checks").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "limits.py").write_text(_LIMITS)
    (root / "pkg" / "api.py").write_text(
        "from pkg.limits import allowed, attempts\n\n\n"
        "def check(name, config):\n    return allowed(name), attempts(config)\n"
    )
    # Reaches limits.py only through api.py: neither beside it nor naming it.
    (root / "checks" / "api_test.py").write_text(
        "from types import SimpleNamespace\n\nfrom pkg.api import check\n\n\n"
        "def test_check():\n"
        "    assert check('beta', SimpleNamespace(retries=1)) == (True, 2)\n"
        "    assert check('gamma', SimpleNamespace(retries=1)) == (False, 2)\n"
    )
    # Reads a constant and runs no line of limits.py.
    (root / "checks" / "reasons_test.py").write_text(
        "def test_every_reason_is_named():\n"
        "    from pkg.limits import REASONS\n\n"
        "    assert sorted(REASONS) == ['lost']\n"
    )
    # The module's own test pins a default, and runs no line of limits.py either.
    (root / "pkg" / "limits_test.py").write_text(
        "from pkg.limits import Config\n\n\n"
        "def test_the_default_retries():\n    assert Config.retries == 3\n"
    )
    limits = root / "pkg" / "limits.py"
    assert root / "checks" / "api_test.py" in mutation._candidates(limits, root, [])

    cache = tmp_path / "results.json"
    done = _tool(root, cache, "--min-timeout", "10", str(limits))
    assert done.returncode == 0, done.stdout + done.stderr
    found = json.loads(cache.read_text())["pkg/limits.py"]["mutants"]
    by_text = {(m.line, m.replacement): found[m.id]["status"] for m in mutation.mutants(_LIMITS)}
    assert by_text[(4, "('XXlostXX')")] == "killed"  # by its reader
    assert by_text[(4, "('XXa record was lostXX')")] == "survived"  # its text is read by none
    assert by_text[(8, "(4)")] == "killed"  # by the module's own test
    assert by_text[(12, "(config.retries - 1)")] == "killed"  # through api.py
    # A constant CPython folds into the tuple on line 16: its statement's lines select.
    assert by_text[(18, "('XXbetaXX')")] == "killed"
    assert by_text[(17, "('XXalphaXX')")] == "survived"


def test_a_mutant_that_breaks_a_test_modules_import_is_killed(tmp_path):
    # A test module builds a constant of its own from the module's at import (as a shared
    # config does): under the mutant it fails to import, and pytest, given the test by id,
    # exits 4 ("found no collectors"), which is the mutant's kill, not the tool's error.
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "conf.py").write_text(
        "SIZE = 4\n\n\ndef checked(size):\n"
        "    if size != 4:\n        raise ValueError(size)\n    return size\n"
    )
    (root / "pkg" / "conf_test.py").write_text(
        "from pkg.conf import SIZE, checked\n\nCHECKED = checked(SIZE)\n\n\n"
        "def test_checked():\n    assert CHECKED == 4\n"
    )
    cache = tmp_path / "results.json"
    done = _tool(root, cache, "--min-timeout", "10", str(root / "pkg" / "conf.py"))
    found = json.loads(cache.read_text())["pkg/conf.py"]["mutants"]
    assert found["1:7:const"]["status"] == "killed", done.stdout + done.stderr


def test_a_failing_parameter_of_a_test_does_not_kill_an_import_time_mutant(tmp_path):
    # A fresh-import child selects whole test functions: one parameter that fails without any
    # mutant must not be run there, or every import-time mutant its function reaches dies.
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "conf.py").write_text(
        "LIMIT = 10\n\n\ndef clamp(n):\n    return min(n, LIMIT)\n"
    )
    (root / "pkg" / "conf_test.py").write_text(
        "import pytest\n\nfrom pkg.conf import clamp\n\n\n"
        "@pytest.mark.parametrize('n', [1, 2])\n"
        "def test_clamp(n):\n    assert clamp(n) == 1\n"
    )
    cache = tmp_path / "results.json"
    done = _tool(root, cache, "--min-timeout", "10", str(root / "pkg" / "conf.py"))
    found = json.loads(cache.read_text())["pkg/conf.py"]["mutants"]
    # LIMIT = 10 -> 11: clamp(1) is still 1, so no passing test kills it.
    assert found["1:8:const"]["status"] == "survived", done.stdout + done.stderr


def test_a_test_module_that_fails_to_import_alone_does_not_kill_a_mutant(tmp_path):
    # pkg/a.py and pkg/b.py import each other: importing b first works (as the session, which
    # collects b_test.py first, does), importing a first fails. A fresh-import child collects
    # only conf_test.py, which imports a: its collection error is no mutant's kill.
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "a.py").write_text("from pkg import b\n\n\ndef f():\n    return b\n")
    (root / "pkg" / "b.py").write_text("from pkg.a import f\n")
    (root / "pkg" / "b_test.py").write_text("import pkg.b\n\n\ndef test_b():\n    assert pkg.b.f\n")
    (root / "pkg" / "conf.py").write_text("SIZE = 4\n\n\ndef size():\n    return SIZE\n")
    (root / "pkg" / "conf_test.py").write_text(
        "import pkg.a\nfrom pkg.conf import size\n\n\ndef test_size():\n    assert size() > 0\n"
    )
    cache = tmp_path / "results.json"
    conf = root / "pkg" / "conf.py"
    done = _tool(root, cache, "--min-timeout", "10", str(conf))
    found = json.loads(cache.read_text())["pkg/conf.py"]["mutants"]
    # SIZE = 4 -> 5: size() is still above 0; no test kills it, and none may be said to.
    assert found["1:7:const"]["status"] != "killed", done.stdout + done.stderr
    assert found["1:7:const"]["status"] == "error"
    assert "without the mutant" in found["1:7:const"]["detail"]


def test_a_test_reading_a_constant_through_the_module_it_imports_is_selected(tmp_path):
    # Tests that read a constant as an attribute of the module (`from pkg import limits`,
    # `import pkg.limits as lim`, `import pkg.limits`) or under another name execute none of
    # its lines either.
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "checks").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "limits.py").write_text(
        "REASONS = {'lost': 'gone'}\nLIMIT = 3\nSIZE = 8\nDEPTH = 2\n"
    )
    # A relative import of a renamed constant, beside the module.
    (root / "pkg" / "depth_test.py").write_text(
        "from .limits import DEPTH as D\n\n\ndef test_depth():\n    assert D == 2\n"
    )
    (root / "checks" / "reasons_test.py").write_text(
        "from pkg import limits\n\n\n"
        "def test_reasons():\n    assert sorted(limits.REASONS) == ['lost']\n"
    )
    (root / "checks" / "limit_test.py").write_text(
        "import pkg.limits as lim\n\n\ndef test_limit():\n    assert lim.LIMIT == 3\n"
    )
    (root / "checks" / "size_test.py").write_text(
        "import pkg.limits\n\n\ndef test_size():\n    assert pkg.limits.SIZE == 8\n"
    )
    cache = tmp_path / "results.json"
    done = _tool(root, cache, "--min-timeout", "10", str(root / "pkg" / "limits.py"))
    found = json.loads(cache.read_text())["pkg/limits.py"]["mutants"]
    statuses = {mutant_id: outcome["status"] for mutant_id, outcome in found.items()}
    assert statuses["1:11:const"] == "killed", done.stdout + done.stderr  # 'lost'
    assert statuses["1:19:const"] == "survived"  # 'gone': read by no test
    assert statuses["2:8:const"] == "killed"  # LIMIT
    assert statuses["3:7:const"] == "killed"  # SIZE
    assert statuses["4:8:const"] == "killed"  # DEPTH


def test_a_mutant_of_a_function_that_runs_at_collection_runs_in_a_fresh_import(tmp_path):
    # cases() builds a test's parameters at collection: swapping its code after collection (in
    # place) changes nothing, and only a fresh collection under the mutant shows its effect.
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    source = "def double(n):\n    return n * 2\n\n\ndef cases():\n    return [(1, 2), (2, 4)]\n"
    (root / "pkg" / "calc.py").write_text(source)
    (root / "pkg" / "calc_test.py").write_text(
        "import pytest\n\nfrom pkg.calc import cases, double\n\n\n"
        "@pytest.mark.parametrize(('n', 'want'), cases())\n"
        "def test_double(n, want):\n    assert double(n) == want\n"
    )
    cache = tmp_path / "results.json"
    done = _tool(root, cache, "--min-timeout", "10", str(root / "pkg" / "calc.py"))
    found = json.loads(cache.read_text())["pkg/calc.py"]["mutants"]
    in_cases = [m for m in mutation.mutants(source) if m.line == 6]
    assert in_cases
    # Each changes a pair so that double(n) != want, or returns no pairs at all.
    assert {found[m.id]["status"] for m in in_cases} == {"killed"}, done.stdout + done.stderr


def test_files_that_do_not_parse_or_decode_are_no_candidates_and_no_crash(tmp_path):
    # A repository may hold Python files that are data (a syntax error a linter's test reads,
    # bytes that are no text): they import nothing. A file in another encoding that says so
    # is Python like any other.
    root = tmp_path / "tree"
    calc = _tree(root)
    (root / "testdata").mkdir()
    (root / "testdata" / "broken.py").write_text("def broken(:\n")
    (root / "testdata" / "noise.py").write_bytes(b"\xff\xfe\x00import pkg.calc\n")
    (root / "testdata" / "latin_test.py").write_bytes(
        b"# -*- coding: latin-1 -*-\n# caf\xe9\nimport pkg.calc\n"
    )
    assert mutation._candidates(calc, root, []) == [
        root / "pkg" / "calc_test.py",
        root / "testdata" / "latin_test.py",
    ]


def test_a_test_that_fails_without_the_tests_run_before_it_does_not_kill_a_mutant(tmp_path):
    # test_reads passes after test_fills (as in the baseline) and fails alone, with no mutant:
    # a mutant's child runs it alone, and its failure there is no kill.
    root = tmp_path / "tree"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    source = "SCALE = 2\n\n\ndef scale(n):\n    return n * SCALE\n"
    (root / "pkg" / "calc.py").write_text(source)
    (root / "pkg" / "calc_test.py").write_text(
        "from pkg.calc import scale\n\nSTATE = {}\n\n\n"
        "def test_fills():\n    STATE['n'] = 3\n\n\n"
        "def test_reads():\n    assert scale(STATE['n']) > 0\n"
    )
    cache = tmp_path / "results.json"
    done = _tool(root, cache, "--min-timeout", "120", str(root / "pkg" / "calc.py"))
    found = json.loads(cache.read_text())["pkg/calc.py"]["mutants"]
    statuses = {mutant_id: outcome["status"] for mutant_id, outcome in found.items()}
    # n * SCALE -> n / SCALE (in place), SCALE = 2 -> 3 (a fresh import): still above 0. And
    # return None fails the same test that fails without it: the tool cannot tell either way.
    assert statuses == {"5:11:binop": "error", "1:8:const": "error", "5:4:return": "error"}, (
        done.stdout + done.stderr
    )
    assert "fails without the mutant" in found["5:11:binop"]["detail"]
    assert "fail without the mutant" in found["1:8:const"]["detail"]
