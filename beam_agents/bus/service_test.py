"""The effector service on a real broker: it commits an intent only after its result is
acknowledged, a redelivered intent never runs its tool again, and effectors killed inside tools,
in the approval window or as static members lose nothing. Engines only (`-m engines`)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from beam_agents._protos import AgentEnvelope, ExecutionRecord, ToolIntent, ToolResult
from beam_agents.bus import (
    EffectorService,
    TopicReader,
    decode_dead_letter,
    produce,
)
from beam_agents.bus.service import _Batch
from beam_agents.intents.effector import (
    INQUIRY_SUFFIX,
    INQUIRY_TOOL,
    Effector,
    Route,
    SqliteExecutionStore,
    VerifyMode,
)
from beam_agents.intents.identity import content_digest
from beam_agents.intents.signing import Keyring, sign
from beam_agents.ops.processes import Launched
from beam_agents.testing.broker import fresh_topics, kafka_bootstrap, now_ms
from beam_agents.testing.chaos import APPROVER_RING, Ledger
from beam_agents.testing.samples import intent

RING = Keyring({"k1": bytes(range(32))}, active="k1")
FAR = 2**62  # an expiry no test reaches


@pytest.fixture(scope="module")
def bootstrap():
    with kafka_bootstrap() as servers:
        yield servers


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
        routes.extend(service.serve())
    return routes


def _uncommitted(bootstrap: str, topics, group: str) -> int:
    """How many intents the group has not committed: the intents topic's end minus the
    group's committed offset (partition 0, the only one)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (committed,) = consumer.committed([TopicPartition(topics.intents, 0)], timeout=10)
        _, end = consumer.get_watermark_offsets(TopicPartition(topics.intents, 0), timeout=10)
    finally:
        consumer.close()
    return end - max(committed.offset, 0)


def _intent(intent_id: str, entity: bytes) -> ToolIntent:
    return sign(
        intent(intent_id=intent_id, entity_key=entity, expires_at_ms=FAR, args_json='{"id":7}'),
        RING,
    )


class _Message:
    """What a batch reads of a consumed message."""

    def __init__(self, topic: str, partition: int, offset: int, epoch: int | None = 4) -> None:
        self._at = (topic, partition, offset, epoch)

    def topic(self) -> str:
        return self._at[0]

    def partition(self) -> int:
        return self._at[1]

    def offset(self) -> int:
        return self._at[2]

    def leader_epoch(self) -> int | None:
        return self._at[3]

    def error(self):
        return None


def test_a_batch_commits_each_partition_to_its_last_finished_message_and_rewinds_the_rest():
    a = [_Message("intents", 0, n) for n in (10, 11, 12)]
    b = [_Message("intents", 1, n, epoch=None) for n in (7, 8)]
    batch = _Batch()
    batch.add(a[0], None)
    batch.hold(a[1])  # a[2] is skipped behind it: batch.holds(a[2])
    batch.add(b[0], None)
    assert batch.holds(a[2]) and not batch.holds(b[1])
    committed = {(t.topic, t.partition): (t.offset, t.leader_epoch) for t in batch.offsets()}
    assert committed == {("intents", 0): (11, 4), ("intents", 1): (8, None)}
    again = {(t.topic, t.partition): t.offset for t in batch.unfinished([*a, *b])}
    assert again == {("intents", 0): 11, ("intents", 1): 8}
    # A batch that failed finished nothing: every partition from its first message.
    again = {(t.topic, t.partition): t.offset for t in _Batch().unfinished([*a, *b])}
    assert again == {("intents", 0): 10, ("intents", 1): 7}
    assert batch.routes == [Route.IN_FLIGHT] and batch.in_flight


@pytest.mark.engines
def test_a_redelivered_intent_gets_the_first_result_and_never_runs_twice(bootstrap, tmp_path):
    topics = fresh_topics(bootstrap)
    store = tmp_path / "effector.sqlite"
    calls = Calls()
    first = _intent("i-1", b"c-1")
    # A service that ran the tool and died before its result was acknowledged: the record is
    # in the store, the offset was never committed.
    crashed = Effector({"crm.lookup": calls}, mode=VerifyMode.REQUIRE, store=store, keyring=RING)
    assert crashed(first).ran_tool
    produce(bootstrap, [(topics.intents, b"c-1", first, now_ms())])
    service = _service(bootstrap, topics, store, calls)
    try:
        assert _serve_until(service, 1) == [Route.DUPLICATE]
    finally:
        service.close()
    # The same intent again, and another entity's intent: one more run, two more results.
    second = _intent("i-2", b"c-2")
    produce(
        bootstrap,
        [(topics.intents, b"c-1", first, now_ms()), (topics.intents, b"c-2", second, now_ms())],
    )
    restarted = _service(bootstrap, topics, store, calls)
    try:
        # The committed offset holds: the restarted service starts after the first copy.
        assert _serve_until(restarted, 2) == [Route.DUPLICATE, Route.RESULT]
    finally:
        restarted.close()
    assert calls.intent_ids == ["i-1", "i-2"]
    reader = TopicReader(bootstrap, [topics.events], dedupe=False)
    deduping = TopicReader(bootstrap, [topics.events])
    try:
        records = reader.read(lambda r: len(r[topics.events]) >= 3, 30)[topics.events]
        reader.settle(1)
        deduping.read(lambda r: len(r[topics.events]) >= 2, 30)
        deduping.settle(1)
    finally:
        reader.close()
        deduping.close()
    # The redelivery's result is the same record again: a deduping consumer sees it once.
    assert reader.repeats[topics.events] == deduping.repeats[topics.events] == 1
    assert deduping.records[topics.events] == [records[0], records[2]]
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
def test_a_result_the_broker_does_not_take_is_retried_and_the_intent_stays_uncommitted(
    bootstrap, tmp_path
):
    from confluent_kafka.admin import AdminClient, NewTopic

    topics = fresh_topics(bootstrap)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topics.events])[topics.events].result(30)
    store, calls = tmp_path / "effector.sqlite", Calls()
    produce(bootstrap, [(topics.intents, b"c-1", _intent("i-4", b"c-1"), now_ms())])
    # The broker creates no topics on its own: the result has nowhere to go, for now.
    failing = _service(
        bootstrap, topics, store, calls, producer_config={"message.timeout.ms": 3000}
    )
    deadline = time.monotonic() + 60
    while not calls.intent_ids:
        assert time.monotonic() < deadline
        assert failing.serve() == []
    # Not acknowledged, a retriable failure: the service backs off and reads the intent again
    # (the store answers it: no second run), never exits and never commits it.
    retried = time.monotonic() + 8
    while time.monotonic() < retried:
        assert failing.serve() == []
    assert failing._backoff_s > 0
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
    topics = fresh_topics(bootstrap)
    calls = Calls()
    unsigned = intent(intent_id="i-3", entity_key=b"c-3", expires_at_ms=FAR)
    produce(bootstrap, [(topics.intents, b"c-3", unsigned, now_ms())])
    produce(bootstrap, [(topics.intents, b"c-3", b"\xff\xfe not a ToolIntent", now_ms())])
    service = _service(bootstrap, topics, tmp_path / "effector.sqlite", calls)
    try:
        assert _serve_until(service, 2) == [Route.DEAD_LETTER, Route.DEAD_LETTER]
    finally:
        service.close()
    assert _uncommitted(bootstrap, topics, f"{topics.prefix}.fx") == 0
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


def _plant_claim(store, held: ToolIntent) -> None:
    """Records `held` as running in another effector, its lease renewed as long as the test
    needs (until `_lapse`)."""
    SqliteExecutionStore(store).claim(
        ExecutionRecord(
            intent_id=held.intent_id,
            entity_key=held.entity_key,
            content_digest=content_digest(held.SerializeToString(deterministic=True)),
            outcome=ExecutionRecord.OUTCOME_RUNNING,
            latest_expires_at_ms=held.expires_at_ms,
            claimed_by="planted",
            lease_owner="planted",
            lease_expires_at_ms=FAR,
        ),
        FAR,
    )


def _lapse(store, held: ToolIntent) -> None:
    """The effector of a planted claim dies: the lease it last renewed expires."""
    shared = SqliteExecutionStore(store)
    claim = shared.get(held.intent_id)
    lapsed = ExecutionRecord()
    lapsed.CopyFrom(claim)
    lapsed.lease_expires_at_ms = now_ms() - 1
    assert shared.replace(lapsed, claim, FAR)


@pytest.mark.engines
def test_an_intent_another_live_effector_holds_is_answered_once_that_effector_dies(
    bootstrap, tmp_path
):
    """The in-flight copy is never committed as done: while the claimant's lease holds the
    service reads it again; once it expired (its effector died), the service asks a person
    what happened (the tool is a plain one) without running the tool, and tells the agent
    nothing yet."""
    topics = fresh_topics(bootstrap)
    store, calls = tmp_path / "effector.sqlite", Calls()
    held = _intent("i-9", b"c-9")
    _plant_claim(store, held)
    produce(bootstrap, [(topics.intents, b"c-9", held, now_ms())])
    service = _service(bootstrap, topics, store, calls)
    try:
        assert _serve_until(service, 2) == [Route.IN_FLIGHT, Route.IN_FLIGHT]
        _lapse(store, held)
        assert _serve_until(service, 1) == [Route.APPROVAL]
    finally:
        service.close()
    assert calls.intent_ids == []
    reader = TopicReader(bootstrap, [topics.events, topics.approvals])
    try:
        reader.read(lambda r: len(r[topics.approvals]) >= 1, 30)
        records = reader.settle(1)
    finally:
        reader.close()
    assert records[topics.events] == []
    (inquiry,) = [ToolIntent.FromString(v) for _, v in records[topics.approvals]]
    assert inquiry.intent_id == "i-9" + INQUIRY_SUFFIX and inquiry.kind == ToolIntent.APPROVAL


@pytest.mark.engines
def test_a_held_intent_holds_back_the_intents_after_it_and_a_batch_commits_what_it_answered(
    bootstrap, tmp_path
):
    """Intents are served in batches, one commit each: an intent another live effector holds
    stops its partition there (the one after it waits, in order, while the one before it is
    answered and committed), and a burst of intents takes a few polls and is all committed."""
    topics = fresh_topics(bootstrap)
    store, calls = tmp_path / "effector.sqlite", Calls()
    before, held, after = (_intent(f"i-{n}", b"c-%d" % n) for n in (1, 2, 3))
    _plant_claim(store, held)
    produce(bootstrap, [(topics.intents, i.entity_key, i, now_ms()) for i in (before, held, after)])
    service = _service(bootstrap, topics, store, calls)
    try:
        routes = _serve_until(service, 4)
        assert routes[0] == Route.RESULT and set(routes[1:]) == {Route.IN_FLIGHT}
        assert calls.intent_ids == ["i-1"]  # i-3 waits behind i-2
    finally:
        service.close()
    # What the batches finished is committed, the held intent and the one after it not.
    assert _uncommitted(bootstrap, topics, f"{topics.prefix}.fx") == 2
    service = _service(bootstrap, topics, store, calls)
    try:
        assert _serve_until(service, 1)[0] == Route.IN_FLIGHT  # i-1 is not read again
        _lapse(store, held)
        routes = _serve_until(service, 2)
        assert routes[-2:] == [Route.APPROVAL, Route.RESULT], routes
    finally:
        service.close()
    assert calls.intent_ids == ["i-1", "i-3"]
    # Many intents at once: served in a few polls, each answered once, all committed.
    many = [_intent(f"m-{n}", b"c-%d" % n) for n in range(200)]
    produce(bootstrap, [(topics.intents, i.entity_key, i, now_ms()) for i in many])
    service = _service(bootstrap, topics, store, calls)
    polls = []
    try:
        deadline = time.monotonic() + 60
        while sum(polls) < len(many):
            assert time.monotonic() < deadline, f"served {sum(polls)} of {len(many)}"
            polls.append(len(service.serve()))
    finally:
        service.close()
    assert len([n for n in polls if n]) <= 10, polls
    assert calls.intent_ids[2:] == [i.intent_id for i in many]
    assert _uncommitted(bootstrap, topics, f"{topics.prefix}.fx") == 0
    reader = TopicReader(bootstrap, [topics.events], dedupe=False)
    try:
        records = reader.read(lambda r: len(r[topics.events]) >= 202, 30)
        reader.settle(1)
    finally:
        reader.close()
    assert reader.repeats[topics.events] == 0 and len(records[topics.events]) == 202


def _chaos_service(bootstrap, topics, directory, log_name, **env) -> Launched:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return Launched.python(
            "beam_agents.testing.chaos",
            [bootstrap, topics.prefix, str(directory)],
            directory / f"{log_name}.log",
        )
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _served(service: Launched) -> list[str]:
    return [
        line.split(" ", 1)[1]
        for line in service.log.read_text().splitlines()
        if line.startswith("served ")
    ]


def _until_killed(service: Launched, timeout_s: float = 60) -> None:
    assert service.wait(timeout_s) == -signal.SIGKILL, service.log.read_text()[-2000:]
    service.stop()


def _tool_intent(name: str, entity: bytes, **fields) -> ToolIntent:
    return intent(
        intent_id=f"{name}-{entity.decode()}",
        entity_key=entity,
        tool_name=name,
        expires_at_ms=FAR,
        args_json='{"id":7}',
        **fields,
    )


@pytest.mark.engines
def test_effectors_killed_inside_tools_and_in_the_approval_window_lose_nothing(bootstrap, tmp_path):
    """A real service process SIGKILLed after each tool acted and before its result was sent,
    once after an approval was recorded and before its request was sent, and once after
    another approval's request was acknowledged and before its intent was committed: the
    idempotent tool runs again with the same key and the system keeps one effect, the
    reconciled one is found done and not run again, the plain one goes to a person whose
    answer becomes its result, the unsent request is sent on redelivery and the sent one sent
    again, a repeat a deduping consumer drops. No ERROR reaches the agent."""
    topics = fresh_topics(bootstrap)
    approval = _tool_intent("ask", b"c-4", kind=ToolIntent.APPROVAL)
    acknowledged = _tool_intent("ask", b"c-5", kind=ToolIntent.APPROVAL)
    for name in ("payments.refund", "crm.note", "mail.send"):
        (tmp_path / f"die-in-{name}").touch()
    (tmp_path / "die-after-approval").touch()
    (tmp_path / "die-after-request").touch()
    produce(
        bootstrap,
        [
            (topics.intents, b"c-1", _tool_intent("payments.refund", b"c-1"), now_ms()),
            (topics.intents, b"c-2", _tool_intent("crm.note", b"c-2"), now_ms()),
            (topics.intents, b"c-3", _tool_intent("mail.send", b"c-3"), now_ms()),
            (topics.intents, b"c-4", approval, now_ms()),
            (topics.intents, b"c-5", acknowledged, now_ms()),
        ],
    )
    # Five faults, five kills: each restart redelivers the uncommitted intent.
    for run in range(5):
        _until_killed(_chaos_service(bootstrap, topics, tmp_path, f"killed-{run}"))
    assert not list(tmp_path.glob("die-*"))
    service = _chaos_service(bootstrap, topics, tmp_path, "last")
    reader = TopicReader(bootstrap, [topics.events, topics.approvals])
    try:
        records = reader.read(
            lambda r: len(r[topics.events]) >= 2 and len(r[topics.approvals]) >= 3, 60
        )
        inquiry = next(
            ToolIntent.FromString(v)
            for _, v in records[topics.approvals]
            if ToolIntent.FromString(v).tool_name == INQUIRY_TOOL
        )
        # The person answers: it did take effect.
        answer = AgentEnvelope(entity_key=b"c-3", event_time_ms=5)
        answer.approval.intent_id = inquiry.intent_id
        answer.approval.approved = True
        answer.approval.approver = "ops"
        answer.approval.intent_digest = content_digest(inquiry.SerializeToString())
        answer.approval.CopyFrom(sign(answer.approval, APPROVER_RING))
        produce(bootstrap, [(topics.events, b"c-3", answer, now_ms())])
        records = reader.read(lambda r: len(r[topics.events]) >= 4, 60)
        reader.settle(2)
    finally:
        reader.close()
        service.stop()
    results = {}
    for _, value in records[topics.events]:
        envelope = AgentEnvelope.FromString(value)
        if envelope.HasField("tool_result"):
            results.setdefault(envelope.tool_result.intent_id, []).append(envelope.tool_result)
    # Once each, as a deduping consumer sees them; never an ERROR.
    assert sorted(results) == ["crm.note-c-2", "mail.send-c-3", "payments.refund-c-1"]
    assert all(len(r) == 1 and r[0].status == ToolResult.OK for r in results.values())
    # A person's "it took effect": OK, its payload unknown (Answer.payload_unknown), who said so
    # in the error_message (issue 37 item 19).
    confirmed = results["mail.send-c-3"][0]
    assert not confirmed.payload and "as ops confirmed" in confirmed.error_message
    # The approval request lost with the first process was sent by the restarted one; the one
    # acknowledged before its process died was sent again (with what else its batch had sent),
    # and a deduping consumer sees each request once.
    requests = [ToolIntent.FromString(v) for _, v in records[topics.approvals]]
    sent = [r.intent_id for r in requests]
    assert sorted(sent) == sorted({approval.intent_id, acknowledged.intent_id, inquiry.intent_id})
    raw = TopicReader(bootstrap, [topics.approvals], dedupe=False)
    try:
        raw.read(lambda r: len(r[topics.approvals]) >= 4, 30)
        copies = [ToolIntent.FromString(v).intent_id for _, v in raw.settle(1)[topics.approvals]]
    finally:
        raw.close()
    assert copies.count(acknowledged.intent_id) >= 2
    # The tools' own logs: refund called twice with one key and one effect; the others once.
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert sorted(calls) == [
        "crm.note crm.note-c-2",
        "mail.send mail.send-c-3",
        "payments.refund payments.refund-c-1",
        "payments.refund payments.refund-c-1",
    ]
    effects = [(e["tool"], e["key"]) for e in Ledger(tmp_path).effects()]
    assert sorted(effects) == [
        ("crm.note", "crm.note-c-2"),
        ("mail.send", "mail.send-c-3"),
        ("payments.refund", "payments.refund-c-1"),
    ]


def _first_served_after_restart(bootstrap, tmp_path, topics, name, **env) -> float:
    """Seconds from starting a service (its predecessor SIGKILLed, its session alive) to it
    serving an intent produced then."""
    first = _chaos_service(bootstrap, topics, tmp_path, f"{name}-1", **env)
    produce(bootstrap, [(topics.intents, b"c-1", _tool_intent("crm.note", b"c-1"), now_ms())])
    deadline = time.monotonic() + 60
    while not _served(first):
        assert time.monotonic() < deadline, first.log.read_text()
        time.sleep(0.2)
    os.killpg(first.process.pid, signal.SIGKILL)
    first.stop()
    started = time.monotonic()
    second = _chaos_service(bootstrap, topics, tmp_path, f"{name}-2", **env)
    produce(bootstrap, [(topics.intents, b"c-2", _tool_intent("crm.note", b"c-2"), now_ms())])
    try:
        while "result" not in _served(second):
            assert time.monotonic() < started + 120, second.log.read_text()
            time.sleep(0.1)
        return time.monotonic() - started
    finally:
        second.stop()


@pytest.mark.engines
def test_a_static_member_restarted_after_a_crash_serves_without_waiting_out_its_session(
    bootstrap, tmp_path
):
    """With a 30 s session timeout, a crashed member's partitions stay assigned to it for
    30 s: a restart without a static id waits that out; one with the same static id takes
    them back at once. Both times are printed (docs/flink-kafka.md quotes them)."""
    timings = {}
    for name, env in (
        ("dynamic", {"FX_SESSION_TIMEOUT_MS": "30000"}),
        ("static", {"FX_SESSION_TIMEOUT_MS": "30000", "FX_INSTANCE_ID": "fx-a"}),
    ):
        directory = tmp_path / name
        directory.mkdir()
        topics = fresh_topics(bootstrap)
        timings[name] = _first_served_after_restart(bootstrap, directory, topics, name, **env)
    print(f"restart to first served: {timings}")
    # The dynamic member waited for the session to expire; the static one did not. Compared
    # with each other, not with the clock's 30 s: the broker's expiry check runs on its own
    # schedule, and a loaded machine shifts both.
    assert timings["static"] * 4 < timings["dynamic"]


class _Record(_Message):
    """A consumed intent record, as the service reads it."""

    def __init__(self, topic: str, offset: int, value: bytes) -> None:
        super().__init__(topic, 0, offset)
        self._value = value

    def value(self) -> bytes:
        return self._value


class _Consumer:
    """A consumer double that returns its records in one batch and keeps what the service
    commits and seeks."""

    def __init__(self, records) -> None:
        self.records = list(records)
        self.committed: list = []
        self.seeks: list = []

    def subscribe(self, topics) -> None:
        pass

    def poll(self, timeout):
        return self.records[0] if self.records else None

    def consume(self, count, timeout):
        return self.records[1 : 1 + count]

    def commit(self, offsets, asynchronous):
        self.committed += [(t.topic, t.partition, t.offset) for t in offsets]

    def seek(self, position) -> None:
        self.seeks.append((position.topic, position.partition, position.offset))

    def close(self) -> None:
        pass


class _Producer:
    """A producer double with librdkafka's local check: a record over message.max.bytes
    (1 MB by default) raises MSG_SIZE_TOO_LARGE at produce, a permanent error."""

    def __init__(self, config) -> None:
        self.produced: list[tuple[str, bytes]] = []

    def produce(self, topic, key=None, value=None, **_) -> None:
        from confluent_kafka import KafkaError, KafkaException

        if len(value or b"") > 1_000_000:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        self.produced.append((topic, key))

    def poll(self, timeout) -> int:
        return 0

    def flush(self, timeout) -> int:
        return 0


def test_a_tool_result_too_large_for_the_broker_does_not_wedge_the_intents_behind_it(
    monkeypatch,
):
    import confluent_kafka

    from beam_agents.bus import Topics
    from beam_agents.testing.effectors import effector as make_effector
    from beam_agents.testing.effectors import signed

    topics = Topics("big")
    records = [
        _Record(topics.intents, 10, signed(intent_id="i-big").SerializeToString()),
        _Record(topics.intents, 11, signed(intent_id="i-small").SerializeToString()),
    ]
    runs: list[str] = []

    def lookup(args, tool_intent):
        runs.append(tool_intent.intent_id)
        return b"x" * 2_000_000 if tool_intent.intent_id == "i-big" else b"ok"

    consumer = _Consumer(records)
    monkeypatch.setattr(confluent_kafka, "Consumer", lambda config: consumer)
    producers: list[_Producer] = []
    monkeypatch.setattr(
        confluent_kafka,
        "Producer",
        lambda config: producers.append(_Producer(config)) or producers[-1],
    )
    service = EffectorService(
        make_effector(**{"crm.lookup": lookup}), bootstrap_servers="-", topics=topics
    )
    service.serve()
    # Each intent has an outcome on a topic and both are committed; the big one ran once.
    assert (topics.intents, 0, 12) in consumer.committed
    assert runs == ["i-big", "i-small"]
    # The big one's result went out OK (it took effect) without its payload.
    (producer,) = producers
    assert [topic for topic, _ in producer.produced] == [topics.events, topics.events]
    record = service.effector.store.get("i-big")
    assert record.result.status == ToolResult.OK and not record.result.payload
    assert "2000000 bytes" in record.result.error_message
