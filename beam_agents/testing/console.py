"""Test support for the console: keys, signed APPROVAL intents, a publisher that records what
the console produces, and an HTTP client that speaks to a console on 127.0.0.1 the way a
browser does (cookies, the CSRF token from the page) with the standard library only."""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import re
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from beam_agents._protos import AgentEnvelope, StateSnapshot, ToolIntent
from beam_agents.bus import KafkaBusError, Topics
from beam_agents.intents.approval_edits import approval_args
from beam_agents.intents.effector import VerifyMode
from beam_agents.intents.identity import canonical_args_json
from beam_agents.intents.signing import Keyring, sign
from beam_agents.ops.console.app import create_app
from beam_agents.ops.console.auth import Auth, hash_password
from beam_agents.ops.console.bus import ConsoleBus
from beam_agents.ops.console.config import Role, User
from beam_agents.ops.console.db import Database
from beam_agents.ops.console.inbox import Inbox
from beam_agents.ops.console.observed import Observations
from beam_agents.ops.console.service import serving
from beam_agents.testing.samples import TRACE_ID

__all__ = [
    "APPROVALS_RING",
    "INTENT_RING",
    "PASSWORD",
    "USERS",
    "Browser",
    "Recorder",
    "approval_intent",
    "export_answer",
    "make_bus",
    "signed_in",
]

INTENT_RING = Keyring(
    {"intents-1": b"intent key of the console tests, 32+ bytes"}, active="intents-1"
)
APPROVALS_RING = Keyring(
    {"approvals-1": b"approvals key of the console tests, 32+ bytes"}, active="approvals-1"
)
PASSWORD = "correct horse battery staple"
_HASH = hash_password(PASSWORD)
USERS = {
    name: User(name, role, _HASH)
    for name, role in (("vera", Role.VIEWER), ("alice", Role.APPROVER), ("ada", Role.ADMIN))
}


def approval_intent(
    intent_id: str = "a-1",
    *,
    key: bytes = b"c-1",
    question: str = "Refund 42.00 EUR to customer c-1?",
    created_at_ms: int = 1_000,
    expires_at_ms: int = 2**62,
    ring: Keyring | None = INTENT_RING,
    tool: str = "human.approval",
    editable: Sequence[str] = (),
) -> ToolIntent:
    """An APPROVAL intent of `tool` asking `question` about 42 EUR (`editable` names what a
    person may change, approval_edits.py), signed with `ring` (unsigned for None)."""
    intent = ToolIntent(
        intent_id=intent_id,
        entity_key=key,
        seq=3,
        step_index=1,
        tool_name=tool,
        args_json=canonical_args_json(approval_args(question, {"amount": 42}, editable)),
        created_at_ms=created_at_ms,
        expires_at_ms=expires_at_ms,
        kind=ToolIntent.APPROVAL,
        trace_id=TRACE_ID,
    )
    return intent if ring is None else sign(intent, ring)


class Recorder:
    """A publisher that keeps what it was given; `fail` makes it refuse like a broker that does
    not acknowledge."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, bytes, int]] = []
        self.fail = False

    def __call__(self, records: Iterable) -> None:
        records = list(records)
        if self.fail:
            raise KafkaBusError("records not acknowledged: the test broker is down")
        for topic, key, value, at in records:
            if not isinstance(value, bytes):
                value = value.SerializeToString(deterministic=True)
            self.records.append((topic, key, value, at))

    def on(self, topic: str) -> list[bytes]:
        return [value for t, _, value, _ in self.records if t == topic]


def make_bus(
    path: Path,
    publish,
    clock,
    *,
    mode: VerifyMode = VerifyMode.REQUIRE,
    topics: Topics = Topics("loop"),  # noqa: B008 - frozen, never changed
    intent_keyring: Keyring = INTENT_RING,
    inquiry_keyring: Keyring | None = None,
) -> tuple[ConsoleBus, Auth]:
    """A console's bus and auth over the SQLite file `path`, as `service.build` makes them."""
    db = Database(path)
    inbox = Inbox(
        db,
        mode=mode,
        intent_keyring=intent_keyring,
        approvals_keyring=APPROVALS_RING,
        inquiry_keyring=inquiry_keyring,
        clock=clock,
    )
    bus = ConsoleBus(inbox, Observations(db, clock=clock), topics, publish, clock=clock)
    return bus, Auth(db, USERS, clock=clock)


def export_answer(bus: ConsoleBus, recorder: Recorder, snapshot: StateSnapshot) -> bytes:
    """`snapshot` as its agent's answer to the latest export request the console sent for its
    key (one sent now when it sent none): the one kind of snapshot the console trusts
    (observed.py)."""

    def requests() -> list[AgentEnvelope]:
        envelopes = map(AgentEnvelope.FromString, recorder.on(bus.topics.events))
        return [
            e
            for e in envelopes
            if e.WhichOneof("payload") == "export_request" and e.entity_key == snapshot.entity_key
        ]

    if not requests():
        bus.request_export(snapshot.entity_key)
        bus.produce_recorded()  # what the sender thread does
    request = requests()[-1]
    answer = StateSnapshot()
    answer.CopyFrom(snapshot)
    answer.request_id = request.export_request.request_id
    answer.snapshot_at_ms = request.event_time_ms
    return answer.SerializeToString()


@dataclasses.dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    text: str

    def csrf(self) -> str:
        match = re.search(r'name="csrf" value="([^"]+)"', self.text)
        assert match, f"no CSRF token in the page:\n{self.text[:2000]}"
        return match.group(1)


class Browser:
    """Real HTTP to a console; keeps cookies by name (Secure ones too: the console is on
    127.0.0.1, which browsers treat as a secure origin). `source` is the address it connects
    from (any of 127.0.0.0/8). With `plain_http_host`, it is a browser that loaded the console
    over plain HTTP by that host name: it names the host, sends that origin with its forms, and
    keeps no Secure cookie (as browsers do on a page that is no secure context). With
    `forwarded_for`, it is a proxy forwarding a client of that address (X-Forwarded-For)."""

    def __init__(
        self,
        base_url: str,
        *,
        source: str = "",
        plain_http_host: str = "",
        forwarded_for: str = "",
        cookies: dict[str, str] | None = None,
    ) -> None:
        parsed = urllib.parse.urlsplit(base_url)
        self._host, self._port = parsed.hostname, parsed.port
        self._source = (source, 0) if source else None
        self._plain_http_host = plain_http_host
        self._forwarded_for = forwarded_for
        self.cookies: dict[str, str] = dict(cookies or {})

    def request(self, method: str, path: str, form: dict | None = None) -> Reply:
        connection = http.client.HTTPConnection(
            self._host, self._port, timeout=30, source_address=self._source
        )
        headers = {"X-Forwarded-For": self._forwarded_for} if self._forwarded_for else {}
        if self._plain_http_host:
            headers["Host"] = f"{self._plain_http_host}:{self._port}"
            if method == "POST":
                headers["Origin"] = f"http://{self._plain_http_host}:{self._port}"
        if self.cookies:
            headers["Cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            text = response.read().decode("utf-8")
        finally:
            connection.close()
        for header in response.headers.get_all("Set-Cookie") or []:
            name, _, rest = header.partition("=")
            value = rest.split(";", 1)[0]
            flags = {flag.strip().lower() for flag in rest.split(";")[1:]}
            if value in ("", '""') or "max-age=0" in flags:
                self.cookies.pop(name, None)
            elif not (self._plain_http_host and "secure" in flags):
                self.cookies[name] = value
        return Reply(response.status, response.headers, text)

    def get(self, path: str) -> Reply:
        return self.request("GET", path)

    def post(self, path: str, form: dict) -> Reply:
        return self.request("POST", path, form)

    def sign_in(self, user: str, password: str = PASSWORD) -> Reply:
        page = self.get("/login")
        return self.post("/login", {"csrf": page.csrf(), "user": user, "password": password})


@contextlib.contextmanager
def signed_in(
    path: Path, clock: Callable[[], int], user: str = "alice"
) -> Iterator[tuple[Browser, ConsoleBus, Recorder]]:
    """A console over real HTTP on 127.0.0.1, its SQLite file at `path`, on `clock`: a Browser
    signed in as `user`, the console's bus and the recorder of what it produces."""
    recorder = Recorder()
    bus, auth = make_bus(path, recorder, clock)
    with serving(create_app(bus, auth, clock=clock)) as url:
        browser = Browser(url)
        if browser.sign_in(user).status != 303:
            raise AssertionError(f"{user} could not sign in")
        yield browser, bus, recorder
