"""How the console shows what it did not write, over real HTTP on 127.0.0.1: characters that draw
nothing or reorder the text (a bidi override spoofing a key) are shown as visible escapes on every
page; an approval nobody can decide any more (no expiry, expired, past the agent's deadline) is
listed apart with the reason and offers no buttons, and a decision refused says why in words with
a readable time."""

from __future__ import annotations

import re
import time
from urllib.parse import quote

import pytest

from beam_agents._protos import StateSnapshot
from beam_agents.bus import Topics
from beam_agents.ops.console.display import MAX_ESCAPES, moment, undecidable, visible
from beam_agents.ops.console.inbox import Approval
from beam_agents.ops.rounds import ManualClock
from beam_agents.runtime.dead_letters import error_record, to_envelope
from beam_agents.testing.console import approval_intent, export_answer, signed_in

NOW = 1_000_000
#: Draws as "customer-1042": the override reverses "2401" until the pop.
SPOOFED_KEY = "customer-\u202e2401\u202c".encode()
HIDDEN = ("\u202e", "\u202c", "\u200b", "\u2066", "\u2069", "\u00a0", "\u2028", "\x07")


@pytest.fixture
def console(tmp_path):
    with signed_in(tmp_path / "console.sqlite", ManualClock(NOW)) as console:
        yield console


def _table(page: str, table_id: str) -> str:
    """The HTML of the table `table_id` on `page` ("" when it has none)."""
    found = re.search(rf'<table class="list" id="{table_id}">(.*?)</table>', page, re.S)
    return found.group(1) if found else ""


def test_visible_shows_each_invisible_or_bidi_character_as_a_styled_escape():
    shown = visible("a\u202eb<\u200b\n\t\u00a0 c")
    assert shown == (
        'a<span class="invisible-char" title="U+202E RIGHT-TO-LEFT OVERRIDE">⟨U+202E⟩</span>'
        'b&lt;<span class="invisible-char" title="U+200B ZERO WIDTH SPACE">⟨U+200B⟩</span>'
        '<span class="invisible-char" title="U+000A control">⟨U+000A⟩</span>'
        '<span class="invisible-char" title="U+0009 control">⟨U+0009⟩</span>'
        '<span class="invisible-char" title="U+00A0 NO-BREAK SPACE">⟨U+00A0⟩</span> c'
    )
    # Text laid out in lines keeps its line breaks and tabs; in SVG an escape is a tspan.
    assert visible("a\n\tb\u2028", lines=True) == (
        'a\n\tb<span class="invisible-char" title="U+2028 LINE SEPARATOR">⟨U+2028⟩</span>'
    )
    assert visible("a\u2066", tag="tspan") == 'a<tspan class="invisible-char">⟨U+2066⟩</tspan>'
    # Default-ignorable letters and marks draw nothing either.
    assert "⟨U+3164⟩" in visible("\u3164") and "⟨U+FE0F⟩" in visible("\ufe0f")
    assert visible("plain text, ümlaut") == "plain text, ümlaut"


def test_a_text_of_more_hidden_characters_than_escapes_shown_is_shown_as_ascii():
    overrides = "\u202e1042\n" * (MAX_ESCAPES + 1)
    started = time.monotonic()
    shown = visible(overrides * 100, lines=True)  # 700 KB
    assert time.monotonic() - started < 1
    assert shown.startswith(
        '<span class="invisible-char" title="too many hidden characters to show each">'
        f"⟨over {MAX_ESCAPES:,} hidden characters: the text is shown as ASCII⟩</span>"
    )
    assert shown.count("\\u202e1042\n") == (MAX_ESCAPES + 1) * 100
    assert shown.split("</span>", 1)[1].isascii()
    assert "⟨U+202E⟩" in visible(overrides[: MAX_ESCAPES * 6], lines=True)  # at the limit


def test_bidi_and_invisible_characters_are_shown_visibly_on_every_page(console):
    browser, bus, recorder = console
    question = "Refund\u200b 42 EUR to customer-\u202e2401\u202c?\u00a0\u2028\x07"
    intent = approval_intent("a-rlo", key=SPOOFED_KEY, question=question)
    bus.handle(bus.topics.approvals, intent.SerializeToString())
    snapshot = StateSnapshot(entity_key=SPOOFED_KEY, snapshot_at_ms=NOW)
    snapshot.memory.entries.add(key="note\u2066", value='{"iban":"\u2066DE89\u2069"}'.encode())
    bus.observations.add_snapshot(export_answer(bus, recorder, snapshot))
    bus.handle(Topics("loop").completions, '{"to":"\u202ecustomer"}'.encode(), SPOOFED_KEY, NOW)
    letter = to_envelope(error_record(SPOOFED_KEY, "bad_output", "in \u202e1042", NOW))
    bus.handle(Topics("loop").dead_letters, letter.SerializeToString())
    key_hex = SPOOFED_KEY.hex()
    for path in ("/", "/fragments/inbox", "/approvals/a-rlo", f"/agents/{key_hex}",
                 f"/fragments/agents/{key_hex}", "/agents", "/fragments/agents", "/dead-letters",
                 "/fragments/dead-letters"):  # fmt: skip
        page = browser.get(path)
        assert page.status == 200, path
        assert not [c for c in HIDDEN if c in page.text], path
        assert '<span class="invisible-char" title="U+202E RIGHT-TO-LEFT OVERRIDE">' in page.text
    approval = browser.get("/approvals/a-rlo").text
    for code in ("200B", "202E", "202C", "00A0", "2028", "0007"):
        assert f"⟨U+{code}⟩" in approval, code
    agent = browser.get(f"/agents/{key_hex}").text
    assert "⟨U+2066⟩" in agent and "⟨U+2069⟩" in agent


def _undecidable_three(bus, recorder) -> None:
    """An approval without expiry, one expired a minute ago, and one the agent stopped waiting
    for a second ago (its snapshot's deadline, in the agent's answer to the console's export
    request: the one snapshot it trusts), each otherwise approvable."""
    for intent in (
        approval_intent("no-expiry", expires_at_ms=0),
        approval_intent("expired", expires_at_ms=NOW - 60_000),
        approval_intent("late", key=b"c-late"),
    ):
        bus.handle(bus.topics.approvals, intent.SerializeToString())
    snapshot = StateSnapshot(entity_key=b"c-late", snapshot_at_ms=NOW - 2_000)
    snapshot.continuation.pending_intent_ids.append("late")
    snapshot.continuation.deadline_ms = NOW - 1_000
    bus.observations.add_snapshot(export_answer(bus, recorder, snapshot))


#: Why each of `_undecidable_three` cannot be decided, in words, with a readable time.
REASONS = {
    "no-expiry": "it has no expiry time",
    "expired": "it expired at 1970-01-01 00:15:40.000 UTC, 60 s ago",
    "late": "the agent stopped waiting for it at 1970-01-01 00:16:39.000 UTC, 1 s ago",
}


def test_an_approval_nobody_can_decide_is_listed_apart_with_its_reason_and_no_buttons(console):
    browser, bus, recorder = console
    bus.handle(bus.topics.approvals, approval_intent("open").SerializeToString())
    _undecidable_three(bus, recorder)
    for path in ("/", "/fragments/inbox"):
        inbox = browser.get(path).text
        assert "/approvals/open" in _table(inbox, "pending")
        closed = _table(inbox, "undecidable")
        for intent_id, reason in REASONS.items():
            assert f"/approvals/{intent_id}" not in _table(inbox, "pending"), intent_id
            assert f"/approvals/{intent_id}" in closed and reason in closed, intent_id
        assert "no expiry" not in _table(inbox, "pending")
    for intent_id, reason in REASONS.items():
        page = browser.get(f"/approvals/{intent_id}").text
        assert 'id="approve"' not in page and 'id="decline"' not in page, intent_id
        assert 'id="undecidable"' in page and reason in page, intent_id
    assert 'id="approve"' in browser.get("/approvals/open").text
    # The agent's page lists its approvals the same way.
    for path in (f"/agents/{b'c-late'.hex()}", f"/fragments/agents/{b'c-1'.hex()}"):
        assert "cannot be decided: " in browser.get(path).text, path
    assert REASONS["late"] in browser.get(f"/agents/{b'c-late'.hex()}").text


def test_a_refused_decision_says_why_in_words_with_a_readable_time(console):
    browser, bus, recorder = console
    _undecidable_three(bus, recorder)
    csrf = browser.get("/").csrf()
    for intent_id, reason in REASONS.items():
        form = {"csrf": csrf, "decision": "approve"}
        reply = browser.post(f"/approvals/{quote(intent_id)}", form)
        assert reply.status == 409 and reason in reply.text, reply.text
        assert not re.search(r"\d{5,} ms", reply.text), reply.text  # no raw epoch
        assert bus.inbox.decision(intent_id) is None


def test_undecidable_mirrors_the_inboxs_refusals_at_their_edges():
    def approval(expires_at_ms):
        return Approval(approval_intent(expires_at_ms=expires_at_ms), "valid", True, 0)

    assert undecidable(approval(NOW + 1), NOW) == ""
    assert undecidable(approval(NOW), NOW).startswith("it expired at")
    assert undecidable(approval(NOW + 1), NOW, deadline=NOW) == ""
    assert undecidable(approval(NOW + 1), NOW, deadline=NOW - 1).startswith("the agent stopped")
    refused = Approval(approval_intent(), "unsigned", False, 0)
    assert undecidable(refused, NOW) == "its intent is unsigned"
    assert moment(0) == "-" and moment(NOW) == "1970-01-01 00:16:40.000 UTC"


def test_a_time_before_1970_is_said_to_be_so():
    assert moment(-5) == "-5 ms (before 1970)"
    assert moment(-(2**63)) == "-9223372036854775808 ms (before 1970)"
    assert moment(2**62).endswith("(beyond year 9999)")


def test_a_key_is_found_by_typing_it_as_the_inbox_shows_it(console):
    browser, bus, _ = console
    keys = {"nu": b"c-\xff", "bidi": SPOOFED_KEY, "plain": b"c-1"}
    for intent_id, key in keys.items():
        bus.inbox.receive(approval_intent(intent_id, key=key).SerializeToString())
    page = browser.get("/").text
    for intent_id, shown in (("nu", "c-\\xff"), ("bidi", "customer-⟨U+202E⟩2401⟨U+202C⟩")):
        assert re.sub("<[^>]*>", "", page).count(shown) >= 1
        found = browser.get("/?state=pending&key=" + quote(shown)).text
        assert f"/approvals/{intent_id}" in found, shown
        assert all(f"/approvals/{other}" not in found for other in keys if other != intent_id)
