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
JSON, a memory value in a <pre>); a key or an id shows them too. Joined emoji show their
joiners: the console is for deciding, not for reading emoji. A text with more than MAX_ESCAPES
hidden characters is nobody's honest text: it is shown whole as ASCII escapes (\\u202e) after
a notice, which bounds what escaping costs and adds to a page.

Undecidable approvals. `undecidable` says, in words, why a person cannot decide an approval now:
the inbox's own refusals (`Inbox.decide`: an intent refused at receipt, no expiry or expired, the
agent's suspension deadline passed), with readable times, so a page offers no buttons for a
click that can only be refused, and a refused decision's page says why.
"""

from __future__ import annotations

import datetime
import functools
import itertools
import json
import re
import unicodedata

from markupsafe import Markup, escape

from beam_agents._protos import ToolIntent
from beam_agents.ops.console.inbox import Approval

__all__ = [
    "NOT_JSON",
    "duration",
    "key_of_text",
    "moment",
    "question",
    "undecidable",
    "visible",
]

#: Default-ignorable code points (Unicode's DerivedCoreProperties) that Python calls printable:
#: they draw nothing in most fonts.
_IGNORABLE = frozenset(
    "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u3164\uffa0"
    + "".join(map(chr, range(0xFE00, 0xFE10)))
    + "".join(map(chr, range(0xE0100, 0xE01F0)))
)
_ESCAPE = "⟨U+{:04X}⟩"
#: Most hidden characters a text shows as escapes. One with more (anyone's: a record of 1 MB
#: holds 333,000 bidi overrides, 70 bytes of HTML each as escapes) is shown whole as ASCII,
#: every character past printable ASCII as a Python escape (\\u202e), after a notice why.
MAX_ESCAPES = 1000


def _element(text: str, tag: str, title: str = "") -> str:
    """`text` (an escape, HTML-safe) in an element of class invisible-char, or as it is for no
    `tag` (in an SVG <title>). SVG text shows no tooltip."""
    if not tag:
        return text
    if tag == "tspan":
        return f'<tspan class="invisible-char">{text}</tspan>'
    return f'<span class="invisible-char" title="{title}">{text}</span>'


@functools.lru_cache(maxsize=4096)
def _escape(char: str, tag: str) -> str:
    name = unicodedata.name(char, "") or ("control" if unicodedata.category(char) == "Cc" else "")
    return _element(_ESCAPE.format(ord(char)), tag, f"U+{ord(char):04X} {name}".strip())


def visible(value: object, *, lines: bool = False, tag: str = "span") -> Markup:
    """`value` as text, HTML-escaped, each hidden character shown as a styled escape (module
    docstring); `lines` keeps newlines and tabs, `tag` "tspan" is for SVG text, "" for text
    that holds no elements (an SVG <title>): there the escape is plain text."""
    text = str(escape(str(value)))  # changes only ASCII (&<>"'), no hidden character
    keep = "\n\t" if lines else ""
    # Each distinct character looked at once, the text then translated at C speed: a 1 MB
    # question of anyone's is shown on a list refreshed every few seconds.
    hidden = list(
        itertools.islice(
            (c for c in set(text) if c not in keep and (not c.isprintable() or c in _IGNORABLE)),
            MAX_ESCAPES + 1,
        )
    )
    if not hidden:
        return Markup(text)
    if len(hidden) <= MAX_ESCAPES and sum(map(text.count, hidden)) <= MAX_ESCAPES:
        return Markup(text.translate({ord(char): _escape(char, tag) for char in hidden}))
    notice = f"⟨over {MAX_ESCAPES:,} hidden characters: the text is shown as ASCII⟩"
    lines_of = text.split("\n") if lines else [text]  # its lines kept, all else escaped
    shown = "\n".join(line.encode("unicode_escape").decode("ascii") for line in lines_of)
    return Markup(_element(notice, tag, "too many hidden characters to show each") + shown)


# Arguments nested past the parser's recursion limit (anyone may write an unsigned intent to the
# approvals topic, and it is listed) are shown as text, like any other text that is not JSON.
NOT_JSON = (ValueError, RecursionError)


def question(intent: ToolIntent) -> str:
    """What an approval asks: its "question" argument, else its arguments as sent (no JSON),
    else its tool's name."""
    try:
        args = json.loads(intent.args_json)
    except NOT_JSON:
        return intent.args_json
    if isinstance(args, dict) and isinstance(args.get("question"), str):
        return args["question"]
    return intent.tool_name


def moment(value: int) -> str:
    """An epoch time in ms as a UTC date and time ("-" for none). The loop writes no time
    before 1970: one there (anyone's, or a default) is shown as the number it is, so said."""
    if not value:
        return "-"
    if value < 0:
        return f"{value} ms (before 1970)"
    try:
        at = datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
    except (ValueError, OverflowError, OSError):  # beyond year 9999: "never" in practice
        return f"{value} ms (beyond year 9999)"
    return at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


#: What a page shows for a character of a key it cannot show as itself: a hidden character's
#: escape (`visible`) or a byte that is not UTF-8 (the key decoded with backslashreplace).
_SHOWN = re.compile(r"⟨U\+([0-9A-F]{4,6})⟩|\\x([89a-f][0-9a-f])")


def key_of_text(text: str) -> bytes:
    """The key a person means by `text` typed as a page shows it: each ⟨U+202E⟩ escape is the
    character, each \\xff the byte that is not UTF-8 (a key whose own text holds such an
    escape is shown the same, and is found by its bytes only through its page's link)."""

    def back(found: re.Match) -> str:
        if found[2]:
            return chr(0xDC00 + int(found[2], 16))  # surrogateescape's stand-in for the byte
        code = int(found[1], 16)
        # A surrogate or past Unicode is no character the escape can stand for: kept as typed.
        return found[0] if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF else chr(code)

    return _SHOWN.sub(back, text).encode("utf-8", "surrogateescape")


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
