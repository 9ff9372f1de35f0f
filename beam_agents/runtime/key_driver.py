"""One key's inputs through the runtime's per-key machine, in process, without a pipeline.

`KeyDriver` holds a key's state between inputs and hands each to `KeyMachine`, in event-time
order (or at the place the caller gives each: the backtest replays the order a key ran in),
as RunAgent's DoFn does (the machine makes every decision; the DoFn only moves state):
what the backtest runs a candidate agent with (beam_agents/ops/backtest.py), and what makes a
recorded history fast in tests (beam_agents/testing/recorded_history.py). Timers fire only when
asked (`fire_deadline`), and nothing is signed or verified: it runs what was already accepted once.
"""

from __future__ import annotations

import heapq
import itertools

from beam_agents._protos import AgentEnvelope
from beam_agents.runtime.config import RuntimeConfig
from beam_agents.runtime.context import Agent, LlmClient
from beam_agents.runtime.machine import KeyMachine, KeyState
from beam_agents.runtime.machine_state import due_at, timer_ms
from beam_agents.runtime.recording import Recording
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION

__all__ = ["KeyDriver", "recording_machine"]

#: At most this many deadline firings at once (`fire_due`): each escalation moves the
#: deadline on, and a policy escalates a bounded number of times.
_MAX_FIRINGS = 64

#: Keeps every answer whole.
_WHOLE = Recording(max_answer_bytes=2**62)


class KeyDriver:
    """Runs one key's inputs through a KeyMachine in event-time order, or by the `at` each was
    scheduled with (ties in the order they were scheduled), holding the key's state between
    them, from `state` (an empty key by default). `step()` returns the (tag, value) outputs of
    the next input; `state` is the key's state after the inputs stepped so far, and `ttl_at`
    the time its TTL timer is set to by the last input that set it (`ttl_set`; None: cleared)."""

    def __init__(self, machine: KeyMachine, key: bytes, state: KeyState | None = None) -> None:
        self._machine = machine
        self._key = key
        self._state = KeyState() if state is None else state
        self.ttl_set = False
        self.ttl_at: int | None = None
        #: (place, order, envelope or None: the deadline timer, taken_in_ms or its `until`,
        #: deferred).
        self._queue: list[tuple[int, int, AgentEnvelope | None, int | None, int]] = []
        self._order = itertools.count()

    def schedule(
        self,
        envelope: AgentEnvelope,
        *,
        at: int | None = None,
        taken_in_ms: int | None = None,
        deferred: int = 0,
    ) -> None:
        """Queues `envelope`; `taken_in_ms`: an event the live key ran from its mailbox or a
        retry at that time, which runs no earlier; `deferred`: how often the live key had
        deferred its start on a busy model (`KeyMachine.on_envelope`)."""
        place = envelope.event_time_ms if at is None else at
        heapq.heappush(self._queue, (place, next(self._order), envelope, taken_in_ms, deferred))

    def schedule_deadline(self, *, at: int, until: int | None = None) -> None:
        """Queues firings of the key's deadline timer (the backtest and the shadow: the live
        key's fired there): when it comes, the timer fires at its suspension's due time while
        that is no later than `until` (an escalation moves it on), or once (a retry's, or
        any) without one."""
        heapq.heappush(self._queue, (at, next(self._order), None, until, 0))

    def fire_due(
        self, until: int, *, short_of: tuple[int, int] | None = None
    ) -> list[tuple[str, object]]:
        """The outputs of the key's deadline timer fired at each due time of its suspension
        up to `until` (a deadline, or an escalation's extension), as a watermark at `until`
        fires them, while the suspension is not at the place (seq, step) `short_of`; a
        retry's timer is not fired."""
        outputs = []
        for _ in range(_MAX_FIRINGS):
            suspended = self._state.continuation
            if (
                suspended is None
                or suspended.retry_at_ms
                or timer_ms(due_at(suspended)) > until
                or (suspended.seq, suspended.step_index) == short_of
            ):
                break
            outputs += self.fire_deadline(timer_ms(due_at(suspended)))
        return outputs

    @property
    def state(self) -> KeyState:
        return self._state

    def __bool__(self) -> bool:
        return bool(self._queue)

    def step(self) -> list[tuple[str, object]]:
        _, _, envelope, taken_in_ms, deferred = heapq.heappop(self._queue)
        if envelope is None:
            suspended = self._state.continuation
            if taken_in_ms is not None:
                return self.fire_due(taken_in_ms)
            return [] if suspended is None else self.fire_deadline(timer_ms(due_at(suspended)))
        return self._apply(
            self._machine.on_envelope(
                self._key, self._state, envelope, taken_in_ms=taken_in_ms, deferred=deferred
            )
        )

    def fire_deadline(self, at_ms: int) -> list[tuple[str, object]]:
        """The outputs of the key's deadline timer fired at `at_ms` (a suspension's deadline,
        or a failed resume's retry), as RunAgent's timer runs it."""
        return self._apply(self._machine.on_deadline_timer(self._key, self._state, at_ms))

    def fire_ttl(self, at_ms: int) -> list[tuple[str, object]]:
        """The outputs of the key's TTL timer fired at `at_ms`, as RunAgent's timer runs it."""
        return self._apply(self._machine.on_ttl_timer(self._key, self._state, at_ms))

    def _apply(self, effects) -> list[tuple[str, object]]:
        if effects.state is not None:
            self._state = effects.state
            if not effects.keep_ttl:
                self.ttl_set, self.ttl_at = True, effects.ttl_at
        return [(tag, value) for tag, (_, value) in effects.outputs]


def recording_machine(
    agent: Agent,
    llm_client: LlmClient | None,
    config: RuntimeConfig,
    recording: Recording = _WHOLE,
) -> KeyMachine:
    """A KeyMachine with no keyrings that records every activation (by default keeping every
    answer whole)."""
    return KeyMachine(
        agent,
        llm_client=llm_client,
        keyring=None,
        result_keyring=None,
        approval_keyring=None,
        config=config,
        registry=None,
        current_version=CURRENT_STATE_SCHEMA_VERSION,
        recording=recording,
    )
