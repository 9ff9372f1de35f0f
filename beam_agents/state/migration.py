"""State-schema versions and lazy, read-path migration of the keyed-state blobs.

Keyed state outlives the binary that wrote it: Dataflow `--update` restores state bytes
verbatim and Beam cannot enumerate user-state keys, so the only chance to migrate a key's state
is when a new binary reads it. Three messages carry `state_schema_version` and take part:
MemoryBlob, Continuation and LlmCacheBlob (`VERSIONED_MESSAGE_TYPES`). Every other message is
additive-only and never migrates.

* `CURRENT_STATE_SCHEMA_VERSION` is the one authoritative version; writers stamp it through
  `new_state_blob`.
* `migrate_to_current` runs on every read. A current-version blob comes back as the very same
  object after one integer compare. Version 0 (proto3's default: written before versioning, or
  never written) reads as 1. A version above current raises `StateSchemaFromFutureError` before
  any other field is read: the caller must let the bundle fail (a newer binary already committed
  this key; roll it forward), never dead-letter it.
* Older versions go through registered steps, one version at a time. A step is pure (no clock,
  no randomness, no I/O: replayed bundles must see the same migrated view) and returns a new
  message stamped exactly one version higher; anything else raises `MigrationStepError`.
* Migration writes nothing. The migrated view reaches durable state only through the next
  commit, and a failed activation commits (the model calls it paid for) only on a key that no
  binary of an older version reads any more, so it never wedges one the binary before reads.

Steps are modules under migrations/ (importable as `beam_agents_migrations.<step>`), one per
(message type, from_version), each declaring MESSAGE_TYPE, FROM_VERSION, TO_VERSION and
`upgrade`. beam_agents_migrations.STEP_MODULES lists them; `default_registry` builds the
registry from that list, rejecting duplicates and malformed steps when it is built.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import TypeVar

from google.protobuf.message import Message

from beam_agents._protos import Continuation, LlmCacheBlob, MemoryBlob, StateSnapshot
from beam_agents.errors import (
    DuplicateMigrationError,
    InvalidMigrationStepError,
    MigrationStepError,
    MissingMigrationError,
    StateSchemaFromFutureError,
    UnversionedMessageError,
)

__all__ = [
    "CURRENT_STATE_SCHEMA_VERSION",
    "INDEX_FIELDS",
    "SNAPSHOT_BLOB_FIELDS",
    "VERSIONED_MESSAGE_TYPES",
    "MigrationRegistry",
    "MigrationStep",
    "default_registry",
    "migrate_snapshot",
    "migrate_to_current",
    "new_state_blob",
]

#: The state schema version this binary reads and writes. Raising it is a bump: see
#: beam_agents/state/schema_completeness_test.py for what must exist before it merges.
#: 2: MemoryBlob and LlmCacheBlob carry an index of their entries (entry_stamps, key_hashes,
#: key_stamps), trustworthy only in blobs a version-2 writer wrote.
CURRENT_STATE_SCHEMA_VERSION = 2

#: The keyed-state blobs that carry state_schema_version and migrate on read.
VERSIONED_MESSAGE_TYPES: tuple[type[Message], ...] = (MemoryBlob, Continuation, LlmCacheBlob)

#: The entry index of MemoryBlob and LlmCacheBlob (see protos/beam_agents.proto), and the
#: total its reader trusts along with it.
INDEX_FIELDS = ("entry_stamps", "key_hashes", "key_stamps")
_INDEXED_TOTALS = {MemoryBlob: "total_value_bytes", LlmCacheBlob: "total_response_bytes"}

#: The StateSnapshot fields that embed versioned blobs, carried verbatim at export.
SNAPSHOT_BLOB_FIELDS = ("memory", "llm_cache", "continuation")

_VERSIONED = frozenset(VERSIONED_MESSAGE_TYPES)
_BlobT = TypeVar("_BlobT", bound=Message)


@dataclasses.dataclass(frozen=True)
class MigrationStep:
    """One registered step: turns a `message_type` message of `from_version` into one of
    `from_version + 1`."""

    message_type: type[Message]
    from_version: int
    upgrade: Callable[[Message], Message]
    #: Where the step comes from, for error messages (its module name).
    name: str

    @classmethod
    def from_module(cls, module: ModuleType) -> MigrationStep:
        """Reads a step module's MESSAGE_TYPE, FROM_VERSION, TO_VERSION and upgrade."""
        name = module.__name__
        try:
            message_type = module.MESSAGE_TYPE
            from_version = module.FROM_VERSION
            to_version = module.TO_VERSION
            upgrade = module.upgrade
        except AttributeError as e:
            raise InvalidMigrationStepError(f"lacks {e.name}", step=name) from None
        if not (isinstance(from_version, int) and isinstance(to_version, int)):
            raise InvalidMigrationStepError("versions must be integers", step=name)
        if to_version != from_version + 1:
            raise InvalidMigrationStepError(
                f"goes from {from_version} to {to_version}; a step advances exactly one version",
                step=name,
            )
        if not callable(upgrade):
            raise InvalidMigrationStepError("upgrade is not callable", step=name)
        return cls(message_type, from_version, upgrade, name)


class MigrationRegistry:
    """The migration steps of one binary, keyed by (message type, from_version).

    Registration rejects a second step for the same key, a step for an unversioned type and a
    step starting below version 1. Completeness against a target version is asked of
    `missing_steps` (the bump checklist's tests) and enforced at read time by
    `migrate_to_current`, which raises MissingMigrationError on a gap.
    """

    def __init__(
        self,
        steps: Iterable[MigrationStep] = (),
        *,
        current_version: int = CURRENT_STATE_SCHEMA_VERSION,
    ) -> None:
        self.current_version = current_version
        self._steps: dict[tuple[type[Message], int], MigrationStep] = {}
        for step in steps:
            self.register(step)

    @classmethod
    def from_modules(
        cls,
        modules: Iterable[ModuleType],
        *,
        current_version: int = CURRENT_STATE_SCHEMA_VERSION,
    ) -> MigrationRegistry:
        return cls((MigrationStep.from_module(m) for m in modules), current_version=current_version)

    def register(self, step: MigrationStep) -> None:
        if step.message_type not in _VERSIONED:
            raise InvalidMigrationStepError(
                f"{step.message_type.DESCRIPTOR.name} is not a versioned state blob",
                step=step.name,
            )
        if step.from_version < 1:
            raise InvalidMigrationStepError(
                f"starts at version {step.from_version}; versions start at 1", step=step.name
            )
        key = (step.message_type, step.from_version)
        if key in self._steps:
            raise DuplicateMigrationError(
                type_name=step.message_type.DESCRIPTOR.name,
                from_version=step.from_version,
                first=self._steps[key].name,
                second=step.name,
            )
        self._steps[key] = step

    def step(self, message_type: type[Message], from_version: int) -> MigrationStep | None:
        return self._steps.get((message_type, from_version))

    @property
    def steps(self) -> list[MigrationStep]:
        return sorted(
            self._steps.values(), key=lambda s: (s.message_type.DESCRIPTOR.name, s.from_version)
        )

    def missing_steps(self) -> list[tuple[str, int]]:
        """(type name, from_version) of every step the chain to current_version lacks."""
        return [
            (message_type.DESCRIPTOR.name, version)
            for message_type in VERSIONED_MESSAGE_TYPES
            for version in range(1, self.current_version)
            if (message_type, version) not in self._steps
        ]

    def migrate(self, message: _BlobT) -> _BlobT:
        """`message` at current_version; see `migrate_to_current`."""
        message_type = type(message)
        if message_type not in _VERSIONED:
            raise UnversionedMessageError(type_name=message_type.DESCRIPTOR.name)
        type_name = message_type.DESCRIPTOR.name
        original, version = message, message.state_schema_version or 1
        if version > self.current_version:
            raise StateSchemaFromFutureError(
                type_name=type_name,
                found_version=message.state_schema_version,
                current_version=self.current_version,
            )
        if version < self.current_version:
            # Steps are pure by contract; one that is not gets a copy to change, never the
            # blob read, which a portable runner hands back as the key's state.
            message = message_type()
            message.CopyFrom(original)
        while version < self.current_version:
            step = self._steps.get((message_type, version))
            if step is None:
                raise MissingMigrationError(type_name=type_name, from_version=version)
            upgraded = step.upgrade(message)
            if upgraded is message or type(upgraded) is not message_type:
                got = "its input" if upgraded is message else type(upgraded).__name__
                raise MigrationStepError(
                    f"returned {got}; a step returns a new {type_name}",
                    type_name=type_name,
                    from_version=version,
                    step=step.name,
                )
            if upgraded.state_schema_version != version + 1:
                raise MigrationStepError(
                    f"stamped {upgraded.state_schema_version}, expected {version + 1}",
                    type_name=type_name,
                    from_version=version,
                    step=step.name,
                )
            message, version = upgraded, version + 1
        return _index_checked(original, message)


def _index_checked(original: _BlobT, migrated: _BlobT) -> _BlobT:
    """`migrated`, without the entry index unless the steps left the entries and the total as
    they were. A reader trusts the index and total as written, and a step (which may rename
    keys, reorder or reshape entries) need not know of them: with the index cleared, the
    reader builds it from the entries by one pass, and the next commit writes it. Clears only
    the steps' own output, never the blob read."""
    total = _INDEXED_TOTALS.get(type(migrated))
    if (
        migrated is original
        or total is None
        or not any(getattr(migrated, field) for field in INDEX_FIELDS)
        or (
            migrated.entries == original.entries
            and getattr(migrated, total) == getattr(original, total)
        )
    ):
        return migrated
    for field in INDEX_FIELDS:
        migrated.ClearField(field)
    return migrated


@functools.cache
def default_registry() -> MigrationRegistry:
    """The registry of every step listed in beam_agents_migrations.STEP_MODULES."""
    import beam_agents_migrations  # deferred: only older-version reads need the steps

    return MigrationRegistry.from_modules(beam_agents_migrations.STEP_MODULES)


def migrate_to_current(message: _BlobT, registry: MigrationRegistry | None = None) -> _BlobT:
    """`message` upgraded to the current state schema version, or `message` itself when it is
    current already. Never mutates `message`; never writes state.

    Raises StateSchemaFromFutureError (do not catch it on the element path),
    MissingMigrationError, MigrationStepError or UnversionedMessageError.
    """
    if registry is None:
        # The identity fast path for the overwhelmingly common case. The type test keeps a
        # StateSnapshot (which also has state_schema_version) from slipping through.
        try:
            if (
                message.state_schema_version == CURRENT_STATE_SCHEMA_VERSION
                and type(message) in _VERSIONED
            ):
                return message
        except AttributeError:
            pass  # an unversioned message; migrate() names it
        registry = default_registry()
    return registry.migrate(message)


def migrate_snapshot(
    snapshot: StateSnapshot, registry: MigrationRegistry | None = None
) -> StateSnapshot:
    """An exported snapshot as the current binary reads it: every embedded blob migrated and
    the envelope stamped with the current version. The input is not changed.

    Export carries blobs verbatim, each with its own version, and stamps the envelope with the
    exporting binary's version; loading is where they meet migration. An envelope from a newer
    binary raises StateSchemaFromFutureError, as a newer blob does.
    """
    registry = registry or default_registry()
    version = snapshot.state_schema_version or 1
    if version > registry.current_version:
        raise StateSchemaFromFutureError(
            type_name=StateSnapshot.DESCRIPTOR.name,
            found_version=snapshot.state_schema_version,
            current_version=registry.current_version,
        )
    migrated = StateSnapshot()
    migrated.CopyFrom(snapshot)
    migrated.state_schema_version = registry.current_version
    for field in SNAPSHOT_BLOB_FIELDS:
        if snapshot.HasField(field):
            getattr(migrated, field).CopyFrom(registry.migrate(getattr(snapshot, field)))
    return migrated


def new_state_blob(message_type: type[_BlobT], **fields) -> _BlobT:
    """A new versioned blob stamped with CURRENT_STATE_SCHEMA_VERSION; every writer uses it."""
    if message_type not in _VERSIONED:
        raise UnversionedMessageError(type_name=message_type.DESCRIPTOR.name)
    return message_type(state_schema_version=CURRENT_STATE_SCHEMA_VERSION, **fields)
