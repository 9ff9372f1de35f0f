"""`beam-agents inspect`: output and exit codes."""

from __future__ import annotations

import pytest

from beam_agents._protos import MemoryBlob, ToolIntent
from beam_agents.cli import EXIT_OK, EXIT_REJECTED, EXIT_USAGE, main


@pytest.fixture
def memory_file(tmp_path):
    blob = MemoryBlob(state_schema_version=1, total_value_bytes=5)
    blob.entries.add(key="greeting", value=b"hello", last_access_ms=9)
    path = tmp_path / "memory.binpb"
    path.write_bytes(blob.SerializeToString())
    return path


def test_inspect_guesses_the_type_and_prints_text_format(memory_file, capsys):
    assert main(["inspect", str(memory_file)]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("# beam_agents.v1.MemoryBlob (guessed)")
    assert 'key: "greeting"' in out and 'value: "hello"' in out


def test_inspect_uses_the_given_type(tmp_path, capsys):
    path = tmp_path / "intent.binpb"
    path.write_bytes(ToolIntent(intent_id="abc", tool_name="search").SerializeToString())
    assert main(["inspect", str(path), "--type", "ToolIntent"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "(given)" in out and 'intent_id: "abc"' in out


def test_inspect_rejects_bytes_that_are_no_message(tmp_path, capsys):
    path = tmp_path / "garbage.bin"
    path.write_bytes(b"\xff\xfe\xfd\xfc")
    assert main(["inspect", str(path)]) == EXIT_REJECTED
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "not a serialized beam_agents message" in captured.err


def test_inspect_rejects_a_missing_file(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "absent")]) == EXIT_REJECTED
    assert "cannot read" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["inspect", "f", "--type", "NotAType"])
    assert raised.value.code == EXIT_USAGE


@pytest.fixture
def snapshots(tmp_path):
    from beam_agents.testing.samples import snapshot

    folder = tmp_path / "export"
    folder.mkdir()
    for key in ("a", "b"):
        exported = snapshot()
        exported.entity_key = key.encode()
        (folder / f"{key}.binpb").write_bytes(exported.SerializeToString(deterministic=True))
    return folder


def test_inspect_reports_the_migration_verdict_of_a_state_blob(tmp_path, capsys):
    path = tmp_path / "future.binpb"
    path.write_bytes(MemoryBlob(state_schema_version=9, total_value_bytes=1).SerializeToString())
    assert main(["inspect", str(path), "--type", "MemoryBlob"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "# MemoryBlob state_schema_version 9: MemoryBlob has state_schema_version 9" in out
    assert "roll the newer binary forward" in out


def test_dry_run_passes_when_every_blob_reads(snapshots, capsys):
    assert main(["dry-run", str(snapshots)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "a.binpb: ready" in out and "b.binpb: ready" in out
    assert "summary: 2 files, 2 ready, 0 not; 8 blobs: 8 current" in out


def test_dry_run_fails_naming_the_blob_that_would_not_read(snapshots, capsys):
    from beam_agents._protos import StateSnapshot

    path = snapshots / "b.binpb"
    exported = StateSnapshot.FromString(path.read_bytes())
    exported.continuation.state_schema_version = 5
    path.write_bytes(exported.SerializeToString())
    assert main(["dry-run", str(snapshots)]) == EXIT_REJECTED
    out = capsys.readouterr().out
    assert "b.binpb: NOT READY" in out
    assert "FAIL continuation: Continuation state_schema_version 5" in out
    assert "1 from the future" in out


def test_dry_run_usage_errors_exit_2(tmp_path, capsys):
    assert main(["dry-run", str(tmp_path / "absent")]) == EXIT_USAGE
    assert main(["dry-run", str(tmp_path)]) == EXIT_USAGE
    assert "holds no files" in capsys.readouterr().err
