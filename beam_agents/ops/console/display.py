"""How the console shows text it did not write, times, and why an approval cannot be decided.

Visible characters. Text from the loop (an entity key, a question, an intent's arguments, a
memory value, a dead letter's detail) is anyone's who can write to a topic, and some characters
draw nothing or reorder what follows them: `customer-\\u202e2401\\u202c` draws as
`customer-1042`, a zero-width space or a no-break space makes two keys that look the same. The
`visible` filter escapes the text and shows each such character as its code point, ⟨U+202E⟩, in
an element of class `invisible-char` (titled with the character's name) that the style sheet
draws boxed and coloured: the escape cannot be mistaken for the same text typed literally.
Which characters: every one Python calls unprintable (Unicode's Cc controls, Cf formats such as
the bidi embeddings, overrides, isolates and marks, and the zero-width joiners, Zl and Zp
separators, every Zs space but U+0020, surrogates, private use and unassigned code points) and
the default-ignorable code points of other categories (Hangul fillers, variation selectors,
...). Newlines and tabs are kept where the text is laid out in lines (`lines=True`: indented
JSON, a memory value in a <pre>); a key or an id shows them too. Joined emoji show their joiners:
the console is for deciding, not for reading emoji.

Undecidable approvals. `undecidable` says, in words, why a person cannot decide an approval now:
the inbox's own refusals (`Inbox.decide`: an intent refused at receipt, no expiry or expired, the
agent's suspension deadline passed), with readable times, so a page offers no buttons for a
click that can only be refused, and a refused decision's page says why.
"""

from __future__ import annotations

import datetime
import functools
import re
import sys
import unicodedata

from markupsafe import Markup, escape

from beam_agents.ops.console.inbox import Approval

__all__ = ["duration", "moment", "undecidable", "visible"]

#: Default-ignorable code points (Unicode's DerivedCoreProperties) that Python calls printable:
#: they draw nothing in most fonts.
_IGNORABLE = (
    "\u034f\u115f\u1160\u17b4\u17b5\u180b-\u180d\u180f\u3164\ufe00-\ufe0f\uffa0"
    "\U000e0100-\U000e01ef"
)
_ESCAPE = "⟨U+{:04X}⟩"


@functools.cache
def _hidden() -> re.Pattern[str]:
    """One character class of every hidden character, built once, on first use (a scan of all
    code points, about 0.1 s)."""
    ranges, start = [], None
    for code in range(sys.maxunicode + 2):
        hidden = code <= sys.maxunicode and not chr(code).isprintable()
        if hidden and start is None:
            start = code
        elif not hidden and start is not None:
            ranges.append(f"{re.escape(chr(start))}-{re.escape(chr(code - 1))}")
            start = None
    return re.compile(f"([{''.join(ranges)}{_IGNORABLE}])")


def _escape(char: str, tag: str) -> str:
    code = _ESCAPE.format(ord(char))
    if not tag:
        return code
    if tag == "tspan":  # SVG text: no tooltip
        return f'<tspan class="invisible-char">{code}</tspan>'
    name = unicodedata.name(char, "") or ("control" if unicodedata.category(char) == "Cc" else "")
    title = f"U+{ord(char):04X} {name}".strip()
    return f'<span class="invisible-char" title="{title}">{code}</span>'


def visible(value: object, *, lines: bool = False, tag: str = "span") -> Markup:
    """`value` as text, HTML-escaped, each hidden character shown as a styled escape (module
    docstring); `lines` keeps newlines and tabs, `tag` "tspan" is for SVG text, "" for text
    that holds no elements (an SVG <title>): there the escape is plain text."""
    keep = "\n\t" if lines else ""
    parts = _hidden().split(str(value))
    # split with a group: the text between hidden characters at even places, each one at odd.
    return Markup("").join(
        escape(part) if i % 2 == 0 or part in keep else Markup(_escape(part, tag))
        for i, part in enumerate(parts)
    )


def moment(value: int) -> str:
    """An epoch time in ms as a UTC date and time ("-" for none)."""
    if not value:
        return "-"
    try:
        at = datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
    except (ValueError, OverflowError, OSError):  # beyond year 9999: "never" in practice
        return f"{value} ms (beyond year 9999)"
    return at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def duration(ms: int) -> str:
    seconds = abs(ms) // 1000
    sign = "-" if ms < 0 else ""
    if seconds < 120:
        return f"{sign}{seconds} s"
    if seconds < 7200:
        return f"{sign}{seconds // 60} min"
    return f"{sign}{seconds // 3600} h"


def undecidable(approval: Approval, now: int, deadline: int = 0) -> str:
    """Why nobody can decide `approval` at `now`, in words ("" when a person can): the
    conditions `Inbox.decide` refuses on, `deadline` being the agent's suspension deadline for
    it (0: not known). A decided approval is not asked about."""
    if not approval.approvable:
        return f"its intent is {approval.verification}"
    expires = approval.intent.expires_at_ms
    if not expires:
        return (
            "it has no expiry time, and an intent without one is refused as expired "
            "(fail closed, as the effector refuses it)"
        )
    if expires <= now:
        return f"it expired at {moment(expires)}, {duration(now - expires)} ago"
    if deadline and deadline < now:
        return (
            f"the agent stopped waiting for it at {moment(deadline)}, "
            f"{duration(now - deadline)} ago (its suspension's deadline)"
        )
    return ""
