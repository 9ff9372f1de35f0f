"""The console on a real Kafka broker: an APPROVAL intent on the approvals topic reaches the
inbox (a forged one never approvable), an approve is one signed Approval on the events topic
however often it is clicked, a console restarted between recording and producing a decision
produces it once, and the demo's agent resumes and completes on the decision the console
produced (the console and the effector as their own processes, RunAgent in DirectRunner rounds).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from beam_agents._protos import AgentEnvelope, TraceEvent
from beam_agents.bus import TopicReader, Topics, create_topics, produce
from beam_agents.intents.effector import wall_clock_ms
from beam_agents.intents.signing import Verification, verify
from beam_agents.ops.console import bus as console_bus
from beam_agents.ops.console.app import create_app
from beam_agents.ops.console.bus import ConsoleBus, KafkaPublisher
from beam_agents.ops.console.service import serving
from beam_agents.ops.demo import DEMO_PASSWORD, DEMO_USER, demo_approver_keyring
from beam_agents.testing.console import APPROVALS_RING, Browser, approval_intent, make_bus
from beam_agents.testing.console_loop import DemoLoop, kafka_broker
from beam_agents.testing.engines import ROOT, Engines

pytestmark = pytest.mark.engines


@pytest.fixture(scope="module")
def bootstrap():
    with kafka_broker() as address:
        yield address


@pytest.fixture
def topics(bootstrap):
    topics = Topics(f"console-{time.time_ns()}")
    create_topics(bootstrap, topics)
    return topics


def _until(condition, what: str, timeout_s: float = 30):
    deadline = time.monotonic() + timeout_s
    while not (found := condition()):
        assert time.monotonic() < deadline, f"no {what} in {timeout_s} s"
        time.sleep(0.1)
    return found


def _console(bootstrap, topics: Topics, tmp_path):
    """A console's bus and auth on the broker, as `service.run` makes them."""
    path = tmp_path / "console.sqlite"
    return make_bus(path, KafkaPublisher(bootstrap), wall_clock_ms, topics=topics)


class Running:
    """`ConsoleBus.run` in a thread, as `service.run` runs it, until `stop()`."""

    def __init__(self, bus: ConsoleBus, bootstrap: str, topics: Topics) -> None:
        bus.connect(bootstrap, f"{topics.prefix}.console")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=bus.run, args=(self._stop,), daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()


def _decisions(
    bootstrap, topics: Topics, settle_s: float = 2, *, dedupe: bool = True
) -> tuple[list, list]:
    """The Approval envelopes on the events topic and the TraceEvents on the traces topic, as
    the loop reads them (`dedupe=False`: every copy on the topic)."""
    reader = TopicReader(bootstrap, [topics.events, topics.traces], dedupe=dedupe)
    try:
        # The key's export request is on the topic before the decision (the sender produces
        # it when the approval arrives): wait for an approval, not for any record.
        reader.read(
            lambda r: any(
                AgentEnvelope.FromString(v).HasField("approval") for _, v in r[topics.events]
            ),
            30,
        )
        records = reader.settle(settle_s)
    finally:
        reader.close()
    envelopes = [AgentEnvelope.FromString(v) for _, v in records[topics.events]]
    return (
        [e for e in envelopes if e.HasField("approval")],
        [TraceEvent.FromString(v) for _, v in records[topics.traces]],
    )


def test_an_approval_on_the_topic_is_listed_and_one_approve_is_one_signed_envelope(
    bootstrap, topics, tmp_path
):
    bus, auth = _console(bootstrap, topics, tmp_path)
    now = wall_clock_ms()
    real = approval_intent("refund-1", created_at_ms=now, expires_at_ms=now + 3_600_000)
    forged = approval_intent("forged-1", created_at_ms=now, expires_at_ms=now + 3_600_000)
    forged.args_json = forged.args_json.replace("42", "4200")
    produce(
        bootstrap,
        [(topics.approvals, b"c-1", intent, now) for intent in (real, forged)],
    )
    running = Running(bus, bootstrap, topics)
    try:
        pending = _until(
            lambda: bus.inbox.approvals()[1] == 2 and bus.inbox.approvals()[0], "inbox"
        )
        # Approvable copies first (issue 38 item 4: a forged copy never buries a real one).
        assert [(a.intent_id, a.approvable) for a in pending] == [
            ("refund-1", True),
            ("forged-1", False),
        ]
        with serving(create_app(bus, auth)) as url:
            browser = Browser(url)
            assert browser.sign_in("alice").status == 303
            page = browser.get("/approvals/refund-1")
            assert "Refund 42.00 EUR to customer c-1?" in page.text
            for _ in range(2):  # a second click, a replayed post
                form = {"csrf": page.csrf(), "decision": "approve", "comment": "ok"}
                browser.post("/approvals/refund-1", form)
            refused = browser.post(
                "/approvals/forged-1", {"csrf": page.csrf(), "decision": "approve"}
            )
            assert refused.status == 409
    finally:
        running.stop()
    approvals, traces = _decisions(bootstrap, topics)
    (envelope,) = approvals
    assert envelope.approval.intent_id == "refund-1" and envelope.approval.approver == "alice"
    assert envelope.approval.approved and envelope.entity_key == b"c-1"
    assert verify(envelope.approval, APPROVALS_RING) is Verification.VALID
    (trace,) = [t for t in traces if t.attributes.get("beam_agents.source") == "console"]
    assert trace.attributes["beam_agents.approval.approver"] == "alice"
    assert trace.trace_id == real.trace_id


def test_a_console_restarted_between_recording_and_producing_produces_the_decision_once(
    bootstrap, topics, tmp_path
):
    path = tmp_path / "console.sqlite"
    now = wall_clock_ms()
    intent = approval_intent("refund-2", created_at_ms=now, expires_at_ms=now + 3_600_000)
    produce(bootstrap, [(topics.approvals, b"c-1", intent, now)])
    # The first process reads the intent and records the decision, and dies before producing.
    crashed, _ = make_bus(path, KafkaPublisher(bootstrap), wall_clock_ms, topics=topics)
    crashed.connect(bootstrap, f"{topics.prefix}.console")
    _until(lambda: crashed.poll(1), "approval read")
    decision, made = crashed.inbox.decide(
        "refund-2", approved=False, user="alice", comment="not ours", address="10.0.0.9"
    )
    assert made and not decision.produced
    crashed._consumer.close()
    # Two restarts: the first produces the recorded decision, the second has nothing to send.
    for _ in range(2):
        restarted, _ = make_bus(path, KafkaPublisher(bootstrap), wall_clock_ms, topics=topics)
        Running(restarted, bootstrap, topics).stop()
        assert restarted.inbox.unproduced() == []
    approvals, _ = _decisions(bootstrap, topics)
    (envelope,) = approvals
    assert envelope.SerializeToString(deterministic=True) == decision.envelope
    assert not envelope.approval.approved and envelope.approval.intent_id == "refund-2"


def test_the_demo_agent_resumes_and_completes_on_the_consoles_decision(bootstrap, tmp_path):
    loop = DemoLoop(bootstrap, tmp_path)
    try:
        loop.start()
        loop.advance()
        (waiting,) = loop.waiting_for
        # The console process (`beam-agents console`, service.run) lists it; a person approves.
        browser = Browser(loop.url)
        assert browser.sign_in(DEMO_USER, DEMO_PASSWORD).status == 303
        page = _until(
            lambda: (p := browser.get(f"/approvals/{waiting}")).status == 200 and p, "approval"
        )
        assert "Refund 42.00 to Ada Lovelace (gold)?" in page.text
        decided = browser.post(
            f"/approvals/{waiting}", {"csrf": page.csrf(), "decision": "approve", "comment": ""}
        )
        assert decided.status == 303, decided.text
        loop.advance()
        assert loop.completions and b'"outcome": "refunded"' in loop.completions[0]
        (answer,) = [a for a in loop.answers if a.approval.intent_id == waiting]
        assert answer.approval.approver == DEMO_USER
        assert verify(answer.approval, demo_approver_keyring()) is Verification.VALID
        # The viewer shows the agent completed, read back from the completions topic.
        agent = f"/agents/{b'c-1'.hex()}"
        _until(lambda: "Completed (1)" in browser.get(agent).text, "completion in the viewer")
    finally:
        loop.close()


def _pending_ids(bus: ConsoleBus) -> set[str]:
    return {a.intent_id for a in bus.inbox.approvals(limit=1000)[0] if a.approvable}


def _health(url: str) -> tuple[int, dict]:
    """GET /healthz without signing in: its status and JSON body."""
    reply = Browser(url).get("/healthz")
    return reply.status, json.loads(reply.text)


def test_a_reader_started_before_its_topics_exist_lives_on_and_reads_what_comes_after(
    bootstrap, tmp_path
):
    # Issue 38, item 1: the reader's thread ended on its first consumer error (a topic of the
    # loop not made yet) and nothing restarted it: the inbox said "Nothing is waiting" for good.
    topics = Topics(f"console-late-{time.time_ns()}")
    bus, _ = _console(bootstrap, topics, tmp_path)
    running = Running(bus, bootstrap, topics)
    try:
        time.sleep(3)  # the reader meets the missing topics
        assert running.alive(), "the reader ended on a missing topic"
        create_topics(bootstrap, topics)
        now = wall_clock_ms()
        intent = approval_intent("late-1", created_at_ms=now, expires_at_ms=now + 3_600_000)
        produce(bootstrap, [(topics.approvals, b"c-1", intent, now)])
        _until(lambda: "late-1" in _pending_ids(bus), "approval read after the topics came", 45)
    finally:
        running.stop()


def test_the_health_endpoint_and_every_pages_banner_say_how_long_the_broker_went_unread(
    bootstrap, tmp_path
):
    # Issue 38, item 13: nothing told a person or a monitor that the console read nothing.
    topics = Topics(f"console-health-{time.time_ns()}")
    bus, auth = _console(bootstrap, topics, tmp_path)
    running = Running(bus, bootstrap, topics)
    try:
        with serving(create_app(bus, auth)) as url:
            _, body = _until(lambda: (h := _health(url))[0] == 503 and h, "unhealthy answer", 20)
            assert body["healthy"] is False and body["reader"]["ok"] is False
            assert body["reader"]["failing_for_s"] >= 0
            assert bootstrap not in json.dumps(body)  # no address, nothing of the config
            browser = Browser(url)
            assert browser.sign_in("alice").status == 303
            for path in ("/", "/agents", "/dead-letters", "/login"):
                page = browser.get(path)
                assert 'id="broker-banner"' in page.text, path
                assert "cannot read" in page.text, path
            create_topics(bootstrap, topics)
            _, body = _until(lambda: (h := _health(url))[0] == 200 and h, "healthy", 30)
            assert body["healthy"] is True and body["reader"]["ok"] is True
            assert 'id="broker-banner"' not in browser.get("/").text
    finally:
        running.stop()


def _broker_down(engines: Engines, how: str) -> None:
    """Stops the broker (`engines.sh stop kafka`: SIGTERM) or SIGKILLs it."""
    if how == "stop":
        engines.run("stop", "kafka")
        return
    for pid in (ROOT / ".cache/engines/run/kafka.pids").read_text().split():
        os.kill(int(pid), signal.SIGKILL)
    _until(lambda: "kafka stopped" in engines.run("status"), "broker killed", 10)


@pytest.mark.parametrize("outage", ["stop", "kill"])
def test_decisions_made_while_the_broker_is_down_answer_at_once_and_arrive_once_after(
    bootstrap, topics, tmp_path, outage
):
    # Issue 38, item 2: with the broker down an approve answered 503 after 30 s and a second
    # approver's click queued 59 s behind it; when the broker came back neither decision was
    # delivered (the reader, which retried them, had died) and no new approval was read.
    bus, auth = _console(bootstrap, topics, tmp_path)
    now = wall_clock_ms()
    intents = {
        intent_id: approval_intent(
            intent_id, key=key, created_at_ms=now, expires_at_ms=now + 3_600_000
        )
        for intent_id, key in (("down-1", b"c-1"), ("down-2", b"c-2"), ("after-1", b"c-3"))
    }
    produce(
        bootstrap,
        [(topics.approvals, i.entity_key, i, now) for n, i in intents.items() if n != "after-1"],
    )
    engines = Engines()
    running = Running(bus, bootstrap, topics)
    try:
        _until(lambda: {"down-1", "down-2"} <= _pending_ids(bus), "approvals")
        with serving(create_app(bus, auth)) as url:
            people = {"down-1": Browser(url), "down-2": Browser(url)}
            forms = {}
            for (intent_id, browser), user in zip(people.items(), ("alice", "ada"), strict=True):
                assert browser.sign_in(user).status == 303
                forms[intent_id] = {
                    "csrf": browser.get(f"/approvals/{intent_id}").csrf(),
                    "decision": "approve",
                }
            _broker_down(engines, outage)
            try:
                replies, took = {}, {}

                def click(intent_id):
                    start = time.monotonic()
                    replies[intent_id] = people[intent_id].post(
                        f"/approvals/{intent_id}", forms[intent_id]
                    )
                    took[intent_id] = time.monotonic() - start

                clicks = [threading.Thread(target=click, args=(i,), daemon=True) for i in people]
                for thread in clicks:
                    thread.start()
                for thread in clicks:
                    thread.join(10)
                assert replies.keys() == people.keys(), f"clicks still waiting: {took}"
                assert all(t < 5 for t in took.values()), took
                assert {r.status for r in replies.values()} == {303}
                page = people["down-1"].get("/approvals/down-1").text
                assert "will be sent" in page
                _until(
                    lambda: 'id="broker-banner"' in people["down-2"].get("/").text,
                    "banner of a broker down",
                    15,
                )
                assert _health(url)[0] == 503
            finally:
                engines.run("start", "kafka", "--keep-data")
            _until(
                lambda: all(bus.inbox.decision(i).produced for i in people),
                "decisions delivered after the outage",
                90,
            )
            after = intents["after-1"]
            produce(bootstrap, [(topics.approvals, after.entity_key, after, wall_clock_ms())])
            _until(lambda: "after-1" in _pending_ids(bus), "approval read after the outage", 60)
            _until(lambda: _health(url)[0] == 200, "healthy after the outage", 30)
    finally:
        running.stop()
    approvals, _ = _decisions(bootstrap, topics, dedupe=False)
    assert sorted(e.approval.intent_id for e in approvals) == ["down-1", "down-2"]


def test_forged_approvals_write_nothing_and_do_not_hold_up_a_real_one(bootstrap, topics, tmp_path):
    # Issue 38, item 3: every forged (refused) approval record made the console produce an
    # export_request for a key the forger chose, with a new producer each, on the reader's
    # thread: 200 of them held a real approval back 101 s.
    bus, _ = _console(bootstrap, topics, tmp_path)
    now = wall_clock_ms()
    forged = [
        approval_intent(f"forged-{n}", key=f"victim-{n}".encode(), created_at_ms=now, ring=None)
        for n in range(200)
    ]
    real = approval_intent("real-1", created_at_ms=now, expires_at_ms=now + 3_600_000)
    produce(
        bootstrap,
        [(topics.approvals, i.entity_key, i, now) for i in [*forged, real]],
    )
    start = time.monotonic()
    running = Running(bus, bootstrap, topics)
    try:
        _until(lambda: "real-1" in _pending_ids(bus), "real approval", 60)
        took = time.monotonic() - start
    finally:
        running.stop()
    reader = TopicReader(bootstrap, [topics.events])
    try:
        # Nothing is decided here: the real approval's export request is all there is to wait
        # for, and the settle is what would show a forged key's.
        reader.read(lambda r: r[topics.events], 30)
        events = [AgentEnvelope.FromString(v) for _, v in reader.settle(3)[topics.events]]
    finally:
        reader.close()
    assert [(e.WhichOneof("payload"), e.entity_key) for e in events] == [("export_request", b"c-1")]
    assert took < 20, f"the real approval waited {took:.0f} s behind forged ones"


def test_the_health_says_how_far_behind_the_reader_is_until_it_caught_up(
    bootstrap, topics, tmp_path, monkeypatch
):
    # Issue 38, item 13: a reader far behind showed old lists as if they were all there was.
    # Behind as soon as it lags, measured often: the reader reads thousands a second.
    monkeypatch.setattr(console_bus, "BEHIND_AFTER_S", 0)
    monkeypatch.setattr(console_bus, "PROBE_S", 0.1)
    now = wall_clock_ms()
    events = [
        TraceEvent(trace_id=b"t" * 16, span_id=n.to_bytes(8, "big"), entity_key=b"c-1", start_ms=n)
        for n in range(5000)
    ]
    produce(bootstrap, [(topics.traces, b"c-1", event, now) for event in events])
    bus, _ = _console(bootstrap, topics, tmp_path)
    running = Running(bus, bootstrap, topics)
    try:
        behind = _until(
            lambda: (h := bus.health())["reader"]["behind_for_s"] is not None and h,
            "reader behind",
        )
        assert not behind["healthy"] and 0 < behind["reader"]["behind_records"] <= 5000
        _until(lambda: bus.health()["healthy"], "reader caught up", 60)
        assert bus.health()["reader"]["behind_records"] == 0
    finally:
        running.stop()
