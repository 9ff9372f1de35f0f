"""Sign-in, sessions, CSRF tokens and the login rate limit, all kept in the console's Database.

Passwords are checked against argon2id hashes (argon2-cffi); an unknown user costs the same
hash verification as a known one, so timing does not tell which names exist. A session is a
random 256-bit token in a cookie (HttpOnly, SameSite=Strict, Secure unless the configuration
says the console is served over plain HTTP); only its SHA-256 is stored, so a copy of the
database signs nobody in. A session also records a digest of the password hash it was opened
under: once the configuration gives the user another password, every session opened with the
old one is over. Each session has its own CSRF token, which every state-changing form carries
and the server compares in constant time.

The rate limit bounds guessing without letting a stranger lock the owner out. Every try counts
as a failure of its address and of its user name over `WINDOW_MS` until its password proves
right. Per address: `MAX_FAILURES` tries are free, then each further try waits `BACKOFF_MS`
after the address's latest failure, doubling with each failure, up to `WINDOW_MS`; so one
address gets about one guess every 15 minutes, and only that address waits. Per account:
after `MAX_FAILURES` failures against a user name from anywhere, the account is locked for
every address that has a failure of its own in the window, and for no other: the owner typing
the right password from a clean address signs in, while each address guessing gets at most
one try at a locked account per window. (The owner who mistypes from an address while a
stranger keeps the account locked waits for that one failure to age out, `WINDOW_MS`.)
Sessions and failures live in SQLite, so every console process on the file shares them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets
from collections.abc import Callable, Mapping

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from beam_agents.errors import BeamAgentsError
from beam_agents.intents.effector import wall_clock_ms
from beam_agents.ops.console.config import Role, User
from beam_agents.ops.console.db import Database

__all__ = [
    "BACKOFF_MS",
    "MAX_FAILURES",
    "SESSION_MS",
    "WINDOW_MS",
    "Auth",
    "RateLimited",
    "Session",
    "hash_password",
]

SESSION_MS = 12 * 60 * 60 * 1000
WINDOW_MS = 15 * 60 * 1000
MAX_FAILURES = 5
BACKOFF_MS = 1000

_HASHER = PasswordHasher()
# Verified for unknown users, so a miss costs what a wrong password costs.
_DUMMY_HASH = _HASHER.hash(secrets.token_hex(16))


def hash_password(password: str) -> str:
    """An argon2id hash for the config file's password_hash."""
    return _HASHER.hash(password)


@dataclasses.dataclass(frozen=True)
class Session:
    user: User
    csrf: str

    def csrf_ok(self, token: object) -> bool:
        # A multipart form can carry the field as a file: anything but a string is refused.
        return (
            isinstance(token, str)
            and bool(token)
            and hmac.compare_digest(token.encode(), self.csrf.encode())
        )

    def may(self, role: Role) -> bool:
        return self.user.role >= role


class RateLimited(BeamAgentsError):
    """Too many failed sign-ins from this address, or for this user name from an address that
    failed too; `retry_after_ms` is how long until this address may try again."""

    def __init__(self, subject: str, *, retry_after_ms: int) -> None:
        super().__init__(subject)
        self.subject = subject
        self.retry_after_ms = retry_after_ms


class Auth:
    def __init__(
        self, db: Database, users: Mapping[str, User], *, clock: Callable[[], int] = wall_clock_ms
    ) -> None:
        self._db = db
        self._users = dict(users)
        self._clock = clock

    def sign_in(self, name: str, password: str, address: str) -> tuple[str, Session] | None:
        """(cookie token, session) for a right password; None for a wrong one. Raises
        RateLimited before checking anything while the address waits out its backoff, or the
        account is locked and the address failed too (module docstring)."""
        now = self._clock()
        by_address, by_user = f"address:{address}", f"user:{name}"
        # Each try counts as a failure from the moment it passes the check, in the same
        # transaction: tries verified at once (threads, processes) cannot all pass it.
        with self._db.transaction() as db:
            db.execute("DELETE FROM login_failures WHERE at_ms < ?", (now - WINDOW_MS,))
            failed, latest = db.execute(
                "SELECT count(*), max(at_ms) FROM login_failures WHERE subject = ?",
                (by_address,),
            ).fetchone()
            if failed >= MAX_FAILURES:
                # Capped shift: failures older than the window are gone, so `failed` stays
                # small, but a wait never needs more than the window.
                wait = min(BACKOFF_MS << min(failed - MAX_FAILURES, 30), WINDOW_MS)
                if now < latest + wait:
                    raise RateLimited(by_address, retry_after_ms=latest + wait - now)
            (against_user,) = db.execute(
                "SELECT count(*) FROM login_failures WHERE subject = ?", (by_user,)
            ).fetchone()
            if against_user >= MAX_FAILURES and failed:
                # Locked for this address until its own failures age out (a clean address is
                # not subject to the lock).
                raise RateLimited(by_user, retry_after_ms=latest + WINDOW_MS - now)
            tries = [
                db.execute("INSERT INTO login_failures VALUES (?, ?)", (s, now)).lastrowid
                for s in (by_address, by_user)
            ]
        user = self._users.get(name)
        if not _password_ok(user, password):
            return None
        token = secrets.token_urlsafe(32)
        session = Session(user, secrets.token_urlsafe(32))
        with self._db.transaction() as db:
            db.executemany("DELETE FROM login_failures WHERE rowid = ?", [(t,) for t in tries])
            db.execute("DELETE FROM sessions WHERE expires_at_ms < ?", (now,))
            db.execute(
                "INSERT INTO sessions (token_hash, user, csrf, expires_at_ms, credential) "
                "VALUES (?, ?, ?, ?, ?)",
                (_digest(token), name, session.csrf, now + SESSION_MS, _credential(user)),
            )
        return token, session

    def session(self, token: str | None) -> Session | None:
        """The live session of a cookie token; None for none, an unknown one or an expired
        one, or one whose user is no longer in the configuration or has another password
        than the session was opened with."""
        if not token:
            return None
        rows = self._db.read(
            "SELECT user, csrf, expires_at_ms, credential FROM sessions WHERE token_hash = ?",
            (_digest(token),),
        )
        if not rows:
            return None
        name, csrf, expires, credential = rows[0]
        user = self._users.get(name)
        if user is None or expires <= self._clock():
            return None
        if not hmac.compare_digest(bytes(credential), _credential(user)):
            return None
        return Session(user, csrf)

    def sign_out(self, token: str | None) -> None:
        if token:
            with self._db.transaction() as db:
                db.execute("DELETE FROM sessions WHERE token_hash = ?", (_digest(token),))


def _password_ok(user: User | None, password: str) -> bool:
    try:
        return _HASHER.verify(user.password_hash if user else _DUMMY_HASH, password) and bool(user)
    except (VerificationError, InvalidHashError):
        return False


def _credential(user: User) -> bytes:
    """What a session is bound to: the password hash it was opened under (a new password is
    a new hash, and a new salt even for the same password)."""
    return hashlib.sha256(user.password_hash.encode()).digest()


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
