"""Sign-in, sessions, CSRF tokens and the login rate limit, all kept in the console's Database.

Passwords are checked against argon2id hashes (argon2-cffi); an unknown user costs the same
hash verification as a known one, so timing does not tell which names exist. A session is a
random 256-bit token in a cookie (Secure, HttpOnly, SameSite=Strict); only its SHA-256 is
stored, so a copy of the database signs nobody in. Each session has its own CSRF token, which
every state-changing form carries and the server compares in constant time. Failed sign-ins are
counted per address and per user name over `WINDOW_MS`; past `MAX_FAILURES` either way, sign-in
is refused before any password is checked, which bounds guessing from one address and against
one account. Sessions and failures live in SQLite, so every console process on the file shares
them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets
from collections.abc import Callable, Mapping

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from beam_agents.intents.effector import wall_clock_ms
from beam_agents.ops.console.config import Role, User
from beam_agents.ops.console.db import Database

__all__ = [
    "MAX_FAILURES",
    "SESSION_MS",
    "WINDOW_MS",
    "Auth",
    "Session",
    "hash_password",
]

SESSION_MS = 12 * 60 * 60 * 1000
WINDOW_MS = 15 * 60 * 1000
MAX_FAILURES = 5

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


class RateLimited(Exception):
    """Too many failed sign-ins from this address or for this user name."""


class Auth:
    def __init__(
        self, db: Database, users: Mapping[str, User], *, clock: Callable[[], int] = wall_clock_ms
    ) -> None:
        self._db = db
        self._users = dict(users)
        self._clock = clock

    def sign_in(self, name: str, password: str, address: str) -> tuple[str, Session] | None:
        """(cookie token, session) for a right password; None for a wrong one. Raises
        RateLimited before checking anything once the address or name failed too often."""
        now = self._clock()
        subjects = (f"address:{address}", f"user:{name}")
        # Each try counts as a failure from the moment it passes the check, in the same
        # transaction: tries verified at once (threads, processes) cannot all pass it.
        with self._db.transaction() as db:
            db.execute("DELETE FROM login_failures WHERE at_ms < ?", (now - WINDOW_MS,))
            for subject in subjects:
                (count,) = db.execute(
                    "SELECT count(*) FROM login_failures WHERE subject = ?", (subject,)
                ).fetchone()
                if count >= MAX_FAILURES:
                    raise RateLimited(subject)
            tries = [
                db.execute("INSERT INTO login_failures VALUES (?, ?)", (s, now)).lastrowid
                for s in subjects
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
                "INSERT INTO sessions VALUES (?, ?, ?, ?)",
                (_digest(token), name, session.csrf, now + SESSION_MS),
            )
        return token, session

    def session(self, token: str | None) -> Session | None:
        """The live session of a cookie token; None for none, an unknown one or an expired
        one, or one whose user is no longer in the configuration."""
        if not token:
            return None
        rows = self._db.read(
            "SELECT user, csrf, expires_at_ms FROM sessions WHERE token_hash = ?",
            (_digest(token),),
        )
        if not rows:
            return None
        name, csrf, expires = rows[0]
        user = self._users.get(name)
        if user is None or expires <= self._clock():
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


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
