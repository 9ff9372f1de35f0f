"""What the current binary would make of stored state: the pre-deploy check.

Before `--update` hands a running job's state to a new binary, an operator can export
StateSnapshots (one per key, see AgentEnvelope.export_request) and ask this module, with the
new binary's migration registry, whether every blob inside will read: current as is, migrating
through registered steps, or not at all (from the future: a newer binary already committed it;
or a missing or failing step). Nothing is written; reports are plain data for the CLI.

Files come from operators' folders, so every oddity is a named failure, never a traceback:
`read_input` opens only regular files (non-blocking, so a FIFO cannot hang it), refuses more
than `max_bytes`, and `printable` names paths whose bytes are not UTF-8. `dry_run` reads every
file under a folder, dot-named ones included, and accepts only bytes that decode as a
StateSnapshot, not as another beam_agents message that happens to parse as one.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from google.protobuf.message import Message

from beam_agents._protos import StateSnapshot
from beam_agents.errors import (
    InputFileError,
    MessageDecodeError,
    MigrationStepError,
    MissingMigrationError,
    StateSchemaFromFutureError,
    with_article,
)
from beam_agents.state.migration import (
    SNAPSHOT_BLOB_FIELDS,
    VERSIONED_MESSAGE_TYPES,
    MigrationRegistry,
    default_registry,
    migrate_snapshot,
)
from beam_agents.wire.decoding import decode

__all__ = [
    "DEFAULT_MAX_BYTES",
    "BlobReport",
    "FileReport",
    "Outcome",
    "dry_run",
    "printable",
    "read_input",
    "report",
]

#: The largest input file the operator commands read unless told otherwise.
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


class Outcome(enum.Enum):
    CURRENT = "current"
    MIGRATES = "migrates"
    FROM_THE_FUTURE = "from the future"
    MISSING_STEP = "missing step"
    STEP_FAILED = "step failed"

    @property
    def readable(self) -> bool:
        return self in (Outcome.CURRENT, Outcome.MIGRATES)


@dataclasses.dataclass(frozen=True)
class BlobReport:
    #: "" for a bare blob; "envelope", "memory", "llm_cache" or "continuation" in a snapshot.
    where: str
    type_name: str
    found_version: int
    outcome: Outcome
    #: One line for people: what happens on read, or why it cannot.
    detail: str
    #: What migrate_to_current returns, when the outcome is readable.
    migrated: Message | None


@dataclasses.dataclass(frozen=True)
class FileReport:
    #: Relative to the folder given to dry_run, printable.
    name: str
    #: Why the file is not a StateSnapshot, or None.
    error: str | None
    blobs: tuple[BlobReport, ...] = ()
    snapshot: StateSnapshot | None = None

    @property
    def ready(self) -> bool:
        return self.error is None and all(b.outcome.readable for b in self.blobs)


def _verdict(where: str, message: Message, migrate, current: int) -> BlobReport:
    type_name = message.DESCRIPTOR.name
    found = message.state_schema_version
    try:
        migrated = migrate(message)
    except StateSchemaFromFutureError as e:
        return BlobReport(where, type_name, found, Outcome.FROM_THE_FUTURE, str(e), None)
    except MissingMigrationError as e:
        return BlobReport(where, type_name, found, Outcome.MISSING_STEP, str(e), None)
    except MigrationStepError as e:
        return BlobReport(where, type_name, found, Outcome.STEP_FAILED, str(e), None)
    reads_as = found or 1
    if reads_as == current:
        note = " (0: pre-versioned, reads as 1)" if found == 0 else ""
        detail = f"current{note}; read as is"
        return BlobReport(where, type_name, found, Outcome.CURRENT, detail, migrated)
    detail = f"migrates {reads_as} -> {current} through {current - reads_as} step(s)"
    return BlobReport(where, type_name, found, Outcome.MIGRATES, detail, migrated)


def report(message: Message, registry: MigrationRegistry | None = None) -> list[BlobReport]:
    """Verdicts for a versioned blob (one) or a StateSnapshot (its envelope and each embedded
    blob); nothing for unversioned messages."""
    registry = registry or default_registry()
    current = registry.current_version
    if type(message) in VERSIONED_MESSAGE_TYPES:
        return [_verdict("", message, registry.migrate, current)]
    if not isinstance(message, StateSnapshot):
        return []
    # The envelope alone, so a failing embedded blob is reported where it is, not here.
    envelope = StateSnapshot(state_schema_version=message.state_schema_version)
    reports = [_verdict("envelope", envelope, lambda m: migrate_snapshot(m, registry), current)]
    for field in SNAPSHOT_BLOB_FIELDS:
        if message.HasField(field):
            reports.append(_verdict(field, getattr(message, field), registry.migrate, current))
    return reports


def printable(path: str | os.PathLike) -> str:
    """`path` as text that prints anywhere: bytes that are not UTF-8 become backslash escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def read_input(path: str | os.PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The bytes of the regular file at `path` (links followed). Raises InputFileError for
    anything else, before reading: a FIFO, a device, a folder, a missing or unreadable file, a
    file over max_bytes."""
    name = printable(path)
    try:
        # O_NONBLOCK: opening a FIFO with no writer must not wait for one.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise InputFileError(f"cannot read: {e.strerror}", path=name) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputFileError(f"not a regular file ({_file_kind(info.st_mode)})", path=name)
        if info.st_size > max_bytes:
            raise InputFileError(
                f"{info.st_size} bytes, over the limit of {max_bytes} (raise it with --max-bytes)",
                path=name,
            )
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:  # it grew while being read
                raise InputFileError(
                    f"over the limit of {max_bytes} bytes (raise it with --max-bytes)", path=name
                )
        return b"".join(chunks)
    except OSError as e:
        raise InputFileError(f"cannot read: {e.strerror}", path=name) from None
    finally:
        os.close(fd)


def _file_kind(mode: int) -> str:
    kinds = {
        stat.S_ISDIR: "a folder",
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISSOCK: "a socket",
    }
    return next((kind for test, kind in kinds.items() if test(mode)), "not a file")


def _walk(directory: Path) -> Iterator[tuple[str, Path | None, str | None]]:
    """(printable relative name, path to read or None, failure or None) for every entry under
    `directory` that is not a folder it descends into, sorted by name."""
    found = []
    unreadable: list[OSError] = []
    for folder, subfolders, files in os.walk(directory, onerror=unreadable.append):
        folder_path = Path(folder)
        for sub in subfolders:
            if (folder_path / sub).is_symlink():
                found.append((folder_path / sub, "a link to a folder, not followed"))
        for file in files:
            found.append((folder_path / file, None))
    for error in unreadable:
        found.append((Path(error.filename), f"cannot list: {error.strerror}"))
    for path, failure in sorted(found, key=lambda item: os.fsencode(item[0])):
        name = printable(path.relative_to(directory))
        try:
            os.fsencode(path).decode("utf-8")
        except UnicodeDecodeError:
            failure = failure or "its name is not UTF-8; rename it to check it"
        yield name, (None if failure else path), failure


def dry_run(
    directory: Path,
    registry: MigrationRegistry | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> list[FileReport]:
    """A report per entry under `directory`, each regular file holding one serialized
    StateSnapshot; anything else is a report with an error."""
    reports = []
    for name, path, failure in _walk(directory):
        if failure is not None:
            reports.append(FileReport(name, failure))
            continue
        try:
            data = read_input(path, max_bytes=max_bytes)
        except InputFileError as e:
            reports.append(FileReport(name, e.reason))
            continue
        if not data:
            reports.append(FileReport(name, "empty file, not a StateSnapshot"))
            continue
        try:
            message = decode(data).message
        except MessageDecodeError as e:
            reports.append(FileReport(name, f"not a StateSnapshot: {e}"))
            continue
        if not isinstance(message, StateSnapshot):
            what = message.DESCRIPTOR.name
            reports.append(
                FileReport(name, f"not a StateSnapshot: it decodes as {with_article(what)}")
            )
            continue
        reports.append(FileReport(name, None, tuple(report(message, registry)), message))
    return reports
