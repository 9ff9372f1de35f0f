"""Bump drill: proves the migration machinery and the bump checklist without bumping the schema.

On a copy of the workspace the drill raises CURRENT_STATE_SCHEMA_VERSION from its value here,
N, to NEXT = N + 1 and runs the completeness test, which must fail naming every missing item.
It then does the checklist for real: one step module per versioned message under migrations/,
each registered in the central registry and in migrations/BUILD.bazel; golden/v<NEXT>/builders.py
from a copy of v<N>'s; the new corpus written by tools/gen_golden.py; //golden/v<NEXT> wired
into the compat test. Then the completeness and compat tests pass, with every fixture of every
older version migrating to NEXT field-equal, v<N> is frozen (gen_golden refuses it) and
tampering with one of its fixtures is caught by name. Everything is written in terms of N, so
a real bump needs no edit here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION as N
from tools.workspace import source_root

NEXT = N + 1
STEP = '''"""{name} v{N} -> v{NEXT}: restamp; the drill's change is a re-interpretation only."""

from beam_agents._protos import {name}

MESSAGE_TYPE = {name}
FROM_VERSION = {N}
TO_VERSION = {NEXT}


def upgrade(old: {name}) -> {name}:
    new = {name}()
    new.CopyFrom(old)
    new.state_schema_version = TO_VERSION
    return new
'''
STEPS = {
    f"memory_blob_v{N}_to_v{NEXT}": "MemoryBlob",
    f"continuation_v{N}_to_v{NEXT}": "Continuation",
    f"llm_cache_blob_v{N}_to_v{NEXT}": "LlmCacheBlob",
}


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("drill") / "beam_agents"
    shutil.copytree(
        source_root(),
        copy,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            ".*_cache",
            ".hypothesis",
            "node_modules",
            "build",
            "*.egg-info",
            "__pycache__",
            "bazel-*",
        ),
    )
    return copy


def _run(workspace: Path, *args: str) -> subprocess.CompletedProcess:
    # The copy comes first on the path; the installed dependencies (pytest, protobuf) after it.
    original = str(source_root())
    inherited = [p for p in sys.path if p and not p.startswith(original)]
    path = [str(workspace), str(workspace / "migrations"), *inherited]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    env.pop("RUNFILES_DIR", None)
    return subprocess.run(
        [sys.executable, *args], cwd=workspace, env=env, capture_output=True, text=True
    )


def _pytest(workspace: Path, *tests: str) -> subprocess.CompletedProcess:
    return _run(workspace, "-m", "pytest", "-p", "no:cacheprovider", "-v", *tests)


COMPLETENESS = "beam_agents/state/schema_completeness_test.py"
COMPAT = "beam_agents/state/schema_compat_test.py"


def test_the_drill_runs_against_the_copy(workspace):
    result = _run(
        workspace,
        "-c",
        "import beam_agents, beam_agents_migrations; "
        "print(beam_agents.__file__); print(beam_agents_migrations.__file__)",
    )
    assert result.returncode == 0, result.stderr
    for line in result.stdout.splitlines():
        assert line.startswith(str(workspace)), line


def test_raising_the_version_fails_the_checklist_naming_each_missing_item(workspace):
    _replace(
        workspace / "beam_agents/state/migration.py",
        f"CURRENT_STATE_SCHEMA_VERSION = {N}\n",
        f"CURRENT_STATE_SCHEMA_VERSION = {NEXT}\n",
    )
    # Every test module still imports: the suite runs to the end instead of stopping at a
    # collection error (pytest's exit 2), and its failures say what the bump lacks.
    collected = _run(workspace, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q")
    assert collected.returncode == 0, collected.stdout + collected.stderr
    result = _pytest(workspace, COMPLETENESS, COMPAT)
    assert result.returncode == 1, result.stdout
    for missing in (
        f"no migration registered for (MemoryBlob, {N})",
        f"no migration registered for (Continuation, {N})",
        f"no migration registered for (LlmCacheBlob, {N})",
        f"golden/v{NEXT}/ missing",
        f"golden/v{NEXT}/BUILD.bazel has no filegroup 'v{NEXT}'",
        f"//beam_agents/state:schema_compat_test does not have //golden/v{NEXT} in its data",
    ):
        assert missing in result.stdout
    assert f"golden/v{NEXT}/builders.py is missing; schema_completeness_test names" in (
        result.stdout
    )


def test_real_steps_and_the_v2_corpus_complete_the_bump(workspace):
    steps = workspace / "migrations" / "beam_agents_migrations"
    for module, name in STEPS.items():
        (steps / f"{module}.py").write_text(STEP.format(name=name, N=N, NEXT=NEXT))
    imports = "".join(f"from beam_agents_migrations import {m}\n" for m in STEPS)
    listed = "".join(f"    {m},\n" for m in STEPS)
    _replace(steps / "__init__.py", "STEP_MODULES = (\n", f"{imports}\nSTEP_MODULES = (\n{listed}")
    libraries = "".join(
        f'\npy_library(\n    name = "{m}",\n    srcs = ["beam_agents_migrations/{m}.py"],\n'
        f'    imports = ["."],\n    deps = ["//beam_agents/_protos"],\n)\n'
        for m in STEPS
    )
    build = workspace / "migrations" / "BUILD.bazel"
    # The first deps of the file are :migrations'.
    _replace(
        build, "    deps = [\n", "    deps = [\n" + "".join(f'        ":{m}",\n' for m in STEPS)
    )
    build.write_text(build.read_text() + libraries)

    old, new = workspace / "golden" / f"v{N}", workspace / "golden" / f"v{NEXT}"
    new.mkdir()
    shutil.copy(old / "builders.py", new / "builders.py")
    _replace(
        new / "builders.py", f"STATE_SCHEMA_VERSION = {N}\n", f"STATE_SCHEMA_VERSION = {NEXT}\n"
    )
    _replace(
        new / "builders.py", f"for state schema version {N}.", f"for state schema version {NEXT}."
    )
    shutil.copy(old / "BUILD.bazel", new / "BUILD.bazel")
    _replace(new / "BUILD.bazel", f'name = "v{N}"', f'name = "v{NEXT}"')
    for test in ("schema_compat_test", "schema_completeness_test"):
        _replace(
            workspace / "beam_agents/state/BUILD.bazel",
            f'name = "{test}",',
            f'name = "{test}",  # drill',
        )
    state_build = workspace / "beam_agents/state/BUILD.bazel"
    state_build.write_text(
        state_build.read_text().replace(f'"//golden/v{N}"', f'"//golden/v{N}", "//golden/v{NEXT}"')
    )

    generated = _run(workspace, "tools/gen_golden.py")
    assert generated.returncode == 0, generated.stderr
    assert f"golden/v{NEXT}/: wrote memory_blob.binpb" in generated.stdout
    for frozen in range(1, NEXT):
        assert f"golden/v{frozen}/" not in generated.stdout

    result = _pytest(workspace, COMPLETENESS, COMPAT)
    assert result.returncode == 0, result.stdout + result.stderr
    for fixture in ("memory_blob", "continuation_escalated", "llm_cache_blob", "state_snapshot"):
        for version in range(1, NEXT + 1):
            assert f"[v{version}/{fixture}] PASSED" in result.stdout

    check = _run(
        workspace,
        "-c",
        "from pathlib import Path\n"
        "from beam_agents._protos import MemoryBlob\n"
        "from beam_agents.state.migration import migrate_to_current\n"
        "old = MemoryBlob.FromString(Path('golden/v1/memory_blob.binpb').read_bytes())\n"
        "new = migrate_to_current(old)\n"
        f"assert (old.state_schema_version, new.state_schema_version) == (1, {NEXT})\n"
        "assert list(new.entries) == list(old.entries)\n"
        "print('migrated')\n",
    )
    assert check.stdout == "migrated\n", check.stderr


def test_after_the_bump_the_operator_commands_show_the_migration(workspace):
    inspected = _run(
        workspace, "-m", "beam_agents.ops.cli", "inspect", "golden/v1/memory_blob.binpb"
    )
    assert inspected.returncode == 0, inspected.stderr
    assert f"# MemoryBlob state_schema_version 1: migrates 1 -> {NEXT} through {N} step(s)" in (
        inspected.stdout
    )
    assert f"# after migrate_to_current:\nstate_schema_version: {NEXT}" in inspected.stdout

    export = workspace / "export"
    export.mkdir()
    for name in ("state_snapshot", "state_snapshot_running"):
        shutil.copy(workspace / "golden" / "v1" / f"{name}.binpb", export)
    checked = _run(workspace, "-m", "beam_agents.ops.cli", "dry-run", str(export))
    assert checked.returncode == 0, checked.stdout
    assert f"memory: MemoryBlob state_schema_version 1: migrates 1 -> {NEXT}" in checked.stdout
    assert "summary: 2 files, 2 ready, 0 not; 7 blobs: 0 current, 7 migrate" in checked.stdout


def test_after_the_bump_the_outgoing_corpus_is_frozen(workspace):
    refused = _run(workspace, "tools/gen_golden.py", "--version", str(N))
    assert refused.returncode == 2
    assert f"golden/v{N}/ is frozen" in refused.stderr

    fixture = workspace / "golden" / f"v{N}" / "memory_blob.binpb"
    fixture.write_bytes(fixture.read_bytes() + b"\x18\x00")
    result = _pytest(workspace, COMPLETENESS)
    assert result.returncode == 1
    assert f"golden/v{N}/ changed: memory_blob.binpb" in result.stdout
