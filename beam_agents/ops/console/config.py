"""The console's configuration file (TOML): where the loop is, its keys, and who may sign in.

    [kafka]
    bootstrap_servers = "127.0.0.1:9092"
    topic_prefix = "my-loop"

    [console]
    database = "console.sqlite"          # relative paths are relative to this file
    host = "127.0.0.1"
    port = 8080
    secure_cookies = true                # false only when served over plain HTTP (below)
    trusted_proxies = ["127.0.0.1"]      # the TLS proxy's address(es); default: none (below)
    verify_mode = "require"              # how APPROVAL intents are verified (as the effector)
    intent_keyring = "intent-keys.json"  # verifies them: a keyring file, or MODULE:NAME
    approvals_keyring = "approval-keys.json"  # its active key signs every decision
    inquiry_keyring = "inquiry-keys.json"  # verifies the effector's inquiries about lost calls

    [users.alice]
    role = "approver"                    # viewer, approver or admin
    password_hash = "$argon2id$v=19$..." # `beam-agents console hash-password`

The console serves plain HTTP and is meant to be reached over HTTPS, through a TLS-terminating
proxy: its cookies are Secure by default, and a browser keeps a Secure cookie only from an
HTTPS page (or from localhost). Served over plain HTTP by a host name (a LAN name, a proxy that
does not terminate TLS), sign-in cannot work until `secure_cookies = false`, and the sign-in
page says so. Behind that proxy every request comes from the proxy's address, which the
audit log would record and the sign-in limit would throttle (five wrong passwords from anyone
would lock everyone out): `trusted_proxies` names the proxy's addresses (IP addresses or
networks, "10.0.0.0/8"), and from those peers only the client is taken from X-Forwarded-For
(the nearest address in it that is no trusted proxy; uvicorn's proxy headers) and the scheme
from X-Forwarded-Proto. Name only proxies that set X-Forwarded-For themselves: a peer named
here chooses the address it forwards. A request from any other peer is its own client,
whatever it forwards. Passwords are kept only as argon2id hashes (argon2-cffi); changing a user's
password_hash ends that user's sessions once the console is restarted on the file. A keyring
given as MODULE:NAME is a callable returning a Keyring (as `effector-service --keyring`), e.g.
the demo's key.
`inquiry_keyring` is the ring the effector signs its inquiries with (`effector-service
--inquiry-keyring`, else its `--result-keyring`); without it, under a verify mode, the
effector's questions about calls it lost are listed refused and nobody can answer them.
"""

from __future__ import annotations

import dataclasses
import enum
import ipaddress
import tomllib
from collections.abc import Mapping
from pathlib import Path

from beam_agents.bus import Topics
from beam_agents.errors import BeamAgentsError, KeyringError, with_article
from beam_agents.intents.effector import VerifyMode
from beam_agents.intents.signing import Keyring
from beam_agents.ops.loading import load_object

__all__ = ["ConsoleConfig", "ConsoleConfigError", "Role", "User", "load_keyring"]


class ConsoleConfigError(BeamAgentsError):
    """The console's configuration file is missing, malformed or names something unusable."""

    def __init__(self, reason: str, *, path: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path


class Role(enum.IntEnum):
    """Ordered: each role may do what the roles below it may."""

    VIEWER = 1
    APPROVER = 2
    ADMIN = 3


@dataclasses.dataclass(frozen=True)
class User:
    name: str
    role: Role
    password_hash: str = dataclasses.field(repr=False)


@dataclasses.dataclass(frozen=True)
class ConsoleConfig:
    users: Mapping[str, User]
    database: Path
    intent_keyring: Keyring | None
    approvals_keyring: Keyring
    verify_mode: VerifyMode = VerifyMode.REQUIRE
    inquiry_keyring: Keyring | None = None
    bootstrap_servers: str = ""
    topics: Topics | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    secure_cookies: bool = True
    trusted_proxies: tuple[str, ...] = ()

    @classmethod
    def from_file(cls, path: str | Path) -> ConsoleConfig:
        path = Path(path)
        try:
            document = tomllib.loads(path.read_text("utf-8"))
        except OSError as e:
            raise ConsoleConfigError(f"cannot read: {e.strerror}", path=str(path)) from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConsoleConfigError(f"not TOML: {e}", path=str(path)) from None
        return cls.from_document(document, base=path.parent, source=str(path))

    @classmethod
    def from_document(cls, document: Mapping, *, base: Path, source: str) -> ConsoleConfig:
        def fail(reason: str) -> ConsoleConfigError:
            return ConsoleConfigError(reason, path=source)

        kafka = _table(document, "kafka", fail)
        console = _table(document, "console", fail)
        users = {}
        for name, entry in _table(document, "users", fail).items():
            if not isinstance(entry, Mapping):
                raise fail(f"users.{name} is not a table")
            role = str(entry.get("role", "")).upper()
            if role not in Role.__members__:
                raise fail(f"users.{name}.role must be viewer, approver or admin")
            password_hash = entry.get("password_hash")
            if not isinstance(password_hash, str) or not password_hash.startswith("$argon2"):
                raise fail(f"users.{name}.password_hash must be an argon2 hash")
            users[name] = User(name, Role[role], password_hash)
        if not users:
            raise fail("no [users.NAME] table: nobody could sign in")

        def text(table: Mapping, section: str, key: str, default: str = "") -> str:
            # A value of another TOML type is the file's mistake, named, not a TypeError.
            value = table.get(key, default)
            if not isinstance(value, str):
                raise fail(f"{section}.{key} must be a string, not {type(value).__name__}")
            return value

        try:
            mode = VerifyMode(text(console, "console", "verify_mode", "require"))
        except ValueError:
            raise fail("console.verify_mode must be off, permissive or require") from None
        intent_ring = text(console, "console", "intent_keyring")
        if mode is not VerifyMode.OFF and not intent_ring:
            raise fail(f"verify_mode {mode.value} needs console.intent_keyring")
        approvals_ring = text(console, "console", "approvals_keyring")
        if not approvals_ring:
            raise fail("console.approvals_keyring is needed: every decision is signed")
        approvals = load_keyring(approvals_ring, base, fail)
        if approvals.active is None:
            raise fail("console.approvals_keyring has no active key to sign decisions with")
        inquiry_ring = text(console, "console", "inquiry_keyring")
        prefix = text(kafka, "kafka", "topic_prefix")
        try:
            topics = Topics(prefix) if prefix else None
        except ValueError as e:
            raise fail(str(e)) from None
        port = console.get("port", 8080)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port < 65536:
            raise fail("console.port must be a port number")
        secure_cookies = console.get("secure_cookies", True)
        if not isinstance(secure_cookies, bool):
            raise fail("console.secure_cookies must be true or false")
        proxies = console.get("trusted_proxies", [])
        if not isinstance(proxies, list) or not all(_ip_or_network(p) for p in proxies):
            raise fail(
                "console.trusted_proxies must be a list of IP addresses or networks "
                '(e.g. ["127.0.0.1", "10.0.0.0/8"])'
            )
        return cls(
            users=users,
            database=base / text(console, "console", "database", "console.sqlite"),
            intent_keyring=load_keyring(intent_ring, base, fail) if intent_ring else None,
            approvals_keyring=approvals,
            verify_mode=mode,
            inquiry_keyring=load_keyring(inquiry_ring, base, fail) if inquiry_ring else None,
            bootstrap_servers=text(kafka, "kafka", "bootstrap_servers"),
            topics=topics,
            host=text(console, "console", "host", "127.0.0.1"),
            port=port,
            secure_cookies=secure_cookies,
            trusted_proxies=tuple(proxies),
        )


def load_keyring(spec: str, base: Path, fail) -> Keyring:
    """A keyring file (relative to `base`), or MODULE:NAME of a callable returning one."""
    try:
        if ":" in spec and not (base / spec).exists():
            ring = load_object(spec)()
        else:
            ring = Keyring.from_file(base / spec)
    except (ValueError, KeyringError) as e:
        raise fail(f"keyring {spec!r}: {e}") from None
    if not isinstance(ring, Keyring):
        raise fail(f"keyring {spec!r} gave {with_article(type(ring).__name__)}, not a Keyring")
    return ring


def _ip_or_network(entry: object) -> bool:
    """Whether `entry` is an address or a network as uvicorn reads them: anything else (a
    host name, "*", "10.0.0.1/8") it would keep as a literal that matches no peer's address,
    or as trust in every peer."""
    try:
        if isinstance(entry, str):
            (ipaddress.ip_network if "/" in entry else ipaddress.ip_address)(entry)
            return True
    except ValueError:
        pass
    return False


def _table(document: Mapping, name: str, fail) -> Mapping:
    table = document.get(name, {})
    if not isinstance(table, Mapping):
        raise fail(f"[{name}] is not a table")
    return table
