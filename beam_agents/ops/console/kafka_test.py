"""The console on a real Kafka broker: an APPROVAL intent on the approvals topic reaches the
inbox (a forged one never approvable), an approve is one signed Approval on the events topic
however often it is clicked, a console restarted between recording and producing a decision
produces it once, and the demo's agent resumes and completes on the decision the console
produced (the console and the effector as their own processes, RunAgent in DirectRunner rounds).
"""

from __future__ import annotations

import threading
import time

import pytest

from beam_agents._protos import AgentEnvelope, TraceEvent
from beam_agents.bus import TopicReader, Topics, create_topics, produce
from beam_agents.intents.effector import wall_clock_ms
from beam_agents.intents.signing import Verification, verify
from beam_agents.ops.console.app import create_app
from beam_agents.ops.console.bus import ConsoleBus, KafkaPublisher
from beam_agents.ops.console.service import serving
from beam_agents.ops.demo import DEMO_PASSWORD, DEMO_USER, demo_approver_keyring
from beam_agents.testing.console import APPROVALS_RING, Browser, approval_intent, make_bus
from beam_agents.testing.console_loop import DemoLoop, kafka_broker

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


class Running:
    """`ConsoleBus.run` in a thread, as `service.run` runs it, until `stop()`."""

    def __init__(self, bus: ConsoleBus, bootstrap: str, topics: Topics) -> None:
        bus.connect(bootstrap, f"{topics.prefix}.console")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=bus.run, args=(self._stop,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()


def _decisions(bootstrap, topics: Topics, settle_s: float = 2) -> tuple[list, list]:
    """The Approval envelopes on the events topic and the TraceEvents on the traces topic, as
    the loop reads them."""
    reader = TopicReader(bootstrap, [topics.events, topics.traces])
    try:
        reader.read(lambda r: r[topics.events], 30)
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
    bus, auth = make_bus(
        tmp_path / "console.sqlite", KafkaPublisher(bootstrap), wall_clock_ms, topics=topics
    )
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
        pending = _until(lambda: bus.inbox.pending()[1] == 2 and bus.inbox.pending()[0], "inbox")
        assert [(a.intent_id, a.approvable) for a in pending] == [
            ("forged-1", False),
            ("refund-1", True),
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
