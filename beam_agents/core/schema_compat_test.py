"""The golden corpus replays: every committed blob of every version decodes with the current
bindings, migrates to the current version, and equals the current builders' message of the
same name (field equality; byte-identical re-encoding is not required)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from google.protobuf import text_format
from google.protobuf.message import Message

from beam_agents._protos import AgentEnvelope, StateSnapshot, ToolIntent
from beam_agents.core.migration import (
    CURRENT_STATE_SCHEMA_VERSION,
    VERSIONED_MESSAGE_TYPES,
    migrate_snapshot,
    migrate_to_current,
)
from beam_agents.decoding import message_type
from tools import golden


def _repo() -> Path:
    runfiles = os.environ.get("RUNFILES_DIR")
    if runfiles:  # under Bazel the corpus arrives as data of this py_test
        return Path(runfiles) / "_main"
    return Path(__file__).resolve().parents[2]


GOLDEN = _repo() / "golden"
FIXTURES = [
    f for folder in golden.version_dirs(GOLDEN).values() for f in golden.read_fixtures(folder)
]
CURRENT_BUILDERS = golden.load_builders(GOLDEN / f"v{CURRENT_STATE_SCHEMA_VERSION}")


def migrated(message: Message) -> Message:
    if isinstance(message, StateSnapshot):
        return migrate_snapshot(message)
    if type(message) in VERSIONED_MESSAGE_TYPES:
        return migrate_to_current(message)
    return message  # unversioned wire messages never migrate


def decode(fixture: golden.Fixture) -> Message:
    return message_type(fixture.type_name).FromString(fixture.data)


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f"v{f.version}/{f.name}")
def test_golden_blobs_decode_with_current_bindings(fixture):
    """Scenario: Golden blobs decode with current bindings."""
    expected = CURRENT_BUILDERS[fixture.name]()
    assert migrated(decode(fixture)) == migrated(expected)


def test_golden_corpus_is_laid_out_per_version():
    """Scenario: Golden corpus is laid out per version."""
    assert golden.stray_files(GOLDEN) == []
    assert sorted(golden.version_dirs(GOLDEN)) == list(range(1, CURRENT_STATE_SCHEMA_VERSION + 1))
    for fixture in FIXTURES:
        message = decode(fixture)
        if type(message) in VERSIONED_MESSAGE_TYPES and message.state_schema_version:
            assert message.state_schema_version == fixture.version, fixture.name


def test_a_fixture_outside_a_version_folder_fails_the_layout_check(tmp_path):
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "ok.binpb").write_bytes(b"")
    (tmp_path / "loose.binpb").write_bytes(b"")
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "x.textproto").write_text("")
    assert golden.stray_files(tmp_path) == ["draft/x.textproto", "loose.binpb"]


@pytest.mark.parametrize(
    "fixture",
    [f for f in FIXTURES if f.version == CURRENT_STATE_SCHEMA_VERSION],
    ids=lambda f: f.name,
)
def test_the_textproto_expectation_matches_the_blob(fixture):
    cls = message_type(fixture.type_name)
    path = GOLDEN / f"v{fixture.version}" / f"{fixture.name}.textproto"
    from_text = text_format.Parse(path.read_text(), cls())
    known_fields_only = decode(fixture)
    known_fields_only.DiscardUnknownFields()
    assert from_text == known_fields_only


def _fixture(name: str) -> golden.Fixture:
    (found,) = [f for f in FIXTURES if f.name == name and f.version == 1]
    return found


def test_a_golden_intent_predating_trace_id_decodes_with_empty_trace_id():
    """Scenario: An intent written without trace_id still decodes (the golden blob)."""
    intent = decode(_fixture("tool_intent_before_trace_id"))
    assert intent.trace_id == b""
    assert intent == CURRENT_BUILDERS["tool_intent_before_trace_id"]()


def test_a_golden_intent_predating_kind_reads_as_unspecified():
    intent = decode(_fixture("tool_intent_before_kind"))
    assert intent.kind == ToolIntent.TOOL_KIND_UNSPECIFIED


def test_a_golden_envelope_predating_export_request_decodes():
    """Scenario: An envelope written before export_request still decodes (the golden blob)."""
    envelope = decode(_fixture("agent_envelope_approval"))
    assert isinstance(envelope, AgentEnvelope)
    assert envelope.WhichOneof("payload") == "approval"
    assert envelope == CURRENT_BUILDERS["agent_envelope_approval"]()


def test_the_golden_future_field_survives_decode_and_re_encode():
    data = _fixture("tool_intent_future_field").data
    intent = ToolIntent.FromString(data)
    assert intent.SerializeToString(deterministic=True) == data
    assert b"route=eu" in intent.SerializeToString()


def test_the_corpus_covers_every_message_type():
    from beam_agents.decoding import MESSAGE_TYPES

    covered = {f.type_name for f in FIXTURES}
    assert covered == {cls.DESCRIPTOR.full_name for cls in MESSAGE_TYPES.values()}
