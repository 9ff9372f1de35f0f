"""Edited arguments of an approval: what a person may change before approving, and what the
agent receives.

Asking. An agent names the arguments a person may change when it asks:
`ctx.request_approval("Refund 42.00 EUR?", editable=("amount",), amount=42, currency="EUR")`
makes an APPROVAL intent whose arguments hold `"editable": ["amount"]` beside the question and
the details (`approval_args`). The request says it, not the effector's ToolSpec: an APPROVAL
intent runs no tool, the approvals console is a process of its own that knows no ToolSpec, and
which of a refund's arguments a person may lower is the agent's to say when it asks. The intent
is signed by the runtime, so what may be changed is as trustworthy as the question itself.

An editable argument is a detail at the top level holding a JSON scalar (a string, a number or
a boolean): never the question, never null, an object or an array. An edit keeps the asked
value's JSON type: a number for a number (an integer or not, JSON having one number type, within
I-JSON's range), a string for a string, a boolean for a boolean (never a number).

Answering. `AgentEnvelope.Approval.edited_args_json` carries the edits: canonical JSON of an
object holding only the changed arguments and their new values; empty when the person approved
as asked (as in every Approval written before the field existed). The field is part of what the
approvals channel signs. A declined approval carries no edits.

`check_edits` is the one judge of edits: the console calls it before it signs a decision and
RunAgent (through `parse_edits`) before the agent sees an answer, so a signed Approval whose
edits its intent did not allow reaches no agent (an answer_mismatch dead letter).
`approved_args` is what the agent reads (`Answer.approved_args`): the intent's details, without
the question and the editable list, with the edits applied.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from beam_agents._protos import AgentEnvelope, ToolIntent
from beam_agents.errors import ApprovalEditError, CanonicalJsonError
from beam_agents.intents.identity import MAX_SAFE_INTEGER, canonical_args_json, parse_args_json

__all__ = [
    "EDITABLE_ARG",
    "QUESTION_ARG",
    "approval_args",
    "approved_args",
    "check_edits",
    "editable",
    "edits_json",
    "json_type",
    "parse_edits",
]

#: The argument of an APPROVAL intent that asks a person (a string).
QUESTION_ARG = "question"
#: The argument of an APPROVAL intent that names the details a person may change (a list).
EDITABLE_ARG = "editable"
_RESERVED = (QUESTION_ARG, EDITABLE_ARG)


def json_type(value: object) -> str | None:
    """The JSON type name of a scalar `value` ("string", "number", "boolean"), else None."""
    if isinstance(value, bool):  # before int: True is an int to Python, not to JSON
        return "boolean"
    if isinstance(value, int):
        return "number" if abs(value) <= MAX_SAFE_INTEGER else None
    if isinstance(value, float):
        return "number" if math.isfinite(value) else None
    if isinstance(value, str):
        return "string"
    return None


def approval_args(
    question: str, details: Mapping[str, object], editable_names: Iterable[str] = ()
) -> dict:
    """The arguments of an APPROVAL intent asking `question` with `details`, naming
    `editable_names` editable (module docstring). Raises ApprovalEditError for a name that is
    no detail holding a scalar, or a detail named like a reserved argument."""
    names = list(editable_names)
    if isinstance(editable_names, str):
        raise ApprovalEditError(
            "editable names arguments: give a list of names, not one string", field=EDITABLE_ARG
        )
    args: dict[str, object] = {QUESTION_ARG: question, **details}
    for name in names:
        if not isinstance(name, str) or name in _RESERVED or name not in details:
            raise ApprovalEditError(
                f"{name!r} is not a detail of this approval request, so it cannot be editable",
                field=str(name),
            )
        if json_type(details[name]) is None:
            raise ApprovalEditError(
                f"detail {name!r} holds {type(details[name]).__name__}: only a string, a "
                "number or a boolean can be edited",
                field=name,
            )
    if len(set(names)) != len(names):
        raise ApprovalEditError("an editable name is given twice", field=EDITABLE_ARG)
    if names:
        args[EDITABLE_ARG] = names
    return args


def editable(intent: ToolIntent) -> dict[str, object]:
    """The arguments a person may change in `intent` and their asked values, in the order the
    intent names them; empty for an intent that names none (or none that qualify: anyone can
    write an intent to the approvals topic, and one that is no APPROVAL offers nothing)."""
    if intent.kind != ToolIntent.APPROVAL:
        return {}
    try:
        args = parse_args_json(intent.args_json)
    except CanonicalJsonError:
        return {}
    names = args.get(EDITABLE_ARG)
    if not isinstance(names, list):
        return {}
    return {
        name: args[name]
        for name in names
        if isinstance(name, str)
        and name not in _RESERVED
        and name in args
        and json_type(args[name]) is not None
    }


def check_edits(intent: ToolIntent, edits: Mapping[str, object]) -> dict[str, object]:
    """The edits of `intent`'s arguments a person asks for, without those that change nothing;
    raises ApprovalEditError naming the first argument that may not be changed, whose new
    value canonical JSON cannot carry, or whose new value is not of its asked value's JSON
    type."""
    allowed = editable(intent)
    changed = {}
    for name, value in edits.items():
        if name not in allowed:
            what = ", ".join(allowed) or "none"
            raise ApprovalEditError(
                f"{name!r} may not be changed in this approval (editable: {what})", field=name
            )
        try:
            canonical_args_json({name: value})
        except CanonicalJsonError as e:
            # 1e16 is a finite float, a number to json_type, yet one that canonical JSON
            # refuses to write (it would read back as an integer past 2^53): refused here,
            # naming the field, not when the decision or the agent's arguments are signed.
            raise ApprovalEditError(
                f"{name!r} cannot be {value!r}: {e.reason}", field=name
            ) from None
        want, got = json_type(allowed[name]), json_type(value)
        if got != want:
            raise ApprovalEditError(
                f"{name!r} needs a {want}, not {got or type(value).__name__}", field=name
            )
        if value != allowed[name]:
            changed[name] = value
    return changed


def edits_json(edits: Mapping[str, object]) -> str:
    """The edits as Approval.edited_args_json: canonical JSON, "" for none."""
    return canonical_args_json(dict(edits)) if edits else ""


def parse_edits(intent: ToolIntent, approval: AgentEnvelope.Approval) -> dict[str, object]:
    """The edits an Approval of `intent` carries, judged against the intent (`check_edits`);
    raises ApprovalEditError for edits that are not JSON, that a declined approval carries, or
    that the intent does not allow."""
    if not approval.edited_args_json:
        return {}
    if not approval.approved:
        raise ApprovalEditError("a declined approval carries edited arguments", field="$")
    try:
        edits = parse_args_json(approval.edited_args_json)
    except CanonicalJsonError as e:
        raise ApprovalEditError(f"edited arguments: {e}", field=e.path) from None
    return check_edits(intent, edits)


def approved_args(intent: ToolIntent, approval: AgentEnvelope.Approval) -> dict[str, object]:
    """The details of `intent` as `approval` approved them: without the question and the
    editable list, with the edits applied (`parse_edits`, which raises ApprovalEditError)."""
    args = parse_args_json(intent.args_json)
    details = {name: value for name, value in args.items() if name not in _RESERVED}
    return {**details, **parse_edits(intent, approval)}
