"""Due times (machine_deadlines): a retry's timer comes before the deadline it postpones, and
escalations keep a key waiting per suspension without standing in the way of the agent's own
answers. Each test drives KeyMachine through `testing.machine_harness`.
"""

from __future__ import annotations

import json

import pytest

from beam_agents._protos import ToolResult
from beam_agents.errors import BeamAgentsError, RuntimeConfigError
from beam_agents.intents.effector import Effector, VerifyMode
from beam_agents.ops.rounds import ManualClock
from beam_agents.runtime import AtDeadline, DeadlinePolicy, RuntimeConfig
from beam_agents.testing.effectors import Recording
from beam_agents.testing.machine_harness import (
    T0,
    DownOnce,
    Harness,
    answer,
    approve,
    asks,
    event,
    parallel,
    pending,
    refund,
)
from beam_agents.testing.probe import Probe, command


def test_a_deadline_past_a_failed_resume_does_not_expire_the_answered_intent():
    config = RuntimeConfig(
        resume_backoff_ms=10**7,
        resume_backoff_max_ms=10**7,
        suspend_deadline_ms=100,
        intent_ttl_ms=100,
    )
    h = Harness(refund, llm=DownOnce(1), config=config)
    h.send(event(T0, b"10"))
    (paid,) = pending(h)
    h.send(answer(T0 + 5, paid))
    # The timer is due at the retry, not at the (earlier) deadline: nothing expires.
    assert h.timers[0].at_ms == T0 + 5 + 10**7
    stale = h.fire_deadline(T0 + 100)
    assert stale.outputs == [] and stale.counters == ["stale_deadline_timers"]
    h.fire_deadline()
    assert h.values("completions") == [b"summary of ok after 1 visit(s)"]


# Point 11: escalation --------------------------------------------------------------------------


def _escalating(max_escalations=1):
    policy = DeadlinePolicy(AtDeadline.ESCALATE, max_escalations=max_escalations, extension_ms=50)
    return RuntimeConfig(deadline_policy=policy, suspend_deadline_ms=10, intent_ttl_ms=10)


def test_the_agents_own_answers_resume_it_while_an_escalation_is_pending():
    h = Harness(parallel, config=_escalating())
    h.send(event(T0, b"go"))
    first, second, third = pending(h)
    h.fire_deadline()  # escalates
    assert len(pending(h)) == 4
    for intent in (first, second, third):
        h.send(answer(T0 + 20, intent, intent.tool_name.encode()))
    assert h.values("completions") == [b"a.tool,b.tool,c.tool"]


def test_a_declined_escalation_resumes_the_agent_at_once_with_its_calls_expired():
    # The person chose not to wait: the agent goes on now, told that each call it waits for
    # expired, instead of waiting out the extension.
    h = Harness(parallel, config=_escalating())
    h.send(event(T0, b"go"))
    h.fire_deadline()  # escalates
    escalation = pending(h)[3]
    h.send(approve(T0 + 20, escalation, approved=False))
    assert h.values("completions") == [b",,"]  # three EXPIRED answers, no payloads
    assert h.continuation is None and pending(h) == []


def test_escalations_are_counted_per_suspension_and_never_asked_about_nothing():
    h = Harness(asks, config=_escalating())
    h.send(event(T0, b"1"))
    (question,) = pending(h)
    h.fire_deadline()  # escalation 1 of 1
    escalation = pending(h)[1]
    h.send(approve(T0 + 20, escalation))  # keep waiting
    # Kept with the suspension: the extension was granted, and not asked again.
    assert [a.approval.intent_id for a in h.continuation.answers] == [escalation.intent_id]
    h.send(approve(T0 + 30, question))
    h.send(event(T0 + 40, b"2"))
    assert h.continuation.escalations == 0  # a new suspension starts at 0
    h.fire_deadline()
    assert h.continuation.escalations == 1


def test_a_deadline_past_what_json_holds_escalates_at_the_end_of_json_time():
    # suspend_deadline_ms set huge to mean "wait for ever": the timer fires at the end of time
    # (a bounded run, replay, a drain), and canonical JSON holds no integer past 2**53 - 1.
    policy = DeadlinePolicy(AtDeadline.ESCALATE, max_escalations=3, extension_ms=50)
    h = Harness(parallel, config=RuntimeConfig(deadline_policy=policy, suspend_deadline_ms=2**62))
    h.send(event(T0, b"go"))
    h.fire_deadline()
    (escalation,) = [i for i in h.values("intents") if i.kind == i.APPROVAL]
    assert json.loads(escalation.args_json)["deadline_ms"] == 2**53 - 1
    assert h.continuation.escalations == 1
    assert not h.values("errors")


# Issue 37, point 3: EXPIRED never answers a call the effector may still run --------------------


def test_a_suspend_deadline_shorter_than_the_intent_ttl_is_a_config_error():
    with pytest.raises(RuntimeConfigError) as raised:
        RuntimeConfig(suspend_deadline_ms=10, intent_ttl_ms=11)
    assert raised.value.field == "suspend_deadline_ms"
    assert isinstance(raised.value, BeamAgentsError)
    RuntimeConfig(suspend_deadline_ms=10, intent_ttl_ms=10)  # equal: expired at the effector


def _effector_run_at(intent, now_ms: int, path) -> tuple[int, list]:
    """What a real Effector on a SQLite file does with `intent` at `now_ms`: its result's
    status and the tool's calls."""
    calls = Recording()
    effector = Effector(
        {intent.tool_name: calls}, mode=VerifyMode.OFF, store=path, clock=ManualClock(now_ms)
    )
    return effector(intent).result.tool_result.status, calls.calls


def test_a_deadline_the_agent_names_before_its_intents_expire_waits_until_the_effector_refuses(
    tmp_path,
):
    h = Harness(Probe(), config=RuntimeConfig(intent_ttl_ms=1000, suspend_deadline_ms=1000))
    h.send(command(T0, calls=["a.tool"], deadline_ms=T0 + 10))
    (intent,) = pending(h)
    # The effector still runs the call one ms before its expiry: no deadline may come first.
    status, ran = _effector_run_at(intent, intent.expires_at_ms - 1, tmp_path / "late.db")
    assert status == ToolResult.OK and ran == [intent.intent_id]
    assert h.continuation.deadline_ms == intent.expires_at_ms == h.timers[0].at_ms
    # At the deadline the effector refuses it: EXPIRED is then the truth.
    status, ran = _effector_run_at(intent, h.timers[0].at_ms, tmp_path / "due.db")
    assert status == ToolResult.EXPIRED and ran == []
    h.fire_deadline()
    assert h.values("completions") == [b'[["a.tool", "EXPIRED"], ["escalations", 0]]']


def test_a_restored_suspension_whose_deadline_precedes_its_intents_expiry_waits_for_them():
    # State written before deadlines were bounded (or built by hand): the timer at the old
    # deadline extends it to the intents' expiry, and an answer until then is taken.
    h = Harness(Probe(), config=RuntimeConfig(intent_ttl_ms=1000, suspend_deadline_ms=1000))
    h.send(command(T0, calls=["a.tool"]))
    snapshot = h.export(T0 + 1)
    snapshot.continuation.deadline_ms = T0 + 10
    restored = Harness(Probe(), config=RuntimeConfig(intent_ttl_ms=1000, suspend_deadline_ms=1000))
    restored.restore(snapshot)
    (intent,) = pending(restored)
    effects = restored.fire_deadline()
    assert effects.outputs == []
    assert restored.continuation.deadline_ms == intent.expires_at_ms == restored.timers[0].at_ms
    restored.send(answer(T0 + 500, intent))
    assert restored.values("completions") == [b'[["a.tool", "OK"], ["escalations", 0]]']


def test_a_deadline_at_the_end_of_time_fires_once_though_its_intents_expire_after_it():
    # Saturated at int64's end, the intent's expiry lies past the last time a timer can fire:
    # waiting for it would set the timer that just fired again, for ever.
    h = Harness(Probe())
    h.send(command(2**63 - 1, calls=["a.tool"]))
    h.fire_deadline()
    assert h.values("completions") == [b'[["a.tool", "EXPIRED"], ["escalations", 0]]']
