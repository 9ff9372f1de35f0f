"""`beam-agents inspect`: output and exit codes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from beam_agents._protos import MemoryBlob, ToolIntent, ToolResult
from beam_agents.ops.cli import EXIT_OK, EXIT_REJECTED, EXIT_USAGE, main
from tools.workspace import data_root


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


# Hostile inputs: every one is a named refusal, never a hang or a traceback ------------------


def _cli(*args: str | bytes, cwd=None) -> subprocess.CompletedProcess:
    # A subprocess with a timeout: an input that blocks the command fails the test, not CI.
    return subprocess.run(
        [sys.executable, "-m", "beam_agents.ops.cli", *args],
        capture_output=True,
        timeout=60,
        cwd=cwd,
    )


def test_inspect_refuses_a_fifo_at_once(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    result = _cli("inspect", str(fifo))
    assert result.returncode == EXIT_REJECTED
    assert b"not a regular file (a FIFO)" in result.stderr and b"Traceback" not in result.stderr


def test_inspect_refuses_a_device_at_once():
    result = _cli("inspect", "/dev/zero")
    assert result.returncode == EXIT_REJECTED
    assert b"not a regular file (a character device)" in result.stderr


def test_inspect_refuses_a_folder(tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) == EXIT_REJECTED
    assert "not a regular file (a folder)" in capsys.readouterr().err


def test_inspect_refuses_input_over_the_size_limit_unless_raised(memory_file, capsys):
    size = memory_file.stat().st_size
    assert main(["inspect", str(memory_file), "--max-bytes", str(size - 1)]) == EXIT_REJECTED
    assert f"{size} bytes, over the limit of {size - 1}" in capsys.readouterr().err
    assert main(["inspect", str(memory_file), "--max-bytes", str(size)]) == EXIT_OK


def test_the_default_size_limit_is_64_mib(tmp_path, capsys):
    big = tmp_path / "big.binpb"
    with open(big, "wb") as f:
        f.truncate(64 * 1024 * 1024 + 1)  # sparse: no 64 MiB written
    assert main(["inspect", str(big)]) == EXIT_REJECTED
    assert "over the limit of 67108864" in capsys.readouterr().err


@pytest.mark.parametrize("bad", ["0", "-5", "lots"])
def test_a_bad_size_limit_is_a_usage_error(memory_file, bad):
    with pytest.raises(SystemExit) as raised:
        main(["inspect", str(memory_file), "--max-bytes", bad])
    assert raised.value.code == EXIT_USAGE


def test_inspect_lists_the_unknown_fields_of_a_newer_writer(capsys):
    path = data_root() / "golden" / "v1" / "tool_intent_future_field.binpb"
    assert main(["inspect", str(path)]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith("# beam_agents.v1.ToolIntent (guessed)")
    assert "# 1 unknown field(s), kept as they are (from a newer schema?):\n#   field 20" in out


def test_inspect_refuses_an_ambiguous_guess_naming_the_candidates(tmp_path, capsys):
    path = tmp_path / "ambiguous.binpb"
    path.write_bytes(ToolResult(intent_id="i", entity_key=b"k", seq=2).SerializeToString())
    assert main(["inspect", str(path)]) == EXIT_REJECTED
    err = capsys.readouterr().err
    assert "parse equally well as" in err and "ToolIntent" in err and "ToolResult" in err


def test_inspect_names_a_non_utf8_path_printably(tmp_path):
    result = _cli("inspect", os.path.join(os.fsencode(tmp_path), b"x-\xff.binpb"))
    assert result.returncode == EXIT_REJECTED
    assert b"x-\\xff.binpb: cannot read: No such file or directory" in result.stderr


@pytest.fixture
def hostile_export(tmp_path):
    """An export folder, itself dot-named, with everything an operator's folder can hold."""
    from beam_agents._protos import TraceEvent
    from beam_agents.testing.samples import sample, snapshot

    folder = tmp_path / ".export"
    (folder / ".hidden").mkdir(parents=True)
    good = snapshot().SerializeToString(deterministic=True)
    (folder / "a.binpb").write_bytes(good)
    (folder / ".hidden" / "b.binpb").write_bytes(good)
    (folder / "memory.binpb").write_bytes(sample(MemoryBlob).SerializeToString())
    (folder / "trace.binpb").write_bytes(sample(TraceEvent).SerializeToString())
    os.mkfifo(folder / "pipe")
    (folder / "dangling").symlink_to(tmp_path / "gone")
    (folder / "elsewhere").symlink_to(tmp_path, target_is_directory=True)
    with open(os.path.join(os.fsencode(folder), b"bad-\xff.binpb"), "wb") as f:
        f.write(good)
    return folder


def test_dry_run_names_every_failure_in_a_hostile_folder(hostile_export):
    result = _cli("dry-run", str(hostile_export))
    out = result.stdout.decode("utf-8")
    assert result.returncode == EXIT_REJECTED, result.stderr
    assert result.stderr == b""
    assert "a.binpb: ready" in out and ".hidden/b.binpb: ready" in out
    assert "memory.binpb: REJECTED: not a StateSnapshot: it decodes as a MemoryBlob" in out
    assert "trace.binpb: REJECTED: not a StateSnapshot: it decodes as a TraceEvent" in out
    assert "pipe: REJECTED: not a regular file (a FIFO)" in out
    assert "dangling: REJECTED: cannot read: No such file or directory" in out
    assert "elsewhere: REJECTED: a link to a folder, not followed" in out
    assert "bad-\\xff.binpb: REJECTED: its name is not UTF-8" in out
    assert "summary: 8 files, 2 ready, 6 not" in out


def test_dry_run_reads_a_dot_named_folder_given_relative(hostile_export):
    result = _cli("dry-run", ".export", cwd=hostile_export.parent)
    assert b".hidden/b.binpb: ready" in result.stdout


_SERVICE = ["effector-service", "--bootstrap-servers", "127.0.0.1:1", "--store", ":memory:"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--topic-prefix", "p", "--tools", "beam_agents.ops.demo:DEMO_KEY_ID"], "not a dict"),
        (["--topic-prefix", "p", "--tools", "no_such_module:TOOLS"], "cannot import"),
        (["--topic-prefix", "p", "--tools", "beam_agents.ops.demo"], "not MODULE:NAME"),
        (
            ["--topic-prefix", "p", "--tools", "beam_agents.examples.support_triage:TOOLS"],
            "name a --keyring",
        ),
        (
            ["--topic-prefix", "has space", "--tools", "beam_agents.examples.support_triage:TOOLS",
             "--mode", "off"],
            "no topic prefix",
        ),
        (
            ["--topic-prefix", "p", "--tools", "beam_agents.examples.support_triage:TOOLS",
             "--mode", "off", "--lease-ms", "10"],
            "lease_ms must be an int of at least 300",
        ),
    ],
)  # fmt: skip
def test_effector_service_refuses_what_it_cannot_serve_before_touching_a_broker(
    args, message, capsys
):
    assert main([*_SERVICE, *args]) == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_inspect_shows_a_keys_model_usage_and_allowance(tmp_path, capsys):
    from beam_agents._protos import StateSnapshot

    snapshot = StateSnapshot(entity_key=b"k-1", seq=7, snapshot_at_ms=1)
    snapshot.llm_cache.state_schema_version = 1
    snapshot.llm_cache.input_tokens = 1200
    snapshot.llm_cache.cost_micros = 4800
    snapshot.llm_cache.token_allowance = 1000
    path = tmp_path / "snapshot.binpb"
    path.write_bytes(snapshot.SerializeToString())
    assert main(["inspect", str(path), "--type", "StateSnapshot"]) == EXIT_OK
    shown = capsys.readouterr().out
    assert "input_tokens: 1200" in shown and "cost_micros: 4800" in shown
    assert "token_allowance: 1000" in shown


_TRIAGE_TOOLS = ["--topic-prefix", "p", "--tools", "beam_agents.examples.support_triage:TOOLS"]


def test_effector_service_refuses_a_keyring_that_is_no_loader_before_touching_a_broker(capsys):
    keyring = ["--keyring", "beam_agents.ops.demo:DEMO_KEY_ID"]
    assert main([*_SERVICE, *_TRIAGE_TOOLS, *keyring]) == EXIT_USAGE
    assert "is not a function returning a Keyring" in capsys.readouterr().err


def test_effector_service_names_a_store_it_cannot_open_before_touching_a_broker(tmp_path, capsys):
    store = str(tmp_path / "no_such_folder" / "store.db")
    args = ["effector-service", "--bootstrap-servers", "127.0.0.1:1", "--store", store]
    assert main([*args, *_TRIAGE_TOOLS, "--mode", "off"]) == EXIT_REJECTED
    assert f"effector-service: {store}: OperationalError" in capsys.readouterr().err


def test_version_prints_the_installed_version(capsys):
    with pytest.raises(SystemExit) as raised:
        main(["--version"])
    assert raised.value.code == 0
    assert capsys.readouterr().out.strip() == "beam-agents 0.1.0"


def test_console_help_describes_its_commands(capsys):
    pytest.importorskip("starlette")
    with pytest.raises(SystemExit) as raised:
        main(["console", "--help"])
    assert raised.value.code == 0
    out = capsys.readouterr().out
    assert "hash-password" in out and "argon2id" in out and "serve" in out
    assert "the approvals inbox" in out


def test_commands_that_import_beam_print_no_apitools_warning():
    result = subprocess.run(
        [sys.executable, "-m", "beam_agents.ops.cli", "demo", "--runner=NoSuchRunner"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == EXIT_USAGE
    (line,) = result.stderr.strip().splitlines()  # Beam's refusal, and no apitools warning
    assert line.startswith("beam-agents demo: Unexpected pipeline runner: NoSuchRunner.")
