"""The world around RunAgent in the deterministic simulation (`simulation`): the real
`Effector` with a SQLite store and a result key (crashing inside a tool, or between its claim and
its result), a human who answers approvals and the effector's inquiries (signed), forgers who
write to the events topic, and a bus that delays, duplicates and restamps answers and events.

`World` is a mixin of `Simulation`: its methods act on the simulation's state
(`Simulation.__init__`) and call its `fail`.
"""

from __future__ import annotations

import json

from beam_agents._protos import AgentEnvelope, ExecutionRecord, ToolIntent, ToolResult
from beam_agents.intents.effector import INQUIRY_TOOL, Effector, Route, VerifyMode
from beam_agents.intents.identity import content_digest
from beam_agents.intents.signing import Keyring, sign
from beam_agents.runtime.context import ESCALATION_TOOL
from beam_agents.testing import simulation_agents as agents
from beam_agents.testing.simulation_state import message_bytes as _bytes

__all__ = [
    "APPROVAL_RING",
    "DEAD_CLAIMANT",
    "FORGER_RING",
    "INTENT_RING",
    "RESULT_RING",
    "World",
    "answer_bytes",
]

INTENT_RING = Keyring({"rt": b"r" * 32}, active="rt")
RESULT_RING = Keyring({"fx": b"f" * 32}, active="fx")
APPROVAL_RING = Keyring({"ap": b"a" * 32}, active="ap")
FORGER_RING = Keyring({"fx": b"x" * 32}, active="fx")
#: The claimant of the claims of effectors that died mid-call, their leases expired.
DEAD_CLAIMANT = "crashed"


class _Crash(BaseException):
    """The effector's process dies inside a tool."""


def answer_bytes(envelope: AgentEnvelope) -> bytes:
    """An answer's identity across copies: its kind and its message's bytes, whatever the
    envelope's event time."""
    which = envelope.WhichOneof("payload")
    return which[0].encode() + _bytes(getattr(envelope, which))


class World:
    """The effector, the human, forgers and the bus, acting on the simulation's state."""

    def _new_effector(self) -> Effector:
        tools = {name: self._tool(name) for name in agents.TOOLS}
        effector = Effector(
            tools,
            mode=VerifyMode.REQUIRE,
            store=self.store,
            keyring=INTENT_RING,
            result_keyring=RESULT_RING,
            approval_keyring=APPROVAL_RING,
            clock=lambda: self.now,
        )
        # A call that crashes inside its tool releases its lease: the next copy finds it lost.
        return effector

    def _tool(self, name: str):
        def run(args: dict, intent: ToolIntent) -> bytes:
            self.executions[intent.intent_id] += 1
            if self.executions[intent.intent_id] > 1:
                self.fail(f"tool {name} ran twice for {intent.intent_id}")
            if self.rng.random() < 0.05:
                raise _Crash  # the effector process dies while the tool acts
            if name == "flaky":
                raise ValueError("flaky tool failed")
            return f"{name}:{args['i']}:{args['llm']}".encode()

        return run

    def _deliver(self, envelope: AgentEnvelope, *, produced: bool = True) -> None:
        """Puts an answer on the bus to its key, maybe twice, maybe stamped 0 or far behind."""
        if produced:
            self.produced.add(answer_bytes(envelope))
        copies = 2 if self.rng.random() < 0.15 else 1
        for _ in range(copies):
            copy = AgentEnvelope()
            copy.CopyFrom(envelope)
            pick = self.rng.random()
            copy.event_time_ms = 0 if pick < 0.05 else self.now - 10**6 if pick < 0.08 else self.now
            self.inbox[envelope.entity_key].append(("E", _bytes(copy), b""))

    def _effect(self) -> None:
        index = self.rng.randrange(len(self.intent_bus))
        data = self.intent_bus[index]
        if self.rng.random() < 0.7:  # else redelivered later too
            self.intent_bus.pop(index)
        intent = ToolIntent.FromString(data)
        if self.rng.random() < 0.08 and self.store.get(intent.intent_id) is None:
            # An effector claims the intent, starts the tool and dies: it may have acted.
            record = ExecutionRecord(
                intent_id=intent.intent_id,
                entity_key=intent.entity_key,
                content_digest=content_digest(data),
                outcome=ExecutionRecord.OUTCOME_RUNNING,
                latest_expires_at_ms=intent.expires_at_ms,
                claimed_by=DEAD_CLAIMANT,
                lease_owner=DEAD_CLAIMANT,
                lease_expires_at_ms=self.now,
            )
            self.store.claim(record, self.now + 10**9)
            self.executions[intent.intent_id] += 1
            self.intent_bus.append(data)
            self.effector = self._new_effector()
            return
        try:
            output = self.effector(data)
        except _Crash:
            self.intent_bus.append(data)
            self.effector = self._new_effector()
            return
        # It dies after its record, before its result or approval request is acknowledged: the
        # redelivered copy must send the recorded output again.
        if self.rng.random() < 0.05:
            self.intent_bus.append(data)
            self.effector = self._new_effector()
            return
        if output.route is Route.DEAD_LETTER:
            self.fail(f"the effector refused {intent.intent_id}: {output.dead_letter.detail}")
        if output.approval is not None:  # put before a human, or sent again on a redelivery
            self.approval_bus.append(output.approval)
        elif output.result is not None:
            result = output.result.tool_result
            self.answered.add((result.intent_id, result.intent_digest))
            self._deliver(output.result)

    def _human(self) -> None:
        intent = self.approval_bus.pop(self.rng.randrange(len(self.approval_bus)))
        decided = self.decisions.get(intent.intent_id)
        if decided is not None and intent.tool_name == INQUIRY_TOOL:
            self._inquiry_answered(decided)
            return
        if decided is not None:
            # The approvals channel dedupes by intent_id: a request sent again gets the
            # recorded decision again.
            self._deliver(decided, produced=intent.tool_name != ESCALATION_TOOL)
            return
        approval = AgentEnvelope.Approval(
            intent_id=intent.intent_id,
            approved=self.rng.random() < 0.7,
            approver="sim@example.com",
            decided_at_ms=self.now,
            intent_digest=content_digest(_bytes(intent)),
        )
        envelope = AgentEnvelope(
            entity_key=intent.entity_key,
            event_time_ms=self.now,
            approval=sign(approval, APPROVAL_RING),
        )
        self.decisions[intent.intent_id] = envelope
        if intent.tool_name == INQUIRY_TOOL:
            # The effector asked whether a call it lost took effect: the person's answer goes
            # to the effector, which makes it the call's result.
            self._inquiry_answered(envelope)
            return
        self.answered.add((intent.intent_id, approval.intent_digest))
        # The runtime's own escalations are answered to the runtime, not to the agent.
        self._deliver(envelope, produced=intent.tool_name != ESCALATION_TOOL)
        if self.rng.random() < 0.1:  # a human who changes their mind: a second answer
            approval.approved = not approval.approved
            envelope.approval.CopyFrom(sign(approval, APPROVAL_RING))
            self._deliver(envelope, produced=intent.tool_name != ESCALATION_TOOL)

    def _inquiry_answered(self, envelope: AgentEnvelope) -> None:
        output = self.effector.resolve(envelope)
        if output is None or output.result is None:
            self.fail(
                f"the effector took no result from the answer to {envelope.approval.intent_id}"
            )
        result = output.result.tool_result
        self.answered.add((result.intent_id, result.intent_digest))
        self._deliver(output.result)

    def _forge(self, key: bytes, intent: ToolIntent) -> None:
        """Someone who can write to the events topic answers a pending intent: with a key of
        their own, unsigned, or, holding an effector's key, approving an approval intent."""
        if intent.kind == ToolIntent.APPROVAL and self.rng.random() < 0.5:
            approval = AgentEnvelope.Approval(
                intent_id=intent.intent_id,
                approved=True,
                approver="an effector",
                intent_digest=content_digest(_bytes(intent)),
            )
            envelope = AgentEnvelope(
                entity_key=key, event_time_ms=self.now, approval=sign(approval, RESULT_RING)
            )
            self.forged.add(answer_bytes(envelope))
            self._deliver(envelope, produced=False)
            return
        result = ToolResult(
            intent_id=intent.intent_id,
            entity_key=key,
            status=ToolResult.OK,
            payload=b"forged",
            intent_digest=content_digest(_bytes(intent)),
        )
        if self.rng.random() < 0.5:
            result = sign(result, FORGER_RING)
        envelope = AgentEnvelope(entity_key=key, event_time_ms=self.now, tool_result=result)
        self.forged.add(answer_bytes(envelope))
        self._deliver(envelope, produced=False)

    def _event(self, key: bytes) -> None:
        self.nonce += 1
        program = {"nonce": self.nonce, "ops": agents.random_program(self.rng)}
        self.programs[self.nonce] = program["ops"]
        pick = self.rng.random()
        at = 0 if pick < 0.05 else self.now - 10**6 if pick < 0.08 else self.now
        envelope = AgentEnvelope(
            entity_key=key,
            event_time_ms=at,
            external_event=json.dumps(program, sort_keys=True).encode(),
        )
        idempotency = b"idem-%d" % self.nonce if self.rng.random() < 0.3 else b""
        for _ in range(2 if self.rng.random() < 0.2 else 1):  # an at-least-once producer
            self.inbox[key].append(("E", _bytes(envelope), idempotency))
        if self.rng.random() < 0.1:
            export = AgentEnvelope(entity_key=key, event_time_ms=self.now)
            export.export_request.request_id = f"x{self.nonce}"
            self.inbox[key].append(("E", _bytes(export), b""))
