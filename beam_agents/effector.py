"""The effector: the one place where ToolIntents act on the world.

Every intent goes through the same gate, in this order:

1. Signature, by `VerifyMode`: OFF checks nothing; PERMISSIVE (for rolling signing out) admits
   valid and unsigned intents and refuses any other outcome; REQUIRE admits only valid ones. A
   refused intent becomes a dead letter (ActivationErrorRecord, reason "signature_<outcome>")
   and gets no ToolResult.
2. Expiry: expires_at_ms at or before now (from an injectable clock) gives an EXPIRED result
   without executing. An intent with no expiry (0) is refused the same way: fail closed.
3. Kind: an APPROVAL intent goes to the approvals output for a human, never executed.
   TOOL_KIND_UNSPECIFIED reads as TOOL.
4. Tool: an unknown tool name, or args_json that is not a JSON object, gives REJECTED.
5. Execution, once per intent_id: the tool's bytes give OK with the payload, an exception gives
   ERROR with its message. A second arrival of an executed intent is a duplicate: nothing runs.

Every result is an AgentEnvelope carrying the ToolResult, keyed by entity_key, ready to flow
back into the agent. Two faces share the gate: `Effector`, a plain callable for a service that
reads intents from a topic (duplicates are remembered until the intent expires, after which
the gate refuses it anyway), and `ExecuteIntents`, a Beam transform that remembers executions
in keyed state per intent_id and clears it with an event-time timer at the intent's expiry.
Signing keys are loaded where the effector runs (`keyring_loader`), never carried in a
pipeline's serialized graph.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
import json
import time
from collections.abc import Callable, Iterable, Iterator, Mapping

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.typehints import Tuple
from apache_beam.utils.timestamp import Timestamp
from google.protobuf.message import DecodeError

from beam_agents._protos import ActivationErrorRecord, AgentEnvelope, ToolIntent, ToolResult
from beam_agents.core.intent import effective_kind
from beam_agents.core.signing import Keyring, Verification, verify

__all__ = [
    "APPROVALS",
    "DEAD_LETTERS",
    "RESULTS",
    "Effector",
    "EffectorOutput",
    "ExecuteIntents",
    "Route",
    "Tool",
    "VerifyMode",
    "wall_clock_ms",
]

#: A tool: called with the parsed args_json object and the intent; returns the result payload.
Tool = Callable[[dict, ToolIntent], bytes | str]

RESULTS = "results"
APPROVALS = "approvals"
DEAD_LETTERS = "dead_letters"


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
    #: Already executed: nothing ran; `result` is the first execution's envelope.
    DUPLICATE = "duplicate"


@dataclasses.dataclass(frozen=True)
class EffectorOutput:
    route: Route
    #: The result envelope (RESULT, DUPLICATE).
    result: AgentEnvelope | None = None
    #: The intent to put before a human (APPROVAL).
    approval: ToolIntent | None = None
    #: Why the intent was refused without a result (DEAD_LETTER).
    dead_letter: ActivationErrorRecord | None = None


class Effector:
    """The gate of the module docstring, as a plain callable: `effector(intent)`."""

    def __init__(
        self,
        tools: Mapping[str, Tool],
        *,
        mode: VerifyMode,
        keyring: Keyring | None = None,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        if mode is not VerifyMode.OFF and keyring is None:
            raise ValueError(f"verify mode {mode.value} needs a keyring")
        self._tools = dict(tools)
        self._mode = mode
        self._keyring = keyring
        self._clock = clock
        self._executed: dict[str, tuple[int, AgentEnvelope]] = {}
        self._expiries: list[tuple[int, str]] = []

    @property
    def remembered(self) -> int:
        """How many executions are remembered for duplicate suppression."""
        return len(self._executed)

    def __call__(self, intent: ToolIntent) -> EffectorOutput:
        now = self._clock()
        self._forget_expired(now)
        refused = self.admit(intent, now)
        if refused is not None:
            return refused
        done = self._executed.get(intent.intent_id)
        if done is not None:
            return EffectorOutput(Route.DUPLICATE, result=done[1])
        result = self.execute(intent)
        self._executed[intent.intent_id] = (intent.expires_at_ms, result)
        heapq.heappush(self._expiries, (intent.expires_at_ms, intent.intent_id))
        return EffectorOutput(Route.RESULT, result=result)

    def admit(self, intent: ToolIntent, now: int) -> EffectorOutput | None:
        """Steps 1 to 4: the output of an intent that must not run, or None to execute it."""
        if self._mode is not VerifyMode.OFF:
            outcome = verify(intent, self._keyring)
            if not self._mode.admits(outcome):
                reason = "signature_" + outcome.name.lower()
                detail = (
                    f"intent {intent.intent_id} ({intent.tool_name}) refused in "
                    f"{self._mode.value} mode: {outcome.value} (key id {intent.signing_key_id!r})"
                )
                return EffectorOutput(
                    Route.DEAD_LETTER,
                    dead_letter=ActivationErrorRecord(
                        entity_key=intent.entity_key,
                        reason=reason,
                        detail=detail,
                        event_time_ms=now,
                    ),
                )
        if intent.expires_at_ms <= now:
            return self._result(
                intent, ToolResult.EXPIRED, error=f"expired at {intent.expires_at_ms}", now=now
            )
        if effective_kind(intent) == ToolIntent.APPROVAL:
            return EffectorOutput(Route.APPROVAL, approval=intent)
        if intent.tool_name not in self._tools:
            return self._result(
                intent, ToolResult.REJECTED, error=f"unknown tool {intent.tool_name!r}", now=now
            )
        if not isinstance(_args(intent), dict):
            return self._result(
                intent, ToolResult.REJECTED, error="args_json is not a JSON object", now=now
            )
        return None

    def execute(self, intent: ToolIntent) -> AgentEnvelope:
        """Step 5: runs the admitted intent's tool and wraps its outcome."""
        try:
            payload = self._tools[intent.tool_name](_args(intent), intent)
            if isinstance(payload, str):
                payload = payload.encode()
            if not isinstance(payload, bytes):
                raise TypeError(f"tool returned {type(payload).__name__}, not bytes or str")
        except Exception as e:  # a tool's failure is its result, never the effector's
            return self._result(
                intent, ToolResult.ERROR, error=f"{type(e).__name__}: {e}", now=self._clock()
            ).result
        return self._result(intent, ToolResult.OK, payload=payload, now=self._clock()).result

    @staticmethod
    def _result(intent: ToolIntent, status, *, now: int, payload=b"", error="") -> EffectorOutput:
        result = ToolResult(
            intent_id=intent.intent_id,
            entity_key=intent.entity_key,
            seq=intent.seq,
            status=status,
            payload=payload,
            error_message=error,
            completed_at_ms=now,
        )
        envelope = AgentEnvelope(
            entity_key=intent.entity_key, event_time_ms=now, tool_result=result
        )
        return EffectorOutput(Route.RESULT, result=envelope)

    def _forget_expired(self, now: int) -> None:
        # An expired intent is refused at step 2, so its execution record is no longer needed.
        while self._expiries and self._expiries[0][0] <= now:
            _, intent_id = heapq.heappop(self._expiries)
            self._executed.pop(intent_id, None)


def _args(intent: ToolIntent) -> object:
    try:
        return json.loads(intent.args_json)
    except json.JSONDecodeError:
        return None


class _KeyByIntentId(beam.DoFn):
    """Parses serialized intents (or passes messages through), keyed by intent_id; bytes that
    are no ToolIntent become dead letters."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock

    def process(self, element: bytes | ToolIntent) -> Iterator:
        if isinstance(element, ToolIntent):
            yield (element.intent_id, element)
            return
        try:
            intent = ToolIntent.FromString(element)
        except DecodeError as e:
            yield beam.pvalue.TaggedOutput(
                DEAD_LETTERS,
                (
                    b"",
                    ActivationErrorRecord(
                        reason="undecodable_intent",
                        detail=f"{len(element)} bytes are not a ToolIntent: {e}",
                        event_time_ms=self._clock(),
                    ),
                ),
            )
            return
        yield (intent.intent_id, intent)


class _ExecuteOnce(beam.DoFn):
    """The gate, with executions remembered in state keyed by intent_id."""

    # Frozen: renaming a spec or changing its coder breaks state restore on --update.
    EXECUTED = ReadModifyWriteStateSpec("executed", BytesCoder())
    EXPIRY = TimerSpec("expiry", TimeDomain.WATERMARK)

    def __init__(self, tools, mode, keyring_loader, clock) -> None:
        self._tools = tools
        self._mode = mode
        self._keyring_loader = keyring_loader
        self._clock = clock
        self._effector: Effector | None = None
        self._duplicates = beam.metrics.Metrics.counter("beam_agents.effector", "duplicates")
        self._executions = beam.metrics.Metrics.counter("beam_agents.effector", "executions")

    def setup(self) -> None:
        keyring = None if self._mode is VerifyMode.OFF else self._keyring_loader()
        self._effector = Effector(self._tools, mode=self._mode, keyring=keyring, clock=self._clock)

    def process(
        self,
        element: tuple[str, ToolIntent],
        executed=beam.DoFn.StateParam(EXECUTED),
        expiry=beam.DoFn.TimerParam(EXPIRY),
    ) -> Iterable:
        _, intent = element
        refused = self._effector.admit(intent, self._clock())
        if refused is not None:
            yield from _emit(refused, intent)
            return
        if executed.read() is not None:
            self._duplicates.inc()
            return
        result = self._effector.execute(intent)
        self._executions.inc()
        executed.write(result.tool_result.SerializeToString(deterministic=True))
        expiry.set(Timestamp.of(intent.expires_at_ms / 1000))
        yield (intent.entity_key, result)

    @on_timer(EXPIRY)
    def expire(self, executed=beam.DoFn.StateParam(EXECUTED)) -> None:
        executed.clear()


def _emit(output: EffectorOutput, intent: ToolIntent) -> Iterator:
    if output.route is Route.RESULT:
        yield (intent.entity_key, output.result)
    elif output.route is Route.APPROVAL:
        yield beam.pvalue.TaggedOutput(APPROVALS, (intent.entity_key, output.approval))
    else:
        yield beam.pvalue.TaggedOutput(DEAD_LETTERS, (intent.entity_key, output.dead_letter))


class ExecuteIntents(beam.PTransform):
    """ToolIntents (messages or serialized bytes) in; a dict of three keyed PCollections out:
    RESULTS (entity_key, AgentEnvelope), APPROVALS (entity_key, ToolIntent) and DEAD_LETTERS
    (entity_key, ActivationErrorRecord)."""

    def __init__(
        self,
        tools: Mapping[str, Tool],
        *,
        mode: VerifyMode,
        keyring_loader: Callable[[], Keyring] = Keyring.from_environment,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        super().__init__()
        self._tools = dict(tools)
        self._mode = mode
        self._keyring_loader = keyring_loader
        self._clock = clock

    def expand(self, intents):
        keyed = intents | "KeyByIntentId" >> beam.ParDo(_KeyByIntentId(self._clock)).with_outputs(
            DEAD_LETTERS, main="intents"
        )
        by_intent_id = _typed(keyed.intents, Tuple[str, ToolIntent])
        gated = by_intent_id | "ExecuteOnce" >> beam.ParDo(
            _ExecuteOnce(self._tools, self._mode, self._keyring_loader, self._clock)
        ).with_outputs(APPROVALS, DEAD_LETTERS, main=RESULTS)
        _typed(keyed[DEAD_LETTERS], Tuple[bytes, ActivationErrorRecord])
        _typed(gated[DEAD_LETTERS], Tuple[bytes, ActivationErrorRecord])
        dead_letters = (keyed[DEAD_LETTERS], gated[DEAD_LETTERS]) | "DeadLetters" >> beam.Flatten()
        return {
            RESULTS: _typed(gated[RESULTS], Tuple[bytes, AgentEnvelope]),
            APPROVALS: _typed(gated[APPROVALS], Tuple[bytes, ToolIntent]),
            DEAD_LETTERS: _typed(dead_letters, Tuple[bytes, ActivationErrorRecord]),
        }


def _typed(pcollection, element_type):
    # Multi-output ParDos leave tagged outputs untyped, and an untyped PCollection of protos
    # would be pickled between stages; a declared type gives Tuple(Bytes/StrUtf8, ProtoCoder).
    pcollection.element_type = element_type
    return pcollection
