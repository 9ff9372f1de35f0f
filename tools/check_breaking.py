"""The breaking-change gate: protos/beam_agents.proto against every descriptor ever released.

`buf breaking` compares against one baseline, so a number freed by one release and reused by a
later one passes it. This gate keeps a ledger, protos/descriptor_ledger/NNNN.binpb (each a
serialized FileDescriptorSet), and judges the current descriptor against every entry:

* a field number keeps its name, type, label and oneof for ever (no retype, no rename, no
  move into or out of a oneof), and a field name keeps its number;
* a removed field leaves both its number and its name reserved, and nothing reserved is ever
  un-reserved;
* an enum value keeps its number, a number keeps its value name, and a removed value is
  reserved;
* no message or enum disappears.

    python tools/check_breaking.py            # check; exit 1 naming each violation
    python tools/check_breaking.py --record   # after a clean check, append the current descriptor

CI also fails while the proto differs from the newest entry, so every merged schema is recorded
and judged by all later changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2

__all__ = ["LEDGER", "compile_proto", "ledger", "main", "record", "violations"]

_REPO = Path(__file__).resolve().parent.parent
PROTO = _REPO / "protos" / "beam_agents.proto"
LEDGER = _REPO / "protos" / "descriptor_ledger"

FileProto = descriptor_pb2.FileDescriptorProto
_Field = descriptor_pb2.FieldDescriptorProto


def compile_proto(proto: Path) -> FileProto:
    """The descriptor protoc (grpcio-tools) builds from `proto`, without source info."""
    from grpc_tools import protoc  # deferred: only compiling needs grpcio-tools

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "set.binpb"
        status = protoc.main(
            ["protoc", f"-I{proto.parent}", f"--descriptor_set_out={out}", str(proto)]
        )
        if status != 0:
            raise RuntimeError(f"protoc failed with exit status {status} on {proto}")
        (file_proto,) = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    return file_proto


def ledger(folder: Path) -> list[tuple[str, FileProto]]:
    """(entry name, descriptor) of every ledger entry, oldest first."""
    entries = []
    for path in sorted(folder.glob("*.binpb")):
        (file_proto,) = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes()).file
        entries.append((path.name, file_proto))
    return entries


@dataclasses.dataclass
class _Scope:
    """A message's fields and reservations, or an enum's values and reservations."""

    by_number: dict[int, object]
    by_name: dict[str, object]
    reserved_numbers: list[tuple[int, int]]  # half-open [start, end)
    reserved_names: set[str]

    def reserves(self, number: int, name: str) -> tuple[bool, bool]:
        return (
            any(start <= number < end for start, end in self.reserved_numbers),
            name in self.reserved_names,
        )


def _scopes(file_proto: FileProto) -> tuple[dict[str, tuple], dict[str, _Scope]]:
    messages: dict[str, tuple] = {}
    enums: dict[str, _Scope] = {}

    def add_enum(prefix: str, enum) -> None:
        enums[f"{prefix}{enum.name}"] = _Scope(
            {v.number: v for v in enum.value},
            {v.name: v for v in enum.value},
            # Enum reserved ranges are inclusive; store them half-open like messages'.
            [(r.start, r.end + 1) for r in enum.reserved_range],
            set(enum.reserved_name),
        )

    def add_message(prefix: str, message) -> None:
        name = f"{prefix}{message.name}"
        real_oneofs = {
            i: o.name
            for i, o in enumerate(message.oneof_decl)
            if not any(f.proto3_optional and f.oneof_index == i for f in message.field)
        }
        scope = _Scope(
            {f.number: f for f in message.field},
            {f.name: f for f in message.field},
            [(r.start, r.end) for r in message.reserved_range],
            set(message.reserved_name),
        )
        messages[name] = (scope, real_oneofs)
        for nested in message.nested_type:
            add_message(f"{name}.", nested)
        for enum in message.enum_type:
            add_enum(f"{name}.", enum)

    for message in file_proto.message_type:
        add_message("", message)
    for enum in file_proto.enum_type:
        add_enum("", enum)
    return messages, enums


def _field_shape(field: _Field, oneofs: dict[int, str]) -> tuple:
    oneof = oneofs.get(field.oneof_index) if field.HasField("oneof_index") else None
    return (_Field.Type.Name(field.type), field.type_name, _Field.Label.Name(field.label), oneof)


def _describe_shape(shape: tuple) -> str:
    kind, type_name, label, oneof = shape
    text = (
        f"{label.removeprefix('LABEL_').lower()} {type_name or kind.removeprefix('TYPE_').lower()}"
    )
    return f"{text} in oneof {oneof}" if oneof else text


def violations(history: list[tuple[str, FileProto]], current: FileProto) -> list[str]:
    """Every way `current` breaks any descriptor of `history`, each naming the entry."""
    found: list[str] = []
    now_messages, now_enums = _scopes(current)
    for entry, past in history:
        then_messages, then_enums = _scopes(past)
        for name, (then, then_oneofs) in then_messages.items():
            if name not in now_messages:
                found.append(f"{name}: message removed (ledger {entry})")
                continue
            now, now_oneofs = now_messages[name]
            for number, field in then.by_number.items():
                where = f"{name}.{field.name} = {number}"
                if number in now.by_number:
                    successor = now.by_number[number]
                    if successor.name != field.name:
                        found.append(
                            f"{where}: number {number} reused by '{successor.name}' "
                            f"(ledger {entry})"
                        )
                        continue
                    was, is_ = _field_shape(field, then_oneofs), _field_shape(successor, now_oneofs)
                    if was[:3] != is_[:3]:
                        found.append(
                            f"{where}: retyped from {_describe_shape(was)} to "
                            f"{_describe_shape(is_)} (ledger {entry})"
                        )
                    elif was[3] != is_[3]:
                        move = f"into oneof {is_[3]}" if is_[3] else f"out of oneof {was[3]}"
                        found.append(f"{where}: moved {move} (ledger {entry})")
                    continue
                number_kept, name_kept = now.reserves(number, field.name)
                if field.name in now.by_name:
                    found.append(
                        f"{where}: name reused for number {now.by_name[field.name].number} "
                        f"(ledger {entry})"
                    )
                elif not (number_kept and name_kept):
                    missing = [
                        w for w, kept in (("number", number_kept), ("name", name_kept)) if not kept
                    ]
                    found.append(
                        f"{where}: removed without reserving its {' and '.join(missing)} "
                        f"(ledger {entry})"
                    )
            found += _unreserved(name, then, now, entry)
        for name, then in then_enums.items():
            if name not in now_enums:
                found.append(f"{name}: enum removed (ledger {entry})")
                continue
            now = now_enums[name]
            for value_name, value in then.by_name.items():
                where = f"{name}.{value_name} = {value.number}"
                if value_name in now.by_name:
                    if now.by_name[value_name].number != value.number:
                        found.append(
                            f"{where}: renumbered to {now.by_name[value_name].number} "
                            f"(ledger {entry})"
                        )
                    continue
                if value.number in now.by_number:
                    found.append(
                        f"{where}: number reused by '{now.by_number[value.number].name}' "
                        f"(ledger {entry})"
                    )
                elif not all(now.reserves(value.number, value_name)):
                    found.append(f"{where}: removed without reserving it (ledger {entry})")
            found += _unreserved(name, then, now, entry)
    return list(dict.fromkeys(found))


def _unreserved(name: str, then: _Scope, now: _Scope, entry: str) -> list[str]:
    found = []
    for start, end in then.reserved_numbers:
        for number in range(start, min(end, start + 10_000)):
            if not now.reserves(number, "")[0]:
                found.append(f"{name}: reserved number {number} un-reserved (ledger {entry})")
    for reserved in sorted(then.reserved_names - now.reserved_names):
        found.append(f"{name}: reserved name '{reserved}' un-reserved (ledger {entry})")
    return found


def record(current: FileProto, folder: Path) -> Path | None:
    """Appends `current` to the ledger unless the newest entry equals it."""
    entries = ledger(folder)
    if entries and entries[-1][1] == current:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{len(entries) + 1:04d}.binpb"
    path.write_bytes(
        descriptor_pb2.FileDescriptorSet(file=[current]).SerializeToString(deterministic=True)
    )
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="append the current descriptor")
    parser.add_argument("--proto", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ledger", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # Under `bazel run` the working directory is the runfiles tree; use the workspace.
    workspace = os.environ.get("BUILD_WORKSPACE_DIRECTORY")
    repo = Path(workspace) if workspace else _REPO
    args.proto = args.proto or repo / PROTO.relative_to(_REPO)
    args.ledger = args.ledger or repo / LEDGER.relative_to(_REPO)

    current = compile_proto(args.proto)
    entries = ledger(args.ledger)
    problems = violations(entries, current)
    for problem in problems:
        print(f"breaking: {problem}")
    if problems:
        return 1
    if args.record:
        path = record(current, args.ledger)
        print(f"recorded {path.name}" if path else "the newest ledger entry is current already")
        return 0
    if not entries or entries[-1][1] != current:
        print(
            "protos/beam_agents.proto differs from the newest ledger entry; it breaks no entry, "
            "so record it: python tools/check_breaking.py --record",
            file=sys.stderr,
        )
        return 1
    print(f"no breaking change against {len(entries)} ledger entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
