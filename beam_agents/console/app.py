"""The console's web application (Starlette, server-rendered Jinja2 templates, no Node).

Every page but the sign-in page and the static files needs a session: an anonymous GET is sent
to /login, an anonymous POST gets 401. Every POST carries the session's CSRF token (the sign-in
form a token of its own, in a SameSite cookie) and is refused with 403 without it, before
anything else is looked at; a decision also needs the approver role (403 for a viewer).
Templates autoescape everything, and the Content-Security-Policy allows scripts only from
/static, so text from the loop (a question, a memory value, a key) is shown, never run.

Live updates: elements with `data-poll` are re-fetched from their fragment URL every few
seconds by static/console.js (plain fetch; server-rendered HTML in, no client templating).
"""

from __future__ import annotations

import datetime
import hmac
import json
import secrets
from collections.abc import Callable
from pathlib import Path

from jinja2 import Environment, FileSystemLoader
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from beam_agents._protos import ToolIntent
from beam_agents.console.auth import Auth, RateLimited, Session
from beam_agents.console.bus import ConsoleBus
from beam_agents.console.config import Role
from beam_agents.console.inbox import DecisionRefused
from beam_agents.console.timeline import timeline
from beam_agents.effector import wall_clock_ms
from beam_agents.kafka_bus import KafkaBusError

__all__ = ["SESSION_COOKIE", "create_app"]

SESSION_COOKIE = "beam_agents_console"
LOGIN_CSRF_COOKIE = "beam_agents_console_login"
PER_PAGE = 20
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


def _ms(value: int) -> str:
    if not value:
        return "-"
    try:
        moment = datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
    except (ValueError, OverflowError, OSError):  # beyond year 9999: "never" in practice
        return f"{value} ms (beyond year 9999)"
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def _duration(ms: int) -> str:
    seconds = abs(ms) // 1000
    sign = "-" if ms < 0 else ""
    if seconds < 120:
        return f"{sign}{seconds} s"
    if seconds < 7200:
        return f"{sign}{seconds // 60} min"
    return f"{sign}{seconds // 3600} h"


def _key(value: bytes) -> str:
    return bytes(value).decode("utf-8", "backslashreplace")


def _question(intent: ToolIntent) -> str:
    try:
        args = json.loads(intent.args_json)
    except ValueError:
        return intent.args_json
    if isinstance(args, dict) and isinstance(args.get("question"), str):
        return args["question"]
    return intent.tool_name


def _pretty(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def _environment() -> Environment:
    env = Environment(loader=FileSystemLoader(_HERE / "templates"), autoescape=True)
    env.filters.update(ms=_ms, duration=_duration, key=_key, question=_question, pretty=_pretty)
    env.filters["hex"] = lambda value: bytes(value).hex()
    env.filters["text"] = lambda value: bytes(value).decode("utf-8", "backslashreplace")
    return env


def _page(request: Request) -> int:
    try:
        return max(int(request.query_params.get("page", "1")), 1)
    except ValueError:
        return 1


def _pager(request: Request, total: int, per_page: int = PER_PAGE) -> dict:
    page = _page(request)
    pages = max((total + per_page - 1) // per_page, 1)

    def link(number: int) -> str:
        params = dict(request.query_params)
        params["page"] = str(number)
        return request.url.path + "?" + "&".join(f"{k}={v}" for k, v in sorted(params.items()))

    return {
        "page": page,
        "pages": pages,
        "total": total,
        "previous": link(page - 1) if page > 1 else None,
        "next": link(page + 1) if page < pages else None,
    }


def create_app(
    bus: ConsoleBus, auth: Auth, *, clock: Callable[[], int] = wall_clock_ms
) -> Starlette:
    env = _environment()
    inbox, observations = bus.inbox, bus.observations

    def render(request, name: str, status: int = 200, session: Session | None = None, **context):
        html = env.get_template(name).render(
            request=request, session=session, now=clock(), Role=Role, **context
        )
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
                form = await request.form()
                if not session.csrf_ok(form.get("csrf")):
                    return message(request, session, 403, "Refused", "missing or wrong CSRF token")
                request.state.form = form
            if not session.may(role):
                what = "decide approvals" if role is Role.APPROVER else "see this page"
                return message(
                    request, session, 403, "Forbidden",
                    f"{session.user.name} is a {session.user.role.name.lower()}: only "
                    f"{role.name.lower()}s may {what}",
                )  # fmt: skip
            return await handler(request, session)

        return endpoint

    # -- sign-in --------------------------------------------------------------------------

    async def login_page(request: Request, status: int = 200, error: str = "") -> Response:
        token = secrets.token_urlsafe(32)
        response = render(request, "login.html", status, error=error, csrf=token)
        response.set_cookie(
            LOGIN_CSRF_COOKIE, token, httponly=True, secure=True, samesite="strict", path="/"
        )
        return response

    async def login(request: Request) -> Response:
        form = await request.form()
        cookie = request.cookies.get(LOGIN_CSRF_COOKIE, "")
        token = str(form.get("csrf", ""))
        if not cookie or not hmac.compare_digest(cookie.encode(), token.encode()):
            return await login_page(request, 403, "The form expired; please sign in again.")
        address = request.client.host if request.client else ""
        try:
            signed = auth.sign_in(str(form.get("user", "")), str(form.get("password", "")), address)
        except RateLimited:
            return await login_page(request, 429, "Too many failed sign-ins; try again later.")
        if signed is None:
            return await login_page(request, 401, "Wrong user name or password.")
        cookie_token, _ = signed
        response = RedirectResponse("/", status_code=303, headers=_HEADERS)
        response.set_cookie(
            SESSION_COOKIE, cookie_token, httponly=True, secure=True, samesite="strict", path="/"
        )
        response.delete_cookie(LOGIN_CSRF_COOKIE, path="/")
        return response

    async def logout(request: Request, session: Session) -> Response:
        auth.sign_out(request.cookies.get(SESSION_COOKIE))
        response = RedirectResponse("/login", status_code=303, headers=_HEADERS)
        response.delete_cookie(SESSION_COOKIE, path="/", secure=True, httponly=True)
        return response

    # -- inbox ----------------------------------------------------------------------------

    def inbox_context(request: Request) -> dict:
        offset = (_page(request) - 1) * PER_PAGE
        pending, total = inbox.pending(offset=offset, limit=PER_PAGE)
        decided, _ = inbox.decided(limit=10)
        return {"pending": pending, "pager": _pager(request, total), "decided": decided}

    async def index(request: Request, session: Session) -> Response:
        return render(request, "inbox.html", session=session, **inbox_context(request))

    async def inbox_fragment(request: Request, session: Session) -> Response:
        return render(request, "_inbox_list.html", session=session, **inbox_context(request))

    async def approval(request: Request, session: Session) -> Response:
        intent_id = request.path_params["intent_id"]
        found = inbox.get(intent_id)
        if found is None:
            return message(request, session, 404, "Not found", f"no approval {intent_id}")
        snapshot = observations.snapshot(found.intent.entity_key)
        deadline = 0
        if snapshot is not None and intent_id in snapshot.continuation.pending_intent_ids:
            deadline = snapshot.continuation.deadline_ms
        activations, _ = observations.activations(found.intent.entity_key, limit=50)
        trace = next((a for a in activations if a.trace_id == found.intent.trace_id), None)
        return render(
            request, "approval.html", session=session, approval=found, deadline=deadline,
            timeline=timeline(trace.events) if trace else None,
        )  # fmt: skip

    async def decide(request: Request, session: Session) -> Response:
        intent_id = request.path_params["intent_id"]
        form = request.state.form
        verdict = form.get("decision")
        if verdict not in ("approve", "decline"):
            return message(request, session, 400, "Refused", "choose approve or decline")
        address = request.client.host if request.client else ""
        back = f"/approvals/{intent_id}"
        try:
            decision, made = bus.decide(
                intent_id,
                approved=verdict == "approve",
                user=session.user.name,
                comment=str(form.get("comment", "")),
                address=address,
            )
        except DecisionRefused as e:
            return message(request, session, 409, "Not decided", str(e), back)
        except KafkaBusError as e:
            return message(
                request, session, 503, "Recorded, not yet delivered",
                f"the decision is recorded and will be delivered when the broker answers: {e}",
                back,
            )  # fmt: skip
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

    async def agents(request: Request, session: Session) -> Response:
        keys, total = observations.keys(offset=(_page(request) - 1) * PER_PAGE, limit=PER_PAGE)
        return render(
            request, "agents.html", session=session, keys=keys, pager=_pager(request, total)
        )

    def agent_context(request: Request) -> dict | None:
        try:
            key = bytes.fromhex(request.path_params["key_hex"])
        except ValueError:
            return None
        per = 5
        activations, total = observations.activations(
            key, offset=(_page(request) - 1) * per, limit=per
        )
        letters, letter_total = observations.dead_letters(key=key, limit=PER_PAGE)
        completions, completion_total = observations.completions(key, limit=PER_PAGE)
        return {
            "key": key,
            "snapshot": observations.snapshot(key),
            "approvals": inbox.for_key(key),
            "activations": [(a, timeline(a.events)) for a in activations],
            "pager": _pager(request, total, per),
            "letters": letters,
            "completions": completions,
            "completion_total": completion_total,
            "letter_total": letter_total,
        }

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
            bus.request_export(bytes.fromhex(key_hex))
        except ValueError:
            return message(request, session, 404, "Not found", "keys are named in hex")
        except KafkaBusError as e:
            return message(request, session, 503, "Not sent", str(e), f"/agents/{key_hex}")
        return RedirectResponse(f"/agents/{key_hex}", status_code=303, headers=_HEADERS)

    async def dead_letters(request: Request, session: Session) -> Response:
        reason = request.query_params.get("reason", "")
        letters, total = observations.dead_letters(
            reason=reason, offset=(_page(request) - 1) * PER_PAGE, limit=PER_PAGE
        )
        return render(
            request, "dead_letters.html", session=session, letters=letters, reason=reason,
            reasons=observations.reasons(), pager=_pager(request, total),
        )  # fmt: skip

    async def audit(request: Request, session: Session) -> Response:
        rows, total = inbox.audit(offset=(_page(request) - 1) * 50, limit=50)
        return render(
            request, "audit.html", session=session, rows=rows, pager=_pager(request, total, 50)
        )

    routes = [
        Route("/login", login_page, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", guarded(logout), methods=["POST"]),
        Route("/", guarded(index)),
        Route("/fragments/inbox", guarded(inbox_fragment)),
        Route("/approvals/{intent_id}", guarded(approval), methods=["GET"]),
        Route("/approvals/{intent_id}", guarded(decide, Role.APPROVER), methods=["POST"]),
        Route("/agents", guarded(agents)),
        Route("/agents/{key_hex}", guarded(agent), methods=["GET"]),
        Route("/agents/{key_hex}/export", guarded(export), methods=["POST"]),
        Route("/fragments/agents/{key_hex}", guarded(agent_fragment)),
        Route("/dead-letters", guarded(dead_letters)),
        Route("/audit", guarded(audit, Role.ADMIN)),
        Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
    ]
    return Starlette(routes=routes)
