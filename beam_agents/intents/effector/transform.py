"""`ExecuteIntents`: the gate as a Beam transform, each intent_id's record in keyed state.

The transform names (GlobalWindow, KeyByIntentId, ExecuteOnce, DeadLetters), the DoFn class
names in them, the state spec `execution`, its coder and the `retention` timer's domain are
frozen by beam_agents/ops/state_manifest.json: a running job's `--update` matches them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping

import apache_beam as beam
from apache_beam.coders.coders import DeterministicProtoCoder
from apache_beam.transforms import window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec, TimerSpec, on_timer
from apache_beam.typehints import Tuple
from google.protobuf.message import DecodeError

from beam_agents._protos import ActivationErrorRecord, AgentEnvelope, ExecutionRecord, ToolIntent
from beam_agents.errors import KeyringError, with_article
from beam_agents.intents.effector.gate import Gate, dead_letter
from beam_agents.intents.effector.spec import (
    APPROVALS,
    DEAD_LETTERS,
    DEFAULT_MAX_RESULT_BYTES,
    DEFAULT_RETENTION_MS,
    REASON_UNDECODABLE,
    RESULTS,
    Route,
    Tool,
    VerifyMode,
    check_max_result_bytes,
    check_retention,
    wall_clock_ms,
)
from beam_agents.intents.effector.stores import ExecutionStore
from beam_agents.intents.signing import KEYS_ENV, KEYS_FILE_ENV, Keyring
from beam_agents.wire.beam_support import keep_each_key_in_one_bundle, timer_timestamp, typed

__all__ = ["ExecuteIntents"]

# The namespace operators' dashboards and alerts know the counters by: the package's old path.
_METRICS = "beam_agents.effector"


class _Serialize(beam.DoFn):
    """Intents as bytes keyed by intent_id; message inputs serialized deterministically (what
    a signer did), bytes kept as received so the signature covers them exactly. A keyed pair,
    (entity_key, intent) as RunAgent's INTENTS output emits it, is its intent: the pair's key
    is dropped, for the signed intent names its own entity_key and its answer goes there."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock

    def process(self, element: bytes | ToolIntent | tuple[bytes, bytes | ToolIntent]) -> Iterator:
        if isinstance(element, tuple) and len(element) == 2:
            element = element[1]
        if isinstance(element, ToolIntent):
            yield (element.intent_id, element.SerializeToString(deterministic=True))
            return
        if not isinstance(element, bytes):
            yield self._undecodable(f"{with_article(type(element).__name__)} is not a ToolIntent")
            return
        try:
            intent_id = ToolIntent.FromString(element).intent_id
        except DecodeError as e:
            yield self._undecodable(f"{len(element)} bytes are not a ToolIntent: {e}")
            return
        yield (intent_id, bytes(element))

    def _undecodable(self, detail: str) -> beam.pvalue.TaggedOutput:
        letter = dead_letter(b"", REASON_UNDECODABLE, detail, self._clock()).dead_letter
        return beam.pvalue.TaggedOutput(DEAD_LETTERS, (b"", letter))


class _StateStore(ExecutionStore):
    """One key's ExecutionStore over Beam keyed state; its retention timer follows each put."""

    def __init__(self, state, timer) -> None:
        self._state = state
        self._timer = timer

    def get(self, intent_id: str) -> ExecutionRecord | None:
        return self._state.read()

    def claim(self, record: ExecutionRecord, keep_until_ms: int) -> ExecutionRecord | None:
        known = self._state.read()
        if known is None:
            self.put(record, keep_until_ms)
        return known

    def put(self, record: ExecutionRecord, keep_until_ms: int) -> None:
        self._state.write(record)
        self._timer.set(timer_timestamp(keep_until_ms))

    def replace(
        self, record: ExecutionRecord, expected: ExecutionRecord, keep_until_ms: int
    ) -> bool:
        # One key's state is read and written by one bundle at a time.
        if self._state.read() != expected:
            return False
        self.put(record, keep_until_ms)
        return True


class _ExecuteOnce(beam.DoFn):
    """The gate, with each intent_id's record in keyed state."""

    # Frozen: renaming a spec or changing its coder breaks state restore on --update.
    RECORD = ReadModifyWriteStateSpec("execution", DeterministicProtoCoder(ExecutionRecord))
    RETENTION = TimerSpec("retention", TimeDomain.WATERMARK)

    def __init__(
        self, tools, mode, keyring_loader, result_keyring_loader, clock, retention_ms, max_result
    ) -> None:
        self._tools = tools
        self._mode = mode
        self._keyring_loader = keyring_loader
        self._result_keyring_loader = result_keyring_loader
        self._clock = clock
        self._retention_ms = retention_ms
        self._max_result = max_result
        self._gate: Gate | None = None
        self._duplicates = beam.metrics.Metrics.counter(_METRICS, "duplicates")
        self._executions = beam.metrics.Metrics.counter(_METRICS, "executions")

    def setup(self) -> None:
        keyring = None if self._mode is VerifyMode.OFF else self._keyring_loader()
        signer = self._result_keyring_loader
        self._gate = Gate(
            self._tools,
            self._mode,
            keyring,
            self._retention_ms,
            None if signer is None else signer(),
            max_result_bytes=self._max_result,
        )

    def process(
        self,
        element: tuple[str, bytes],
        record=beam.DoFn.StateParam(RECORD),
        retention=beam.DoFn.TimerParam(RETENTION),
    ) -> Iterable:
        _, data = element
        store = _StateStore(record, retention)
        output = self._gate.decide(data, now=self._clock, store=store)
        # Beam retries a bundle with its state, so a copy here follows a committed decision
        # whose outputs were committed with it: nothing to send again.
        if output.route in (Route.DUPLICATE, Route.IN_FLIGHT):
            self._duplicates.inc()
            return
        if output.ran_tool:
            self._executions.inc()
        if output.route is Route.RESULT:
            result = output.result
            yield (result.entity_key, result)
        elif output.route is Route.APPROVAL:
            yield beam.pvalue.TaggedOutput(APPROVALS, (output.approval.entity_key, output.approval))
        else:
            letter = output.dead_letter
            yield beam.pvalue.TaggedOutput(DEAD_LETTERS, (letter.entity_key, letter))

    @on_timer(RETENTION)
    def forget(self, record=beam.DoFn.StateParam(RECORD)) -> None:
        record.clear()


class ExecuteIntents(beam.PTransform):
    """ToolIntents (messages or serialized bytes, in any windowing, alone or keyed as RunAgent's
    INTENTS output emits them: `run[INTENTS] | ExecuteIntents(...)`) in; a dict of three keyed
    PCollections out, in the global window: RESULTS (entity_key, AgentEnvelope), APPROVALS
    (entity_key, ToolIntent) and DEAD_LETTERS (entity_key, ActivationErrorRecord).
    `result_keyring_loader`, called on the worker, gives the ring whose active key signs every
    ToolResult. A tool's payload over `max_result_bytes` is not kept, as in `Effector`.

    `keyring_loader`, called on the worker, gives the ring that verifies intents (unless `mode`
    is VerifyMode.OFF). Without one, it is `Keyring.from_environment`, and the environment of
    the process building the pipeline must name the keys: a missing key is one KeyringError
    here, naming the fix, never a failure of every bundle on the workers. Where only the
    workers hold the key, pass `keyring_loader` (`Keyring.from_environment`, or a function
    reading a secret store)."""

    def __init__(
        self,
        tools: Mapping[str, Tool],
        *,
        mode: VerifyMode,
        keyring_loader: Callable[[], Keyring] | None = None,
        result_keyring_loader: Callable[[], Keyring] | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        retention_ms: int = DEFAULT_RETENTION_MS,
        max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES,
    ) -> None:
        super().__init__()
        if keyring_loader is None:
            if mode is not VerifyMode.OFF and not {KEYS_ENV, KEYS_FILE_ENV} & set(os.environ):
                raise KeyringError(
                    f"VerifyMode.{mode.name} verifies intents and no key is given: set "
                    f"{KEYS_ENV} (or {KEYS_FILE_ENV}), pass keyring_loader=, or for a local "
                    "run pass mode=VerifyMode.OFF",
                    source="ExecuteIntents",
                )
            keyring_loader = Keyring.from_environment
        check_retention(retention_ms)
        self._max_result = check_max_result_bytes(max_result_bytes)
        self._tools = dict(tools)
        self._mode = mode
        self._keyring_loader = keyring_loader
        self._result_keyring_loader = result_keyring_loader
        self._clock = clock
        self._retention_ms = retention_ms

    def expand(self, intents):
        # Keyed state is per window: without this, one intent in two windows would run twice.
        global_window = intents | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
        keyed = global_window | "KeyByIntentId" >> beam.ParDo(_Serialize(self._clock)).with_outputs(
            DEAD_LETTERS, main="intents"
        )
        by_intent_id = typed(keyed.intents, Tuple[str, bytes])
        keep_each_key_in_one_bundle(by_intent_id.pipeline)
        gated = by_intent_id | "ExecuteOnce" >> beam.ParDo(
            _ExecuteOnce(
                self._tools,
                self._mode,
                self._keyring_loader,
                self._result_keyring_loader,
                self._clock,
                self._retention_ms,
                self._max_result,
            )
        ).with_outputs(APPROVALS, DEAD_LETTERS, main=RESULTS)
        typed(keyed[DEAD_LETTERS], Tuple[bytes, ActivationErrorRecord])
        typed(gated[DEAD_LETTERS], Tuple[bytes, ActivationErrorRecord])
        dead_letters = (keyed[DEAD_LETTERS], gated[DEAD_LETTERS]) | "DeadLetters" >> beam.Flatten()
        return {
            RESULTS: typed(gated[RESULTS], Tuple[bytes, AgentEnvelope]),
            APPROVALS: typed(gated[APPROVALS], Tuple[bytes, ToolIntent]),
            DEAD_LETTERS: typed(dead_letters, Tuple[bytes, ActivationErrorRecord]),
        }
