"""ReadWatchdog against a Flink-shaped REST server on 127.0.0.1: it trips on records the job
does not move, and never on a quiet topic, a recovering job, a broker it cannot ask or
records the job moved in the same look; progress restarts its clock."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from beam_agents.bus.flink import FlinkRest, KafkaArrivals, ReadWatchdog
from beam_agents.errors import FlinkRestError, ReadStalledError
from beam_agents.testing.local_http import JSON, LocalHttpServer, Reply, Request


class Cluster:
    """What the REST server reports for job j1 (two vertices: their status, the records they
    read and when this attempt started them) and how many records arrived on the topic."""

    def __init__(self) -> None:
        self.state = "RUNNING"
        self.status = ["RUNNING", "RUNNING"]
        self.moved = [0, 0]
        self.started = 1000
        self.complete = True
        self.http_status = 200
        self.end: int | None = 0  # records arrived; None: the broker cannot be asked
        self.now = 0.0

    def restart(self) -> None:
        """A new attempt: Flink starts the tasks again and counts from zero."""
        self.started += 1
        self.moved = [0, 0]

    def reply(self, request: Request) -> Reply:
        assert request.path == "/jobs/j1"
        if self.http_status != 200:
            return Reply(self.http_status, b'{"errors": ["Job not found"]}', JSON)
        vertices = [
            {
                "status": status,
                "start-time": self.started,
                "metrics": {"read-records": moved, "read-records-complete": self.complete},
            }
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
            arrivals=lambda: cluster.end,
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
    with pytest.raises(ReadStalledError, match=r"job j1: records wait unread on loop\.events") as e:
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
        lambda c: setattr(c, "complete", False),  # a task manager's counts missing
        lambda c: setattr(c, "end", None),  # the broker cannot be asked
        lambda c: setattr(c, "http_status", 503),  # nor Flink
        lambda c: setattr(c, "http_status", 404),  # a job manager that forgot the job
    ],
    ids=[
        "job restarting",
        "a task not running",
        "metrics incomplete",
        "broker unreachable",
        "rest unavailable",
        "job unknown",
    ],
)
def test_time_the_job_recovers_or_cannot_be_seen_does_not_count(cluster, recovering):
    cluster, watchdog = cluster
    _at(cluster, watchdog, 0)
    cluster.end = 1
    _at(cluster, watchdog, 5)
    saved = (cluster.state, list(cluster.status), cluster.end, cluster.complete)
    recovering(cluster)
    for now in range(10, 200, 5):
        _at(cluster, watchdog, now)
    cluster.state, cluster.status, cluster.end, cluster.complete = saved
    cluster.http_status = 200
    _at(cluster, watchdog, 200)  # the clock starts again here
    _at(cluster, watchdog, 259)
    with pytest.raises(ReadStalledError):
        _at(cluster, watchdog, 260)


def test_a_restart_that_rereads_what_waited_is_progress_not_a_stall(cluster):
    cluster, watchdog = cluster
    cluster.moved = [7, 9]
    _at(cluster, watchdog, 0)
    cluster.end = 1
    _at(cluster, watchdog, 5)
    cluster.restart()
    cluster.moved = [0, 20]  # it reads again from its checkpoint, the waiting record too
    _at(cluster, watchdog, 40)
    for now in range(45, 300, 5):
        _at(cluster, watchdog, now)


def test_records_that_waited_before_a_restart_still_wait_after_it(cluster):
    cluster, watchdog = cluster
    cluster.moved = [5, 5]
    _at(cluster, watchdog, 0)
    cluster.end = 3
    _at(cluster, watchdog, 5)
    cluster.state = "RESTARTING"
    _at(cluster, watchdog, 10)
    cluster.state = "RUNNING"
    cluster.restart()  # the new attempt reads nothing
    _at(cluster, watchdog, 15)
    _at(cluster, watchdog, 74)
    with pytest.raises(ReadStalledError):
        _at(cluster, watchdog, 75)


def test_a_restart_between_two_looks_is_told_by_its_start_times_not_its_counts(cluster):
    cluster, watchdog = cluster
    cluster.end, cluster.moved = 10, [1, 10]
    _at(cluster, watchdog, 0)
    # Restarted and caught up between looks: its new counts are above the old ones.
    cluster.restart()
    cluster.end, cluster.moved = 19, [1, 11]
    for now in range(5, 300, 5):
        _at(cluster, watchdog, now)


def test_a_finished_source_task_still_lets_it_watch(cluster):
    cluster, watchdog = cluster
    cluster.status = ["FINISHED", "RUNNING"]  # an Impulse source without checkpointing
    _at(cluster, watchdog, 0)
    cluster.end = 1
    _at(cluster, watchdog, 5)
    with pytest.raises(ReadStalledError):
        _at(cluster, watchdog, 65)


def test_flink_rest_failures_are_one_typed_error():
    gone = LocalHttpServer(lambda request: Reply(404, b'{"errors": []}', JSON))
    with gone as server, pytest.raises(FlinkRestError, match="404"):
        FlinkRest(server.url).job("gone")
    not_json = LocalHttpServer(lambda request: Reply(200, b"<html>", {}))
    with not_json as server, pytest.raises(FlinkRestError):
        FlinkRest(server.url).jobs()
    with pytest.raises(FlinkRestError):
        FlinkRest("http://127.0.0.1:1").jobs()


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


def test_a_broker_that_cannot_be_asked_gives_no_count_rather_than_zero():
    unreachable = KafkaArrivals("127.0.0.1:1", "loop.events", timeout_s=0.5)
    try:
        assert unreachable() is None
    finally:
        unreachable.close()


def test_a_new_attempt_gets_the_whole_stall_limit(cluster):
    cluster, watchdog = cluster
    _at(cluster, watchdog, 0)
    cluster.end = 3
    _at(cluster, watchdog, 5)
    _at(cluster, watchdog, 45)
    cluster.restart()  # between two looks: no look saw it restarting
    _at(cluster, watchdog, 50)
    _at(cluster, watchdog, 109)
    with pytest.raises(ReadStalledError):
        _at(cluster, watchdog, 110)


def test_counting_starts_at_the_first_look_that_sees_the_job(cluster):
    cluster, watchdog = cluster
    cluster.complete = False  # a task manager's counts missing: not a look
    assert not watchdog.first_look(timeout_s=0)
    cluster.complete = True
    assert watchdog.first_look(timeout_s=0)
    cluster.end = 1  # the ticket, sent once the first look returned
    _at(cluster, watchdog, 5)
    with pytest.raises(ReadStalledError):
        _at(cluster, watchdog, 65)


def test_a_reply_cut_short_is_a_flink_rest_error():
    listener = socket.create_server(("127.0.0.1", 0))

    def cut_short() -> None:
        connection, _ = listener.accept()
        with connection:
            connection.recv(65536)
            connection.sendall(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"jobs": [')

    server = threading.Thread(target=cut_short, daemon=True)
    server.start()
    try:
        with pytest.raises(FlinkRestError):
            FlinkRest(f"http://127.0.0.1:{listener.getsockname()[1]}").jobs()
    finally:
        server.join(10)
        listener.close()


def test_subtasks_names_each_vertex_with_the_task_manager_of_every_subtask():
    def reply(request: Request) -> Reply:
        vertices = {"v1": "Source: Kafka", "v2": "RunAgent"}
        if request.path == "/jobs/j1":
            body = {"vertices": [{"id": v, "name": n} for v, n in vertices.items()]}
        else:
            vertex = request.path.rsplit("/", 1)[1]
            assert request.path == f"/jobs/j1/vertices/{vertex}" and vertex in vertices
            count = 1 if vertex == "v1" else 2
            body = {"subtasks": [{"subtask": i, "taskmanager-id": f"tm{i}"} for i in range(count)]}
        return Reply(200, json.dumps(body).encode(), JSON)

    with LocalHttpServer(reply) as server:
        placed = FlinkRest(server.url).subtasks("j1")
    assert {name: [s["taskmanager-id"] for s in subtasks] for name, subtasks in placed.items()} == {
        "Source: Kafka": ["tm0"],
        "RunAgent": ["tm0", "tm1"],
    }


def test_a_jobs_checkpoint_config_and_pipeline_options_come_from_its_rest_resources():
    def reply(request: Request) -> Reply:
        if request.path == "/jobs/j1/checkpoints/config":
            body = {"interval": 1000, "state_backend": "EmbeddedRocksDBStateBackend"}
        else:
            assert request.path == "/jobs/j1/config"
            user = {"finishBundleBeforeCheckpointing": "true", "checkpointingInterval": "1000"}
            body = {"jid": "j1", "execution-config": {"user-config": user}}
        return Reply(200, json.dumps(body).encode(), JSON)

    with LocalHttpServer(reply) as server:
        rest = FlinkRest(server.url)
        checkpoints, options = rest.checkpoint_config("j1"), rest.pipeline_options("j1")
    assert checkpoints["state_backend"] == "EmbeddedRocksDBStateBackend"
    assert options["finishBundleBeforeCheckpointing"] == "true"
