"""External events through RunAgent's DoFn in a real pipeline (the DirectRunner, or the runner
$BEAM_AGENTS_PIPELINE_OPTIONS names): an event stamped far ahead neither wipes the key's dedupe
marks nor pins its TTL, a snapshot whose dedupe marks are malformed is refused, and an event
queued behind a suspension runs at the time its mailbox drains."""

from __future__ import annotations

import apache_beam as beam

from beam_agents._protos import AgentEnvelope, MemoryBlob, StateSnapshot
from beam_agents.intents.identity import intent_id
from beam_agents.ops.rounds import Advance, run_round
from beam_agents.runtime import RuntimeConfig
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION
from beam_agents.testing.probe import (
    DAY,
    FAR,
    KEY,
    SEQ,
    T0,
    command,
    event,
    export,
    probe,
    result,
)

YEAR = 365 * DAY
HOUR = 60 * 60 * 1000


class _Claimed(beam.PTransform):
    """RunAgent behind a transport that stamps each record at its arrival (the pipeline's
    element timestamp) while the envelope claims a time of its own: `claims` maps an arrival
    time to the event time its envelope says."""

    def __init__(self, claims: dict[int, int], agent: beam.PTransform) -> None:
        super().__init__()
        self._claims = claims
        self._agent = agent

    def expand(self, inputs):
        envelopes = inputs["envelopes"] | beam.Map(_claim, self._claims)
        return {"envelopes": envelopes, "snapshots": inputs["snapshots"]} | self._agent


def _claim(data: bytes, claims: dict[int, int]) -> bytes:
    envelope = AgentEnvelope.FromString(data)
    envelope.event_time_ms = claims.get(envelope.event_time_ms, envelope.event_time_ms)
    return envelope.SerializeToString(deterministic=True)


def test_a_copy_of_an_event_after_one_stamped_far_ahead_does_not_pay_again(tmp_path):
    """The key waits on the refund; an event whose sender's clock is ten years ahead, and
    later a redelivered copy of the refund's event, queue behind it. Had the far event cut the
    key's dedupe marks, the copy would run when the answer comes, under a new seq: a second
    refund."""
    refund = b'{"calls": ["payments.refund"], "deadline_ms": %d}' % (T0 + 100)
    outputs = run_round(
        _Claimed(
            {T0 + 1: T0 + 10 * YEAR, T0 + 2: T0},
            probe(RuntimeConfig(ttl_ms=30 * DAY)),
        ),
        [
            event(T0, refund),
            command(T0 + 1, put={"clock": "wrong"}),  # claims T0 + 10 years
            event(T0 + 2, refund),  # redelivered: claims T0, as the first
            result(T0 + 3, intent_id(KEY, SEQ, 0)),
            Advance(T0 + 61 * DAY),  # the far event kept the key one TTL longer at most
            export(T0 + 61 * DAY + 1, "idle"),
        ],
        tmp_path,
    )
    refunds = [i for i in outputs.values("intents") if i.tool_name == "payments.refund"]
    assert [i.intent_id for i in refunds] == [intent_id(KEY, SEQ, 0)]
    assert outputs.values("completions") == [
        b'[["payments.refund", "OK"], ["escalations", 0]]',
        b"done",
    ]
    (idle,) = outputs.values("snapshots")
    assert not idle.HasField("memory")  # wiped by its TTL
    assert outputs.values("errors") == []


def test_a_snapshot_whose_dedupe_marks_are_torn_is_a_dead_letter_and_restores_nothing(tmp_path):
    memory = MemoryBlob(
        state_schema_version=CURRENT_STATE_SCHEMA_VERSION,
        last_activity_ms=T0,
        event_marks=bytes(24 + 5),
    )
    snapshot = StateSnapshot(
        state_schema_version=CURRENT_STATE_SCHEMA_VERSION,
        entity_key=KEY,
        seq=SEQ,
        snapshot_at_ms=T0,
        memory=memory,
    )
    outputs = run_round(
        probe(), [snapshot, Advance(T0 + 1), export(T0 + 2, "after")], tmp_path
    ).before(T0 + 3)
    (refused,) = outputs.values("errors")
    assert refused.reason == "invalid_snapshot" and "event_marks" in refused.detail
    (after,) = outputs.values("snapshots")
    assert not after.HasField("memory") and after.seq == 0


def test_an_event_queued_past_an_intent_ttl_emits_intents_that_can_still_run(tmp_path):
    drained_at = T0 + 2 * HOUR
    approval = AgentEnvelope(entity_key=KEY, event_time_ms=drained_at)
    approval.approval.intent_id = intent_id(KEY, SEQ, 0)
    approval.approval.approved = True
    outputs = run_round(
        probe(RuntimeConfig(intent_ttl_ms=HOUR)),
        [
            command(T0, approval=True, deadline_ms=FAR),
            command(T0 + 1, calls=["payments.refund"], deadline_ms=FAR),  # queued
            approval,  # the suspension ends: the queued event runs now
        ],
        tmp_path,
    ).before(drained_at + 1)
    (refund,) = [i for i in outputs.values("intents") if i.tool_name == "payments.refund"]
    assert refund.created_at_ms == drained_at
    assert refund.expires_at_ms == drained_at + HOUR
    assert refund.seq == SEQ + 1
    assert outputs.values("errors") == []
