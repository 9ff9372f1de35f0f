"""The golden corpus replays: every committed blob of every version decodes with the current
bindings, migrates to the current version, and equals the current builders' message of the
same name (field equality; byte-identical re-encoding is not required)."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet

from beam_agents._protos import AgentEnvelope, StateSnapshot, ToolIntent
from beam_agents.state.migration import (
    CURRENT_STATE_SCHEMA_VERSION,
    VERSIONED_MESSAGE_TYPES,
    migrate_snapshot,
    migrate_to_current,
)
from beam_agents.wire.decoding import message_type
from tools import golden
from tools.workspace import data_root

GOLDEN = data_root() / "golden"
FIXTURES = [
    f for folder in golden.version_dirs(GOLDEN).values() for f in golden.read_fixtures(folder)
]


def _current_builders():
    # Missing only mid-bump; the compat tests then fail, while the completeness test names
    # everything the bump lacks. Loading it at import would stop the whole run instead.
    folder = GOLDEN / f"v{CURRENT_STATE_SCHEMA_VERSION}"
    return golden.load_builders(folder) if (folder / golden.BUILDERS).exists() else None


@pytest.fixture(scope="module")
def current_builders():
    builders = _current_builders()
    if builders is None:
        pytest.fail(
            f"golden/v{CURRENT_STATE_SCHEMA_VERSION}/builders.py is missing; "
            "schema_completeness_test names every item the bump checklist lacks"
        )
    return builders


def migrated(message: Message) -> Message:
    if isinstance(message, StateSnapshot):
        return migrate_snapshot(message)
    if type(message) in VERSIONED_MESSAGE_TYPES:
        return migrate_to_current(message)
    return message  # unversioned wire messages never migrate


def decode(fixture: golden.Fixture) -> Message:
    return message_type(fixture.type_name).FromString(fixture.data)


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda f: f"v{f.version}/{f.name}")
def test_golden_blobs_decode_with_current_bindings(fixture, current_builders):
    """Scenario: Golden blobs decode with current bindings."""
    expected = current_builders[fixture.name]()
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


def test_a_golden_intent_predating_trace_id_decodes_with_empty_trace_id(current_builders):
    """Scenario: An intent written without trace_id still decodes (the golden blob)."""
    intent = decode(_fixture("tool_intent_before_trace_id"))
    assert intent.trace_id == b""
    assert intent == current_builders["tool_intent_before_trace_id"]()


def test_a_golden_intent_predating_kind_reads_as_unspecified():
    intent = decode(_fixture("tool_intent_before_kind"))
    assert intent.kind == ToolIntent.TOOL_KIND_UNSPECIFIED


def test_a_golden_envelope_predating_export_request_decodes(current_builders):
    """Scenario: An envelope written before export_request still decodes (the golden blob)."""
    envelope = decode(_fixture("agent_envelope_approval"))
    assert isinstance(envelope, AgentEnvelope)
    assert envelope.WhichOneof("payload") == "approval"
    assert envelope == current_builders["agent_envelope_approval"]()


def _unknown(message) -> list[tuple[int, int, object]]:
    return [(f.field_number, f.wire_type, f.data) for f in UnknownFieldSet(message)]


def test_the_golden_future_field_survives_decode_and_re_encode():
    """Scenarios: Unknown fields are tolerated on decode, and survive re-encode (compared
    field by field: byte identity is not required)."""
    intent = ToolIntent.FromString(_fixture("tool_intent_future_field").data)
    assert _unknown(intent) == [(20, 2, b"route=eu")]
    re_encoded = ToolIntent.FromString(intent.SerializeToString())
    assert re_encoded == intent and _unknown(re_encoded) == _unknown(intent)


def test_the_corpus_covers_every_message_type():
    from beam_agents.wire.decoding import MESSAGE_TYPES

    covered = {f.type_name for f in FIXTURES}
    assert covered == {cls.DESCRIPTOR.full_name for cls in MESSAGE_TYPES.values()}
