"""The state backend of a portable SDK harness, as the deterministic simulation
(`simulation`) models it, and RunAgent's DoFn driven over it.

Beam's portable harness (Prism, Flink, Dataflow Runner v2) caches state objects: a read hands
back the very object the last write stored, never a copy, so an object changed in place after a
read is state changed, committed or not. `Bundle` does the same over a key's committed state
(`Durable`, kept as bytes too so a worker restart can drop the objects and decode again),
records every message a read hands out with its bytes then, and commits its writes and timers
only when the bundle succeeds. `run` feeds one input to RunAgent's own DoFn (`_AgentDoFn`:
`process` or a timer callback, through `_read` and `write`) with these as its state cells.
"""

from __future__ import annotations

from apache_beam.utils.timestamp import Timestamp

from beam_agents._protos import Continuation, LlmCacheBlob, MemoryBlob, ToolIntent
from beam_agents.runtime import run_agent

__all__ = ["Bundle", "Cell", "Counters", "Durable", "Timer", "message_bytes", "run"]

_BLOBS = {"memory": MemoryBlob, "cache": LlmCacheBlob, "continuation": Continuation}


def message_bytes(message) -> bytes:
    return message.SerializeToString(deterministic=True)


class Durable:
    """One key's committed state as a runner keeps it: bytes, plus a worker's cache of the very
    objects last written (or last decoded)."""

    def __init__(self) -> None:
        self.seq: int | None = None
        self.blobs: dict[str, bytes] = {}
        self.pending: list[bytes] = []
        self.timers: dict[str, int | None] = {"deadline": None, "ttl": None}
        self.cache: dict[str, object] = {}


class Bundle:
    """A bundle's view of one key's state: its own writes over the committed state."""

    def __init__(self, durable: Durable) -> None:
        self.durable = durable
        self.writes: dict[str, object] = {}
        self.timers: dict[str, int | None] = {}
        #: Every message a read handed out, with its bytes then: none may change.
        self.handed: list[tuple[object, bytes]] = []

    def read(self, name: str):
        durable = self.durable
        if name in self.writes:
            value = self.writes[name]
        elif name == "seq":
            return durable.seq
        elif name in durable.cache:
            value = durable.cache[name]
        else:
            if name == "pending":
                value = [ToolIntent.FromString(b) for b in durable.pending]
            else:
                data = durable.blobs.get(name)
                value = None if data is None else _BLOBS[name].FromString(data)
            durable.cache[name] = value
        for message in value if name == "pending" else [value]:
            if message is not None and not isinstance(message, int):
                self.handed.append((message, message_bytes(message)))
        return list(value) if name == "pending" else value

    def view(self) -> tuple:
        """The state a read would see, as bytes: (seq, memory, cache, continuation, pending)."""
        durable, writes = self.durable, self.writes
        values = [writes.get("seq", durable.seq)]
        for name in ("memory", "cache", "continuation"):
            if name not in writes:
                values.append(durable.blobs.get(name))
            else:
                values.append(None if writes[name] is None else message_bytes(writes[name]))
        if "pending" in writes:
            values.append(tuple(message_bytes(i) for i in writes["pending"]))
        else:
            values.append(tuple(durable.pending))
        return tuple(values)

    def commit(self) -> None:
        durable = self.durable
        for name, value in self.writes.items():
            if name == "seq":
                durable.seq = value
                continue
            durable.cache[name] = value
            if name == "pending":
                durable.pending = [message_bytes(i) for i in value]
            elif value is None:
                durable.blobs.pop(name, None)
            else:
                durable.blobs[name] = message_bytes(value)
        durable.timers.update(self.timers)


class Cell:
    def __init__(self, bundle: Bundle, name: str) -> None:
        self._bundle, self._name = bundle, name

    def read(self):
        return self._bundle.read(self._name)

    def write(self, value) -> None:
        self._bundle.writes[self._name] = value

    def clear(self) -> None:
        self._bundle.writes[self._name] = [] if self._name == "pending" else None

    def add(self, value) -> None:
        if "pending" not in self._bundle.writes:
            self._bundle.writes["pending"] = self.read()
        self._bundle.writes["pending"].append(value)


class Timer:
    def __init__(self, bundle: Bundle, name: str) -> None:
        self._bundle, self._name = bundle, name

    def set(self, timestamp: Timestamp) -> None:
        self._bundle.timers[self._name] = timestamp.micros // 1000

    def clear(self) -> None:
        self._bundle.timers[self._name] = None


class Counters(dict):
    """Stands in for the DoFn's Beam counters: the names counted by the current input."""

    def __init__(self) -> None:
        super().__init__()
        self.counted: list[str] = []

    def __missing__(self, name: str):
        counted = self.counted
        return type("Counter", (), {"inc": staticmethod(lambda: counted.append(name))})()


def run(dofn, key: bytes, bundle: Bundle, item, now: int) -> list:
    """One input of a bundle through RunAgent's DoFn at time `now`: an envelope or a snapshot
    ("E" or "S", its bytes, an idempotency key), a timer firing ("T", family, time) or a stale
    one ("G", family, time). Its outputs as (tag, value)."""
    params = {name: Cell(bundle, name) for name in ("seq", "memory", "continuation", "pending")}
    params["cache"] = Cell(bundle, "cache")
    params.update(deadline=Timer(bundle, "deadline"), ttl=Timer(bundle, "ttl"))
    if item[0] in ("E", "S"):
        _, data, idempotency = item
        tag = run_agent._ENVELOPE if item[0] == "E" else run_agent._SNAPSHOT
        element = (data, idempotency) if idempotency else data
        stamp = Timestamp(micros=now * 1000)
        (keyed,) = run_agent._KeyAndTag(tag).process(element, timestamp=stamp)
        outputs = dofn.process(keyed, timestamp=stamp, **params)
    else:
        family, fired = item[1], item[2]
        if item[0] == "T":
            bundle.timers[family] = None  # a timer that fires is consumed
        callback = dofn.at_deadline if family == "deadline" else dofn.at_ttl
        outputs = callback(key=key, fired=Timestamp(micros=fired * 1000), **params)
    return [
        (value.tag, value.value) if hasattr(value, "tag") else (run_agent.COMPLETIONS, value)
        for value in outputs
    ]
