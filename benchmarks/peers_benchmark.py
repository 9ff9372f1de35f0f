"""Side by side with the peers: the same three-step agent on beam_agents, LangGraph and DBOS.

The agent (issue 41, point 6): a scripted model answer of about 1 KiB, kept in the agent's
state; one tool call, whose side effect is a row in a SQLite ledger (so runs can be counted);
one human approval, answered at once; then it completes. Each system runs it as its users
would on one machine with SQLite:

- ``beam_agents``: RunAgent's logic driven directly (`run_agent._read`, `KeyMachine`,
  `run_agent._write`, as benchmarks/driver_benchmark.py drives it), with each activation's state
  reads and writes committed to a SQLite file (`SqliteKeyedState`, WAL, fsync on commit: a
  stand-in for a runner's durable state backend), the tool run by the SQLite `Effector` (its own
  file) and the approval answered by an Approval envelope, as the approvals inbox sends it.
- ``langgraph``: a StateGraph of three nodes with `SqliteSaver` (langgraph-checkpoint-sqlite),
  the approval an `interrupt` resumed by `Command(resume=...)`, durability "sync" (each step's
  checkpoint written before the next runs) and "async" (written beside the next step).
- ``dbos``: a DBOS workflow on its SQLite system database, the model and the tool as steps, the
  approval `DBOS.recv` answered by `DBOS.send` (the workflow says it waits with `set_event`).
- ``restate``: only when a `restate-server` binary is on PATH or in node_modules/.bin; it is
  not driven yet, so it prints why it is skipped either way.

Every system runs in its own child process (one process tree), so its CPU is its own (getrusage
of the child, every thread counted) and no system's background threads run beside another's
measured round. Rounds are interleaved: round after round, each child runs the same number of
keys in turn, and every ratio is taken within a round and reported as the median of rounds, so
a shared machine's drift hits all systems alike. Printed per system:

- per-key latency: a key's whole life, event to completion, the person answering at once
  (median over keys);
- CPU per key (user + system time of the child over a round, divided by its keys);
- the approval round trip: from the person's answer to the completion (median);
- durable bytes per key after completion: the pages in use in the system's SQLite files
  ((page_count - freelist_count) * page_size, after a WAL checkpoint) beyond an empty store,
  divided by the keys it completed; beam_agents counts its state file and its effector's
  execution records (kept for the effector's retention, 24 h by default), and says each;
- a kill check: a child killed with SIGKILL right after the tool's side effect is committed,
  then a new process resumes the key; the ledger counts the tool's runs. beam_agents' effector
  claimed the call before running it, so the resumed effector finds a lost call and settles it
  with the tool's reconciler (`ToolSpec.reconcile`, which reads the ledger by intent_id) instead
  of running it again; the peers run a step again that did not record its output.

Goals (issue 41): beam_agents with the durable backend at least 3x faster per key than the
fastest peer, and its durable bytes per key at most 1x the fewest among the peers.

    python benchmarks/peers_benchmark.py [--keys N] [--rounds R]

The peers are an optional extra (`pip install 'beam-agents[peers]'`), never a runtime
dependency.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import multiprocessing
import os
import pathlib
import resource
import shutil
import signal
import sqlite3
import statistics
import struct
import tempfile
import time

from apache_beam.coders.coders import DeterministicProtoCoder, VarIntCoder

from beam_agents._protos import (
    AgentEnvelope,
    Continuation,
    LlmCacheBlob,
    MemoryBlob,
    ToolIntent,
)
from beam_agents.intents.effector import Effector, Route, ToolSpec, VerifyMode, wall_clock_ms
from beam_agents.intents.identity import content_digest
from beam_agents.runtime import RuntimeConfig, ScriptedLlmClient, agent
from beam_agents.runtime.machine import KeyMachine
from beam_agents.runtime.run_agent import _read, _write
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION
from beam_agents.wire.fields import join_delimited, split_delimited

__all__ = ["PEERS", "SqliteKeyedState", "kill_check", "main", "peers_installed", "run"]

#: The model's answer: about 1 KiB of text, the same for every key and system.
MODEL_ANSWER = " ".join(f"word{i:03d}" for i in range(128))[:1024]
SPEED_GOAL = 3.0
BYTES_GOAL = 1.0
#: The peers' packages (the `peers` extra); a system whose package is missing is skipped.
PEERS = {
    "langgraph-sync": "langgraph.checkpoint.sqlite",
    "langgraph-async": "langgraph.checkpoint.sqlite",
    "dbos": "dbos",
}
#: beam_agents' effector lease in the kill check: how long a killed effector's claim holds.
_LEASE_MS = 300


def peers_installed() -> list[str]:
    """The peers whose packages are installed."""
    return [name for name, module in PEERS.items() if _importable(module)]


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


# The ledger: the tool's side effect, counted -----------------------------------------------------


class Ledger:
    """A SQLite file of the tool's runs: one row per run, committed before the tool returns."""

    def __init__(self, path: pathlib.Path) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS runs (key TEXT, call TEXT)")

    def book(self, key: str, call: str, *, die: bool) -> str:
        self._db.execute("INSERT INTO runs VALUES (?, ?)", (key, call))
        if die:
            # Right after the side effect, before the system can record that the step ran.
            os.kill(os.getpid(), signal.SIGKILL)
        return f"booked {key}"

    def booked(self, call: str) -> bool:
        return self._db.execute("SELECT 1 FROM runs WHERE call = ?", (call,)).fetchone() is not None

    def runs(self, key: str) -> int:
        return self._db.execute("SELECT COUNT(*) FROM runs WHERE key = ?", (key,)).fetchone()[0]


def _used_bytes(path: pathlib.Path) -> int:
    """The bytes of the pages in use in the SQLite file at `path`, after a WAL checkpoint."""
    if not path.exists():
        return 0
    db = sqlite3.connect(path)
    try:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        free = db.execute("PRAGMA freelist_count").fetchone()[0]
        return (pages - free) * db.execute("PRAGMA page_size").fetchone()[0]
    finally:
        db.close()


# beam_agents with a durable local state backend --------------------------------------------------

_CODERS = {
    "seq": VarIntCoder(),
    "memory": DeterministicProtoCoder(MemoryBlob),
    "llm_cache": DeterministicProtoCoder(LlmCacheBlob),
    "continuation": DeterministicProtoCoder(Continuation),
}
_CELLS = ("seq", "memory", "llm_cache", "continuation")


class _Cell:
    """One state cell of a key in an activation: the value read (decoded from the row), and
    what the activation wrote, encoded by the cell's state coder as a runner encodes at commit."""

    def __init__(self, name: str, data: bytes | None, writes: dict) -> None:
        self.name = name
        self.value = None if data is None else _CODERS[name].decode(data)
        self._writes = writes

    def read(self):
        return self.value

    def write(self, value) -> None:
        self.value = value
        self._writes[self.name] = _CODERS[self.name].encode(value)

    def clear(self) -> None:
        self.value = None
        self._writes[self.name] = None


class _Bag:
    """The pending intents: one row of length-delimited ToolIntents."""

    def __init__(self, data: bytes | None, writes: dict) -> None:
        self.value = [ToolIntent.FromString(b) for b in split_delimited(data or b"")]
        self._writes = writes

    def read(self):
        return self.value

    def add(self, value) -> None:
        self.value = [*self.value, value]
        self._writes["pending"] = join_delimited(self.value)

    def clear(self) -> None:
        self.value = []
        self._writes["pending"] = None


class _Timer:
    def __init__(self, name: str, writes: dict) -> None:
        self._name, self._writes = name, writes

    def set(self, timestamp) -> None:
        self._writes[self._name] = struct.pack(">q", timestamp.micros)

    def clear(self) -> None:
        self._writes[self._name] = None


class SqliteKeyedState:
    """A durable keyed-state backend in one SQLite file (WAL, fsync on every commit): each
    activation reads its key's cells, and commits the cells and timers it changed in one
    transaction before its outputs leave, as a runner commits a bundle's state with its outputs.
    A stand-in for a runner's state backend, to measure RunAgent's logic on durable state."""

    def __init__(self, path: pathlib.Path) -> None:
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute(
            # A rowid table: a WITHOUT ROWID row over about 1 KB spills into an overflow page
            # of its own (4 KiB for a memory of 1.1 KB).
            "CREATE TABLE IF NOT EXISTS state (key BLOB, cell TEXT, value BLOB, "
            "PRIMARY KEY (key, cell))"
        )

    def activate(self, machine: KeyMachine, key: bytes, envelope: AgentEnvelope):
        """Runs one input of `key` through `machine` and commits what it wrote; its effects."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            rows = dict(db.execute("SELECT cell, value FROM state WHERE key = ?", (key,)))
            writes: dict[str, bytes | None] = {}
            states = (
                *(_Cell(name, rows.get(name), writes) for name in _CELLS),
                _Bag(rows.get("pending"), writes),
            )
            stored = _read(states)
            effects = machine.on_envelope(key, stored, envelope)
            if effects.state is not None:
                _write(effects, stored, states, (_Timer("deadline", writes), _Timer("ttl", writes)))
            for cell, value in writes.items():
                if value is None:
                    db.execute("DELETE FROM state WHERE key = ? AND cell = ?", (key, cell))
                else:
                    db.execute("REPLACE INTO state VALUES (?, ?, ?)", (key, cell, value))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return effects

    def pending(self, key: bytes) -> list[ToolIntent]:
        """The intents the key's suspension waits on (what a bus delivers again after a crash)."""
        row = self._db.execute(
            "SELECT value FROM state WHERE key = ? AND cell = 'pending'", (key,)
        ).fetchone()
        return [] if row is None else [ToolIntent.FromString(b) for b in split_delimited(row[0])]

    def close(self) -> None:
        self._db.close()


@agent(name="benchmarks.three_steps/v1")
def three_steps(ctx, event: bytes) -> bytes:
    draft = ctx.llm([{"role": "user", "content": event.decode()}], model="m").text
    ctx.memory.put("draft", draft.encode())
    booked = ctx.call_tool("ledger.book", {"key": event.decode()})
    decided = ctx.request_approval("send the draft?", booked=booked.payload.decode())
    return b"sent" if decided.ok else b"held"


class BeamAgents:
    """The agent on RunAgent's logic with `SqliteKeyedState` and the SQLite effector."""

    name = "beam_agents"

    def __init__(self, folder: pathlib.Path, *, die_after_tool: bool = False) -> None:
        self.folder = folder
        self.ledger = Ledger(folder / "ledger.sqlite")
        self.state = SqliteKeyedState(folder / "state.sqlite")
        self._die = die_after_tool
        spec = ToolSpec(self._book, reconcile=self._reconcile)
        self.effector = Effector(
            {"ledger.book": spec},
            mode=VerifyMode.OFF,
            store=folder / "effector.sqlite",
            lease_ms=_LEASE_MS,
        )
        self.machine = KeyMachine(
            three_steps,
            llm_client=ScriptedLlmClient(lambda request: MODEL_ANSWER),
            keyring=None,
            result_keyring=None,
            approval_keyring=None,
            config=RuntimeConfig(),
            registry=None,
            current_version=CURRENT_STATE_SCHEMA_VERSION,
        )
        self._at = 0

    def stores(self) -> list[pathlib.Path]:
        return [self.folder / "state.sqlite", self.folder / "effector.sqlite"]

    def _book(self, args: dict, intent: ToolIntent) -> bytes:
        return self.ledger.book(args["key"], intent.intent_id, die=self._die).encode()

    def _reconcile(self, intent: ToolIntent) -> bytes | None:
        return (
            f"booked {intent.entity_key.decode()}".encode()
            if self.ledger.booked(intent.intent_id)
            else None
        )

    def _now(self) -> int:
        # The effector checks expiry on the wall clock: the key's times follow it, each later.
        self._at = max(self._at + 1, wall_clock_ms())
        return self._at

    def _send(self, key: bytes, envelope: AgentEnvelope) -> list:
        envelope.entity_key, envelope.event_time_ms = key, self._now()
        effects = self.state.activate(self.machine, key, envelope)
        return effects.outputs

    def _deliver(self, key: bytes, outputs: list) -> tuple[ToolIntent | None, bytes | None]:
        """Hands the intents in `outputs` to the effector and their results to the key, until
        the key asks a person or completes: the approval asked, or the completion."""
        while True:
            completions = [value for tag, (_, value) in outputs if tag == "completions"]
            if completions:
                return None, completions[0]
            intents = [value for tag, (_, value) in outputs if tag == "intents"]
            if not intents:
                raise RuntimeError(f"the key stopped with neither intent nor completion: {outputs}")
            (intent,) = intents
            decided = self.effector(intent)
            if decided.route == Route.APPROVAL:
                return decided.approval, None
            if decided.route not in (Route.RESULT, Route.DUPLICATE):
                raise RuntimeError(f"the effector answered {decided.route}")
            outputs = self._send(key, decided.result)

    def _approve(self, key: bytes, asked: ToolIntent) -> bytes:
        approval = AgentEnvelope()
        approval.approval.intent_id = asked.intent_id
        approval.approval.approved = True
        approval.approval.approver = "benchmark"
        approval.approval.decided_at_ms = self._at
        approval.approval.intent_digest = content_digest(
            asked.SerializeToString(deterministic=True)
        )
        _, completion = self._deliver(key, self._send(key, approval))
        return completion

    def run_key(self, key: str) -> tuple[float, float]:
        start = time.perf_counter()
        event = AgentEnvelope(external_event=key.encode())
        asked, _ = self._deliver(key.encode(), self._send(key.encode(), event))
        answered = time.perf_counter()
        completion = self._approve(key.encode(), asked)
        end = time.perf_counter()
        assert completion == b"sent", completion
        return end - start, end - answered

    def resume(self, key: str) -> bytes:
        """After a crash: the bus delivers the suspension's intents again, to an effector that
        finds the killed one's claim once its lease has run out."""
        time.sleep(2 * _LEASE_MS / 1000)
        (intent,) = self.state.pending(key.encode())
        asked, _ = self._deliver(key.encode(), [("intents", (key.encode(), intent))])
        return self._approve(key.encode(), asked)

    def close(self) -> None:
        self.state.close()
        self.effector.store.close()


# LangGraph with SqliteSaver -----------------------------------------------------------------------


class LangGraph:
    """The agent as a three-node StateGraph checkpointed by SqliteSaver."""

    def __init__(self, folder: pathlib.Path, *, durability: str, die_after_tool: bool = False):
        from typing import TypedDict

        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
        from langgraph.types import interrupt

        self.name = f"langgraph-{durability}"
        self.folder = folder
        self.ledger = Ledger(folder / "ledger.sqlite")
        self._durability = durability
        self._db = sqlite3.connect(folder / "checkpoints.sqlite", check_same_thread=False)
        saver = SqliteSaver(self._db)

        class State(TypedDict, total=False):
            key: str
            draft: str
            booked: str
            decision: bool

        def draft(state: State) -> State:
            return {"draft": MODEL_ANSWER}

        def book(state: State) -> State:
            key = state["key"]
            return {"booked": self.ledger.book(key, f"{key}:book", die=die_after_tool)}

        def approve(state: State) -> State:
            return {"decision": bool(interrupt({"question": "send the draft?"}))}

        graph = StateGraph(State)
        graph.add_node("draft", draft)
        graph.add_node("book", book)
        graph.add_node("approve", approve)
        graph.add_edge(START, "draft")
        graph.add_edge("draft", "book")
        graph.add_edge("book", "approve")
        graph.add_edge("approve", END)
        self.graph = graph.compile(checkpointer=saver)

    def stores(self) -> list[pathlib.Path]:
        return [self.folder / "checkpoints.sqlite"]

    def _approve(self, config) -> bool:
        from langgraph.types import Command

        return self.graph.invoke(Command(resume=True), config, durability=self._durability)[
            "decision"
        ]

    def run_key(self, key: str) -> tuple[float, float]:
        config = {"configurable": {"thread_id": key}}
        start = time.perf_counter()
        self.graph.invoke({"key": key}, config, durability=self._durability)
        answered = time.perf_counter()
        decision = self._approve(config)
        end = time.perf_counter()
        assert decision is True
        return end - start, end - answered

    def resume(self, key: str) -> bytes:
        config = {"configurable": {"thread_id": key}}
        self.graph.invoke(None, config, durability=self._durability)
        return b"sent" if self._approve(config) else b"held"

    def close(self) -> None:
        self._db.close()


# DBOS on SQLite ----------------------------------------------------------------------------------

_DBOS_WORKFLOWS: dict = {}
#: DBOS's polling interval for waits (its minimum; the default is 1 s).
_DBOS_POLL_S = 0.001


def _dbos_workflow(ledger_of, die_of):
    """The agent as a DBOS workflow (registered once per process, before launch)."""
    if _DBOS_WORKFLOWS:
        return _DBOS_WORKFLOWS["three_steps"]
    from dbos import DBOS

    @DBOS.step()
    def draft(key: str) -> str:
        return MODEL_ANSWER

    @DBOS.step()
    def book(key: str) -> str:
        return ledger_of().book(key, f"{key}:book", die=die_of())

    @DBOS.workflow()
    def dbos_three_steps(key: str) -> str:
        draft(key)
        booked = book(key)
        DBOS.set_event("asked", booked)
        return "sent" if DBOS.recv("approval", timeout_seconds=60) else "held"

    _DBOS_WORKFLOWS["three_steps"] = dbos_three_steps
    return dbos_three_steps


class Dbos:
    """The agent as a DBOS workflow on a SQLite system database."""

    name = "dbos"

    def __init__(self, folder: pathlib.Path, *, die_after_tool: bool = False) -> None:
        from dbos import DBOS

        self.folder = folder
        self.ledger = Ledger(folder / "ledger.sqlite")
        self._die = die_after_tool
        self._workflow = _dbos_workflow(lambda: self.ledger, lambda: self._die)
        DBOS(
            config={
                "name": "peers-benchmark",
                "system_database_url": f"sqlite:///{folder / 'dbos.sqlite'}",
                "log_level": "ERROR",
                "run_admin_server": False,
                # On SQLite a waiting recv or get_event learns of a message by polling, every
                # second by default: the fastest setting DBOS allows, its CPU counted.
                "notification_listener_polling_interval_sec": _DBOS_POLL_S,
            }
        )
        DBOS.launch()

    def stores(self) -> list[pathlib.Path]:
        return [self.folder / "dbos.sqlite"]

    def _approve(self, key: str, handle=None) -> str:
        from dbos import DBOS

        DBOS.send(key, True, topic="approval")
        # A handle of this process's own workflow is its future; one of a recovered workflow
        # polls the database, every second by default.
        handle = handle or DBOS.retrieve_workflow(key)
        return handle.get_result(polling_interval_sec=_DBOS_POLL_S)

    def run_key(self, key: str) -> tuple[float, float]:
        from dbos import DBOS, SetWorkflowID

        start = time.perf_counter()
        with SetWorkflowID(key):
            handle = DBOS.start_workflow(self._workflow, key)
        DBOS.get_event(key, "asked", timeout_seconds=60)
        answered = time.perf_counter()
        result = self._approve(key, handle)
        end = time.perf_counter()
        assert result == "sent", result
        return end - start, end - answered

    def resume(self, key: str) -> bytes:
        from dbos import DBOS

        # DBOS.launch recovers the killed process's pending workflow: it waits on its approval.
        DBOS.get_event(key, "asked", timeout_seconds=60)
        return self._approve(key).encode()

    def close(self) -> None:
        from dbos import DBOS

        DBOS.destroy()


def _system(name: str, folder: pathlib.Path, **options):
    folder.mkdir(parents=True, exist_ok=True)
    if name == "beam_agents":
        return BeamAgents(folder, **options)
    if name.startswith("langgraph-"):
        return LangGraph(folder, durability=name.removeprefix("langgraph-"), **options)
    if name == "dbos":
        return Dbos(folder, **options)
    raise ValueError(f"unknown system {name!r}")


# One child process per system --------------------------------------------------------------------


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _worker(name: str, folder: str, conn) -> None:
    """Runs rounds of keys for `conn`'s requests: ("round", keys) answers the per-key
    latencies and approval round trips and the round's CPU; ("bytes",) the used bytes of each
    store; ("stop",) ends."""
    system = _system(name, pathlib.Path(folder))
    conn.send([_used_bytes(p) for p in system.stores()])
    while True:
        request = conn.recv()
        if request[0] == "round":
            cpu = _cpu()
            timings = [system.run_key(key) for key in request[1]]
            conn.send((timings, _cpu() - cpu))
        elif request[0] == "bytes":
            conn.send([_used_bytes(p) for p in system.stores()])
        else:
            system.close()
            conn.send("stopped")
            return


def _kill_child(name: str, folder: str, key: str) -> None:
    _system(name, pathlib.Path(folder), die_after_tool=True).run_key(key)


def _resume_child(name: str, folder: str, key: str, conn) -> None:
    system = _system(name, pathlib.Path(folder))
    conn.send(system.resume(key))
    system.close()


def kill_check(name: str, folder: pathlib.Path, context=None) -> tuple[int, bytes | str]:
    """A child killed (SIGKILL) right after the tool's side effect, then a new child that
    resumes the key: the tool's runs the ledger counts, and the key's outcome."""
    context = context or multiprocessing.get_context("spawn")
    key = "killed-key"
    child = context.Process(target=_kill_child, args=(name, str(folder), key))
    child.start()
    child.join(120)
    if child.exitcode != -signal.SIGKILL:
        return Ledger(folder / "ledger.sqlite").runs(key), f"the child exited {child.exitcode}"
    parent, conn = context.Pipe()
    resumer = context.Process(target=_resume_child, args=(name, str(folder), key, conn))
    resumer.start()
    outcome = parent.recv() if parent.poll(120) else "no outcome in 120 s"
    resumer.join(30)
    return Ledger(folder / "ledger.sqlite").runs(key), outcome


def run(systems: list[str], keys: int, rounds: int, folder: pathlib.Path) -> dict:
    """Interleaved rounds of `keys` keys on every system, each in its own child: per system,
    the per-key latencies, approval round trips, per-round CPU per key and durable bytes per
    key (per store)."""
    context = multiprocessing.get_context("spawn")
    children = {}
    for name in systems:
        parent, conn = context.Pipe()
        process = context.Process(target=_worker, args=(name, str(folder / name), conn))
        process.start()
        children[name] = (process, parent, parent.recv())
    figures = {name: {"latency": [], "approval": [], "cpu": [], "round": []} for name in systems}
    try:
        for r in range(rounds):
            # A different first system each round, so none is always measured first.
            order = systems[r % len(systems) :] + systems[: r % len(systems)]
            for name in order:
                _, parent, _ = children[name]
                parent.send(("round", [f"r{r}-k{i}" for i in range(keys)]))
                timings, cpu = parent.recv()
                figures[name]["latency"] += [t for t, _ in timings]
                figures[name]["approval"] += [a for _, a in timings]
                figures[name]["round"].append(statistics.median(t for t, _ in timings))
                figures[name]["cpu"].append(cpu / keys)
        for name, (_, parent, empty) in children.items():
            parent.send(("bytes",))
            used = parent.recv()
            completed = keys * rounds
            figures[name]["bytes"] = [(u - e) / completed for u, e in zip(used, empty, strict=True)]
    finally:
        for process, parent, _ in children.values():
            with contextlib.suppress(OSError, EOFError):
                parent.send(("stop",))
                parent.recv()
            process.join(30)
    return figures


def _restate_server() -> str | None:
    local = pathlib.Path(__file__).resolve().parent.parent / "node_modules" / ".bin"
    return shutil.which("restate-server") or shutil.which("restate-server", path=str(local))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=50, help="keys per system per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--folder",
        type=pathlib.Path,
        default=None,
        help="where the SQLite files go (default: a temporary folder; /dev/shm takes fsync out)",
    )
    args = parser.parse_args(argv)
    peers = peers_installed()
    systems = ["beam_agents", *peers]
    for name in PEERS:
        if name not in peers:
            print(f"{name}: skipped, its package is not installed (pip install beam-agents[peers])")
    if _restate_server() is None:
        print("restate: skipped, server not installed")
    else:
        print("restate: skipped, a server is installed but this benchmark does not drive it yet")
    with tempfile.TemporaryDirectory(prefix="peers-benchmark-", dir=args.folder) as tmp:
        folder = pathlib.Path(tmp)
        figures = run(systems, args.keys, args.rounds, folder / "rounds")
        kills = {name: kill_check(name, folder / "kill" / name) for name in systems}
    _report(figures, kills, args.keys, args.rounds)
    return {"figures": figures, "kills": kills}


def _report(figures: dict, kills: dict, keys: int, rounds: int) -> None:
    ours = figures["beam_agents"]
    print(
        f"the same three-step agent, {keys} keys a round, {rounds} interleaved rounds, one child "
        "process per system; medians; ratios to beam_agents taken within each round"
    )
    print(
        f"{'':16} {'ms/key':>8} {'x ours':>7} {'CPU ms/key':>11} {'approval ms':>12} "
        f"{'x ours':>7} {'bytes/key':>10}  tool runs after a kill"
    )
    approval = statistics.median(ours["approval"])
    for name, f in figures.items():
        ratio = statistics.median(t / o for t, o in zip(f["round"], ours["round"], strict=True))
        runs, outcome = kills[name]
        print(
            f"  {name:14} {statistics.median(f['latency']) * 1e3:8.2f} {ratio:7.2f} "
            f"{statistics.median(f['cpu']) * 1e3:11.2f} "
            f"{statistics.median(f['approval']) * 1e3:12.2f} "
            f"{statistics.median(f['approval']) / approval:7.2f} {sum(f['bytes']):10.0f}  "
            f"{runs} (then {outcome!r})"
        )
    state, effector = ours["bytes"]
    print(f"  beam_agents' bytes/key: state {state:.0f}, effector records {effector:.0f}")
    peers = [n for n in figures if n != "beam_agents"]
    if not peers:
        print("goals: no peer installed, nothing to compare")
        return
    fastest = min(peers, key=lambda n: statistics.median(figures[n]["round"]))
    pairs = zip(figures[fastest]["round"], ours["round"], strict=True)
    speedup = statistics.median(p / o for p, o in pairs)
    verdict = "meets" if speedup >= SPEED_GOAL else "BELOW"
    print(
        f"goal: at least {SPEED_GOAL:.0f}x faster per key than the fastest peer ({fastest}): "
        f"{speedup:.2f}x, {verdict}"
    )
    fewest = min(peers, key=lambda n: sum(figures[n]["bytes"]))
    share = sum(ours["bytes"]) / sum(figures[fewest]["bytes"])
    verdict = "meets" if share <= BYTES_GOAL else "ABOVE"
    print(
        f"goal: durable bytes per key at most {BYTES_GOAL:.0f}x the fewest among the peers "
        f"({fewest}): {share:.2f}x, {verdict} (state alone: "
        f"{state / sum(figures[fewest]['bytes']):.2f}x)"
    )


if __name__ == "__main__":
    main()
