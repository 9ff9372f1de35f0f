"""tools/gen_golden.py: writes only the current corpus, refuses others, and --check catches a
corpus that differs from its builders."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION as CURRENT
from tools import gen_golden, golden
from tools.workspace import data_root

REPO = data_root()
#: The current corpus, the one gen_golden writes.
V = f"v{CURRENT}"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    shutil.copytree(REPO / "golden" / V, tmp_path / "golden" / V)
    return tmp_path


def test_the_committed_corpus_matches_its_builders():
    assert gen_golden.main(["--check", "--repo", str(REPO)]) == 0


def test_check_names_each_file_that_differs(repo, capsys):
    (repo / "golden" / V / "memory_blob.binpb").write_bytes(b"\x08\x01")
    (repo / "golden" / V / "continuation.textproto").unlink()
    assert gen_golden.main(["--check", "--repo", str(repo)]) == 1
    out = capsys.readouterr().out
    assert f"golden/{V}/ stale (fix: bazel run //tools:gen_golden" in out
    assert ": continuation.textproto" in out and ": memory_blob.binpb" in out


def test_writing_restores_the_corpus_and_touches_nothing_else(repo, capsys):
    folder = repo / "golden" / V
    (folder / "memory_blob.binpb").write_bytes(b"\x08\x01")
    (folder / "leftover.binpb").write_bytes(b"")
    (repo / "golden" / "notes.txt").write_text("not corpus")
    assert gen_golden.main(["--repo", str(repo)]) == 0
    out = capsys.readouterr().out
    assert f"golden/{V}/: wrote memory_blob.binpb" in out
    assert f"golden/{V}/: removed leftover.binpb" in out
    assert golden.check_current(folder) == []
    assert (repo / "golden" / "notes.txt").read_text() == "not corpus"
    for name in ("memory_blob.binpb", "SHA256SUMS"):
        assert (folder / name).read_bytes() == (REPO / "golden" / V / name).read_bytes()


@pytest.mark.parametrize(
    ("version", "state"), [(CURRENT - 1, "frozen"), (CURRENT + 1, "not a version yet")]
)
def test_a_version_other_than_the_current_one_is_refused(repo, capsys, version, state):
    assert gen_golden.main(["--version", str(version), "--repo", str(repo)]) == 2
    err = capsys.readouterr().err
    assert f"golden/v{version}/ is {state}; this tool writes only golden/{V}/" in err
    assert not (repo / "golden" / f"v{version}").exists()


def test_a_version_folder_without_builders_is_refused(repo, capsys):
    (repo / "golden" / V / "builders.py").unlink()
    assert gen_golden.main(["--repo", str(repo)]) == 2
    assert f"write golden/{V}/builders.py first" in capsys.readouterr().err


def test_a_fixture_encoded_in_another_field_order_is_not_stale(repo):
    """Golden checks compare fields: another runtime's equally valid encoding passes."""
    from beam_agents._protos import MemoryBlob

    folder = repo / "golden" / V
    blob = MemoryBlob.FromString((folder / "memory_blob.binpb").read_bytes())
    total_first = (
        MemoryBlob(total_value_bytes=blob.total_value_bytes).SerializeToString()
        + MemoryBlob(state_schema_version=CURRENT, entries=blob.entries).SerializeToString()
    )
    assert total_first != (folder / "memory_blob.binpb").read_bytes()
    (folder / "memory_blob.binpb").write_bytes(total_first)
    manifest = folder / golden.MANIFEST
    manifest.write_bytes(golden._manifest(golden._on_disk(folder)))
    assert golden.check_current(folder) == []
    (folder / "memory_blob.binpb").write_bytes(total_first + b"\x18\x00")  # now 0 bytes total
    manifest.write_bytes(golden._manifest(golden._on_disk(folder)))
    assert golden.check_current(folder) == [
        f"golden/{V}/ stale (fix: bazel run //tools:gen_golden  (without Bazel: python "
        "tools/gen_golden.py)): memory_blob.binpb"
    ]
