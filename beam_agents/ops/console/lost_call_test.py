"""A call the effector lost, answered by a person in the console, end to end: the example agent
in rounds on a real pipeline, a real effector process killed inside `payments.refund` after the
refund was paid, the restarted Effector's inquiry in the real console over HTTP on 127.0.0.1
(verified with the effector's inquiry ring, answerable a day after the call's own expiry), the
person's answer resolved by the Effector on the same SQLite file, and the agent completing."""

from __future__ import annotations

import html
import json
import re
import signal
from urllib.parse import unquote, urldefrag

from beam_agents._protos import AgentEnvelope, ToolIntent
from beam_agents.examples.support_triage import TOOLS
from beam_agents.intents.effector import INQUIRY_TOOL, Effector, Route, VerifyMode
from beam_agents.intents.signing import Keyring
from beam_agents.ops.console.app import create_app
from beam_agents.ops.console.service import serving
from beam_agents.ops.rounds import ManualClock
from beam_agents.testing.console import APPROVALS_RING, Browser, Recorder, make_bus
from beam_agents.testing.effectors import killed_inside
from beam_agents.testing.probe import CHARGED_TWICE, DAY, RING, T0, converse, event, run_agent

RESULTS_RING = Keyring({"effector-results": bytes(range(1, 33))}, active="effector-results")
INQUIRY_RING = Keyring({"effector-inquiries": bytes(range(3, 35))}, active="effector-inquiries")


def results_ring() -> Keyring:
    return RESULTS_RING


def approvals_ring() -> Keyring:
    return APPROVALS_RING


def test_a_lost_refund_is_settled_by_a_person_in_the_console_and_the_agent_completes(tmp_path):
    clock, recorder = ManualClock(T0), Recorder()
    # The console as shipped: agents' questions verified with their intent ring, the
    # effector's with its inquiry ring; it holds no key that signs results.
    bus, auth = make_bus(
        tmp_path / "console.sqlite", recorder, clock,
        intent_keyring=RING, inquiry_keyring=INQUIRY_RING,
    )  # fmt: skip
    store, ledger = tmp_path / "effector.sqlite", tmp_path / "ledger"
    effector = Effector(
        TOOLS,
        mode=VerifyMode.REQUIRE,
        store=store,
        keyring=RING,
        result_keyring=RESULTS_RING,
        inquiry_keyring=INQUIRY_RING,
        approval_keyring=APPROVALS_RING,
        clock=clock,
    )
    shown = []
    with serving(create_app(bus, auth, clock=clock)) as url:

        def decided_in_console(question: ToolIntent) -> AgentEnvelope:
            """A person signs in, follows the inbox's link to the question, and approves it
            with the page's form, as a browser would."""
            bus.handle(bus.topics.approvals, question.SerializeToString(deterministic=True))
            browser = Browser(url)
            assert browser.sign_in("alice").status == 303
            links = re.findall(r'href="(/approvals/[^"]+)"', browser.get("/").text)
            # Pending first; what a browser requests: the link without its fragment.
            base = question.intent_id.partition("#")[0]
            link = next(urldefrag(html.unescape(h)).url for h in links if base in unquote(h))
            page = browser.get(link)
            assert page.status == 200, page.text
            shown.append(page.text)
            (action,) = re.findall(r'action="([^"]+)" class="decide"', page.text)
            reply = browser.post(
                urldefrag(html.unescape(action)).url,
                {"csrf": page.csrf(), "decision": "approve", "comment": "checked"},
            )
            assert reply.status == 303, reply.text
            assert browser.get(reply.headers["Location"]).status == 200
            assert bus.produce_recorded() == 1  # what the console's sender does (bus.py)
            produced = [AgentEnvelope.FromString(v) for v in recorder.on(bus.topics.events)]
            return [e for e in produced if e.HasField("approval")][-1]

        def answer(intent: ToolIntent, at: int) -> list[AgentEnvelope]:
            data = intent.SerializeToString(deterministic=True)
            clock.now_ms = at + 5
            if intent.tool_name == "payments.refund":
                status = killed_inside(
                    store, data, tools="beam_agents.examples.support_triage:TOOLS",
                    keyring=RING, now=at + 5, ledger=ledger,
                )  # fmt: skip
                assert status == -signal.SIGKILL
                # Its copy finds the claim dead a day after the call expired; a person answers.
                clock.now_ms = intent.expires_at_ms + DAY
                inquiry = effector(data)
                assert inquiry.route is Route.APPROVAL
                assert inquiry.approval.tool_name == INQUIRY_TOOL
                settled = effector.resolve(decided_in_console(inquiry.approval))
                assert settled.route is Route.RESULT
                reply = settled.result
            else:
                decided = effector(data)
                if decided.route is Route.APPROVAL:
                    reply = decided_in_console(decided.approval)
                else:
                    reply = decided.result
            reply.event_time_ms = at + 10
            return [reply]

        def transform():
            return run_agent(
                result_keyring_loader=results_ring, approval_keyring_loader=approvals_ring
            )

        completions, intents = converse(transform, event(T0, CHARGED_TWICE), answer, tmp_path)
    assert [i.tool_name for i in intents] == ["crm.lookup", "human.approval", "payments.refund"]
    assert "Did it take effect?" in shown[-1]
    (summary,) = completions
    summary = json.loads(summary)
    assert summary["outcome"] == "refunded" and summary["receipt"] is None
    assert "alice confirmed" in summary["detail"]
    # Paid once: by the process that was killed; nobody paid again.
    (paid,) = ledger.read_bytes().splitlines()
    assert json.loads(paid)["receipt"] == f"r-{intents[-1].intent_id}"
    (audit, *_), _ = bus.inbox.audit()
    assert audit[1:4] == ("alice", "approve", intents[-1].intent_id + "#outcome")
