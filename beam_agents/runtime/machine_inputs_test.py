"""Continuations and usage checked where they come in (machine_inputs): stored, restored or built
by an agent, none reaches a decision that cannot act on it. Each test drives KeyMachine through
`testing.machine_harness`, whose state cells hand back the very object stored; the last one
generates hostile states and inputs (Hypothesis, a fixed seed and a small budget)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from beam_agents._protos import (
    ActivationRecord,
    AgentEnvelope,
    Continuation,
    LlmCacheBlob,
    MemoryBlob,
    StateSnapshot,
    ToolIntent,
)
from beam_agents.runtime import AtDeadline, DeadlinePolicy, RuntimeConfig, agent
from beam_agents.runtime.budget import BUDGET_TOOL, Budget, OnBudget
from beam_agents.runtime.context import Suspension
from beam_agents.runtime.dead_letters import REASONS
from beam_agents.runtime.machine import ERRORS
from beam_agents.runtime.machine_inputs import MAX_GRANTS, MAX_STEP
from beam_agents.runtime.machine_state import INT64_MAX
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION
from beam_agents.testing.machine_harness import (
    KEY,
    SEQ,
    T0,
    Harness,
    answer,
    echo,
    event,
    pending,
    refund,
    summarise,
    summarise_event,
)

_ESCALATE = RuntimeConfig(deadline_policy=DeadlinePolicy(action=AtDeadline.ESCALATE))


def _stored(h: Harness, suspended: Continuation, intents=(), cache=None) -> None:
    """Puts state in the cells as a binary that did not check it would have left it."""
    h.states[0].value = SEQ
    h.states[2].value = cache
    h.states[3].value = suspended
    h.states[4].value = list(intents)
    h.timers[0].at_ms = suspended.retry_at_ms or suspended.deadline_ms


def _suspended(**fields) -> Continuation:
    defaults = dict(
        state_schema_version=CURRENT_STATE_SCHEMA_VERSION,
        seq=SEQ,
        step_index=1,
        pending_intent_ids=["i-0"],
        adapter=refund.adapter,
        deadline_ms=T0 + 5,
    )
    return Continuation(**{**defaults, **fields})


def _intent(intent_id: str = "i-0") -> ToolIntent:
    return ToolIntent(intent_id=intent_id, entity_key=KEY, seq=SEQ, tool_name="payments.refund")


def test_a_stored_suspension_with_a_negative_seq_ends_at_its_escalation_with_its_inputs_kept():
    h = Harness(echo, config=_ESCALATE)
    answered = AgentEnvelope(entity_key=KEY, event_time_ms=T0)
    answered.tool_result.intent_id = "i-0"
    _stored(h, _suspended(seq=-1, answers=[answered], mailbox=[event(T0 + 1, b"queued")]))
    h.fire_deadline()
    ended, queued = h.values(ERRORS)
    assert (ended.reason, list(ended.answers)) == ("invalid_state", [answered])
    assert "seq -1 is negative" in ended.detail
    assert (queued.reason, queued.input.external_event) == ("invalid_state", b"queued")
    assert h.continuation is None and pending(h) == [] and h.timers[0].at_ms is None
    h.send(event(T0 + 10, b"next"))
    assert h.values("completions") == [b"echo next"]


def test_a_ttl_timer_ends_a_stored_suspension_it_cannot_act_on_with_its_inputs_kept():
    h = Harness(echo)
    answered = AgentEnvelope(entity_key=KEY, event_time_ms=T0)
    answered.tool_result.intent_id = "i-0"
    _stored(h, _suspended(seq=-1, answers=[answered], mailbox=[event(T0 + 1, b"queued")]))
    h.fire_ttl(T0 + 10)  # past the suspension's due time, which would leave it to its timer
    ended, queued = h.values(ERRORS)
    assert (ended.reason, list(ended.answers)) == ("invalid_state", [answered])
    assert (queued.reason, queued.input.external_event) == ("invalid_state", b"queued")
    assert h.continuation is None and pending(h) == []


@pytest.mark.parametrize(
    ("held_attempts", "numbered"),
    [(1, 2), (0, 1)],
    ids=["numbered past the count", "numbered with no count"],
)
def test_a_stored_suspension_whose_held_calls_name_no_held_attempt_ends_named(
    held_attempts, numbered
):
    # A backtest offers a held attempt's calls by their number: one no attempt has would
    # never be offered (review rev46). Unnumbered calls are an older binary's (rev47's
    # review: one wrote a count and unnumbered calls), and are kept (the next test).
    call = ActivationRecord.ModelCall(cache_key="c", held_attempt=numbered)
    h = Harness(echo)
    _stored(h, _suspended(held_attempts=held_attempts, held_calls=[call]))
    h.fire_deadline()
    (ended,) = h.values(ERRORS)
    assert ended.reason == "invalid_state" and "held call numbers attempt" in ended.detail


def test_a_stored_suspension_with_unnumbered_held_calls_an_older_binary_wrote_goes_on():
    call = ActivationRecord.ModelCall(cache_key="c")
    h = Harness(echo)
    _stored(h, _suspended(held_attempts=2, held_calls=[call]))
    h.fire_deadline()
    assert [e.reason for e in h.values(ERRORS)] != ["invalid_state"]


def test_a_stored_retry_of_a_start_with_no_event_ends_instead_of_failing_its_timer():
    h = Harness(echo)
    _stored(h, _suspended(pending_intent_ids=[], retry_at_ms=T0 + 5, resume_failures=1))
    h.fire_deadline()
    (ended,) = h.values(ERRORS)
    assert ended.reason == "invalid_state" and "with no event" in ended.detail
    assert h.continuation is None


def test_stored_usage_out_of_range_is_set_in_range_and_the_budget_question_is_asked():
    config = RuntimeConfig(budget=Budget(key_tokens=1, on_exceed=OnBudget.ASK, raise_tokens=9))
    h = Harness(summarise_event, llm=summarise(""), config=config)
    h.states[0].value = SEQ
    h.states[2].value = LlmCacheBlob(
        state_schema_version=CURRENT_STATE_SCHEMA_VERSION,
        input_tokens=-(10**9),
        budget_grants=2**32 - 1,
    )
    h.send(event(T0, b"a question"))
    (repaired,) = h.values(ERRORS)
    assert repaired.reason == "invalid_state" and "negative input_tokens" in repaired.detail
    cache = h.states[2].value
    assert (cache.input_tokens, cache.budget_grants) == (0, MAX_GRANTS)
    (question,) = h.values("intents")
    assert question.tool_name == BUDGET_TOOL and question.step_index == 2**31 + MAX_GRANTS


@pytest.mark.parametrize(
    ("cache", "why"),
    [
        (LlmCacheBlob(state_schema_version=1, cost_micros=-1), "negative cost_micros"),
        (LlmCacheBlob(state_schema_version=1, budget_grants=MAX_GRANTS + 1), "budget grants"),
    ],
)
def test_a_snapshot_with_usage_out_of_range_is_not_restored(cache, why):
    h = Harness(echo)
    h.restore(StateSnapshot(entity_key=KEY, snapshot_at_ms=T0, llm_cache=cache))
    (refused,) = h.values(ERRORS)
    assert refused.reason == "invalid_snapshot" and why in refused.detail
    assert h.states[2].value is None


def test_a_snapshot_at_the_most_budget_grants_is_restored():
    h = Harness(echo)
    cache = LlmCacheBlob(state_schema_version=1, budget_grants=MAX_GRANTS)
    h.restore(StateSnapshot(entity_key=KEY, snapshot_at_ms=T0, llm_cache=cache))
    assert h.values(ERRORS) == [] and h.states[2].value.budget_grants == MAX_GRANTS


def test_a_key_at_the_last_seq_refuses_its_next_start_with_the_event_in_the_record():
    h = Harness(echo)
    h.states[0].value = INT64_MAX - 1
    h.send(event(T0, b"last"))
    h.send(event(T0 + 1, b"one too many"))
    assert h.values("completions") == [b"echo last"] and h.states[0].value == INT64_MAX
    (refused,) = h.values(ERRORS)
    assert (refused.reason, refused.input.external_event) == ("seq_exhausted", b"one too many")


@agent(name="tests.pays/v1")
def _pays(ctx, event: bytes) -> bytes:
    paid = ctx.call_tool("pay", {"event": event.decode()})
    return b"paid " + event if paid.ok else b"not paid"


def test_a_key_past_the_last_first_seq_restores_its_export_and_issues_no_id_again():
    """A key whose first event was stamped at the end of int64 starts at the largest first
    seq, and its next activation goes past it. Its own export was refused on restore, so the
    new job's key began again at that first seq and issued the first intent's id for another
    call (review rev48)."""
    old = Harness(_pays)
    old.send(event(INT64_MAX, b"first"))
    (first,) = old.values("intents")
    old.send(answer(INT64_MAX, first))
    old.send(event(INT64_MAX - 1, b"second"))
    old.send(answer(INT64_MAX, old.values("intents")[-1]))
    export = AgentEnvelope(entity_key=KEY, event_time_ms=INT64_MAX)
    export.export_request.request_id = "move"
    export.export_request.release = True
    old.send(export)
    (snapshot,) = old.values("snapshots")
    assert snapshot.seq == first.seq + 1
    new = Harness(_pays)
    new.restore(snapshot)
    assert new.values(ERRORS) == []
    new.send(event(INT64_MAX, b"third"))
    third = new.values("intents")[-1]
    assert third.seq == snapshot.seq + 1
    assert third.intent_id not in {i.intent_id for i in old.values("intents")}


def test_a_snapshot_whose_entries_were_deleted_but_not_their_totals_runs_its_next_event():
    """Someone emptied a snapshot's memory and cache by hand and left their totals, over the
    restoring job's limits: every input of the key raised KeyError out of the machine, the
    bundle failed for ever (review rev48)."""
    h = Harness(echo, config=RuntimeConfig(memory_budget_bytes=1_000))
    memory = MemoryBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION, total_value_bytes=10**6)
    cache = LlmCacheBlob(state_schema_version=CURRENT_STATE_SCHEMA_VERSION)
    cache.total_response_bytes = 10**12
    h.restore(StateSnapshot(entity_key=KEY, snapshot_at_ms=T0, memory=memory, llm_cache=cache))
    h.send(event(T0 + 1, b"after"))
    assert h.values(ERRORS) == [] and h.values("completions") == [b"echo after"]


class _Builds:
    """Emits one intent, then suspends on a Continuation built from it and `fields`."""

    adapter = "tests.builds/v1"

    def __init__(self, **fields) -> None:
        self.fields = fields

    def start(self, ctx, event: bytes):
        (emitted,) = ctx.call_tools([("a.tool", {})])
        fields = {
            "seq": ctx.seq,
            "step_index": ctx.next_step,
            "pending_intent_ids": [emitted.intent_id],
            **self.fields,
        }
        # "mine" names the intent it emitted.
        fields["pending_intent_ids"] = [
            emitted.intent_id if i == "mine" else i for i in fields["pending_intent_ids"]
        ]
        return Suspension(Continuation(adapter=self.adapter, deadline_ms=T0 + 5, **fields))

    def resume(self, ctx, answers):
        return ctx.complete(b"resumed")


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"seq": -1}, "negative"),
        ({"seq": SEQ + 1}, "not its activation's"),
        ({"step_index": 0}, "before its next step"),
        ({"step_index": MAX_STEP + 1}, "past an agent's steps"),
        ({"pending_intent_ids": []}, "waits on no intent"),
        ({"pending_intent_ids": ["someone-elses"]}, "did not emit"),
        ({"pending_intent_ids": [], "retry_at_ms": T0}, "with no event"),
        ({"escalations": 1}, "runtime's own escalations"),
        ({"mailbox": [event(T0, b"x")]}, "runtime's own mailbox"),
        ({"held_calls": [ActivationRecord.ModelCall(cache_key="c")]}, "runtime's own held_calls"),
    ],
)
def test_a_continuation_an_agent_builds_out_of_shape_is_a_contract_breach(fields, why):
    h = Harness(_Builds(**fields), config=_ESCALATE)
    h.send(event(T0, b"go"))
    (refused,) = h.values(ERRORS)
    assert refused.reason == "agent_contract" and why in refused.detail
    assert h.continuation is None and h.values("intents") == []
    assert h.timers[0].at_ms is None  # nothing is due


# Generated: hostile Continuations and usage, stored or restored, then every kind of input ----

_INT64 = st.sampled_from([0, 1, -1, T0, T0 + 10, -(2**63), 2**63 - 1, 2**53, SEQ])
_UINT32 = st.sampled_from([0, 1, 2**30, 2**31, 2**32 - 1])


@st.composite
def _hostile_state(draw):
    ids = draw(st.lists(st.sampled_from(["i-0", "i-1"]), max_size=2))
    suspended = _suspended(
        seq=draw(_INT64),
        step_index=draw(_UINT32),
        pending_intent_ids=ids,
        deadline_ms=draw(_INT64),
        escalations=draw(_UINT32),
        resume_failures=draw(_UINT32),
        retry_at_ms=draw(_INT64),
        mailbox=[event(T0 + i, b"7") for i in range(draw(st.integers(0, 2)))],
    )
    intents = [_intent(i) for i in ids] if draw(st.booleans()) else []
    cache = LlmCacheBlob(
        state_schema_version=CURRENT_STATE_SCHEMA_VERSION,
        input_tokens=draw(_INT64),
        token_allowance=draw(_INT64),
        budget_grants=draw(_UINT32),
    )
    return suspended, intents, cache


@settings(
    max_examples=60,
    derandomize=True,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(
    state=_hostile_state(),
    restored=st.booleans(),
    policy=st.sampled_from(list(AtDeadline)),
)
def test_no_hostile_continuation_or_usage_stored_or_restored_fails_an_input(
    state, restored, policy
):
    suspended, intents, cache = state
    config = RuntimeConfig(
        deadline_policy=DeadlinePolicy(action=policy),
        budget=Budget(key_tokens=10, on_exceed=OnBudget.ASK, raise_tokens=5),
    )
    h = Harness(refund, llm=summarise(""), config=config)
    if restored:
        h.restore(
            StateSnapshot(
                entity_key=KEY,
                snapshot_at_ms=T0,
                continuation=suspended,
                pending=intents,
                llm_cache=cache,
            )
        )
    else:
        _stored(h, suspended, intents, cache)
    for _ in range(2):
        if h.timers[0].at_ms is not None:
            h.fire_deadline()
    h.send(event(T0 + 5, b"2"))
    if h.timers[1].at_ms is not None:
        h.fire_ttl()
    assert {record.reason for record in h.values(ERRORS)} <= set(REASONS)


@settings(max_examples=40, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    seq=_INT64,
    step=_UINT32,
    ids=st.lists(st.sampled_from(["mine", "someone-elses"]), max_size=2),
    retry=_INT64,
    escalations=_UINT32,
    mailbox=st.integers(0, 1),
    policy=st.sampled_from(list(AtDeadline)),
)
def test_no_continuation_an_agent_builds_fails_an_input(
    seq, step, ids, retry, escalations, mailbox, policy
):
    fields = {"seq": seq, "step_index": step, "retry_at_ms": retry, "escalations": escalations}
    if ids:
        fields["pending_intent_ids"] = ids
    if mailbox:
        fields["mailbox"] = [event(T0, b"x")]
    h = Harness(_Builds(**fields), config=RuntimeConfig(deadline_policy=DeadlinePolicy(policy)))
    h.send(event(T0, b"go"))
    for _ in range(2):
        if h.timers[0].at_ms is not None:
            h.fire_deadline()
    assert {record.reason for record in h.values(ERRORS)} <= set(REASONS)
