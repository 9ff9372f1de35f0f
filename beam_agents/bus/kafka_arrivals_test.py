"""The stalled-read watchdog's count (beam_agents.bus.flink.KafkaArrivals) on a real broker: it
counts committed records only, follows a partition added, and knows nothing of a deleted topic.
Beside flink.py, apart from flink_test.py because it needs the broker (`-m engines`)."""

from __future__ import annotations

import time

import pytest

from beam_agents.bus import produce
from beam_agents.testing.broker import fresh_topics, kafka_bootstrap, now_ms


@pytest.fixture(scope="module")
def bootstrap():
    with kafka_bootstrap() as servers:
        yield servers


def _first_look(arrivals) -> None:
    """Its first count, once the new topic's metadata reaches it (None until then): 0, and
    every record after it counts."""
    deadline = time.monotonic() + 30
    while (first := arrivals()) is None:
        assert time.monotonic() < deadline
    assert first == 0


@pytest.mark.engines
def test_the_watchdogs_arrivals_are_committed_records_not_markers_or_aborted_ones(bootstrap):
    from confluent_kafka import Producer

    from beam_agents.bus.flink import KafkaArrivals

    topics = fresh_topics(bootstrap)
    produce(bootstrap, [(topics.events, b"c-1", b"there before the first look", now_ms())])
    arrivals = KafkaArrivals(bootstrap, topics.events)
    try:
        _first_look(arrivals)
        producer = Producer(
            {"bootstrap.servers": bootstrap, "transactional.id": f"{topics.prefix}.tx"}
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        producer.produce(topics.events, key=b"c-1", value=b"aborted", timestamp=now_ms())
        producer.abort_transaction(30)
        producer.begin_transaction()
        for n in range(2):
            producer.produce(topics.events, key=b"c-1", value=b"%d" % n, timestamp=now_ms())
        producer.commit_transaction(30)
        # Six offsets taken (an aborted record, two committed, two markers and the first
        # record's): two records a job can read.
        assert arrivals() == 2
        produce(bootstrap, [(topics.events, b"c-2", b"one more", now_ms())])
        assert arrivals() == 3
    finally:
        arrivals.close()


@pytest.mark.engines
def test_the_watchdogs_arrivals_count_a_partition_added_and_know_nothing_of_a_deleted_topic(
    bootstrap,
):
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewPartitions

    from beam_agents.bus.flink import KafkaArrivals

    topics = fresh_topics(bootstrap)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    arrivals = KafkaArrivals(bootstrap, topics.events, timeout_s=5)
    try:
        _first_look(arrivals)
        admin.create_partitions([NewPartitions(topics.events, 2)])[topics.events].result(30)
        producer = Producer({"bootstrap.servers": bootstrap})
        for partition in (0, 1):
            producer.produce(topics.events, b"x", b"c-1", partition=partition, timestamp=now_ms())
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 30
        while arrivals() != 2:  # the new partition's metadata reaches the client in time
            assert time.monotonic() < deadline
        admin.delete_topics([topics.events])[topics.events].result(30)
        deadline = time.monotonic() + 30
        while arrivals() is not None:  # unknown, never a count of 0
            assert time.monotonic() < deadline
    finally:
        arrivals.close()
