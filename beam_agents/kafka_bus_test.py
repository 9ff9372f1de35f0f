"""The Kafka loop's pieces on a real broker: the effector service commits an intent only after
its result is acknowledged, and a redelivered intent never runs its tool again."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from beam_agents._protos import AgentEnvelope, ExecutionRecord, ToolIntent, ToolResult
from beam_agents.core.intent import content_digest
from beam_agents.core.signing import Keyring, sign
from beam_agents.effector import Effector, Route, VerifyMode, _process_start
from beam_agents.kafka_bus import (
    EffectorService,
    KafkaBusError,
    TopicReader,
    Topics,
    create_topics,
    decode_dead_letter,
    produce,
)
from beam_agents.testing.engines import Engines
from beam_agents.testing.samples import intent

RING = Keyring({"k1": bytes(range(32))}, active="k1")
FAR = 2**62  # an expiry no test reaches


@pytest.mark.parametrize("prefix", ["", "has space", "slash/", "x" * 201, "ünï"])
def test_a_topic_prefix_kafka_would_refuse_is_refused_before_any_broker_sees_it(prefix):
    with pytest.raises(ValueError, match="no topic prefix"):
        Topics(prefix)


@pytest.fixture(scope="module")
def bootstrap():
    engines = Engines()
    try:
        yield engines.up(["kafka"]).endpoints["KAFKA_BOOTSTRAP"]
    finally:
        engines.down()


class Calls:
    def __init__(self) -> None:
        self.intent_ids: list[str] = []

    def __call__(self, args: dict, tool_intent: ToolIntent) -> bytes:
        self.intent_ids.append(tool_intent.intent_id)
        return f"looked up {args['id']}".encode()


def _service(bootstrap, topics, store, calls, **options) -> EffectorService:
    effector = Effector({"crm.lookup": calls}, mode=VerifyMode.REQUIRE, store=store, keyring=RING)
    return EffectorService(
        effector,
        bootstrap_servers=bootstrap,
        topics=topics,
        group_id=f"{topics.prefix}.fx",
        **options,
    )


def _serve_until(service: EffectorService, count: int) -> list[Route]:
    routes: list[Route] = []
    deadline = time.monotonic() + 60
    while len(routes) < count:
        assert time.monotonic() < deadline, f"served {routes} of {count}"
        route = service.serve_one()
        if route is not None:
            routes.append(route)
    return routes


def _fresh_topics(bootstrap) -> Topics:
    topics = Topics(f"fx-{time.time_ns()}")
    create_topics(bootstrap, topics)
    return topics


def _intent(intent_id: str, entity: bytes) -> ToolIntent:
    return sign(
        intent(intent_id=intent_id, entity_key=entity, expires_at_ms=FAR, args_json='{"id":7}'),
        RING,
    )


@pytest.mark.engines
def test_a_redelivered_intent_gets_the_first_result_and_never_runs_twice(bootstrap, tmp_path):
    topics = _fresh_topics(bootstrap)
    store = tmp_path / "effector.sqlite"
    calls = Calls()
    first = _intent("i-1", b"c-1")
    # A service that ran the tool and died before its result was acknowledged: the record is
    # in the store, the offset was never committed.
    crashed = Effector({"crm.lookup": calls}, mode=VerifyMode.REQUIRE, store=store, keyring=RING)
    assert crashed(first).ran_tool
    produce(bootstrap, [(topics.intents, b"c-1", first, 1)])
    service = _service(bootstrap, topics, store, calls)
    try:
        assert _serve_until(service, 1) == [Route.DUPLICATE]
    finally:
        service.close()
    # The same intent again, and another entity's intent: one more run, two more results.
    second = _intent("i-2", b"c-2")
    produce(bootstrap, [(topics.intents, b"c-1", first, 2), (topics.intents, b"c-2", second, 3)])
    restarted = _service(bootstrap, topics, store, calls)
    try:
        # The committed offset holds: the restarted service starts after the first copy.
        assert _serve_until(restarted, 2) == [Route.DUPLICATE, Route.RESULT]
    finally:
        restarted.close()
    assert calls.intent_ids == ["i-1", "i-2"]
    reader = TopicReader(bootstrap, [topics.events])
    try:
        records = reader.read(lambda r: len(r[topics.events]) >= 3, 30)[topics.events]
        reader.settle(1)
    finally:
        reader.close()
    results = [(k, AgentEnvelope.FromString(v).tool_result) for k, v in records]
    assert len(results) == 3
    assert [(k, r.intent_id) for k, r in results] == [
        (b"c-1", "i-1"),
        (b"c-1", "i-1"),
        (b"c-2", "i-2"),
    ]
    # Each entity gets its own result, and a redelivery the first one, byte for byte.
    assert results[0][1] == results[1][1] and results[0][1].status == ToolResult.OK
    assert results[2][1].payload == b"looked up 7"


@pytest.mark.engines
def test_a_result_the_broker_does_not_take_leaves_the_intent_uncommitted(bootstrap, tmp_path):
    from confluent_kafka.admin import AdminClient, NewTopic

    topics = _fresh_topics(bootstrap)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topics.events])[topics.events].result(30)
    store, calls = tmp_path / "effector.sqlite", Calls()
    produce(bootstrap, [(topics.intents, b"c-1", _intent("i-4", b"c-1"), 1)])
    # The broker creates no topics on its own: the result has nowhere to go.
    failing = _service(
        bootstrap, topics, store, calls, producer_config={"message.timeout.ms": 3000}
    )
    with pytest.raises(KafkaBusError, match="not acknowledged"):
        _serve_until(failing, 1)
    failing.close()  # closing commits nothing: the offset stays where it was
    admin.create_topics([NewTopic(topics.events, 1, 1)])[topics.events].result(30)
    restarted = _service(bootstrap, topics, store, calls)
    try:
        assert _serve_until(restarted, 1) == [Route.DUPLICATE]
    finally:
        restarted.close()
    assert calls.intent_ids == ["i-4"]  # ran before the failed delivery, never again
    reader = TopicReader(bootstrap, [topics.events])
    try:
        reader.read(lambda r: len(r[topics.events]) >= 1, 30)
        (record,) = reader.settle(1)[topics.events]
    finally:
        reader.close()
    assert AgentEnvelope.FromString(record[1]).tool_result.payload == b"looked up 7"


@pytest.mark.engines
def test_refused_intents_become_dead_letters_on_the_topic_and_are_committed(bootstrap, tmp_path):
    topics = _fresh_topics(bootstrap)
    calls = Calls()
    unsigned = intent(intent_id="i-3", entity_key=b"c-3", expires_at_ms=FAR)
    produce(bootstrap, [(topics.intents, b"c-3", unsigned, 1)])
    produce(bootstrap, [(topics.intents, b"c-3", b"\xff\xfe not a ToolIntent", 2)])
    service = _service(bootstrap, topics, tmp_path / "effector.sqlite", calls)
    try:
        assert _serve_until(service, 2) == [Route.DEAD_LETTER, Route.DEAD_LETTER]
        assert service.serve_one() is None  # both committed: nothing comes again
    finally:
        service.close()
    reader = TopicReader(bootstrap, [topics.dead_letters])
    try:
        records = reader.read(lambda r: len(r[topics.dead_letters]) >= 2, 30)[topics.dead_letters]
    finally:
        reader.close()
    # The errors-sink convention: each record inside an envelope's external_event.
    envelopes = [AgentEnvelope.FromString(v) for _, v in records]
    assert [e.entity_key for e in envelopes] == [b"c-3", b""]
    reasons = [decode_dead_letter(v).reason for _, v in records]
    assert reasons == ["signature_unsigned", "undecodable_intent"]
    assert calls.intent_ids == []


@pytest.mark.engines
def test_an_intent_another_live_effector_holds_is_answered_once_that_effector_dies(
    bootstrap, tmp_path
):
    """The in-flight copy is never committed as done: while the claimant lives the service
    reads it again; once it is gone, the service answers it (outcome unknown) without running
    the tool."""
    topics = _fresh_topics(bootstrap)
    store, calls = tmp_path / "effector.sqlite", Calls()
    held = _intent("i-9", b"c-9")
    claimant = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        pid = claimant.pid
        planted = Effector({}, mode=VerifyMode.OFF, store=store)
        planted.store.claim(
            ExecutionRecord(
                intent_id="i-9",
                entity_key=b"c-9",
                content_digest=content_digest(held.SerializeToString(deterministic=True)),
                outcome=ExecutionRecord.OUTCOME_RUNNING,
                latest_expires_at_ms=held.expires_at_ms,
                claimed_by=f"{pid}:{_process_start(pid)}:planted",
            ),
            FAR,
        )
        produce(bootstrap, [(topics.intents, b"c-9", held, 1)])
        service = _service(bootstrap, topics, store, calls)
        try:
            assert _serve_until(service, 2) == [Route.IN_FLIGHT, Route.IN_FLIGHT]
            claimant.kill()
            claimant.wait()
            assert _serve_until(service, 1) == [Route.RESULT]
        finally:
            service.close()
    finally:
        claimant.kill()
    assert calls.intent_ids == []
    reader = TopicReader(bootstrap, [topics.events])
    try:
        reader.read(lambda r: len(r[topics.events]) >= 1, 30)
        (record,) = reader.settle(1)[topics.events]
    finally:
        reader.close()
    result = AgentEnvelope.FromString(record[1]).tool_result
    assert result.status == ToolResult.ERROR and result.error_message.startswith("outcome unknown")


def test_a_producers_idempotency_header_drops_a_second_copy_through_the_loops_read_path():
    """Records as ReadFromKafka gives them with their metadata, through the loop's own read
    step and RunAgent: a copy re-sent with the same idempotency header runs once, though its
    bytes (a re-stamped time) differ; a record without the header still runs."""
    import apache_beam as beam
    from apache_beam.testing.util import assert_that, equal_to

    from beam_agents.kafka_bus import _RecordValues
    from beam_agents.runtime import COMPLETIONS, RunAgent, agent

    @agent(name="tests.echo/v1")
    def echo(ctx, event: bytes) -> bytes:
        return b"echo " + event

    def record(at: int, data: bytes, key: bytes | None):
        value = AgentEnvelope(entity_key=b"c-1", event_time_ms=at, external_event=data)
        headers = [] if key is None else [beam.Row(key="idempotency-key", value=key)]
        return beam.Row(key=b"c-1", value=value.SerializeToString(), headers=headers)

    with beam.Pipeline() as pipeline:
        values = (
            pipeline
            | beam.Create(
                [
                    record(1, b"refund 42", b"order-42"),
                    record(2, b"refund 42", b"order-42"),
                    record(3, b"other", None),
                ],
                reshuffle=False,
            )
            | beam.ParDo(_RecordValues("idempotency-key")).with_outputs("errors", main="values")
        )
        outputs = values.values | RunAgent(echo)
        assert_that(
            outputs[COMPLETIONS] | beam.Values(), equal_to([b"echo refund 42", b"echo other"])
        )
