"""`beam-agents console`: the web console as its own process on a Kafka loop.

`run(config)` opens the console's SQLite file, runs the bus (`ConsoleBus.run`: the reader of
the loop's topics, and the sender that produces every decision recorded and not yet
acknowledged, an earlier process's too) in a background thread, and serves the web
application with uvicorn until interrupted. `serving(app)` runs an application on a free port
of 127.0.0.1 in a thread, for tests and for the demo.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import sys
import threading
import time
from collections.abc import Iterator, Sequence

import uvicorn

from beam_agents.errors import BeamAgentsError
from beam_agents.ops.console.app import create_app
from beam_agents.ops.console.auth import Auth, hash_password
from beam_agents.ops.console.bus import ConsoleBus, KafkaPublisher
from beam_agents.ops.console.config import ConsoleConfig, ConsoleConfigError
from beam_agents.ops.console.db import Database
from beam_agents.ops.console.inbox import Inbox
from beam_agents.ops.console.observed import Observations

__all__ = ["build", "main", "run", "serving"]


def _client(trusted_proxies: Sequence[str]) -> dict:
    """uvicorn's settings for who the client is: the peer, unless the peer is one of
    `trusted_proxies` (config.py), whose X-Forwarded-For names it. Never uvicorn's default,
    which believes X-Forwarded-For from 127.0.0.1: anyone reaching the console through the
    loopback (a local user, an SSH tunnel) would choose the address the audit log records and
    escape the per-address sign-in limit."""
    if not trusted_proxies:
        return {"proxy_headers": False}
    return {"proxy_headers": True, "forwarded_allow_ips": list(trusted_proxies)}


def build(config: ConsoleConfig, publish) -> tuple[ConsoleBus, Auth]:
    """The console's parts over its database; `publish` produces records (KafkaPublisher)."""
    if config.topics is None:
        raise ConsoleConfigError("[kafka] topic_prefix is needed", path=str(config.database))
    db = Database(config.database)
    inbox = Inbox(
        db,
        mode=config.verify_mode,
        intent_keyring=config.intent_keyring,
        approvals_keyring=config.approvals_keyring,
        inquiry_keyring=config.inquiry_keyring,
    )
    bus = ConsoleBus(inbox, Observations(db), config.topics, publish)
    return bus, Auth(db, config.users)


@contextlib.contextmanager
def serving(
    app, host: str = "127.0.0.1", port: int = 0, *, trusted_proxies: Sequence[str] = ()
) -> Iterator[str]:
    """Serves `app` in a thread; yields its base URL and stops it on exit."""
    client = _client(trusted_proxies)
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off", **client)
    )
    thread = threading.Thread(target=server.run, name="console-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the console did not start on {host}:{port}")
        time.sleep(0.02)
    bound = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(30)


def run(config: ConsoleConfig, *, group_id: str | None = None) -> None:
    """Serves the console until interrupted (module docstring)."""
    bus, auth = build(config, KafkaPublisher(config.bootstrap_servers))
    bus.connect(config.bootstrap_servers, group_id or f"{config.topics.prefix}.console")
    stop = threading.Event()
    reader = threading.Thread(target=bus.run, args=(stop,), name="console-bus", daemon=True)
    reader.start()
    try:
        uvicorn.run(
            create_app(bus, auth, secure_cookies=config.secure_cookies),
            host=config.host,
            port=config.port,
            log_level="info",
            **_client(config.trusted_proxies),
        )
    finally:
        stop.set()
        reader.join(30)


def main(argv: Sequence[str] | None = None) -> int:
    """`beam-agents console --bus=kafka --config FILE`, or `beam-agents console
    hash-password` (reads a password, prints its argon2id hash for the config file)."""
    parser = argparse.ArgumentParser(
        prog="beam-agents console",
        description="Serves the approvals inbox and agent viewer of a Kafka agent loop in the "
        "browser (the beam-agents[console] extra). Exit codes: 0 stopped; 2 a configuration "
        "error, named.",
    )
    parser.add_argument(
        "action",
        nargs="?",
        choices=["serve", "hash-password"],
        default="serve",
        help="serve (default): run the console on the loop --config describes; "
        "hash-password: read a password from standard input and print its argon2id hash, "
        "for a user's entry in the config file",
    )
    parser.add_argument(
        "--bus", choices=["kafka"], default="kafka", help="the loop's bus (only kafka)"
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="serve: the console's TOML file (the loop's topics, its keys and its users)",
    )
    args = parser.parse_args(argv)
    if args.action == "hash-password":
        password = getpass.getpass("password: ") if sys.stdin.isatty() else sys.stdin.readline()
        print(hash_password(password.rstrip("\n")))
        return 0
    if not args.config:
        parser.error("--config FILE is needed")
    try:
        config = ConsoleConfig.from_file(args.config)
        run(config)
    except BeamAgentsError as e:
        print(f"beam-agents console: {e}", file=sys.stderr)
        return 2
    return 0
