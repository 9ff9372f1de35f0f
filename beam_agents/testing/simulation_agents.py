"""The random deterministic agents, model and tools of the deterministic simulation
(`simulation`): everything an agent does is a function of its event, its answers, its memory
and its model's answers, so the only nondeterminism is the model's, drawn from the seed.

A program is a JSON list of operations carried in the external event:

    ["put", key, value]   a memory write
    ["count"]             visits = memory["visits"] + 1 (one visit per completed event)
    ["llm", prompt]       a model call; later tool arguments carry its answer
    ["try_llm", prompt]   a model call whose failure the agent catches: its answer is then
                          the failure's kind ("busy" or "down") and text
    ["call", tool]        one tool call, suspending until it is answered
    ["calls", [tools]]    parallel tool calls in one step
    ["approve", question] an approval, answered by the simulated human
    ["raise"]             fails, deterministically
    ["raise_unless_ok"]   fails when the latest answer was not OK

`FUNCTION` runs a program as an `@agent` function (re-executed from the top on every resume);
`StepAgent` runs it as a class agent that carries its position in the Continuation.
"""

from __future__ import annotations

import json
import random

from beam_agents.errors import LlmCallError
from beam_agents.runtime import LlmRequest, LlmResponse, agent

__all__ = ["FUNCTION", "TOOLS", "SimModel", "StepAgent", "random_program"]

TOOLS = ("pay", "lookup", "flaky")


def random_program(rng: random.Random) -> list:
    ops: list = []
    for _ in range(rng.randint(0, 4)):
        pick = rng.random()
        if pick < 0.12:
            ops.append(["put", rng.choice("abc"), str(rng.randrange(100))])
        elif pick < 0.24:
            ops.append(["count"])
        elif pick < 0.42:
            ops.append(["llm", f"p{rng.randrange(3)}"])
        elif pick < 0.64:
            ops.append(["call", rng.choice(TOOLS)])
        elif pick < 0.78:
            ops.append(["calls", [rng.choice(TOOLS) for _ in range(rng.randint(2, 3))]])
        elif pick < 0.9:
            ops.append(["approve", f"q{rng.randrange(3)}"])
        elif pick < 0.93:
            ops.append(["raise"])
        else:
            ops.append(["raise_unless_ok"])
    return ops


class SimModel:
    """A model that fails now and then (LlmCallError, retryable or not) and answers a request
    it was asked before differently now and then (a retried bundle's model call)."""

    def __init__(self, rng: random.Random, fail_p: float, variant_p: float) -> None:
        self._rng = rng
        self._fail_p = fail_p
        self._variant_p = variant_p
        self._asked: set[str] = set()
        #: Tokens of every answer it gave: no key's usage may count more than were paid.
        self.paid = 0
        #: Called with each request it answers.
        self.on_paid = lambda request: None

    def complete(self, request: LlmRequest) -> LlmResponse:
        if self._rng.random() < self._fail_p:
            raise LlmCallError("busy", model=request.model, retryable=self._rng.random() < 0.7)
        canonical = request.canonical()
        variant = 0
        if canonical in self._asked and self._rng.random() < self._variant_p:
            variant = self._rng.randrange(1, 4)
        self._asked.add(canonical)
        self.paid += 3 + 2
        self.on_paid(request)
        return LlmResponse(f"{request.messages[-1]['content']}#{variant}", request.model, 3, 2)


def _summary(answers) -> list:
    return [
        [a.intent.intent_id, a.ok, a.result.status if a.result is not None else -1] for a in answers
    ]


@agent(name="sim.function/v1")
def _function(ctx, event: bytes) -> bytes:
    program = json.loads(event)
    last, latest_ok, seen, visits = "", True, [], None
    for index, op in enumerate(program["ops"]):
        name = op[0]
        if name == "put":
            ctx.memory.put(op[1], op[2].encode())
        elif name == "count":
            visits = int(ctx.memory.get("visits", b"0")) + 1
            ctx.memory.put("visits", str(visits).encode())
        elif name in ("llm", "try_llm"):
            last = _ask(ctx, name, op[1])
        elif name in ("call", "calls"):
            tools = [op[1]] if name == "call" else op[1]
            answers = ctx.call_tools([(t, {"i": index, "llm": last}) for t in tools])
            latest_ok = all(a.ok for a in answers)
            seen += _summary(answers)
        elif name == "approve":
            answer = ctx.request_approval(op[1], llm=last)
            latest_ok = answer.ok
            seen += _summary([answer])
        elif name == "raise" or (name == "raise_unless_ok" and not latest_ok):
            raise RuntimeError(f"{name} at op {index}")
    return json.dumps({"nonce": program["nonce"], "seen": seen, "visits": visits}).encode()


FUNCTION = _function


def _ask(ctx, op: str, prompt: str) -> str:
    """The model's answer to `prompt`; under "try_llm", a failure's kind and text instead."""
    try:
        return ctx.llm([{"role": "user", "content": prompt}], model="sim").text
    except LlmCallError as e:
        if op == "llm":
            raise
        return f"{'busy' if e.retryable else 'down'}: {e}"


class StepAgent:
    """The class-agent form of a program: its position and what it saw travel in the
    Continuation's snapshot; memory writes commit with each activation."""

    adapter = "sim.class/v1"

    def start(self, ctx, event: bytes):
        program = json.loads(event)
        return self._go(ctx, program, 0, [], True)

    def resume(self, ctx, answers):
        state = json.loads(ctx.resume_of.snapshot)
        seen = state["seen"] + _summary(answers)
        return self._go(ctx, state["program"], state["at"], seen, all(a.ok for a in answers))

    def _go(self, ctx, program, at, seen, latest_ok):
        last = ""
        ops = program["ops"]
        for index in range(at, len(ops)):
            op = ops[index]
            name = op[0]
            if name == "put":
                ctx.memory.put(op[1], op[2].encode())
            elif name in ("llm", "try_llm"):
                last = _ask(ctx, name, f"{op[1]}@{index}")
            elif name in ("call", "calls", "approve"):
                if name == "approve":
                    ctx.request_approval(op[1], llm=last)
                else:
                    tools = [op[1]] if name == "call" else op[1]
                    ctx.call_tools([(t, {"i": index, "llm": last}) for t in tools])
                state = {"program": program, "at": index + 1, "seen": seen}
                return ctx.suspend(snapshot=json.dumps(state).encode())
            elif name == "raise" or (name == "raise_unless_ok" and not latest_ok):
                raise RuntimeError(f"{name} at op {index}")
        return ctx.complete(json.dumps({"nonce": program["nonce"], "seen": seen}).encode())
