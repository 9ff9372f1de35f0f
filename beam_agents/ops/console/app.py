"""The console's web application (Starlette, server-rendered Jinja2 templates, no Node).

Every page but the sign-in page and the static files needs a session: an anonymous GET is sent
to /login, an anonymous POST gets 401. Every POST carries the session's CSRF token (the sign-in
form a token of its own, in a SameSite cookie) and is refused with 403 without it, before
anything else is looked at; a decision also needs the approver role (403 for a viewer).
Templates autoescape everything, and the Content-Security-Policy allows scripts only from
/static, so text from the loop (a question, a memory value, a key) is shown, never run.

No request waits for the broker: a decision is recorded (its SQLite transaction, like a
password's argon2 hash, runs in the thread pool) and a snapshot request queued, and the bus's
sender produces them (bus.py); the decision's page says whether it was delivered yet.

Cookies are Secure unless the configuration says the console is served over plain HTTP
(`secure_cookies = false`): a browser keeps a Secure cookie only from an HTTPS page (or from
localhost), so a sign-in posted without its form cookie from a page loaded over plain HTTP by
a host name (the browser's Origin says so) is told that, and what to change, rather than that
its form expired.

Live updates: elements with `data-poll` are re-fetched from their fragment URL every few
seconds by static/console.js (plain fetch; server-rendered HTML in, no client templating) and
merged in place, so a refresh keeps the keyboard focus and a text selection; a fragment request
redirected to /login tells the tab it is signed out. A page's fragment URL carries the page's
whole query string, so a refresh keeps the pages and the filter the user chose.

Text from the loop is shown through display.visible (bidi controls and invisible characters as
visible escapes), and an approval nobody can decide any more is shown with why, in words
(display.undecidable), never with buttons that can only be refused.

The inbox (/) lists what waits for a person by urgency, the soonest to expire first, under
filters that are query parameters (state: pending, decided or refused; tool; key), and what
was decided with the decision, the approver, the time and the comment. An approval whose
request names editable arguments offers a field for each ("edit.<name>", read as the asked
value's JSON type) to approve with changes (inbox.py). An agent's page starts with its status
in one line (status.py), then its approvals and timelines, where the wait for a person is a
span and every entry expands to its details (timeline.py).

Health: GET /healthz answers the bus's health (`ConsoleBus.health`: can it read and write its
broker, is its reader behind, for how long) as JSON, 200 healthy or 503 not, to anyone (a
monitor signs in nowhere; it holds error codes and durations, no address or secret); every
page, the sign-in page too, shows the same as a banner, refreshed from /fragments/health.

Paging: every list reads one page in SQL (LIMIT/OFFSET) or, for a StateSnapshot's repeated
fields (decoded whole anyway), slices one page; each list of a page has its own query parameter
(`page`, `decided_page`, `memory_page`, ...), and a pager link changes only its own, keeping
the others and the dead-letter reason filter, and points at the page, never at the fragment.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
from collections.abc import Callable
from functools import cache, partial
from pathlib import Path
from urllib.parse import quote, urlencode, urlsplit

from jinja2 import Environment, FileSystemLoader
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from beam_agents._protos import ToolIntent
from beam_agents.errors import ApprovalEditError, with_article
from beam_agents.intents.approval_edits import editable, json_type
from beam_agents.intents.effector import INQUIRY_SUFFIX, INQUIRY_TOOL, wall_clock_ms
from beam_agents.intents.identity import MAX_ARGS_DEPTH
from beam_agents.ops.console.auth import Auth, RateLimited, Session
from beam_agents.ops.console.bus import ConsoleBus
from beam_agents.ops.console.config import Role
from beam_agents.ops.console.display import NOT_JSON, key_of_text, question, undecidable, visible
from beam_agents.ops.console.display import duration as _duration
from beam_agents.ops.console.display import moment as _ms
from beam_agents.ops.console.inbox import STATES, DecisionRefused
from beam_agents.ops.console.status import agent_status
from beam_agents.ops.console.timeline import span_text, timeline, waits_of

__all__ = ["SESSION_COOKIE", "create_app"]

SESSION_COOKIE = "beam_agents_console"
LOGIN_CSRF_COOKIE = "beam_agents_console_login"
_LOGIN_TOKEN = re.compile(r"[A-Za-z0-9_-]{43}")  # secrets.token_urlsafe(32)
PER_PAGE = 20
AUDIT_PER_PAGE = 50
#: Most approvals of a key read for one trace's timeline or the key's status line.
_TRACE_APPROVALS = 100
#: Highest page number read: any further is past every list, and its offset must still fit
#: SQLite's 64-bit integers (a larger one made the query raise, a 500).
MAX_PAGE = 10**9
#: Largest form body read. The largest form, a decision with its 2,000-character comment, is
#: at most 24 KB percent-encoded; without a bound the form parser buffered up to 1,000 fields
#: of 1 MB each, for anyone, the sign-in form needing no session.
MAX_FORM_BYTES = 64 * 1024
_SECURE_COOKIES_REFUSED = (
    "Sign-in cannot work on this address: the console sets Secure cookies (secure_cookies "
    "is on in its configuration), and a browser keeps them only from a page loaded over "
    "HTTPS (or from localhost). Open the console by its https:// address, or, if it is served "
    "over plain HTTP on a network you trust, set secure_cookies = false in its [console] "
    "table."
)
_HERE = Path(__file__).parent
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _path_part(value: str) -> str:
    """`value` as one segment of a URL path: an inquiry's id ends in "#outcome", and a link
    that left the "#" as it is went to the page of no approval (a browser cuts a URL there)."""
    return quote(value, safe="")


def _key(value: bytes) -> str:
    return bytes(value).decode("utf-8", "backslashreplace")


#: Longest arguments shown indented.
_PRETTY_MAX_CHARS = 64 * 1024


def _pretty(text: str) -> str:
    """JSON indented, or the text as it is when it is no JSON or indenting could multiply it:
    indents grow with depth, and a forged 1 MB intent of deep arrays came to 851 MB in 50 s. A
    real intent's arguments nest at most MAX_ARGS_DEPTH."""
    if len(text) > _PRETTY_MAX_CHARS:
        return text
    try:
        value = json.loads(text)
    except NOT_JSON:
        return text
    level = [value]
    for _ in range(MAX_ARGS_DEPTH):
        level = [
            child
            for v in level
            if isinstance(v, dict | list)
            for child in (v.values() if isinstance(v, dict) else v)
        ]
    if any(isinstance(v, dict | list) for v in level):
        return text
    return json.dumps(value, indent=2, ensure_ascii=False)


def _environment() -> Environment:
    """Text from the loop is shown through `visible` (display.py): `key`, `question`, `pretty`
    and `text` show it so themselves, and `visible` shows any other string so."""
    env = Environment(loader=FileSystemLoader(_HERE / "templates"), autoescape=True)
    env.filters.update(
        ms=_ms, duration=_duration, span=span_text, path_part=_path_part, visible=visible,
        key=lambda value: visible(_key(value)),
        question=lambda intent: visible(question(intent)),
        pretty=lambda text: visible(_pretty(text), lines=True),
        text=lambda value: visible(_key(value), lines=True),
    )  # fmt: skip
    env.filters["hex"] = lambda value: bytes(value).hex()
    return env


#: Hosts a browser treats as a secure context over plain HTTP (it keeps their Secure cookies).
_LOOPBACK = re.compile(r"(.+\.)?localhost|127(\.\d{1,3}){3}|::1")


def _plain_http_origin(request: Request) -> bool:
    """Whether the browser says (Origin, sent with every form post) that it loaded the page
    over plain HTTP from a host that is not the loopback: there it keeps no Secure cookie."""
    try:
        origin = urlsplit(request.headers.get("origin", ""))
        host = origin.hostname or ""
    except ValueError:  # a header that is no URL says nothing
        return False
    return origin.scheme == "http" and not _LOOPBACK.fullmatch(host)


def _unreadable(request: Request) -> Response | None:
    """The refusal of a form body too large to read (413) or of unknown length (411: a
    browser always sends the length of a form), else None."""
    length = request.headers.get("content-length", "")
    if not length.isdigit():
        return Response("a form needs its Content-Length", status_code=411, headers=_HEADERS)
    if int(length) > MAX_FORM_BYTES:
        return Response("the form is too large", status_code=413, headers=_HEADERS)
    return None


#: A form field naming an argument the approver changed: "edit.<argument>".
EDIT_FIELD = "edit."
# JSON's number grammar (RFC 8259 section 6): float() also reads "+40", "4_0", "inf" and
# fullwidth digits, which no person means as the number JSON would write.
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?P<float>(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)")


def _form_value(asked: object, text: str) -> object:
    """The value a form field's `text` gives an argument asked as `asked`: a number for a
    number (written as JSON writes one), true or false for a boolean, the text for a string;
    the text as it is when it is none of these, which the inbox then refuses as a value of the
    wrong type (and a number JSON cannot carry exactly, `check_edits`)."""
    kind, text_ = json_type(asked), text.strip()
    if kind == "boolean" and text_ in ("true", "false"):
        return text_ == "true"
    number = _JSON_NUMBER.fullmatch(text_) if kind == "number" else None
    if number is None:
        return text
    # int() refuses thousands of digits (CPython's limit on int from str); a number that long
    # is past 2^53 either way, and check_edits refuses it as a float as well.
    return float(text_) if number["float"] or len(text_) > 64 else int(text_)


def _edits(intent: ToolIntent, form) -> dict[str, object]:
    """The arguments a decision form changes (its "edit." fields), each as `_form_value` reads
    it against the asked value; a field of an argument that is not editable is kept as text,
    for the inbox to refuse. Raises ApprovalEditError for an argument the form edits twice
    (which of two values was meant is not the console's to guess)."""
    asked = editable(intent)
    edits: dict[str, object] = {}
    for field, value in form.multi_items():
        if not field.startswith(EDIT_FIELD):
            continue
        name = field[len(EDIT_FIELD) :]
        if name in edits:
            raise ApprovalEditError(f"{name!r} is edited twice in one form", field=name)
        edits[name] = _form_value(asked[name], str(value)) if name in asked else str(value)
    return edits


def _page(request: Request, param: str = "page") -> int:
    try:
        return min(max(int(request.query_params.get(param, "1")), 1), MAX_PAGE)
    except ValueError:
        return 1


def _pager(
    request: Request, total: int, per_page: int = PER_PAGE, *, param: str = "page", path: str = ""
) -> dict:
    """Where the list paged by the query parameter `param` stands, with links to its neighbours
    on the page at `path` (default: this request's; a fragment names the page it is part of).
    A link keeps every other query parameter (a filter, the other lists' pages)."""
    page = _page(request, param)
    pages = max((total + per_page - 1) // per_page, 1)

    def link(number: int) -> str:
        params = {**request.query_params, param: str(number)}
        return (path or request.url.path) + "?" + urlencode(sorted(params.items()))

    return {
        "id": param,
        "page": page,
        "pages": pages,
        "total": total,
        "previous": link(page - 1) if page > 1 else None,
        "next": link(page + 1) if page < pages else None,
    }


def _paged(request, fetch, per_page: int = PER_PAGE, *, param: str = "page", path: str = ""):
    """`fetch(offset=, limit=)` -> (rows, total) for the requested page of one list; returns the
    rows and its pager."""
    offset = (_page(request, param) - 1) * per_page
    rows, total = fetch(offset=offset, limit=per_page)
    return rows, _pager(request, total, per_page, param=param, path=path)


def _slice(items):
    """`fetch` over a list already in memory (a StateSnapshot's repeated field)."""
    return lambda *, offset, limit: (list(items[offset : offset + limit]), len(items))


def create_app(
    bus: ConsoleBus,
    auth: Auth,
    *,
    clock: Callable[[], int] = wall_clock_ms,
    secure_cookies: bool = True,
) -> Starlette:
    env = _environment()
    inbox, observations = bus.inbox, bus.observations
    cookie_flags = {"httponly": True, "secure": secure_cookies, "samesite": "strict", "path": "/"}

    def render(request, name: str, status: int = 200, session: Session | None = None, **context):
        html = env.get_template(name).render(
            request=request, session=session, now=clock(), Role=Role, health=bus.health(),
            **context,
        )  # fmt: skip
        return HTMLResponse(html, status_code=status, headers=_HEADERS)

    def message(request, session, status: int, title: str, text: str, back: str = "/"):
        return render(request, "message.html", status, session, title=title, text=text, back=back)

    def guarded(handler, role: Role = Role.VIEWER):
        """`handler(request, session)` for a signed-in user of at least `role`; a POST also
        needs the session's CSRF token."""

        async def endpoint(request: Request) -> Response:
            session = auth.session(request.cookies.get(SESSION_COOKIE))
            if session is None:
                if request.method == "GET":
                    return RedirectResponse("/login", status_code=303, headers=_HEADERS)
                return Response("sign in first", status_code=401, headers=_HEADERS)
            if request.method == "POST":
                if refused := _unreadable(request):
                    return refused
                form = await request.form()
                if not session.csrf_ok(form.get("csrf")):
                    return message(request, session, 403, "Refused", "missing or wrong CSRF token")
                request.state.form = form
            if not session.may(role):
                what = "decide approvals" if role is Role.APPROVER else "see this page"
                return message(
                    request, session, 403, "Forbidden",
                    f"{session.user.name} is {with_article(session.user.role.name.lower())}: only "
                    f"{role.name.lower()}s may {what}",
                )  # fmt: skip
            return await handler(request, session)

        return endpoint

    # -- sign-in --------------------------------------------------------------------------

    async def login_page(request: Request, status: int = 200, error: str = "") -> Response:
        # The token a sign-in form already open (another tab) carries stays valid: a new one
        # each load expired it, and an old tab's refresh, redirected here once its session
        # ends, loads this page every 2 s.
        token = request.cookies.get(LOGIN_CSRF_COOKIE, "")
        if not _LOGIN_TOKEN.fullmatch(token):
            token = secrets.token_urlsafe(32)
        response = render(request, "login.html", status, error=error, csrf=token)
        response.set_cookie(LOGIN_CSRF_COOKIE, token, **cookie_flags)
        return response

    async def login(request: Request) -> Response:
        if refused := _unreadable(request):
            return refused
        form = await request.form()
        cookie = request.cookies.get(LOGIN_CSRF_COOKIE, "")
        token = str(form.get("csrf", ""))
        if not cookie and secure_cookies and _plain_http_origin(request):
            # The browser posts from a page it loaded over plain HTTP (its Origin says so):
            # it dropped the Secure cookie, and would drop the session's.
            return await login_page(request, 403, _SECURE_COOKIES_REFUSED)
        if not cookie or not hmac.compare_digest(cookie.encode(), token.encode()):
            return await login_page(request, 403, "The form expired; please sign in again.")
        address = request.client.host if request.client else ""
        try:
            signed = await run_in_threadpool(
                auth.sign_in, str(form.get("user", "")), str(form.get("password", "")), address
            )
        except RateLimited as e:
            why = "from this address" if e.subject.startswith("address:") else "for this account"
            return await login_page(
                request, 429,
                f"Too many failed sign-ins {why}; try again from here in "
                f"{_duration(e.retry_after_ms + 999)}.",
            )  # fmt: skip
        if signed is None:
            return await login_page(request, 401, "Wrong user name or password.")
        cookie_token, _ = signed
        response = RedirectResponse("/", status_code=303, headers=_HEADERS)
        response.set_cookie(SESSION_COOKIE, cookie_token, **cookie_flags)
        response.delete_cookie(LOGIN_CSRF_COOKIE, path="/", secure=secure_cookies, httponly=True)
        return response

    async def logout(request: Request, session: Session) -> Response:
        auth.sign_out(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/login", status_code=303, headers=_HEADERS)
        response.delete_cookie(SESSION_COOKIE, path="/", secure=secure_cookies, httponly=True)
        return response

    # -- inbox ----------------------------------------------------------------------------

    def inbox_context(request: Request) -> dict:
        """The inbox under its filters (query parameters): `state` ("": the undecided ones and
        the decided ones, each a list of its own; or one of "pending", "decided", "refused"),
        `tool` (a tool name) and `key` (an entity key as text)."""
        query = request.query_params
        state = query.get("state", "")
        state = state if state in STATES else ""
        tool, key_text = query.get("tool", ""), query.get("key", "")
        # The key as the page shows it (display.key_of_text): a byte that is not UTF-8 or a
        # hidden character, typed as shown, finds the key.
        key = key_of_text(key_text) if key_text else None
        chosen = partial(inbox.approvals, tool=tool, key=key)
        pending, pager, decided, decided_pager = [], None, [], None
        if state != "decided":
            pending, pager = _paged(request, partial(chosen, state=state or "undecided"), path="/")
        if state in ("", "decided"):
            decided, decided_pager = _paged(
                request, partial(chosen, state="decided"), param="decided_page", path="/"
            )
        return {
            "pending": pending, "pager": pager, "decided": decided, "decided_pager": decided_pager,
            # The page's approvals nobody can decide any more, with why, are listed apart.
            "undecidable": undecidable_among(pending),
            "filters": {"state": state, "tool": tool, "key": key_text}, "tools": inbox.tools(),
        }  # fmt: skip

    # Only a snapshot that answers the console's own request decides anything (observed.py): a
    # forged deadline neither refuses a decision nor shows.
    trusted_snapshot = partial(observations.snapshot, trusted=True)

    def deadline_of(found, snapshot_of=trusted_snapshot) -> int:
        """When the agent stops waiting for the answer to `found` (0: not known): its
        suspension's deadline, from the key's latest snapshot (`snapshot_of(key)`)."""
        snapshot = snapshot_of(found.intent.entity_key)
        # The effector's inquiry is about a call the agent waits on under the call's own id:
        # its deadline is when the agent stops waiting for the answer asked for here.
        waited = found.intent_id
        if found.intent.tool_name == INQUIRY_TOOL:
            waited = waited.removesuffix(INQUIRY_SUFFIX)
        if snapshot is not None and waited in snapshot.continuation.pending_intent_ids:
            return snapshot.continuation.deadline_ms
        return 0

    def why_undecidable(found, snapshot_of=trusted_snapshot) -> str:
        """Why nobody can decide `found` now, in words ("" when a person can), as the inbox
        refuses: an inquiry's deadline is its call's, which the inbox does not refuse on."""
        inquiry = found.intent.tool_name == INQUIRY_TOOL
        return undecidable(found, clock(), 0 if inquiry else deadline_of(found, snapshot_of))

    def undecidable_among(approvals) -> list[tuple]:
        """(approval, why) for each undecided one of `approvals` nobody can decide, reading
        each key's snapshot once (a list refreshes every few seconds)."""
        snapshot_of = cache(trusted_snapshot)
        reasons = ((a, why_undecidable(a, snapshot_of)) for a in approvals if not a.decision)
        return [(a, why) for a, why in reasons if why]

    async def approval(request: Request, session: Session) -> Response:
        intent_id = request.path_params["intent_id"]
        found = inbox.get(intent_id)
        if found is None:
            return message(request, session, 404, "Not found", f"no approval {intent_id}")
        trace = observations.activation(found.intent.entity_key, found.intent.trace_id)
        waits = waits_of(trace_approvals(found.intent.entity_key, found.intent.trace_id),
                         clock(), why_undecidable)  # fmt: skip
        return render(
            request, "approval.html", session=session, approval=found,
            deadline=deadline_of(found), undecidable=why_undecidable(found),
            timeline=timeline(trace.events if trace else [], waits),
            editable=editable(found.intent) if found.approvable else {},
        )  # fmt: skip

    def trace_approvals(key: bytes, trace_id: bytes) -> list:
        """The key's approvals asked in the trace `trace_id`, as the inbox keeps them (the
        approvable ones: a refused copy is nobody's wait)."""
        found, _ = inbox.approvals(state="all", key=key, limit=_TRACE_APPROVALS)
        return [a for a in found if a.approvable and a.intent.trace_id == trace_id]

    async def decide(request: Request, session: Session) -> Response:
        intent_id = request.path_params["intent_id"]
        form = request.state.form
        verdict = form.get("decision")
        if verdict not in ("approve", "decline"):
            return message(request, session, 400, "Refused", "choose approve or decline")
        address = request.client.host if request.client else ""
        back = f"/approvals/{_path_part(intent_id)}"
        found = inbox.get(intent_id)
        # Edits go with an approval only; a decline's form carries the fields as they were.
        try:
            edits = _edits(found.intent, form) if found and verdict == "approve" else {}
        except ApprovalEditError as e:
            return message(request, session, 400, "Refused", str(e), back)
        try:
            decision, made = await run_in_threadpool(
                partial(
                    bus.decide,
                    intent_id,
                    approved=verdict == "approve",
                    user=session.user.name,
                    comment=str(form.get("comment", "")),
                    address=address,
                    edits=edits,
                )
            )
        except DecisionRefused as e:
            # In words with readable times, as the approval's page says it (the refusal's own
            # message, for the log, has the raw times).
            found = inbox.get(intent_id)
            why = why_undecidable(found) if found is not None else ""
            text = f"This request cannot be decided: {why}." if why else str(e)
            return message(request, session, 409, "Cannot be decided", text, back)
        if not made:
            what = "approved" if decision.approved else "declined"
            return message(
                request, session, 409, "Already decided",
                f"{decision.approver} {what} this at {_ms(decision.decided_at_ms)}; "
                "nothing was sent again",
                back,
            )  # fmt: skip
        return RedirectResponse(back, status_code=303, headers=_HEADERS)

    # -- viewer ---------------------------------------------------------------------------

    def agents_context(request: Request) -> dict:
        keys, pager = _paged(request, observations.keys, path="/agents")
        return {"keys": keys, "pager": pager}

    def agent_context(request: Request) -> dict | None:
        try:
            key = bytes.fromhex(request.path_params["key_hex"])
        except ValueError:
            return None
        path = f"/agents/{key.hex()}"
        pagers = {}

        def page_of(fetch, param: str, per_page: int = PER_PAGE) -> list:
            rows, pagers[param] = _paged(request, fetch, per_page, param=param, path=path)
            return rows

        activations = page_of(partial(observations.activations, key), "page", 5)
        now = clock()
        snapshot = observations.snapshot(key)
        state = {}
        if snapshot is not None:
            state = {
                "memory": page_of(_slice(snapshot.memory.entries), "memory_page"),
                "intents": page_of(_slice(snapshot.pending), "intents_page"),
                "llm_cache": page_of(_slice(snapshot.llm_cache.entries), "cache_page"),
            }
        approvals = page_of(partial(inbox.approvals, state="all", key=key), "approvals_page")
        letters = page_of(partial(observations.dead_letters, key=key), "letters_page")
        completions = page_of(partial(observations.completions, key), "completions_page")
        return {
            "key": key,
            "agent_status": key_status(key, now, snapshot),
            "snapshot": snapshot,
            "snapshot_trusted": observations.snapshot_trusted(key),
            **state,
            "approvals": approvals,
            "undecidable": {a.intent_id: why for a, why in undecidable_among(approvals)},
            "activations": [
                (
                    a,
                    timeline(
                        a.events, waits_of(trace_approvals(key, a.trace_id), now, why_undecidable)
                    ),
                )
                for a in activations
            ],
            "letters": letters,
            "completions": completions,
            "pagers": pagers,
        }

    def key_status(key: bytes, now: int, snapshot):
        """The key's status line (status.py), from what a person can trust: the inbox's
        approvals, the key's trusted snapshot, its latest completion and dead letter."""
        waiting, _ = inbox.approvals(state="pending", key=key, limit=_TRACE_APPROVALS)
        decidable = [a for a in waiting if not why_undecidable(a)]
        trusted = snapshot if observations.snapshot_trusted(key) else None
        completion, _ = observations.completions(key, limit=1)
        letter = observations.latest_dead_letter(key)
        latest, _ = observations.activations(key, limit=1)
        decided, _ = inbox.approvals(state="decided", key=key, limit=1)
        return agent_status(
            now=now,
            waiting=decidable[0] if decidable else None,
            waiting_total=len(decidable),
            snapshot=trusted,
            completion=completion[0] if completion else None,
            letter=letter[1] if letter else None,
            letter_at_ms=letter[0] if letter else None,
            decision=decided[0].decision if decided else None,
            last_trace_ms=latest[0].start_ms if latest else 0,
        )

    async def agent(request: Request, session: Session) -> Response:
        context = agent_context(request)
        if context is None:
            return message(request, session, 404, "Not found", "keys are named in hex")
        return render(request, "agent.html", session=session, **context)

    async def agent_fragment(request: Request, session: Session) -> Response:
        context = agent_context(request)
        if context is None:
            return Response("keys are named in hex", status_code=404, headers=_HEADERS)
        return render(request, "_agent_live.html", session=session, **context)

    async def export(request: Request, session: Session) -> Response:
        key_hex = request.path_params["key_hex"]
        try:
            bus.request_export(bytes.fromhex(key_hex))  # queued: the sender produces it
        except ValueError:
            return message(request, session, 404, "Not found", "keys are named in hex")
        return RedirectResponse(f"/agents/{key_hex}", status_code=303, headers=_HEADERS)

    def dead_letters_context(request: Request) -> dict:
        reason = request.query_params.get("reason", "")
        letters, pager = _paged(
            request, partial(observations.dead_letters, reason=reason), path="/dead-letters"
        )
        return {"letters": letters, "reason": reason, "pager": pager}

    def audit_context(request: Request) -> dict:
        rows, pager = _paged(request, inbox.audit, AUDIT_PER_PAGE, path="/audit")
        return {"rows": rows, "pager": pager}

    async def healthz(request: Request) -> Response:
        health = bus.health()
        return JSONResponse(health, 200 if health["healthy"] else 503, headers=_HEADERS)

    async def health_fragment(request: Request) -> Response:
        return render(request, "_health.html")

    def page(template: str, context: Callable[[Request], dict], **more: Callable[[], object]):
        """The handler rendering `template` with `context(request)` and `more`'s values."""

        async def handler(request: Request, session: Session) -> Response:
            extra = {name: value() for name, value in more.items()}
            return render(request, template, session=session, **context(request), **extra)

        return handler

    routes = [
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/fragments/health", health_fragment, methods=["GET"]),
        Route("/logout", guarded(logout), methods=["POST"]),
        Route("/", guarded(page("inbox.html", inbox_context))),
        Route("/fragments/inbox", guarded(page("_inbox_list.html", inbox_context))),
        Route("/approvals/{intent_id}", guarded(approval), methods=["GET"]),
        Route("/approvals/{intent_id}", guarded(decide, Role.APPROVER), methods=["POST"]),
        Route("/agents", guarded(page("agents.html", agents_context))),
        Route("/fragments/agents", guarded(page("_agents_list.html", agents_context))),
        Route("/agents/{key_hex}", guarded(agent), methods=["GET"]),
        Route("/agents/{key_hex}/export", guarded(export), methods=["POST"]),
        Route("/fragments/agents/{key_hex}", guarded(agent_fragment)),
        Route(
            "/dead-letters",
            guarded(page("dead_letters.html", dead_letters_context, reasons=observations.reasons)),
        ),
        Route(
            "/fragments/dead-letters",
            guarded(page("_dead_letters_list.html", dead_letters_context)),
        ),
        Route("/audit", guarded(page("audit.html", audit_context), Role.ADMIN)),
        Route("/fragments/audit", guarded(page("_audit_list.html", audit_context), Role.ADMIN)),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes)
