"""The console in a real browser: Debian's headless chromium, driven through chromedriver by
Selenium. An approver signs in, sees the pending refund, approves it, and the page shows it
decided while the signed Approval is produced; a viewer sees the request but cannot approve it.
On a real Kafka broker (also marked engines), the demo's loop end to end: the console and the
effector service as their own processes, RunAgent in DirectRunner rounds (DemoLoop); the demo
user approves the agent's refund in the browser and watches the agent complete on the agent's
page, which updates itself. Screenshots go to $BEAM_AGENTS_ARTIFACTS (default
.cache/artifacts/console/); the approval page of the end-to-end run is docs/console.png.

Run with `-m browser` after `bash tools/browser.sh` (.ci/run does both, with Kafka started)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest

from beam_agents._protos import AgentEnvelope, StateSnapshot, TraceEvent
from beam_agents.intents.effector import wall_clock_ms
from beam_agents.intents.signing import Verification, verify
from beam_agents.ops.console.app import create_app
from beam_agents.ops.console.service import serving
from beam_agents.ops.demo import DEMO_PASSWORD, DEMO_USER, demo_approver_keyring
from beam_agents.testing.console import (
    APPROVALS_RING,
    PASSWORD,
    Recorder,
    approval_intent,
    export_answer,
    make_bus,
)
from beam_agents.testing.console_loop import DemoLoop, kafka_broker

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("BEAM_AGENTS_ARTIFACTS", ROOT / ".cache" / "artifacts")) / "console"


@pytest.fixture(scope="module")
def driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not chromedriver:
        pytest.fail("chromium and chromedriver are missing: run `bash tools/browser.sh`")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--window-size=1280,1000", "--disable-gpu"):  # fmt: skip
        options.add_argument(argument)
    browser = webdriver.Chrome(service=Service(chromedriver), options=options)
    browser.implicitly_wait(0)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def console(tmp_path):
    now = wall_clock_ms()
    recorder = Recorder()
    bus, auth = make_bus(tmp_path / "console.sqlite", recorder, wall_clock_ms)
    intent = approval_intent(
        "refund-1",
        question="Refund 42.00 EUR to customer c-1 for the double charge on ticket t-1?",
        created_at_ms=now - 65_000,
        expires_at_ms=now + 3_600_000,
    )
    bus.handle(bus.topics.approvals, intent.SerializeToString(deterministic=True))
    snapshot = StateSnapshot(entity_key=b"c-1", seq=3)
    snapshot.memory.entries.add(key="ticket", value=b'{"id":"t-1","text":"charged twice"}')
    snapshot.continuation.pending_intent_ids.append("refund-1")
    snapshot.continuation.suspended_at_ms = now - 64_000
    snapshot.continuation.deadline_ms = now + 3_600_000
    snapshot.pending.append(intent)
    bus.observations.add_snapshot(export_answer(bus, recorder, snapshot))
    for event in _activation(intent, now - 65_600):
        bus.handle(bus.topics.traces, event.SerializeToString())
    # The sender, as `ConsoleBus.run` runs it: it produces the export request and decisions.
    stop = threading.Event()
    sender = threading.Thread(target=bus.send, args=(stop,), daemon=True)
    sender.start()
    try:
        with serving(create_app(bus, auth)) as url:
            yield url, bus, recorder
    finally:
        stop.set()
        sender.join(30)


def _activation(intent, t0: int) -> list[TraceEvent]:
    """The spans of the activation that asked: its root, two model calls, the intent."""
    root, child = b"\x01" * 8, b"\x02" * 8

    def event(span, parent, kind, start, end, **attributes):
        return TraceEvent(
            trace_id=intent.trace_id, span_id=span, parent_span_id=parent,
            entity_key=intent.entity_key, seq=intent.seq, event_type=kind,
            attributes=attributes, start_ms=t0 + start, end_ms=t0 + end,
        )  # fmt: skip

    model = {"gen_ai.request.model": "triage-1"}
    return [
        event(root, b"", TraceEvent.ACTIVATION_START, 0, 600),
        event(child, root, TraceEvent.LLM_CALL, 20, 340, **model),
        event(b"\x03" * 8, root, TraceEvent.TOOL_CALL, 350, 420, **{"gen_ai.tool.name": "crm"}),
        event(b"\x06" * 8, root, TraceEvent.LLM_CALL, 425, 580, **model),
        event(b"\x04" * 8, root, TraceEvent.INTENT_EMITTED, 590, 600, **{"gen_ai.tool.name": "ok"}),
        event(b"\x05" * 8, root, TraceEvent.SUSPENDED, 600, 600),
    ]


def _wait(driver, condition, timeout=10):
    """`condition`'s first truthy answer. The pages poll and replace their parts, so an element
    found may be gone by the next call: a condition reads what it needs from it, and a stale
    element is one more miss."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    ignored = (NoSuchElementException, StaleElementReferenceException)
    return WebDriverWait(driver, timeout, ignored_exceptions=ignored).until(condition)


def _sign_in(driver, url, user, password=PASSWORD):
    from selenium.webdriver.common.by import By

    driver.delete_all_cookies()
    driver.get(url + "/")
    _wait(driver, lambda d: d.current_url.endswith("/login"))
    driver.find_element(By.ID, "user").send_keys(user)
    driver.find_element(By.ID, "password").send_keys(password)
    driver.find_element(By.ID, "sign-in").click()
    _wait(driver, lambda d: d.find_elements(By.ID, "who"))


def test_an_approver_approves_the_pending_refund_in_the_browser(driver, console):
    from selenium.webdriver.common.by import By

    url, bus, recorder = console
    _sign_in(driver, url, "alice")
    link = _wait(driver, lambda d: d.find_element(By.PARTIAL_LINK_TEXT, "Refund 42.00 EUR"))
    driver.save_screenshot(str(ARTIFACTS / "inbox.png"))
    link.click()
    _wait(driver, lambda d: d.find_element(By.ID, "approve"))
    driver.find_element(By.ID, "comment").send_keys("double charge confirmed")
    driver.save_screenshot(str(ARTIFACTS / "approval.png"))
    driver.find_element(By.ID, "approve").click()
    decided = _wait(driver, lambda d: d.find_element(By.ID, "decision"))
    assert decided.text.startswith("Approved by alice")
    # Recorded at once; the sender delivers it (at once here, the broker being up).
    _wait(driver, lambda d: len(recorder.on(bus.topics.events)) == 2)
    driver.refresh()
    decided = _wait(driver, lambda d: d.find_element(By.ID, "decision"))
    assert "Delivered to the agent" in decided.text
    driver.save_screenshot(str(ARTIFACTS / "decided.png"))
    (data,) = recorder.on(bus.topics.events)[1:]  # after the export request
    approval = AgentEnvelope.FromString(data).approval
    assert approval.intent_id == "refund-1" and approval.approved and approval.approver == "alice"
    assert verify(approval, APPROVALS_RING) is Verification.VALID
    # The inbox, polled live, no longer lists it.
    driver.get(url + "/")
    _wait(driver, lambda d: d.find_element(By.ID, "empty"))


def test_a_broker_down_is_a_banner_on_the_page_until_the_waiting_decision_is_delivered(
    driver, console
):
    # Issue 38, items 2 and 13: a click met a broker down with a 30 s wait and a 503, and no
    # page said the console could not reach its broker.
    from selenium.webdriver.common.by import By

    url, bus, recorder = console
    recorder.fail = True
    _sign_in(driver, url, "alice")
    driver.get(url + "/approvals/refund-1")
    _wait(driver, lambda d: d.find_element(By.ID, "approve")).click()
    decided = _wait(driver, lambda d: d.find_element(By.ID, "decision"))
    assert "will be sent to the agent once the broker answers" in decided.text
    # The banner comes with the page's live refresh, without a reload.
    banner = _wait(driver, lambda d: d.find_element(By.ID, "broker-banner"), timeout=15)
    assert "cannot write to its broker" in banner.text
    driver.save_screenshot(str(ARTIFACTS / "broker-down.png"))
    recorder.fail = False
    _wait(driver, lambda d: not d.find_elements(By.ID, "broker-banner"), timeout=30)
    assert bus.inbox.decision("refund-1").produced


def test_a_viewer_sees_the_refund_but_cannot_approve_it(driver, console):
    from selenium.webdriver.common.by import By

    url, bus, recorder = console
    _sign_in(driver, url, "vera")
    driver.get(url + "/approvals/refund-1")
    _wait(driver, lambda d: d.find_element(By.ID, "view-only"))
    assert not driver.find_elements(By.ID, "approve")
    # A forged form post from the viewer's own session is refused by the server.
    status = driver.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const csrf = document.querySelector('input[name=csrf]').value;
        fetch('/approvals/refund-1', {method: 'POST', credentials: 'same-origin',
          headers: {'Content-Type': 'application/x-www-form-urlencoded'},
          body: 'decision=approve&csrf=' + encodeURIComponent(csrf)})
          .then(r => done(r.status));
        """
    )
    assert status == 403
    driver.save_screenshot(str(ARTIFACTS / "viewer.png"))
    assert bus.inbox.decision("refund-1") is None
    assert len(recorder.on(bus.topics.events)) == 1  # only the export request


@pytest.mark.engines
def test_the_demo_user_approves_the_refund_and_watches_the_agent_complete(driver, tmp_path):
    from selenium.webdriver.common.by import By

    with kafka_broker() as bootstrap:
        loop = DemoLoop(bootstrap, tmp_path)
        try:
            loop.start()
            loop.advance()
            (waiting,) = loop.waiting_for
            _sign_in(driver, loop.url, DEMO_USER, DEMO_PASSWORD)
            # The inbox polls: the request shows up once the console read it from Kafka.
            link = _wait(driver, lambda d: d.find_element(By.PARTIAL_LINK_TEXT, "Refund 42.00"), 30)
            driver.save_screenshot(str(ARTIFACTS / "demo-inbox.png"))
            link.click()
            _wait(driver, lambda d: d.find_element(By.ID, "approve"))
            # The agent's trace (its rounds' TraceEvents, from the traces topic) as bars.
            _wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "rect.bar"), 30)
            driver.find_element(By.ID, "comment").send_keys("double charge confirmed")
            driver.save_screenshot(str(ARTIFACTS / "demo-approval.png"))
            driver.find_element(By.ID, "approve").click()
            decided = _wait(driver, lambda d: d.find_element(By.ID, "decision").text)
            assert decided.startswith(f"Approved by {DEMO_USER}")
            driver.find_element(By.ID, "key").click()
            before = _wait(driver, lambda d: d.find_element(By.ID, "completions").text)
            assert "none yet" in before
            # The agent resumes on the Approval the console produced, read from Kafka; the
            # open page shows its completion when it next refreshes itself.
            loop.advance()
            completed = _wait(
                driver,
                lambda d: (
                    "refunded" in (text := d.find_element(By.ID, "completions").text) and text
                ),
                30,
            )
            assert '"outcome": "refunded"' in completed
            driver.save_screenshot(str(ARTIFACTS / "demo-completed.png"))
        finally:
            loop.close()
    (answer,) = [a for a in loop.answers if a.approval.intent_id == waiting]
    assert answer.approval.approver == DEMO_USER and answer.approval.approved
    assert verify(answer.approval, demo_approver_keyring()) is Verification.VALID
