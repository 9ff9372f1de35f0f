"""The effector's terms: what a caller gives it and what it gives back.

In: tools (a callable, or a `ToolSpec` saying what to do when a call's outcome is unknown), a
`VerifyMode` for intents' signatures and a retention. Out: an `EffectorOutput` with its `Route`;
`ExecuteIntents` tags its outputs RESULTS, APPROVALS and DEAD_LETTERS, and a refused intent's
dead letter names one of the REASON_* reasons. Shared by `gate` and `transform`.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable

from beam_agents._protos import ActivationErrorRecord, AgentEnvelope, ToolIntent
from beam_agents.intents.signing import Verification

__all__ = [
    "APPROVALS",
    "DEAD_LETTERS",
    "DEFAULT_LEASE_MS",
    "DEFAULT_MAX_RESULT_BYTES",
    "DEFAULT_RETENTION_MS",
    "INQUIRY_SUFFIX",
    "INQUIRY_TOOL",
    "REASON_CONFLICT",
    "REASON_UNDECODABLE",
    "RESULTS",
    "EffectorOutput",
    "Route",
    "Tool",
    "ToolSpec",
    "VerifyMode",
    "check_lease_ms",
    "check_max_result_bytes",
    "check_retention",
    "wall_clock_ms",
]

#: A tool: called with the parsed args_json object and the intent; returns the result payload.
#: The intent's intent_id is the call's idempotency key: pass it to the system the tool calls.
Tool = Callable[[dict, ToolIntent], bytes | str]

#: The tool name and intent_id suffix of the APPROVAL intent that asks a person whether a call
#: whose outcome is unknown took effect (the id is the original intent's id + the suffix).
INQUIRY_TOOL = "beam_agents.outcome_unknown"
INQUIRY_SUFFIX = "#outcome"


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """A tool with what the effector may do when a call's outcome is unknown (its effector
    died mid-call). A plain callable is `ToolSpec(fn)`.

    * `idempotent`: the tool is run again with the same intent (so the same intent_id as its
      idempotency key); the system it calls makes the second call a no-op.
    * `reconcile(intent)`: asks the system whether the call took effect: the payload (bytes or
      str) when it did, which becomes the OK result, or None when it did not, and the tool is
      run. An exception from it leaves the outcome unknown.
    * neither, or a reconciler that fails: the outcome goes to a person as an APPROVAL intent
      (`INQUIRY_TOOL`) asking whether it took effect; the agent hears nothing until they
      answer (`Effector.resolve`). An agent is never told a call failed that may have acted.
    """

    fn: Tool
    idempotent: bool = False
    reconcile: Callable[[ToolIntent], bytes | str | None] | None = None

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"a tool must be callable, not {type(self.fn).__name__}")
        if self.idempotent and self.reconcile is not None:
            raise ValueError("an idempotent tool needs no reconciler: give one or the other")
        if self.reconcile is not None and not callable(self.reconcile):
            raise TypeError("reconcile must be callable")


RESULTS = "results"
APPROVALS = "approvals"
DEAD_LETTERS = "dead_letters"

#: Dead-letter reasons (besides "signature_<outcome>", one per refused Verification).
REASON_UNDECODABLE = "undecodable_intent"
REASON_CONFLICT = "intent_id_conflict"

DEFAULT_RETENTION_MS = 24 * 60 * 60 * 1000
#: How long an effector's claim on a call stays its own unless renewed (`leases`): a call whose
#: effector died is answered (its ToolSpec, or a person) this long after it last renewed.
DEFAULT_LEASE_MS = 30_000
#: The shortest lease: one is renewed every third of it, each renewal a durable write.
MIN_LEASE_MS = 300
#: The largest tool payload a result keeps: half of Kafka's default record limit (1 MB), which
#: leaves room for the envelope and signature, and a size a key's Continuation can hold.
DEFAULT_MAX_RESULT_BYTES = 512 * 1024


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class VerifyMode(enum.Enum):
    OFF = "off"
    PERMISSIVE = "permissive"
    REQUIRE = "require"

    def admits(self, outcome: Verification) -> bool:
        if self is VerifyMode.PERMISSIVE:
            return outcome in (Verification.VALID, Verification.UNSIGNED)
        return outcome is Verification.VALID


class Route(enum.Enum):
    RESULT = "result"
    APPROVAL = "approval"
    DEAD_LETTER = "dead letter"
    #: Decided before: nothing ran. `result` is the first result, or `approval` the intent
    #: put before a human: what was sent for the first copy, to be sent again (a receiver
    #: dedupes by intent_id), since the first sending may never have been acknowledged.
    DUPLICATE = "duplicate"
    #: Another effector holds the claim, its lease unexpired: nothing ran and there is no
    #: result yet. Deliver this copy again later; never acknowledge it as done.
    IN_FLIGHT = "in flight"


@dataclasses.dataclass(frozen=True)
class EffectorOutput:
    route: Route
    #: The result envelope (RESULT, DUPLICATE of a result).
    result: AgentEnvelope | None = None
    #: The intent to put before a human (APPROVAL).
    approval: ToolIntent | None = None
    #: Why the intent was refused without a result (DEAD_LETTER).
    dead_letter: ActivationErrorRecord | None = None
    #: True when this call ran the tool.
    ran_tool: bool = False


def check_retention(retention_ms: int) -> None:
    if isinstance(retention_ms, bool) or not isinstance(retention_ms, int) or retention_ms < 0:
        raise ValueError(f"retention_ms must be a non-negative int, not {retention_ms!r}")


def check_max_result_bytes(max_result_bytes: int) -> int:
    if (
        isinstance(max_result_bytes, bool)
        or not isinstance(max_result_bytes, int)
        or max_result_bytes < 0
    ):
        raise ValueError(f"max_result_bytes must be a non-negative int, not {max_result_bytes!r}")
    return max_result_bytes


def check_lease_ms(lease_ms: int) -> int:
    if isinstance(lease_ms, bool) or not isinstance(lease_ms, int) or lease_ms < MIN_LEASE_MS:
        raise ValueError(f"lease_ms must be an int of at least {MIN_LEASE_MS}, not {lease_ms!r}")
    return lease_ms
