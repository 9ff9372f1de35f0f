"""The runtime's decisions under the state model of Beam's portable SDK harness.

Prism, Flink and Dataflow Runner v2 hand back from a state read the very object an earlier write
stored; the DirectRunner decodes a fresh copy on every read and so cannot see a change made in
place. These tests drive `KeyMachine` through the DoFn's own `_read` and `write` over state
cells that hand back the stored object, and check after every step that nothing the machine
read was changed in place. Each test is one guarantee of issue 15 that a pipeline test could
not observe (or only slowly).
"""

from __future__ import annotations

import json

import pytest

from beam_agents._protos import (
    AgentEnvelope,
    Continuation,
    MemoryBlob,
    StateSnapshot,
    ToolIntent,
    ToolResult,
)
from beam_agents.core.intent import content_digest
from beam_agents.core.migration import CURRENT_STATE_SCHEMA_VERSION, StateSchemaFromFutureError
from beam_agents.core.signing import Keyring, sign
from beam_agents.errors import LlmCallError
from beam_agents.runtime import (
    AtDeadline,
    DeadlinePolicy,
    LlmResponse,
    RuntimeConfig,
    ScriptedLlmClient,
    Suspension,
    agent,
)
from beam_agents.runtime.machine import ERRORS, KeyMachine, KeyState
from beam_agents.runtime.run_agent import _read, _write

KEY = b"k-1"
T0 = 1_764_460_800_000
SEQ = T0 * 1000
EFFECTOR = Keyring({"effector-1": bytes(range(32))}, active="effector-1")
HUMANS = Keyring({"approvals-1": bytes(range(1, 33))}, active="approvals-1")
#: Keys with the right ids and the wrong secrets.
FORGED = Keyring({"effector-1": b"x" * 32, "approvals-1": b"y" * 32}, active="effector-1")
FORGED_HUMAN = Keyring(FORGED.keys, active="approvals-1")


class Cell:
    """A ReadModifyWrite state double that hands back the very object it stored."""

    def __init__(self) -> None:
        self.value = None

    def read(self):
        return self.value

    def write(self, value) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class Bag(Cell):
    def __init__(self) -> None:
        self.value = []

    def read(self):
        return self.value

    def add(self, value) -> None:
        self.value.append(value)

    def clear(self) -> None:
        self.value = []


class Timer:
    def __init__(self) -> None:
        self.at_ms = None

    def set(self, timestamp) -> None:
        self.at_ms = timestamp.micros // 1000

    def clear(self) -> None:
        self.at_ms = None


def _frozen(stored: KeyState) -> list[bytes | None]:
    blobs = [stored.memory, stored.cache, stored.continuation, *stored.pending]
    return [None if b is None else b.SerializeToString(deterministic=True) for b in blobs]


class Harness:
    """One key's state cells and timers, and the machine; every step checks that nothing it
    read was changed in place."""

    def __init__(self, agent_, *, llm=None, config=None, verify_answers=False, keyring=None):
        self.states = (Cell(), Cell(), Cell(), Cell(), Bag())
        self.timers = (Timer(), Timer())
        self.machine = KeyMachine(
            agent_,
            llm_client=llm,
            keyring=keyring,
            result_keyring=EFFECTOR if verify_answers else None,
            approval_keyring=HUMANS if verify_answers else None,
            config=config or RuntimeConfig(),
            registry=None,
            current_version=CURRENT_STATE_SCHEMA_VERSION,
        )
        self.outputs: list[tuple[str, object]] = []

    def _step(self, call):
        stored = _read(self.states)
        before = _frozen(stored)
        effects = call(stored)
        assert _frozen(stored) == before, "the machine changed a state read in place"
        if effects.state is not None:
            _write(effects, stored, self.states, self.timers)
        self.outputs += [(tag, value) for tag, (_, value) in effects.outputs]
        return effects

    def send(self, envelope: AgentEnvelope, *, arrival_ms: int = 0, idempotency_key=b""):
        return self._step(
            lambda stored: self.machine.on_envelope(
                KEY, stored, envelope, arrival_ms=arrival_ms, idempotency_key=idempotency_key
            )
        )

    def restore(self, snapshot: StateSnapshot):
        return self._step(lambda stored: self.machine.on_snapshot(KEY, stored, snapshot))

    def fire_deadline(self, at_ms: int | None = None):
        at = self.timers[0].at_ms if at_ms is None else at_ms
        return self._step(lambda stored: self.machine.on_deadline_timer(KEY, stored, at))

    def fire_ttl(self, at_ms: int | None = None):
        at = self.timers[1].at_ms if at_ms is None else at_ms
        return self._step(lambda stored: self.machine.on_ttl_timer(KEY, stored, at))

    def export(self, at: int = T0 + 10**6) -> StateSnapshot:
        envelope = AgentEnvelope(entity_key=KEY, event_time_ms=at)
        envelope.export_request.request_id = "export"
        (snapshot,) = [v for t, v in self.send(envelope).outputs if t == "snapshots"]
        return snapshot[1]

    def values(self, tag: str) -> list:
        return [v for t, v in self.outputs if t == tag]

    @property
    def continuation(self) -> Continuation | None:
        return self.states[3].value

    @property
    def memory(self) -> MemoryBlob | None:
        return self.states[1].value


def event(at: int, data: bytes) -> AgentEnvelope:
    return AgentEnvelope(entity_key=KEY, event_time_ms=at, external_event=data)


def answer(at: int, intent: ToolIntent, payload=b"ok", *, status=ToolResult.OK, ring=EFFECTOR):
    """The effector's signed result for `intent`, bound to its content."""
    result = ToolResult(
        intent_id=intent.intent_id,
        entity_key=KEY,
        status=status,
        payload=payload,
        completed_at_ms=at,
        intent_digest=content_digest(intent.SerializeToString(deterministic=True)),
    )
    if ring is not None:
        result = sign(result, ring)
    return AgentEnvelope(entity_key=KEY, event_time_ms=at, tool_result=result)


def approve(at: int, intent: ToolIntent, approved=True, *, ring=HUMANS) -> AgentEnvelope:
    decision = AgentEnvelope.Approval(
        intent_id=intent.intent_id,
        approved=approved,
        approver="ops@example.com",
        decided_at_ms=at,
        intent_digest=content_digest(intent.SerializeToString(deterministic=True)),
    )
    if ring is not None:
        decision = sign(decision, ring)
    return AgentEnvelope(entity_key=KEY, event_time_ms=at, approval=decision)


@agent(name="tests.refund/v1")
def refund(ctx, event: bytes) -> bytes:
    visits = int(ctx.memory.get("visits", b"0")) + 1
    ctx.memory.put("visits", str(visits).encode())
    paid = ctx.call_tool("payments.refund", {"amount": int(event)})
    summary = ctx.llm([{"role": "user", "content": paid.payload.decode()}], model="m")
    return f"{summary.text} after {visits} visit(s)".encode()


@agent(name="tests.parallel/v1")
def parallel(ctx, event: bytes) -> bytes:
    answers = ctx.call_tools([("a.tool", {"n": 1}), ("b.tool", {"n": 2}), ("c.tool", {"n": 3})])
    return b",".join(a.payload for a in answers)


@agent(name="tests.echo/v1")
def echo(ctx, event: bytes) -> bytes:
    ctx.memory.put("last", event)
    return b"echo " + event


@agent(name="tests.asks/v1")
def asks(ctx, event: bytes) -> bytes:
    decided = ctx.request_approval("refund?", amount=int(event))
    return b"approved" if decided.ok else b"declined"


def summarise(payload: str):
    return ScriptedLlmClient(lambda request: f"summary of {request.messages[-1]['content']}")


def _pending(h: Harness) -> list[ToolIntent]:
    return list(h.states[4].value)


# Point 1: an accepted answer is durable input -------------------------------------------------


class _DownOnce:
    """A model that is down for its first `failures` calls (retryable), then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures

    def complete(self, request):
        if self.failures:
            self.failures -= 1
            raise LlmCallError("model overloaded", model=request.model, retryable=True)
        return LlmResponse(f"summary of {request.messages[-1]['content']}", request.model)


def test_a_result_survives_a_failing_resume_and_is_never_presented_as_expired():
    h = Harness(refund, llm=_DownOnce(2), config=RuntimeConfig(resume_backoff_ms=1000))
    h.send(event(T0, b"4200"))
    (paid,) = _pending(h)
    h.send(answer(T0 + 5, paid, b"refunded 4200"))
    (failed,) = h.values(ERRORS)
    assert (
        failed.reason == "llm_failed" and failed.answers[0].tool_result.payload == b"refunded 4200"
    )
    assert h.continuation.resume_failures == 1 and h.timers[0].at_ms == T0 + 5 + 1000
    h.fire_deadline()  # down again: a second retry, twice the backoff
    assert h.continuation.resume_failures == 2 and h.timers[0].at_ms == T0 + 1005 + 2000
    h.fire_deadline()
    assert h.values("completions") == [b"summary of refunded 4200 after 1 visit(s)"]
    assert h.continuation is None and h.timers[0].at_ms is None


def test_a_deadline_past_a_failed_resume_does_not_expire_the_answered_intent():
    config = RuntimeConfig(
        resume_backoff_ms=10**7, resume_backoff_max_ms=10**7, suspend_deadline_ms=100
    )
    h = Harness(refund, llm=_DownOnce(1), config=config)
    h.send(event(T0, b"10"))
    (paid,) = _pending(h)
    h.send(answer(T0 + 5, paid))
    # The timer is due at the retry, not at the (earlier) deadline: nothing expires.
    assert h.timers[0].at_ms == T0 + 5 + 10**7
    stale = h.fire_deadline(T0 + 100)
    assert [e.reason for _, (_, e) in stale.outputs] == ["stale_timer"]
    h.fire_deadline()
    assert h.values("completions") == [b"summary of ok after 1 visit(s)"]


def test_a_result_on_time_while_an_expired_resume_awaits_its_retry_reaches_the_agent():
    """The human let the agent go on without the answer, but its resume failed: the refund's
    result arrives before the agent has seen anything and must not be presented as EXPIRED."""
    policy = DeadlinePolicy(AtDeadline.ESCALATE, max_escalations=1, extension_ms=10**6)
    config = RuntimeConfig(deadline_policy=policy, suspend_deadline_ms=10, resume_backoff_ms=1000)
    h = Harness(refund, llm=_DownOnce(1), config=config)
    h.send(event(T0, b"4200"))
    (paid,) = _pending(h)
    h.fire_deadline()  # escalates
    escalation = _pending(h)[1]
    h.send(approve(T0 + 20, escalation, approved=False))  # go on without it: the resume fails
    assert h.continuation.retry_at_ms
    h.send(answer(T0 + 30, paid, b"refunded 4200"))  # on time, before any resume succeeded
    h.fire_deadline()
    assert h.values("completions") == [b"summary of refunded 4200 after 1 visit(s)"]


# Point 2: never mutate what was read --------------------------------------------------------


def test_refused_and_failing_inputs_leave_the_stored_objects_untouched():
    """The Harness checks every step; here the steps that used to change state in place: an
    answer recorded, a deadline expiring, a failing resume, an escalation."""
    policy = DeadlinePolicy(AtDeadline.ESCALATE, max_escalations=1, extension_ms=50)
    h = Harness(
        parallel, llm=None, config=RuntimeConfig(deadline_policy=policy, suspend_deadline_ms=10)
    )
    h.send(event(T0, b"go"))
    first = _pending(h)[0]
    stored = h.continuation
    h.send(answer(T0 + 1, first))
    assert list(stored.answers) == [] and h.continuation is not stored
    h.fire_deadline()  # escalates
    h.fire_deadline()  # expires the rest and resumes
    (done,) = h.values("completions")
    assert done == b"ok,,"


# Point 3: a function agent's memory writes count once -----------------------------------------


def test_a_function_agent_counts_one_visit_per_event_however_often_it_suspends():
    h = Harness(refund, llm=summarise(""))
    for n, at in enumerate((T0, T0 + 100), start=1):
        h.send(event(at, b"7"))
        (paid,) = _pending(h)
        assert h.memory.entries[0].value == str(n - 1).encode() if n > 1 else True
        h.send(answer(at + 1, paid))
    assert h.values("completions") == [
        b"summary of ok after 1 visit(s)",
        b"summary of ok after 2 visit(s)",
    ]
    assert [(e.key, e.value) for e in h.memory.entries] == [("visits", b"2")]


# Point 4: answers reach resume in intent order ------------------------------------------------


def test_answers_in_any_order_and_a_shuffled_restore_resume_in_the_continuations_order():
    h = Harness(parallel)
    h.send(event(T0, b"go"))
    first, second, third = _pending(h)
    snapshot = h.export(T0 + 1)
    snapshot.pending.reverse()  # an export or restore may list them in any order
    restored = Harness(parallel)
    restored.restore(snapshot)
    for intent, payload in ((third, b"3"), (first, b"1"), (second, b"2")):
        restored.send(answer(T0 + 2, intent, payload))
    assert restored.values(ERRORS) == []
    assert restored.values("completions") == [b"1,2,3"]


# Point 5: a result answers the content it was computed for -----------------------------------


def test_a_result_for_other_content_under_the_same_id_is_refused_and_the_key_keeps_waiting():
    h = Harness(refund, llm=summarise(""), verify_answers=True)
    h.send(event(T0, b"4200"))
    (paid,) = _pending(h)
    other = ToolIntent()
    other.CopyFrom(paid)
    other.args_json = '{"amount":5000}'  # the first try's content, from a failed bundle
    h.send(answer(T0 + 1, other, b"refunded 5000"))
    (refused,) = h.values(ERRORS)
    assert refused.reason == "answer_for_other_content"
    assert refused.input.tool_result.payload == b"refunded 5000"
    assert h.continuation is not None and list(h.continuation.answers) == []
    h.send(answer(T0 + 2, paid, b"refunded 4200"))
    assert h.values("completions") == [b"summary of refunded 4200 after 1 visit(s)"]


# Point 6: duplicates of external events ---------------------------------------------------------


def test_the_same_event_twice_runs_once_within_the_dedupe_window():
    h = Harness(echo, config=RuntimeConfig(dedupe_window_ms=1000))
    h.send(event(T0, b"a"))
    h.send(event(T0, b"a"))  # back to back
    h.send(event(T0 + 10, b"b"))
    h.send(event(T0, b"a"))  # after completion, late
    assert h.values("completions") == [b"echo a", b"echo b"]
    h.send(event(T0 + 5000, b"c"))  # the window moved past the first event
    h.send(event(T0, b"a"))
    assert h.values("completions") == [b"echo a", b"echo b", b"echo c", b"echo a"]


def test_dedupe_marks_stay_within_their_count_and_window():
    h = Harness(echo, config=RuntimeConfig(dedupe_window_ms=1000, dedupe_max_events=3))
    for n in range(5):
        h.send(event(T0 + n, b"e%d" % n))
    assert len(h.memory.event_marks) == 3 * 24  # the three latest
    h.send(event(T0 + 1, b"e1"))  # forgotten by count: runs again
    h.send(event(T0 + 4, b"e4"))  # remembered
    assert h.values("completions")[-1] == b"echo e1" and len(h.values("completions")) == 6
    h.send(event(T0 + 5000, b"later"))
    assert len(h.memory.event_marks) == 24  # the window dropped the rest


def test_a_transport_idempotency_key_dedupes_copies_whose_bytes_differ():
    h = Harness(echo)
    h.send(event(T0, b"a"), idempotency_key=b"kafka:events/0@17")
    h.send(event(T0 + 1, b"a, re-stamped"), idempotency_key=b"kafka:events/0@17")
    h.send(event(T0 + 2, b"b"), idempotency_key=b"kafka:events/0@18")
    assert h.values("completions") == [b"echo a", b"echo b"]


def test_a_duplicate_of_a_queued_event_is_recognised_while_suspended():
    h = Harness(asks)
    h.send(event(T0, b"1"))
    h.send(event(T0 + 1, b"2"))
    h.send(event(T0 + 1, b"2"))
    assert [e.external_event for e in h.continuation.mailbox] == [b"2"]


def test_an_event_with_an_idempotency_key_leaves_two_of_the_dedupe_marks():
    """dedupe_max_events bounds marks (RuntimeConfig says so): a keyed event leaves two."""
    h = Harness(echo, config=RuntimeConfig(dedupe_max_events=4))
    h.send(event(T0, b"a"), idempotency_key=b"kafka:events/0@1")
    h.send(event(T0 + 1, b"b"), idempotency_key=b"kafka:events/0@2")
    assert len(h.memory.event_marks) == 4 * 24
    h.send(event(T0, b"a"), idempotency_key=b"kafka:events/0@1")  # one of the last two
    assert h.values("completions") == [b"echo a", b"echo b"]
    h.send(event(T0 + 2, b"c"), idempotency_key=b"kafka:events/0@3")
    h.send(event(T0, b"a"), idempotency_key=b"kafka:events/0@1")  # forgotten: runs again
    assert h.values("completions") == [b"echo a", b"echo b", b"echo c", b"echo a"]


# Point 7: the mailbox -------------------------------------------------------------------------


def test_events_for_a_suspended_key_queue_and_run_in_event_time_order_after_it_resumes():
    h = Harness(asks)
    h.send(event(T0, b"1"))
    (question,) = _pending(h)
    h.send(event(T0 + 30, b"3"))
    h.send(event(T0 + 20, b"2"))
    snapshot = h.export(T0 + 40)
    assert [e.external_event for e in snapshot.continuation.mailbox] == [b"3", b"2"]
    restored = Harness(asks)
    restored.restore(snapshot)
    restored.send(approve(T0 + 50, question))
    # The queued "2" runs first and suspends again; "3" waits in the new mailbox.
    assert restored.values("completions") == [b"approved"]
    (asked,) = _pending(restored)
    assert json.loads(asked.args_json)["amount"] == 2
    assert [e.external_event for e in restored.continuation.mailbox] == [b"3"]
    restored.send(approve(T0 + 60, asked, approved=False))
    (last,) = _pending(restored)
    assert json.loads(last.args_json)["amount"] == 3
    assert restored.values("completions") == [b"approved", b"declined"]


def test_a_full_mailbox_dead_letters_the_event_with_the_event_inside():
    h = Harness(asks, config=RuntimeConfig(mailbox_max_events=1))
    h.send(event(T0, b"1"))
    h.send(event(T0 + 1, b"2"))
    h.send(event(T0 + 2, b"3"))
    (full,) = h.values(ERRORS)
    assert full.reason == "mailbox_full" and full.input.external_event == b"3"


def test_a_mailbox_over_its_byte_bound_dead_letters_the_event_that_would_overflow_it():
    h = Harness(asks, config=RuntimeConfig(mailbox_max_bytes=3))
    h.send(event(T0, b"1"))
    h.send(event(T0 + 1, b"22"))
    h.send(event(T0 + 2, b"33"))  # 2 + 2 bytes > 3
    (full,) = h.values(ERRORS)
    assert full.reason == "mailbox_full" and full.input.external_event == b"33"
    assert [e.external_event for e in h.continuation.mailbox] == [b"22"]


@agent(name="tests.fragile/v1")
def fragile(ctx, event: bytes) -> bytes:
    if event == b"boom":
        raise RuntimeError("the agent cannot handle this event")
    decided = ctx.request_approval("go on?", event=event.decode())
    return b"approved" if decided.ok else b"declined"


def test_a_queued_event_whose_activation_fails_is_in_its_dead_letter():
    """A queued event was marked as seen when it was queued, so its redelivery does nothing:
    when its activation fails after the mailbox drains, the dead letter is all that holds it."""
    h = Harness(fragile)
    h.send(event(T0, b"first"))
    (question,) = _pending(h)
    h.send(event(T0 + 1, b"boom"))
    h.send(approve(T0 + 2, question, ring=None))
    (failed,) = h.values(ERRORS)
    assert failed.reason == "agent_raised" and failed.input.external_event == b"boom"


# Point 8: the TTL only moves forward ------------------------------------------------------------


def test_an_event_stamped_zero_never_wipes_the_memory_it_just_wrote():
    ttl = 1000
    h = Harness(echo, config=RuntimeConfig(ttl_ms=ttl))
    h.send(event(T0, b"a"), arrival_ms=T0)
    assert h.timers[1].at_ms == T0 + ttl
    h.send(event(0, b"late"), arrival_ms=T0 + 5)
    assert h.timers[1].at_ms == T0 + 5 + ttl and h.memory.last_activity_ms == T0 + 5
    h.send(event(0, b"later"))  # no arrival time either (a bounded source)
    assert h.timers[1].at_ms == T0 + 5 + ttl and h.memory.last_activity_ms == T0 + 5
    h.fire_ttl(T0 + ttl)  # a stale firing of the earlier TTL
    assert h.memory is not None
    assert [(e.key, e.value) for e in h.memory.entries] == [("last", b"later")]
    h.fire_ttl()
    assert h.memory is None and h.states[0].value == SEQ + 2


def test_a_new_key_whose_first_event_is_stamped_zero_counts_its_ttl_from_arrival():
    h = Harness(echo, config=RuntimeConfig(ttl_ms=1000))
    h.send(event(0, b"a"), arrival_ms=T0)
    assert h.timers[1].at_ms == T0 + 1000 and h.states[0].value == 1  # seq 0 means "none"


# Point 9: answers are authenticated -------------------------------------------------------------


@pytest.mark.parametrize(
    "forge",
    [
        lambda intent: answer(T0 + 1, intent, b"paid", ring=None),
        lambda intent: answer(T0 + 1, intent, b"paid", ring=FORGED),
        lambda intent: approve(T0 + 1, intent, ring=None),
    ],
    ids=["unsigned result", "result under a forged key", "unsigned approval"],
)
def test_an_unsigned_or_forged_answer_is_refused_and_the_genuine_one_still_resumes(forge):
    h = Harness(refund, llm=summarise(""), verify_answers=True)
    h.send(event(T0, b"10"))
    (paid,) = _pending(h)
    forged = forge(paid)
    h.send(forged)
    (refused,) = h.values(ERRORS)
    want = "bad_answer_signature" if forged.HasField("tool_result") else "answer_mismatch"
    assert refused.reason == want and refused.input == forged
    assert list(h.continuation.answers) == []
    h.send(answer(T0 + 2, paid, b"paid"))
    assert h.values("completions") == [b"summary of paid after 1 visit(s)"]


def test_a_signed_approval_resumes_and_a_forged_one_does_not():
    h = Harness(asks, verify_answers=True)
    h.send(event(T0, b"10"))
    (question,) = _pending(h)
    h.send(approve(T0 + 1, question, ring=FORGED_HUMAN))
    assert [e.reason for e in h.values(ERRORS)] == ["bad_answer_signature"]
    h.send(approve(T0 + 2, question))
    assert h.values("completions") == [b"approved"]


def test_an_approval_signed_with_the_effectors_key_is_refused():
    """The effector's result key is in the answer ring to verify its results; an approval it
    signs is not the approvals channel's, and must not open an approval gate."""
    h = Harness(asks, verify_answers=True)
    h.send(event(T0, b"10"))
    (question,) = _pending(h)
    h.send(approve(T0 + 1, question, ring=EFFECTOR))
    assert [e.reason for e in h.values(ERRORS)] == ["bad_answer_signature"]
    assert h.values("completions") == [] and h.continuation is not None


# Point 10: contract, future snapshots, seq ------------------------------------------------------


class _BadSuspension:
    adapter = "tests.bad/v1"

    def start(self, ctx, event):
        ctx.call_tool("a.tool", {})
        return Suspension(continuation=b"not a continuation")

    def resume(self, ctx, answers):
        raise AssertionError("never resumed")


def test_a_suspension_without_a_continuation_is_a_contract_dead_letter_not_a_crash():
    h = Harness(_BadSuspension())
    effects = h.send(event(T0, b"x"))
    assert [e.reason for e in h.values(ERRORS)] == ["agent_contract"]
    assert effects.state is None and h.values("intents") == []


def test_state_a_newer_binary_wrote_wedges_the_key_instead_of_being_read_or_wiped():
    h = Harness(echo)
    future = MemoryBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION + 1)
    h.states[1].write(future)
    with pytest.raises(StateSchemaFromFutureError):
        h.send(event(T0, b"a"))
    with pytest.raises(StateSchemaFromFutureError):
        h.fire_ttl(T0)
    assert h.states[1].value is future


def test_a_key_with_no_seq_exports_none_and_its_restore_keeps_the_time_based_first_seq():
    snapshot = StateSnapshot(entity_key=KEY, snapshot_at_ms=T0)
    snapshot.memory.CopyFrom(MemoryBlob(state_schema_version=1))
    h = Harness(echo)
    h.restore(snapshot)
    assert h.states[0].value is None
    h.send(event(T0 + 1, b"a"))
    assert h.states[0].value == (T0 + 1) * 1000


# Point 11: escalation and memory totals ---------------------------------------------------------


def _escalating(max_escalations=1):
    policy = DeadlinePolicy(AtDeadline.ESCALATE, max_escalations=max_escalations, extension_ms=50)
    return RuntimeConfig(deadline_policy=policy, suspend_deadline_ms=10)


def test_the_agents_own_answers_resume_it_while_an_escalation_is_pending():
    h = Harness(parallel, config=_escalating())
    h.send(event(T0, b"go"))
    first, second, third = _pending(h)
    h.fire_deadline()  # escalates
    assert len(_pending(h)) == 4
    for intent in (first, second, third):
        h.send(answer(T0 + 20, intent, intent.tool_name.encode()))
    assert h.values("completions") == [b"a.tool,b.tool,c.tool"]


def test_escalations_are_counted_per_suspension_and_never_asked_about_nothing():
    h = Harness(asks, config=_escalating())
    h.send(event(T0, b"1"))
    (question,) = _pending(h)
    h.fire_deadline()  # escalation 1 of 1
    escalation = _pending(h)[1]
    h.send(approve(T0 + 20, escalation))  # keep waiting
    h.send(approve(T0 + 30, question))
    h.send(event(T0 + 40, b"2"))
    assert h.continuation.escalations == 0  # a new suspension starts at 0
    h.fire_deadline()
    assert h.continuation.escalations == 1


def test_a_memory_total_that_drops_to_zero_is_written_as_zero():
    @agent(name="tests.forget/v1")
    def forget(ctx, event):
        if event == b"put":
            ctx.memory.put("k", b"value")
        else:
            ctx.memory.delete("k")
        return b"ok"

    h = Harness(forget)
    h.send(event(T0, b"put"))
    assert h.memory.total_value_bytes == 5
    h.send(event(T0 + 1, b"delete"))
    assert h.memory.total_value_bytes == 0 and list(h.memory.entries) == []


def test_a_digest_matches_only_where_a_mark_holds_one():
    from beam_agents.runtime.machine_events import _seen

    digest = bytes(range(16))
    straddling = b"\x00" * 12 + digest + b"\x00" * 20  # across two marks' digests
    assert not _seen(straddling, digest)
    assert _seen(straddling + b"\x00" * 8 + digest, digest)  # the third mark's


# Issue 19 point 5: a busy model is not a failure ------------------------------------------------


@agent(name="tests.summarise/v1")
def summarise_event(ctx, event: bytes) -> bytes:
    return ctx.llm([{"role": "user", "content": event.decode()}], model="m").text.encode()


def test_a_start_whose_model_stays_busy_waits_on_a_timer_and_keeps_its_place():
    config = RuntimeConfig(resume_backoff_ms=100, resume_backoff_max_ms=100)
    h = Harness(summarise_event, llm=_DownOnce(2), config=config)
    h.send(event(T0, b"first"), arrival_ms=T0)
    assert h.values(ERRORS) == [] and h.values("completions") == []
    assert h.timers[0].at_ms == T0 + 100
    h.send(event(T0 + 10, b"second"))  # waits behind the deferred one
    h.send(event(T0, b"first"))  # a copy of the deferred event: dropped
    assert [e.external_event for e in h.continuation.mailbox] == [b"first", b"second"]
    h.fire_deadline()  # busy again: a second deferral
    assert h.values("completions") == [] and h.continuation.resume_failures == 2
    h.fire_deadline()
    assert h.values("completions") == [b"summary of first", b"summary of second"]
    assert h.continuation is None and h.values(ERRORS) == []


def test_a_model_busy_past_the_retries_is_a_dead_letter_then_the_queue_runs():
    config = RuntimeConfig(retryable_resume_retries=1, resume_backoff_ms=10)
    h = Harness(summarise_event, llm=_DownOnce(2), config=config)
    h.send(event(T0, b"first"))
    h.send(event(T0 + 1, b"second"))
    h.fire_deadline()
    assert [e.reason for e in h.values(ERRORS)] == ["llm_failed"]
    assert h.values("completions") == [b"summary of second"] and h.continuation is None


def test_calls_to_one_model_are_capped_per_worker():
    import threading
    import time

    from beam_agents.runtime.context import model_slot

    running, peak, lock = [0], [0], threading.Lock()

    def call():
        with model_slot("capped-model", 2):
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.02)
            with lock:
                running[0] -= 1

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert peak[0] == 2


# Issue 19 point 3: budgets --------------------------------------------------------------------


class _Counting:
    """A model that answers every call, counting them, with fixed token usage."""

    def __init__(self, input_tokens=100, output_tokens=50) -> None:
        self.calls = 0
        self.usage = (input_tokens, output_tokens)

    def complete(self, request):
        self.calls += 1
        return LlmResponse("ok", request.model, *self.usage)


def _budgeted(**budget):
    from beam_agents.runtime.budget import Budget, Price

    prices = {"m": Price(input_per_million=2_000_000, output_per_million=8_000_000)}
    return RuntimeConfig(budget=Budget(prices=prices, **budget))


def test_usage_is_kept_per_key_and_a_call_past_the_key_budget_is_not_made():
    model = _Counting()
    h = Harness(summarise_event, llm=model, config=_budgeted(key_tokens=400))
    h.send(event(T0, b"a"))
    h.send(event(T0 + 1, b"b"))
    cache = h.states[2].value
    assert (cache.input_tokens, cache.output_tokens) == (200, 100)
    # Each call: 100 input tokens at 2 and 50 output tokens at 8 per million, in micros.
    assert cache.cost_micros == 2 * (200 + 400)
    h.send(event(T0 + 2, b"c"))  # 300 used, the estimate fits: 450 used after it
    before = _frozen(_read(h.states))
    h.send(event(T0 + 3, b"d" * 400))  # past 400 already: not called
    (refused,) = [e for e in h.values(ERRORS)]
    assert refused.reason == "budget_exceeded" and "key tokens" in refused.detail
    assert refused.input.external_event == b"d" * 400
    assert model.calls == 3 and _frozen(_read(h.states)) == before


def test_an_activation_budget_and_a_model_without_a_price_under_a_cost_limit():
    h = Harness(summarise_event, llm=_Counting(), config=_budgeted(activation_tokens=5))
    h.send(event(T0, b"a long enough question to pass five tokens"))
    assert [e.reason for e in h.values(ERRORS)] == ["budget_exceeded"]

    @agent(name="tests.unpriced/v1")
    def unpriced(ctx, event):
        return ctx.llm([{"role": "user", "content": "hi"}], model="unpriced").text.encode()

    h = Harness(unpriced, llm=_Counting(), config=_budgeted(key_cost_micros=10**9))
    h.send(event(T0, b"x"))
    (refused,) = h.values(ERRORS)
    assert refused.reason == "budget_exceeded" and "no price for model 'unpriced'" in refused.detail


def test_under_ask_a_person_raises_the_budget_and_the_start_runs_then():
    from beam_agents.runtime.budget import BUDGET_TOOL, OnBudget

    model = _Counting()
    config = _budgeted(key_tokens=10, on_exceed=OnBudget.ASK, raise_tokens=1000)
    h = Harness(summarise_event, llm=model, config=config)
    h.send(event(T0, b"first"))
    (question,) = _pending(h)
    assert question.tool_name == BUDGET_TOOL and question.kind == ToolIntent.APPROVAL
    assert h.values(ERRORS) == [] and model.calls == 0
    h.send(event(T0 + 1, b"second"))  # waits behind it
    h.send(approve(T0 + 2, question))
    assert model.calls == 2 and h.values("completions") == [b"ok", b"ok"]
    assert h.states[2].value.token_allowance == 1000 and h.continuation is None


def test_under_ask_a_declined_budget_ends_with_the_event_in_the_dead_letter():
    from beam_agents.runtime.budget import OnBudget

    config = _budgeted(key_tokens=10, on_exceed=OnBudget.ASK, raise_tokens=1000)
    h = Harness(summarise_event, llm=_Counting(), config=config)
    h.send(event(T0, b"first"))
    (question,) = _pending(h)
    h.send(approve(T0 + 1, question, approved=False))
    (refused,) = h.values(ERRORS)
    assert refused.reason == "budget_exceeded" and refused.input.external_event == b"first"
    assert h.continuation is None and not _pending(h)


def test_under_ask_a_resume_past_its_budget_waits_with_its_answers_and_goes_on_when_raised():
    from beam_agents.runtime.budget import BUDGET_TOOL, OnBudget

    model = _Counting(input_tokens=5, output_tokens=5)
    config = _budgeted(key_tokens=30, on_exceed=OnBudget.ASK, raise_tokens=1000)
    h = Harness(refund, llm=model, config=config)
    h.send(event(T0, b"4200"))
    (paid,) = _pending(h)
    h.send(answer(T0 + 1, paid, b"refunded 4200 " * 20))  # a long prompt for the model
    paid_again, question = _pending(h)
    assert paid_again == paid and question.tool_name == BUDGET_TOOL and model.calls == 0
    assert [a.tool_result.payload for a in h.continuation.answers] == [b"refunded 4200 " * 20]
    h.send(approve(T0 + 2, question))
    assert model.calls == 1 and h.values(ERRORS) == []
    assert h.values("completions") == [b"ok after 1 visit(s)"]
    assert h.states[2].value.input_tokens == 5 and h.states[2].value.token_allowance == 1000


def test_an_activation_limit_is_a_dead_letter_even_under_ask():
    from beam_agents.runtime.budget import OnBudget

    config = _budgeted(activation_tokens=5, on_exceed=OnBudget.ASK, raise_tokens=1000)
    h = Harness(summarise_event, llm=_Counting(), config=config)
    h.send(event(T0, b"a long enough question to pass five tokens"))
    assert [e.reason for e in h.values(ERRORS)] == ["budget_exceeded"] and not _pending(h)


def test_a_keys_usage_travels_in_its_snapshot():
    h = Harness(summarise_event, llm=_Counting(), config=_budgeted(key_tokens=10**6))
    h.send(event(T0, b"a"))
    snapshot = h.export()
    assert (snapshot.llm_cache.input_tokens, snapshot.llm_cache.output_tokens) == (100, 50)
    assert snapshot.llm_cache.cost_micros == 600


# Issue 18: an activation writes only what it changed ---------------------------------------------


@agent(name="tests.lookup/v1")
def lookup(ctx, event: bytes) -> bytes:
    return ctx.call_tool("crm.lookup", {"id": event.decode()}).payload


def test_a_resume_that_touches_no_memory_and_no_cache_writes_neither():
    h = Harness(lookup, config=RuntimeConfig(ttl_ms=1000))
    h.send(event(T0 + 5, b"7"))
    memory = h.memory
    (intent,) = _pending(h)
    # An answer stamped before the start's activity: nothing moves the TTL's anchor either.
    h.send(answer(T0 + 4, intent, b"profile"))
    assert h.values("completions") == [b"profile"]
    assert h.memory is memory and h.states[2].value is None  # not rewritten, no cache made
    assert h.timers[1].at_ms == T0 + 5 + 1000


def test_a_later_answer_moves_the_ttl_anchor_forward_in_a_copy_of_the_memory():
    h = Harness(lookup, config=RuntimeConfig(ttl_ms=1000))
    h.send(event(T0, b"7"))
    memory = h.memory
    (intent,) = _pending(h)
    h.send(answer(T0 + 9, intent, b"profile"))
    assert h.memory is not memory and h.memory.last_activity_ms == T0 + 9
    assert h.memory.entries == memory.entries and h.states[2].value is None
    h.fire_ttl(T0 + 1000)  # the TTL the start set has moved: the key stays
    assert h.memory is not None and h.timers[1].at_ms == T0 + 9 + 1000


def test_a_resume_that_replays_no_llm_call_keeps_the_cache_it_read():
    h = Harness(refund, llm=summarise("a summary"))
    h.send(event(T0, b"10"))
    (paid,) = _pending(h)
    h.send(answer(T0 + 1, paid, b"paid"))  # one LLM call: the cache is written
    cache = h.states[2].value
    assert len(cache.entries) == 1
    h.send(event(T0 + 2, b"20"))  # suspends before any LLM call: the cache is untouched
    assert h.states[2].value is cache


def test_a_second_budget_question_for_the_same_start_has_its_own_intent_id():
    # Review: a raise too small for the retried start makes the key ask again. The console keeps
    # one decision per intent_id, so a second question under the first one's id is shown as
    # already decided and can never be answered: the key would wait out its deadline.
    from beam_agents.runtime.budget import BUDGET_TOOL, OnBudget

    model = _Counting()
    config = _budgeted(key_tokens=10, on_exceed=OnBudget.ASK, raise_tokens=1)
    h = Harness(summarise_event, llm=model, config=config)
    h.send(event(T0, b"first"))
    (first,) = _pending(h)
    h.send(approve(T0 + 1, first))
    (second,) = _pending(h)
    assert second.tool_name == BUDGET_TOOL and model.calls == 0
    assert second.intent_id != first.intent_id
    h.send(approve(T0 + 2, second))
    (third,) = _pending(h)
    assert third.intent_id not in (first.intent_id, second.intent_id)
