"""The README and the user guide (docs/) say what the code does: every code block runs here.

Sybil parses the pages' fenced blocks and evaluates each page's Python blocks in order in one
namespace (a page's later blocks build on its earlier ones), reporting a failure at the page's
line. It runs inside an ordinary test, not as a pytest plugin collecting .md files, so Bazel's
py_test runs the same file and a page's blocks can be split by tier. Chosen over
pytest-markdown-docs, which collects every fence as its own test and needs a fixture or a
`continuation` fence to share a namespace, and offers no per-block tier marker.

Markers, each an HTML comment on the line before the block's fence (invisible on the site):

* `<!-- engines -->`: the block needs what tools/engines.sh builds and starts (Kafka, Flink,
  Prism); it runs in the engines tier (`pytest -m engines`), with the page's blocks before it.
  A shell block so marked runs in the checkout (its commands are the checkout's `tools/`);
* `<!-- run -->`: a shell block (`sh`) that runs, with `bash -euo pipefail`, in the page's
  temporary folder (where its Python blocks ran, so it reads the files they wrote), with
  `python` (this Python) and `beam-agents` first on PATH, the checkout first on PYTHONPATH,
  and the checkout's `examples/` linked in;
* `<!-- console-config -->`: a fragment of the console's TOML file; it is read by the
  console's own loader (`ConsoleConfig.from_document`, completed with a user and a keyring)
  and each of its `[console]` settings must come out as the fragment gives it;
* `<!-- output -->`: a block showing what the page's Python blocks before it printed; each of
  its lines but `...` must have been printed, in that order;
* `<!-- not-run: WHY -->`: a block to read, not run (a long command, a config file shown for
  its fields); the reason is required, and `test_no_block_is_left_unchecked` fails on any
  block that is neither Python nor marked.

The troubleshooting page and the API reference are checked against the code: the page lists
exactly the dead-letter reasons the runtime emits, and the reference exactly `__all__`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sybil import Document
from sybil.parsers.markdown import PythonCodeBlockParser
from sybil.parsers.markdown.lexers import RawFencedCodeBlockLexer

from tools.workspace import source_root

ROOT = source_root()
PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").glob("*.md")], key=lambda p: str(p.relative_to(ROOT))
)

_ENGINES = "<!-- engines -->"
_OUTPUT = "<!-- output -->"
_RUN = "<!-- run -->"
_CONSOLE_CONFIG = "<!-- console-config -->"
_SHELL = "sh"
_NOT_RUN = re.compile(r"<!-- not-run: \S.*? -->")
_FENCES = RawFencedCodeBlockLexer(
    info_pattern=re.compile(r"(?P<language>[^\n]*)$\n", re.MULTILINE),
    mapping={"language": "language", "source": "source"},
)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _marker(document: Document, start: int) -> str:
    """The HTML comment on the line before the fence that opens at `start`, if any."""
    before = document.text[:start].rstrip(" \t")
    line = before[: before.rfind("\n")].rsplit("\n", 1)[-1].strip()
    return line if line.startswith("<!--") else ""


def _python_blocks(page: Path) -> tuple[Document, list]:
    document = Document.parse(str(page), PythonCodeBlockParser())
    return document, list(document.examples())


@dataclasses.dataclass(frozen=True)
class _Fence:
    """A fenced block of a page: where it starts, its language, its marker and its text."""

    start: int
    language: str
    marker: str
    source: str

    @property
    def runs_in_a_shell(self) -> bool:
        return self.language == _SHELL and self.marker in (_RUN, _ENGINES)


def _fences(document: Document) -> list[_Fence]:
    return [
        _Fence(
            region.start,
            region.lexemes["language"].strip(),
            _marker(document, region.start),
            region.lexemes["source"],
        )
        for region in _FENCES(document)
    ]


def _shell_blocks(document: Document) -> list[_Fence]:
    """Each shell block marked to run, in either tier."""
    return [fence for fence in _fences(document) if fence.runs_in_a_shell]


def _has_engines_blocks(page: Path) -> bool:
    document, examples = _python_blocks(page)
    starts = [e.region.start for e in examples] + [f.start for f in _shell_blocks(document)]
    return any(_marker(document, start) == _ENGINES for start in starts)


def _commands(folder: Path) -> Path:
    """A bin/ of the commands a reader has after installing beam_agents, made from this
    Python (a Bazel test has no console scripts): `python` and `beam-agents`."""
    folder.mkdir(exist_ok=True)
    # Scripts, not links: a link to a virtualenv's python is no longer in the virtualenv.
    for name, run in (("python", ""), ("beam-agents", " -m beam_agents.ops.cli")):
        command = folder / name
        command.write_text(f'#!/bin/sh\nexec "{sys.executable}"{run} "$@"\n')
        command.chmod(0o755)
    return folder


def _run_shell(source: str, *, in_checkout: bool, where: str) -> None:
    """Runs a shell block as a reader would, in the page's folder (or the checkout)."""
    if not in_checkout and not Path("examples").exists():
        Path("examples").symlink_to(ROOT / "examples")
    commands = _commands(Path.cwd() / ".docs-bin")
    paths = [str(ROOT), str(ROOT / "migrations"), os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "PATH": f"{commands}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, paths)),
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", source],
        cwd=ROOT if in_checkout else None,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, (
        f"{where}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )


def _run(page: Path, *, engines: bool) -> int:
    document, examples = _python_blocks(page)
    outputs = [(f.start, f.source) for f in _fences(document) if f.marker == _OUTPUT]
    shells = _shell_blocks(document)
    printed, skipped, ran = io.StringIO(), False, 0

    def check_outputs_before(position: int) -> None:
        nonlocal printed, skipped
        while outputs and outputs[0][0] < position:
            start, shown = outputs.pop(0)
            if not skipped:  # what a block left to another tier would have printed
                where = f"{_name(page)}, {document.line_column(start)}"
                _assert_printed(shown, printed.getvalue(), where)
            printed, skipped = io.StringIO(), False

    def run_shells_before(position: int) -> int:
        count = 0
        while shells and shells[0].start < position:
            shell = shells.pop(0)
            check_outputs_before(shell.start)
            if shell.marker == _ENGINES and not engines:
                continue
            where = f"{_name(page)}, {document.line_column(shell.start)}"
            _run_shell(shell.source, in_checkout=shell.marker == _ENGINES, where=where)
            count += 1
        return count

    for example in examples:
        ran += run_shells_before(example.region.start)
        check_outputs_before(example.region.start)
        marker = _marker(document, example.region.start)
        if _NOT_RUN.fullmatch(marker) or (marker == _ENGINES and not engines):
            skipped = True
            continue
        with contextlib.redirect_stdout(printed):
            example.evaluate()
        ran += 1
    ran += run_shells_before(len(document.text))
    check_outputs_before(len(document.text))
    return ran


def _assert_printed(shown: str, printed: str, where: str) -> None:
    """Every line of `shown` but `...` is a line of `printed`, in the same order."""
    lines = iter(printed.splitlines())
    for line in shown.splitlines():
        if line.strip() != "..." and not any(line == out for out in lines):
            raise AssertionError(f"{where}: the output block shows {line!r}, never printed")


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_the_code_blocks_of_the_page_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks may write files (an effector's store)
    _run(page, engines=False)


@pytest.mark.engines
@pytest.mark.parametrize("page", [p for p in PAGES if _has_engines_blocks(p)], ids=_name)
def test_the_engines_code_blocks_of_the_page_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _run(page, engines=True)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_no_block_is_left_unchecked(page):
    """A block runs (Python), or says why not: nothing rots unseen."""
    document = Document(page.read_text(), str(page))
    unchecked = [
        f"{_name(page)}, {document.line_column(fence.start)}: ```{fence.language}"
        for fence in _fences(document)
        if fence.language != "python"
        and not _NOT_RUN.fullmatch(fence.marker)
        and fence.marker not in (_OUTPUT, _CONSOLE_CONFIG)
        and not fence.runs_in_a_shell
    ]
    assert not unchecked, "blocks neither run nor marked <!-- not-run: WHY -->: " + str(unchecked)


def test_the_guide_builds_strictly(tmp_path):
    """`mkdocs build --strict`, as tools/dev.sh docs runs it: a broken link or anchor, a page
    missing from the nav, an API reference to a name that no longer exists fail it."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-4000:]


def test_the_readme_links_to_files_that_exist():
    """The README is outside the guide's build: its links are checked here."""
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    assert links
    assert [link for link in links if not (ROOT / link).is_file()] == []


def test_the_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def _table_reasons(text: str) -> set[str]:
    return {
        reason
        for row in re.findall(r"^\| (.+?) \|", text, re.MULTILINE)
        for reason in re.findall(r"`([a-z_]+)`", row)
    }


def _section(page: str, title: str) -> str:
    text = (ROOT / "docs" / page).read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_troubleshooting_page_lists_every_dead_letter_reason_of_the_runtime():
    from beam_agents.runtime.dead_letters import REASONS

    assert _table_reasons(_section("troubleshooting.md", "Dead letters of RunAgent")) == set(
        REASONS
    )


def test_the_troubleshooting_page_lists_every_dead_letter_reason_of_the_effector():
    from beam_agents.intents import effector
    from beam_agents.intents.signing import Verification

    signature = {"signature_" + outcome.name.lower() for outcome in Verification}
    signature.discard("signature_valid")
    expected = {effector.REASON_UNDECODABLE} | signature
    assert _table_reasons(_section("troubleshooting.md", "Dead letters of the effector")) == (
        expected
    )


def test_the_api_reference_documents_exactly_the_public_names_from_their_owners():
    import beam_agents

    documented = re.findall(r"^::: ([\w.]+)$", (ROOT / "docs/reference.md").read_text(), re.M)
    assert sorted(documented) == sorted(
        f"{beam_agents._OWNERS[name]}.{name}" for name in beam_agents.__all__
    )


#: The modules a README or guide snippet may import from: the package's API, the integrations
#: that need an optional extra, and the scripted rounds of the local loop.
_IMPORTABLE = (
    "beam_agents",
    "beam_agents.ops.console",
    "beam_agents.ops.rounds",
    "beam_agents.integrations.langgraph",
    "beam_agents.integrations.llm.anthropic_messages",
    "beam_agents.integrations.llm.gemini",
    "beam_agents.integrations.llm.openai_chat",
    "beam_agents.integrations.mcp_tools",
    "beam_agents.integrations.telemetry",
)


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_snippets_import_only_the_public_api_and_the_extras_modules(page):
    import beam_agents

    text = page.read_text()
    for module, names in re.findall(r"^\s*from (beam_agents[\w.]*) import ([^\n(]+)$", text, re.M):
        assert module in _IMPORTABLE, f"{_name(page)} imports from {module}"
        if module == "beam_agents":
            for name in (n.strip() for n in names.split(",")):
                assert name in beam_agents.__all__, f"{name} is not in beam_agents.__all__"


#: The README's and the guide's agents, and the examples they are copied from.
_AGENT_SOURCES = [
    *PAGES,
    *sorted((ROOT / "examples").glob("*.py")),
    *sorted((ROOT / "beam_agents/examples").glob("*.py")),
    ROOT / "beam_agents/ops/scaffold.py",
]


@pytest.mark.parametrize("source", _AGENT_SOURCES, ids=_name)
def test_an_answers_payload_is_read_only_after_its_payload_unknown_is_checked(source):
    """A call can take effect with its answer unknown (`Answer.payload_unknown`, its payload
    then empty): an example that reads a tool's payload unchecked teaches a crash."""
    text = source.read_text()
    unchecked = [
        f"{_name(source)}: {name}.payload"
        for name in set(re.findall(r"(\w+) = ctx\.call_tool\(", text))
        for read in re.finditer(rf"\b{name}\.payload\b(?!_)", text)
        if f"{name}.payload_unknown" not in text[: read.start()]
    ]
    assert not unchecked, unchecked


def _row(page: str, reason: str) -> str:
    (row,) = [
        line
        for line in (ROOT / "docs" / page).read_text().splitlines()
        if line.startswith(f"| `{reason}`")
    ]
    return row


@pytest.mark.parametrize(
    ("reason", "fixes"),
    [
        ("signature_unsigned", ["keyring_loader=", "VerifyMode.OFF"]),
        ("llm_failed", ["llm_client="]),
    ],
)
def test_the_troubleshooting_row_names_the_fix_the_error_names(reason, fixes):
    """The dead letter's detail names the option to set; its row says the same."""
    row = _row("troubleshooting.md", reason)
    assert [fix for fix in fixes if fix not in row] == []


def test_each_reference_section_names_its_entries_in_a_table_readable_without_the_site():
    """On GitHub, `::: name` lines render as bare text: each section's table says, one line
    a name, what each of its rendered entries is."""
    text = (ROOT / "docs/reference.md").read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    assert sections
    for section in sections:
        rendered = [n.rsplit(".", 1)[1] for n in re.findall(r"^::: ([\w.]+)$", section, re.M)]
        tabled = re.findall(r"^\| `(\w+)` \| \S.* \|$", section, re.M)
        assert tabled == rendered, section.splitlines()[0]


def _console_config_blocks(page: Path) -> list[str]:
    document = Document(page.read_text(), str(page))
    return [fence.source for fence in _fences(document) if fence.marker == _CONSOLE_CONFIG]


@pytest.mark.parametrize(
    "fragment",
    [block for page in PAGES for block in _console_config_blocks(page)],
    ids=lambda fragment: fragment.splitlines()[1].split("=")[0].strip(),
)
def test_a_console_configuration_fragment_is_read_as_the_page_says(fragment, tmp_path):
    import base64
    import json
    import tomllib

    if os.environ.get("RUNFILES_DIR"):
        pytest.skip("//beam_agents/ops/console is not visible to //tools; pytest reads it")
    from beam_agents.ops.console.config import ConsoleConfig

    (tmp_path / "approvals.json").write_text(
        json.dumps({"active": "a1", "keys": {"a1": base64.b64encode(bytes(32)).decode()}})
    )
    given = tomllib.loads(fragment)
    document = {
        "users": {"ada": {"role": "admin", "password_hash": "$argon2id$v=19$stand-in"}},
        "console": {"approvals_keyring": "approvals.json", "verify_mode": "off"},
    }
    for table, settings in given.items():
        document[table] = {**document.get(table, {}), **settings}
    config = ConsoleConfig.from_document(document, base=tmp_path, source="the page")
    for name, value in given.get("console", {}).items():
        got = getattr(config, name)
        assert (list(got) if isinstance(got, tuple) else got) == value, name


#: Commands of our CLI that serve until stopped: shown, never run to an end.
_SERVICES = ("beam-agents effector-service", "beam-agents console")


def test_the_engines_tier_has_blocks_to_run():
    """Blocks that need the engines are marked and run there, not left unrun."""
    assert [p for p in PAGES if _has_engines_blocks(p)], "no page has an <!-- engines --> block"


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_a_shell_block_running_our_cli_runs(page):
    """A `beam-agents` command that ends runs in the suite, as the reader would type it."""
    document = Document(page.read_text(), str(page))
    unrun = [
        f"{_name(page)}, {document.line_column(fence.start)}"
        for fence in _fences(document)
        if fence.language == _SHELL
        and "beam-agents " in fence.source
        and not any(service in fence.source for service in _SERVICES)
        and not fence.runs_in_a_shell
    ]
    assert not unrun, unrun
