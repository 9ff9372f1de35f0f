"""ReadWatchdog against a Flink-shaped REST server on 127.0.0.1: it trips on records the job
does not move, and never on a quiet topic, a recovering job, a broker it cannot ask or
records the job moved in the same look; progress restarts its clock."""

from __future__ import annotations

import json

import pytest

from beam_agents.errors import ReadStalledError
from beam_agents.flink import FlinkRest, KafkaEndOffsets, ReadWatchdog
from beam_agents.testing.local_http import JSON, LocalHttpServer, Reply, Request


class Cluster:
    """What the REST server reports for job j1 (two vertices) and what the broker holds."""

    def __init__(self) -> None:
        self.state = "RUNNING"
        self.status = ["RUNNING", "RUNNING"]
        self.moved = [0, 0]
        self.end: int | None = 0
        self.now = 0.0

    def reply(self, request: Request) -> Reply:
        assert request.path == "/jobs/j1"
        vertices = [
            {"status": status, "metrics": {"read-records": moved}}
            for status, moved in zip(self.status, self.moved, strict=True)
        ]
        body = {"jid": "j1", "state": self.state, "vertices": vertices}
        return Reply(200, json.dumps(body).encode(), JSON)


@pytest.fixture
def cluster():
    cluster = Cluster()
    with LocalHttpServer(cluster.reply) as server:
        watchdog = ReadWatchdog(
            FlinkRest(server.url),
            "j1",
            end_offsets=lambda: cluster.end,
            topic="loop.events",
            stall_after_s=60,
            clock=lambda: cluster.now,
        )
        yield cluster, watchdog


def _at(cluster: Cluster, watchdog: ReadWatchdog, now: float) -> None:
    cluster.now = now
    watchdog.check()


def test_records_the_job_does_not_move_for_a_minute_are_a_stall_named_with_its_job(cluster):
    cluster, watchdog = cluster
    _at(cluster, watchdog, 0)
    cluster.end = 3  # three records arrive; the job moves none of them
    _at(cluster, watchdog, 5)
    _at(cluster, watchdog, 64)
    with pytest.raises(ReadStalledError, match=r"job j1: records arrived on loop\.events") as e:
        _at(cluster, watchdog, 65)
    assert (e.value.job_id, e.value.topic, e.value.stalled_s) == ("j1", "loop.events", 60)


def test_a_quiet_topic_and_a_backlog_there_before_it_looked_never_trip_it(cluster):
    cluster, watchdog = cluster
    cluster.end = 40  # a backlog before the first look
    for now in range(0, 600, 5):
        _at(cluster, watchdog, now)


def test_a_move_after_the_records_arrived_disarms_it_and_the_next_arrival_rearms_it(cluster):
    cluster, watchdog = cluster
    _at(cluster, watchdog, 0)
    cluster.end = 1
    _at(cluster, watchdog, 5)
    cluster.moved = [1, 2]  # Flink's metrics show the move a little later
    _at(cluster, watchdog, 15)
    _at(cluster, watchdog, 200)  # quiet since: nothing pending
    cluster.end = 2
    _at(cluster, watchdog, 205)
    with pytest.raises(ReadStalledError):
        _at(cluster, watchdog, 265)


def test_records_seen_with_a_move_in_the_same_look_do_not_arm_it(cluster):
    cluster, watchdog = cluster
    _at(cluster, watchdog, 0)
    cluster.end, cluster.moved = 5, [5, 5]
    _at(cluster, watchdog, 5)
    for now in range(10, 300, 5):
        _at(cluster, watchdog, now)


@pytest.mark.parametrize(
    "recovering",
    [
        lambda c: setattr(c, "state", "RESTARTING"),
        lambda c: setattr(c, "status", ["RUNNING", "DEPLOYING"]),
        lambda c: setattr(c, "end", None),  # the broker cannot be asked
    ],
    ids=["job restarting", "a task not running", "broker unreachable"],
)
def test_time_the_job_recovers_or_the_broker_is_away_does_not_count(cluster, recovering):
    cluster, watchdog = cluster
    _at(cluster, watchdog, 0)
    cluster.end = 1
    _at(cluster, watchdog, 5)
    saved = (cluster.state, list(cluster.status), cluster.end)
    recovering(cluster)
    for now in range(10, 200, 5):
        _at(cluster, watchdog, now)
    cluster.state, cluster.status, cluster.end = saved
    _at(cluster, watchdog, 200)  # the clock starts again here
    _at(cluster, watchdog, 259)
    with pytest.raises(ReadStalledError):
        _at(cluster, watchdog, 260)


def test_counters_reset_by_a_restart_are_a_new_attempt_not_a_stall(cluster):
    cluster, watchdog = cluster
    cluster.moved = [7, 9]
    _at(cluster, watchdog, 0)
    cluster.end = 1
    _at(cluster, watchdog, 5)
    cluster.moved = [0, 0]  # a restart: Flink counts from zero again
    _at(cluster, watchdog, 40)
    _at(cluster, watchdog, 99)
    cluster.end = 2
    _at(cluster, watchdog, 100)
    _at(cluster, watchdog, 159)
    with pytest.raises(ReadStalledError):
        _at(cluster, watchdog, 160)


def test_progress_restarts_the_clock_and_a_read_that_stops_halfway_is_a_stall(cluster):
    cluster, watchdog = cluster
    _at(cluster, watchdog, 0)
    cluster.end = 10
    _at(cluster, watchdog, 5)
    cluster.moved = [2, 2]  # four of ten moved, then nothing
    _at(cluster, watchdog, 30)
    _at(cluster, watchdog, 89)
    with pytest.raises(ReadStalledError):
        _at(cluster, watchdog, 90)


def test_metrics_that_trail_the_job_never_fake_a_stall(cluster):
    cluster, watchdog = cluster
    cluster.end, cluster.moved = 12, [1, 12]
    _at(cluster, watchdog, 0)
    cluster.end = 15  # three records the job reads at once, its metrics showing it 10 s later
    _at(cluster, watchdog, 5)
    cluster.moved = [1, 15]
    for now in range(15, 600, 5):
        _at(cluster, watchdog, now)


def test_records_hidden_by_metrics_still_catching_up_are_caught_at_the_next_arrival(cluster):
    cluster, watchdog = cluster
    cluster.end, cluster.moved = 12, [0, 1]  # the first look: metrics behind the job
    _at(cluster, watchdog, 0)
    cluster.end, cluster.moved = 15, [1, 12]  # they catch up as three records arrive, unread
    for now in range(5, 300, 5):
        _at(cluster, watchdog, now)
    cluster.end = 16
    _at(cluster, watchdog, 300)
    _at(cluster, watchdog, 359)
    with pytest.raises(ReadStalledError):
        _at(cluster, watchdog, 360)


def test_a_broker_that_cannot_be_asked_gives_no_end_offsets_rather_than_zero():
    unreachable = KafkaEndOffsets("127.0.0.1:1", "loop.events", timeout_s=0.5)
    try:
        assert unreachable() is None
    finally:
        unreachable.close()
