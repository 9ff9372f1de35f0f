"""What the current binary would make of stored state: the pre-deploy check.

Before `--update` hands a running job's state to a new binary, an operator can export
StateSnapshots (one per key, see AgentEnvelope.export_request) and ask this module, with the
new binary's migration registry, whether every blob inside will read: current as is, migrating
through registered steps, or not at all (from the future: a newer binary already committed it;
or a missing or failing step). Nothing is written; reports are plain data for the CLI.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator
from pathlib import Path

from google.protobuf.message import DecodeError, Message

from beam_agents._protos import StateSnapshot
from beam_agents.core.migration import (
    SNAPSHOT_BLOB_FIELDS,
    VERSIONED_MESSAGE_TYPES,
    MigrationRegistry,
    default_registry,
    migrate_snapshot,
)
from beam_agents.errors import (
    MigrationStepError,
    MissingMigrationError,
    StateSchemaFromFutureError,
)

__all__ = ["BlobReport", "FileReport", "Outcome", "dry_run", "report"]


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
    path: Path
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


def _files(directory: Path) -> Iterator[Path]:
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not any(part.startswith(".") for part in path.parts):
            yield path


def dry_run(directory: Path, registry: MigrationRegistry | None = None) -> list[FileReport]:
    """A report per file under `directory`, each file holding one serialized StateSnapshot."""
    reports = []
    for path in _files(directory):
        data = path.read_bytes()
        if not data:
            reports.append(FileReport(path, "empty file, not a StateSnapshot"))
            continue
        try:
            snapshot = StateSnapshot.FromString(data)
        except DecodeError as e:
            reports.append(FileReport(path, f"not a StateSnapshot: {e}"))
            continue
        reports.append(FileReport(path, None, tuple(report(snapshot, registry)), snapshot))
    return reports
