"""Edited arguments of an approval (approval_edits): which arguments a request makes editable,
the one judge of edits, their place in the signed Approval, and what the agent reads."""

from __future__ import annotations

import pytest

from beam_agents._protos import AgentEnvelope, ToolIntent
from beam_agents.errors import ApprovalEditError
from beam_agents.intents.approval_edits import (
    approval_args,
    approved_args,
    check_edits,
    editable,
    edits_json,
    json_type,
    parse_edits,
)
from beam_agents.intents.identity import canonical_args_json
from beam_agents.intents.signing import Keyring, Verification, sign, verify

RING = Keyring({"approvals-1": b"approvals key of the edit tests, 32+ bytes"}, active="approvals-1")


def _request(**details) -> ToolIntent:
    names = details.pop("editable", ())
    return ToolIntent(
        intent_id="refund-1",
        tool_name="human.approval",
        kind=ToolIntent.APPROVAL,
        args_json=canonical_args_json(approval_args("Refund?", details, names)),
    )


def test_a_request_names_its_editable_details_in_its_arguments():
    args = approval_args("Refund?", {"amount": 42, "to": "c-1"}, ["amount"])
    assert args == {"question": "Refund?", "amount": 42, "to": "c-1", "editable": ["amount"]}
    assert approval_args("Refund?", {"amount": 42}) == {"question": "Refund?", "amount": 42}


@pytest.mark.parametrize(
    ("details", "names", "field"),
    [
        ({"amount": 42}, ["amont"], "amont"),  # no such detail
        ({"amount": 42}, ["question"], "question"),
        ({"items": [1, 2]}, ["items"], "items"),  # not a scalar
        ({"note": None}, ["note"], "note"),
        ({"amount": 42}, ["amount", "amount"], "editable"),
        ({"amount": 42}, "amount", "editable"),  # one string, not a list of names
    ],
)
def test_a_request_cannot_make_editable_what_no_one_can_edit(details, names, field):
    with pytest.raises(ApprovalEditError) as refused:
        approval_args("Refund?", details, names)
    assert refused.value.field == field


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, "boolean"),
        (2**53 - 1, "number"),  # the largest integer I-JSON carries exactly
        (-(2**53 - 1), "number"),
        (2**53, None),
        (1.5, "number"),
        ("s", "string"),
        (None, None),
    ],
)
def test_json_type_names_each_scalar_and_numbers_up_to_the_largest_safe_integer(value, expected):
    assert json_type(value) == expected


def test_a_non_string_among_the_editable_names_is_skipped_not_looked_up():
    args = {"question": "Refund?", "amount": 1, "editable": [1, "amount"]}
    intent = ToolIntent(kind=ToolIntent.APPROVAL, args_json=canonical_args_json(args))
    assert editable(intent) == {"amount": 1}


def test_a_refused_edit_names_what_the_approval_lets_a_person_change():
    intent = _request(amount=42, to="c-1", urgent=False, editable=["amount", "urgent"])
    with pytest.raises(ApprovalEditError, match=r"\(editable: amount, urgent\)$"):
        check_edits(intent, {"to": "c-2"})
    with pytest.raises(ApprovalEditError, match=r"\(editable: none\)$"):
        check_edits(_request(amount=42), {"amount": 1})


def test_editable_reads_the_asked_values_and_nothing_from_a_request_that_is_no_approval():
    intent = _request(amount=42, to="c-1", urgent=False, editable=["amount", "urgent"])
    assert editable(intent) == {"amount": 42, "urgent": False}
    assert editable(_request(amount=42)) == {}
    as_tool = ToolIntent()
    as_tool.CopyFrom(intent)
    as_tool.kind = ToolIntent.TOOL
    assert editable(as_tool) == {}
    broken = ToolIntent(kind=ToolIntent.APPROVAL, args_json='{"editable": "amount", "amount": 1')
    assert editable(broken) == {}


@pytest.mark.parametrize(
    ("edits", "field"),
    [
        ({"to": "c-2"}, "to"),
        ({"amount": "30"}, "amount"),
        ({"amount": True}, "amount"),
        ({"amount": float("nan")}, "amount"),
        ({"amount": 2**60}, "amount"),  # past I-JSON's integers
        ({"urgent": 1}, "urgent"),
        ({"question": "Refund 1?"}, "question"),
    ],
)
def test_an_edit_of_an_argument_not_editable_or_of_another_type_is_refused(edits, field):
    intent = _request(amount=42, to="c-1", urgent=False, editable=["amount", "urgent"])
    with pytest.raises(ApprovalEditError) as refused:
        check_edits(intent, edits)
    assert refused.value.field == field


def test_an_edit_keeps_only_what_changed_and_a_number_may_lose_or_gain_its_fraction():
    intent = _request(amount=42, urgent=False, editable=["amount", "urgent"])
    assert check_edits(intent, {"amount": 42, "urgent": True}) == {"urgent": True}
    assert check_edits(intent, {"amount": 30.5}) == {"amount": 30.5}
    assert edits_json({}) == "" and edits_json({"amount": 30}) == '{"amount":30}'


@pytest.mark.parametrize(
    "value", [12345678901234567, -(2**53), 1e16, 9007199254740992.0, "lone \ud800 surrogate"]
)
def test_an_edit_canonical_json_cannot_carry_is_refused_naming_its_field(value):
    # Review 38: 1e16 is a finite float, so it passed the type check and the signer's
    # canonical JSON raised CanonicalJsonError, a 500 in the console.
    intent = _request(amount=42, note="hi", editable=["amount", "note"])
    name = "note" if isinstance(value, str) else "amount"
    with pytest.raises(ApprovalEditError) as refused:
        check_edits(intent, {name: value})
    assert refused.value.field == name and repr(name) in str(refused.value)


def test_the_edits_are_signed_with_the_decision_and_old_approvals_read_as_approved_as_asked():
    intent = _request(amount=42, to="c-1", editable=["amount"])
    edited = AgentEnvelope.Approval(
        intent_id="refund-1", approved=True, edited_args_json='{"amount":30}'
    )
    approval = sign(edited, RING)
    assert verify(approval, RING) is Verification.VALID
    assert approved_args(intent, approval) == {"amount": 30, "to": "c-1"}
    raised = AgentEnvelope.Approval()
    raised.CopyFrom(approval)
    raised.edited_args_json = '{"amount":4200}'
    assert verify(raised, RING) is Verification.BAD_SIGNATURE
    # Bytes of an Approval written before the field existed: fields 1-8 only.
    old = sign(AgentEnvelope.Approval(intent_id="refund-1", approved=True), RING)
    read = AgentEnvelope.Approval.FromString(old.SerializeToString(deterministic=True))
    assert verify(read, RING) is Verification.VALID and read.edited_args_json == ""
    assert approved_args(intent, read) == {"amount": 42, "to": "c-1"}


def test_parse_edits_refuses_edits_on_a_declined_approval_and_edits_that_are_not_json():
    intent = _request(amount=42, editable=["amount"])
    declined = AgentEnvelope.Approval(approved=False, edited_args_json='{"amount":1}')
    with pytest.raises(ApprovalEditError) as refused:
        parse_edits(intent, declined)
    assert refused.value.field == "$"  # the edits as a whole, not one argument
    with pytest.raises(ApprovalEditError):
        parse_edits(intent, AgentEnvelope.Approval(approved=True, edited_args_json='{"amount":'))
