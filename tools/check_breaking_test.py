"""The breaking-change gate catches each kind of violation, against every ledger entry."""

from __future__ import annotations

import shutil

import pytest
from google.protobuf import descriptor_pb2

from tools import check_breaking

Field = descriptor_pb2.FieldDescriptorProto
CURRENT = check_breaking.compile_proto(check_breaking.PROTO)


def edited(edit, base=CURRENT) -> descriptor_pb2.FileDescriptorProto:
    copy = descriptor_pb2.FileDescriptorProto()
    copy.CopyFrom(base)
    edit(copy)
    return copy


def message(file_proto, dotted: str) -> descriptor_pb2.DescriptorProto:
    scope, found = file_proto.message_type, None
    for part in dotted.split("."):
        (found,) = [m for m in scope if m.name == part]
        scope = found.nested_type
    return found


def field(file_proto, dotted: str) -> Field:
    owner, _, name = dotted.rpartition(".")
    (found,) = [f for f in message(file_proto, owner).field if f.name == name]
    return found


def remove(file_proto, dotted: str, reserve_number=False, reserve_name=False) -> None:
    owner, _, name = dotted.rpartition(".")
    descriptor = message(file_proto, owner)
    (gone,) = [f for f in descriptor.field if f.name == name]
    descriptor.field.remove(gone)
    if reserve_number:
        descriptor.reserved_range.add(start=gone.number, end=gone.number + 1)
    if reserve_name:
        descriptor.reserved_name.append(name)


def check(current, *history) -> list[str]:
    entries = [(f"{i + 1:04d}.binpb", d) for i, d in enumerate(history or [CURRENT])]
    return check_breaking.violations(entries, current)


def test_the_repository_proto_breaks_no_ledger_entry_and_is_recorded():
    entries = check_breaking.ledger(check_breaking.LEDGER)
    assert entries, "protos/descriptor_ledger/ is empty"
    assert check_breaking.violations(entries, CURRENT) == []
    assert entries[-1][1] == CURRENT, "record it: python tools/check_breaking.py --record"
    assert check_breaking.main([]) == 0


def test_an_additive_field_and_a_properly_reserved_removal_pass():
    def additive(fp):
        message(fp, "ToolIntent").field.add(
            name="routing_hint", number=15, type=Field.TYPE_STRING, label=Field.LABEL_OPTIONAL
        )
        remove(fp, "ToolResult.error_message", reserve_number=True, reserve_name=True)

    assert check(edited(additive)) == []


def test_retyping_a_field_is_caught():
    current = edited(lambda fp: setattr(field(fp, "ToolIntent.seq"), "type", Field.TYPE_STRING))
    assert check(current) == [
        "ToolIntent.seq = 3: retyped from optional int64 to optional string (ledger 0001.binpb)"
    ]


def test_reusing_a_field_number_is_caught():
    def reuse(fp):
        remove(fp, "ToolIntent.signing_key_id")
        message(fp, "ToolIntent").field.add(
            name="key_ref", number=13, type=Field.TYPE_BYTES, label=Field.LABEL_OPTIONAL
        )

    assert check(edited(reuse)) == [
        "ToolIntent.signing_key_id = 13: number 13 reused by 'key_ref' (ledger 0001.binpb)"
    ]


def test_reusing_a_field_name_for_another_number_is_caught():
    def renumber(fp):
        field(fp, "ToolIntent.signing_key_id").number = 20
        message(fp, "ToolIntent").reserved_range.add(start=13, end=14)

    assert check(edited(renumber)) == [
        "ToolIntent.signing_key_id = 13: name reused for number 20 (ledger 0001.binpb)"
    ]


@pytest.mark.parametrize(
    ("reserve_number", "reserve_name", "missing"),
    [(False, False, "number and name"), (True, False, "name"), (False, True, "number")],
)
def test_removing_a_field_without_reserving_both_is_caught(reserve_number, reserve_name, missing):
    current = edited(
        lambda fp: remove(fp, "ToolResult.error_message", reserve_number, reserve_name)
    )
    assert check(current) == [
        f"ToolResult.error_message = 6: removed without reserving its {missing} (ledger 0001.binpb)"
    ]


def test_un_reserving_a_number_or_a_name_is_caught():
    reserved = edited(lambda fp: remove(fp, "ToolResult.error_message", True, True))

    def unreserve(fp):
        del message(fp, "ToolResult").reserved_range[:]
        del message(fp, "ToolResult").reserved_name[:]

    assert check(edited(unreserve, reserved), CURRENT, reserved) == [
        "ToolResult.error_message = 6: removed without reserving its number and name "
        "(ledger 0001.binpb)",
        "ToolResult: reserved number 6 un-reserved (ledger 0002.binpb)",
        "ToolResult: reserved name 'error_message' un-reserved (ledger 0002.binpb)",
    ]


def test_moving_a_field_into_a_oneof_is_caught():
    current = edited(lambda fp: setattr(field(fp, "AgentEnvelope.event_time_ms"), "oneof_index", 0))
    assert check(current) == [
        "AgentEnvelope.event_time_ms = 2: moved into oneof payload (ledger 0001.binpb)"
    ]


def test_moving_a_field_out_of_a_oneof_is_caught():
    current = edited(lambda fp: field(fp, "AgentEnvelope.external_event").ClearField("oneof_index"))
    assert check(current) == [
        "AgentEnvelope.external_event = 3: moved out of oneof payload (ledger 0001.binpb)"
    ]


def test_renumbering_an_enum_value_is_caught():
    def renumber(fp):
        (status,) = message(fp, "ToolResult").enum_type
        (expired,) = [v for v in status.value if v.name == "EXPIRED"]
        expired.number = 5

    assert check(edited(renumber)) == [
        "ToolResult.Status.EXPIRED = 3: renumbered to 5 (ledger 0001.binpb)"
    ]


def test_a_violation_of_an_older_entry_is_caught_where_the_newest_alone_passes():
    # A past release dropped error_message without reserving it (the ledger kept it anyway);
    # today's change reuses number 6 for another type. Against the newest entry alone, the
    # one baseline `buf breaking` would use, it looks additive.
    dropped = edited(lambda fp: remove(fp, "ToolResult.error_message"))

    def reuse(fp):
        message(fp, "ToolResult").field.add(
            name="error_code", number=6, type=Field.TYPE_INT64, label=Field.LABEL_OPTIONAL
        )

    current = edited(reuse, dropped)
    assert check(current, dropped) == []
    assert check(current, CURRENT, dropped) == [
        "ToolResult.error_message = 6: number 6 reused by 'error_code' (ledger 0001.binpb)"
    ]


def test_the_cli_refuses_to_record_a_breaking_change_and_demands_recording(tmp_path, capsys):
    proto = tmp_path / "beam_agents.proto"
    ledger = tmp_path / "ledger"
    shutil.copytree(check_breaking.LEDGER, ledger)
    recorded = sorted(p.name for p in ledger.iterdir())
    following = f"{len(recorded) + 1:04d}.binpb"
    text = check_breaking.PROTO.read_text()
    proto.write_text(
        text.replace(
            "  int64 seq = 3;\n  Status status = 4;", "  string seq = 3;\n  Status status = 4;"
        )
    )
    assert check_breaking.main(["--proto", str(proto), "--ledger", str(ledger), "--record"]) == 1
    assert "ToolResult.seq = 3: retyped" in capsys.readouterr().out
    assert sorted(p.name for p in ledger.iterdir()) == recorded

    proto.write_text(
        text.replace(
            "  bytes key_stamps = 12;\n}",
            "  bytes key_stamps = 12;\n  string note = 13;\n}",
        )
    )
    assert check_breaking.main(["--proto", str(proto), "--ledger", str(ledger)]) == 1
    assert "record it" in capsys.readouterr().err
    assert check_breaking.main(["--proto", str(proto), "--ledger", str(ledger), "--record"]) == 0
    assert sorted(p.name for p in ledger.iterdir()) == [*recorded, following]
    assert check_breaking.main(["--proto", str(proto), "--ledger", str(ledger)]) == 0
