"""RunAgent: one agent per entity key, driven through activations inside a stateful DoFn.

See the package docstring (beam_agents.runtime) for the design. This module holds the
transform and the DoFn, which only moves state between Beam and the per-key state machine
(`machine.KeyMachine`, where every decision is made): it reads the key's state, hands it to
the machine with the input, and writes back the blobs the machine replaced, with the timers
its new state implies.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.coders.coders import DeterministicProtoCoder
from apache_beam.transforms import window
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.typehints import Tuple
from google.protobuf.message import DecodeError

from beam_agents._protos import (
    ActivationErrorRecord,
    ActivationRecord,
    AgentEnvelope,
    Continuation,
    LlmCacheBlob,
    MemoryBlob,
    StateSnapshot,
    ToolIntent,
    TraceEvent,
)
from beam_agents.errors import with_article
from beam_agents.intents.signing import Keyring
from beam_agents.runtime.config import RuntimeConfig
from beam_agents.runtime.context import Agent, LlmClient
from beam_agents.runtime.dead_letters import NO_ENTITY_KEY, UNDECODABLE, error_record, over_limit
from beam_agents.runtime.machine import (
    COMPLETIONS,
    ERRORS,
    INTENTS,
    SNAPSHOTS,
    TRACES,
    Effects,
    KeyMachine,
    KeyState,
)
from beam_agents.runtime.machine_state import COUNTERS
from beam_agents.runtime.recording import RECORDS, Recording
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION, MigrationRegistry
from beam_agents.wire.beam_support import keep_each_key_in_one_bundle, timer_timestamp, typed
from beam_agents.wire.fields import encode_varint, read_varint

__all__ = [
    "COMPLETIONS",
    "ERRORS",
    "INTENTS",
    "MIN_OUTPUT_BYTES",
    "RECORDS",
    "SNAPSHOTS",
    "TRACES",
    "RunAgent",
]

_TAGS = (INTENTS, TRACES, ERRORS, SNAPSHOTS)

#: The smallest max_output_bytes RunAgent takes: room for a `record_too_large` dead letter.
MIN_OUTPUT_BYTES = 64 * 1024

# The tag of each element between _KeyAndTag and the DoFn: an envelope, an envelope with a
# transport's idempotency key (varint length, key, envelope), or a snapshot.
_ENVELOPE, _IDEMPOTENT, _SNAPSHOT = b"E", b"I", b"S"


class _KeyAndTag(beam.DoFn):
    """AgentEnvelopes or StateSnapshots (`kind`), as messages or bytes, in (an envelope may come
    as a pair (envelope, idempotency key)); (entity_key, tag + bytes) out, the tag saying which
    it is. Bytes that do not parse as `kind` are dead letters."""

    def __init__(self, kind: bytes) -> None:
        self._kind = kind
        self._type = AgentEnvelope if kind == _ENVELOPE else StateSnapshot

    def process(self, element, timestamp=beam.DoFn.TimestampParam) -> Iterator:
        tag, given, idempotency_key = self._kind, None, b""
        if self._kind == _ENVELOPE and isinstance(element, tuple) and len(element) == 2:
            element, given = element
            idempotency_key = _key_bytes(given)
            if idempotency_key:
                tag = _IDEMPOTENT + encode_varint(len(idempotency_key)) + idempotency_key
        if isinstance(element, self._type):
            message, element = element, element.SerializeToString(deterministic=True)
        else:
            try:
                message = self._type.FromString(element)
            except (DecodeError, TypeError) as e:
                size = len(element) if isinstance(element, bytes | bytearray) else 0
                name = self._type.__name__
                detail = f"{type(element).__name__} of {size} bytes is no {name}: {e}"
                record = error_record(b"", UNDECODABLE, detail, timestamp.micros // 1000)
                yield beam.pvalue.TaggedOutput(ERRORS, (b"", record))
                return
        if not message.entity_key:
            detail = f"{with_article(self._type.__name__)} with no entity_key; an agent needs a key"
            record = error_record(b"", NO_ENTITY_KEY, detail, timestamp.micros // 1000)
            yield beam.pvalue.TaggedOutput(ERRORS, (b"", record))
            return
        if idempotency_key is None:
            # Run without it, the event would lose the transport's dedupe without a word.
            key = message.entity_key
            detail = f"an idempotency key of type {type(given).__name__}, not bytes or str"
            record = error_record(key, UNDECODABLE, detail, timestamp.micros // 1000, input=message)
            yield beam.pvalue.TaggedOutput(ERRORS, (key, record))
            return
        yield (message.entity_key, tag + bytes(element))


def _key_bytes(given: object) -> bytes | None:
    """A transport's idempotency key as bytes (b"": none), or None when it is no key."""
    if given is None:
        return b""
    if isinstance(given, str):
        # A str from bytes that were not UTF-8 holds lone surrogates, which strict UTF-8
        # refuses: "surrogatepass" gives every str bytes of its own, and a valid one the UTF-8
        # it always had (so its marks stay what they were).
        return given.encode("utf-8", "surrogatepass")
    if isinstance(given, bytes | bytearray):
        return bytes(given)
    return None


class _AgentDoFn(beam.DoFn):
    """Moves a key's state between Beam and the KeyMachine; see the module docstring."""

    # Frozen (beam_agents/ops/state_manifest.json): a renamed spec, another coder or another timer
    # domain breaks Dataflow --update's state restore for every key.
    MEMORY = ReadModifyWriteStateSpec("memory", DeterministicProtoCoder(MemoryBlob))
    CONTINUATION = ReadModifyWriteStateSpec("continuation", DeterministicProtoCoder(Continuation))
    LLM_CACHE = ReadModifyWriteStateSpec("llm_cache", DeterministicProtoCoder(LlmCacheBlob))
    SEQ = ReadModifyWriteStateSpec("seq", VarIntCoder())
    PENDING = BagStateSpec("pending", DeterministicProtoCoder(ToolIntent))
    DEADLINE = TimerSpec("deadline", TimeDomain.WATERMARK)
    TTL = TimerSpec("ttl", TimeDomain.WATERMARK)

    def __init__(
        self,
        agent: Agent,
        llm_client,
        keyring_loaders,
        config,
        registry,
        *,
        max_output_bytes: int | None = None,
        recording: Recording | None = None,
    ) -> None:
        self._agent = agent
        self._llm_client = llm_client
        #: Loaders of the rings that sign intents and verify results and approvals.
        self._keyring_loaders = keyring_loaders
        self._config = config
        self._registry = registry
        self._max_output_bytes = max_output_bytes
        self._recording = recording
        self._machine: KeyMachine | None = None
        self._counters = {
            name: beam.metrics.Metrics.counter("beam_agents.runtime", name) for name in COUNTERS
        }

    def setup(self) -> None:
        rings = {
            name: None if loader is None else loader()
            for name, loader in self._keyring_loaders.items()
        }
        self._machine = KeyMachine(
            self._agent,
            llm_client=self._llm_client,
            keyring=rings["intent"],
            result_keyring=rings["result"],
            approval_keyring=rings["approval"],
            config=self._config,
            registry=self._registry,
            current_version=(
                CURRENT_STATE_SCHEMA_VERSION
                if self._registry is None
                else self._registry.current_version
            ),
            recording=self._recording,
        )

    def process(
        self,
        element: tuple[bytes, bytes],
        timestamp=beam.DoFn.TimestampParam,
        seq=beam.DoFn.StateParam(SEQ),
        memory=beam.DoFn.StateParam(MEMORY),
        cache=beam.DoFn.StateParam(LLM_CACHE),
        continuation=beam.DoFn.StateParam(CONTINUATION),
        pending=beam.DoFn.StateParam(PENDING),
        deadline=beam.DoFn.TimerParam(DEADLINE),
        ttl=beam.DoFn.TimerParam(TTL),
    ) -> Iterable:
        key, tagged = element
        states = (seq, memory, cache, continuation, pending)
        stored = _read(states)
        arrival = _ms(timestamp)
        tag, body = tagged[:1], tagged[1:]
        if tag == _SNAPSHOT:
            effects = self._machine.on_snapshot(
                key, stored, StateSnapshot.FromString(body), arrival_ms=arrival
            )
        else:
            idempotency_key = b""
            if tag == _IDEMPOTENT:
                size, position = read_varint(body, 0)
                idempotency_key, body = body[position : position + size], body[position + size :]
            effects = self._machine.on_envelope(
                key,
                stored,
                AgentEnvelope.FromString(body),
                arrival_ms=arrival,
                idempotency_key=idempotency_key,
            )
        yield from self._apply(effects, stored, states, (deadline, ttl), arrival)

    @on_timer(DEADLINE)
    def at_deadline(
        self,
        key=beam.DoFn.KeyParam,
        fired=beam.DoFn.TimestampParam,
        seq=beam.DoFn.StateParam(SEQ),
        memory=beam.DoFn.StateParam(MEMORY),
        cache=beam.DoFn.StateParam(LLM_CACHE),
        continuation=beam.DoFn.StateParam(CONTINUATION),
        pending=beam.DoFn.StateParam(PENDING),
        deadline=beam.DoFn.TimerParam(DEADLINE),
        ttl=beam.DoFn.TimerParam(TTL),
    ) -> Iterable:
        states = (seq, memory, cache, continuation, pending)
        stored = _read(states)
        effects = self._machine.on_deadline_timer(key, stored, _ms(fired))
        yield from self._apply(effects, stored, states, (deadline, ttl), _ms(fired))

    @on_timer(TTL)
    def at_ttl(
        self,
        key=beam.DoFn.KeyParam,
        fired=beam.DoFn.TimestampParam,
        seq=beam.DoFn.StateParam(SEQ),
        memory=beam.DoFn.StateParam(MEMORY),
        cache=beam.DoFn.StateParam(LLM_CACHE),
        continuation=beam.DoFn.StateParam(CONTINUATION),
        pending=beam.DoFn.StateParam(PENDING),
        deadline=beam.DoFn.TimerParam(DEADLINE),
        ttl=beam.DoFn.TimerParam(TTL),
    ) -> Iterable:
        states = (seq, memory, cache, continuation, pending)
        stored = _read(states)
        effects = self._machine.on_ttl_timer(key, stored, _ms(fired))
        yield from self._apply(effects, stored, states, (deadline, ttl), _ms(fired))

    def _apply(self, effects: Effects, stored: KeyState, states, timers, at_ms: int) -> Iterator:
        """Writes what the machine replaced (before any output: Beam commits both with the
        bundle), sets the timers, counts, and yields the outputs, each over max_output_bytes
        as a `record_too_large` dead letter instead."""
        if effects.state is not None:
            _write(effects, stored, states, timers)
        for name in effects.counters:
            self._counters[name].inc()
        for tag, value in effects.outputs:
            if self._max_output_bytes is not None:
                key, body = value
                letter = over_limit(tag, key, body, self._max_output_bytes, at_ms)
                if letter is not None:
                    tag, value = ERRORS, (key, letter)
            yield value if tag == COMPLETIONS else beam.pvalue.TaggedOutput(tag, value)


def _read(states) -> KeyState:
    seq, memory, cache, continuation, pending = states
    suspended = continuation.read()
    return KeyState(
        seq=seq.read(),
        memory=memory.read(),
        cache=cache.read(),
        continuation=suspended,
        # Only a suspension has pending intents (every commit and restore sets or clears
        # them together): a key that is not suspended saves a state round trip.
        pending=() if suspended is None else tuple(pending.read()),
    )


def _write(effects: Effects, stored: KeyState, states, timers) -> None:
    """Writes the components of `effects.state` that differ from what `stored` holds (a
    machine never changes a blob in place, so identity tells what changed; the seq is a
    number, compared by value), and the timers."""
    new = effects.state
    seq, memory, cache, continuation, pending = states
    if new.seq != stored.seq:
        if new.seq is None:
            seq.clear()
        else:
            seq.write(new.seq)
    for state, old_value, new_value in (
        (memory, stored.memory, new.memory),
        (cache, stored.cache, new.cache),
        (continuation, stored.continuation, new.continuation),
    ):
        if new_value is not old_value:
            if new_value is None:
                state.clear()
            else:
                state.write(new_value)
    # Without a suspension the bag was not read (`_read`): empty, unless a restore by an older
    # binary left intents there. A new suspension or a wiped key sets it outright.
    unknown = stored.continuation is None and (new.continuation is not None or new.empty)
    if new.pending is not stored.pending or unknown:
        pending.clear()
        for intent in new.pending:
            pending.add(intent)
    deadline, ttl = timers
    for timer, at in ((deadline, effects.deadline_at), (ttl, effects.ttl_at)):
        if timer is ttl and effects.keep_ttl:
            continue
        if at is None:
            timer.clear()
        else:
            timer.set(timer_timestamp(at))


def _ms(timestamp) -> int:
    # Portable runners keep timers to the millisecond: compare firing times in milliseconds.
    return timestamp.micros // 1000


class RunAgent(beam.PTransform):
    """Runs `agent` for every entity key.

    Input: a PCollection of AgentEnvelopes (messages or serialized bytes), each alone or as a
    pair (envelope, idempotency key: bytes, str, or None for none) where the transport has one
    (a Kafka header, Pub/Sub's message id; a key of another type is an `undecodable_envelope`
    dead letter, the envelope inside), or a dict {"envelopes": ..., "snapshots": ...} whose
    snapshots (StateSnapshot messages or bytes) restore empty keys; any windowing. Nothing
    orders the two inputs: an envelope that reaches a key before its snapshot runs on the empty
    key, and the snapshot is then a `restore_conflict` dead letter, so restore a key before its
    events flow. Output: a dict of keyed PCollections in the global window: COMPLETIONS
    (entity_key, bytes), INTENTS (entity_key, ToolIntent), TRACES (entity_key, TraceEvent),
    ERRORS (entity_key, ActivationErrorRecord), SNAPSHOTS (entity_key, StateSnapshot).

    `keyring_loader` is called on the worker (DoFn.setup) to sign intents;
    `result_keyring_loader` and `approval_keyring_loader`, likewise, for the rings that verify
    answers: ToolResults under the effectors' keys, Approvals under the approvals channel's
    (two rings, so that an effector cannot approve an intent it is asked to wait for). With a
    ring, an answer of its kind that is unsigned or forged is a `bad_answer_signature` dead
    letter, and the key keeps waiting for the genuine one. `registry`
    replaces the default migration registry (tests of a future schema version).
    `max_output_bytes` bounds each output record (its key and value, a dead letter inside its
    envelope): one over it is a `record_too_large` dead letter instead, on ERRORS, and the
    key goes on (a sink such as Kafka fails its bundle for good on a record over its limit).
    `recording` (off by default: None) adds the RECORDS output, (entity_key,
    ActivationRecord), one per activation (`beam_agents.runtime.recording`).
    """

    def __init__(
        self,
        agent: Agent,
        *,
        llm_client: LlmClient | None = None,
        keyring_loader: Callable[[], Keyring] | None = None,
        result_keyring_loader: Callable[[], Keyring] | None = None,
        approval_keyring_loader: Callable[[], Keyring] | None = None,
        config: RuntimeConfig | None = None,
        registry: MigrationRegistry | None = None,
        max_output_bytes: int | None = None,
        recording: Recording | None = None,
    ) -> None:
        super().__init__()
        if max_output_bytes is not None and (
            isinstance(max_output_bytes, bool)
            or not isinstance(max_output_bytes, int)
            or max_output_bytes < MIN_OUTPUT_BYTES
        ):
            # Checked when the pipeline is built: the dead letter that stands in for an output
            # over the limit must fit under it.
            raise ValueError(
                f"max_output_bytes must be None or an int of at least {MIN_OUTPUT_BYTES}, "
                f"not {max_output_bytes!r}"
            )
        if recording is not None and not isinstance(recording, Recording):
            raise TypeError(f"recording must be None or a Recording, not {recording!r}")
        if not isinstance(agent, Agent):
            raise TypeError(f"{agent!r} has no adapter, start and resume: not an Agent")
        self._agent = agent
        self._llm_client = llm_client
        self._keyring_loaders = {
            "intent": keyring_loader,
            "result": result_keyring_loader,
            "approval": approval_keyring_loader,
        }
        for name, loader in self._keyring_loaders.items():
            if loader is not None and not callable(loader):
                # A Keyring itself would be pickled into the job graph, keys and all (and
                # fails to pickle): the workers load their own.
                option = "keyring_loader" if name == "intent" else f"{name}_keyring_loader"
                raise TypeError(
                    f"{option} takes a function the workers call for their Keyring (e.g. "
                    f"Keyring.from_environment, or functools.partial(Keyring.from_json, ...)), "
                    f"not {type(loader).__name__}"
                )
        self._config = RuntimeConfig() if config is None else config
        self._registry = registry
        self._max_output_bytes = max_output_bytes
        self._recording = recording

    def expand(self, inputs):
        if isinstance(inputs, dict):
            unknown = set(inputs) - {"envelopes", "snapshots"}
            if unknown:
                raise ValueError(f"RunAgent takes envelopes and snapshots, not {sorted(unknown)}")
            sources = [
                (kind, inputs[name])
                for kind, name in ((_ENVELOPE, "envelopes"), (_SNAPSHOT, "snapshots"))
                if name in inputs
            ]
        else:
            sources = [(_ENVELOPE, inputs)]
        keyed, errors = [], []
        for kind, source in sources:
            name = "Envelopes" if kind == _ENVELOPE else "Snapshots"
            # Keyed state is per window: one key's activations must share one state.
            tagged = (
                source
                | f"{name}GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
                | f"Key{name}" >> beam.ParDo(_KeyAndTag(kind)).with_outputs(ERRORS, main="keyed")
            )
            keyed.append(typed(tagged.keyed, Tuple[bytes, bytes]))
            errors.append(typed(tagged[ERRORS], Tuple[bytes, ActivationErrorRecord]))
        merged = keyed[0] if len(keyed) == 1 else tuple(keyed) | "Merge" >> beam.Flatten()
        keep_each_key_in_one_bundle(merged.pipeline)
        outputs = typed(merged, Tuple[bytes, bytes]) | "Activate" >> beam.ParDo(
            _AgentDoFn(
                self._agent,
                self._llm_client,
                self._keyring_loaders,
                self._config,
                self._registry,
                max_output_bytes=self._max_output_bytes,
                recording=self._recording,
            )
            # RECORDS only when recording: without it the graph is the one jobs run today.
        ).with_outputs(*_TAGS, *([RECORDS] if self._recording else []), main=COMPLETIONS)
        errors.append(typed(outputs[ERRORS], Tuple[bytes, ActivationErrorRecord]))
        records = (
            {RECORDS: typed(outputs[RECORDS], Tuple[bytes, ActivationRecord])}
            if self._recording
            else {}
        )
        return {
            **records,
            COMPLETIONS: typed(outputs[COMPLETIONS], Tuple[bytes, bytes]),
            INTENTS: typed(outputs[INTENTS], Tuple[bytes, ToolIntent]),
            TRACES: typed(outputs[TRACES], Tuple[bytes, TraceEvent]),
            ERRORS: typed(
                tuple(errors) | "Errors" >> beam.Flatten(), Tuple[bytes, ActivationErrorRecord]
            ),
            SNAPSHOTS: typed(outputs[SNAPSHOTS], Tuple[bytes, StateSnapshot]),
        }
