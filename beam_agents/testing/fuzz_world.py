"""The world of RunAgent's generative harness (beam_agents.testing.fuzz): the agent, the model
and the tool it drives, all deterministic functions of the generated inputs, so that two
runners and two processes given one scenario must emit the same bytes.

`FuzzAgent` reads JSON commands from its event (as `probe.Probe` does): ask the model (with the
usage the model is to report, or a failure, or a billed refusal it may catch), call tools,
raise (a plain error, or one whose `__str__` raises too), then suspend or complete. Its outputs
name the event, the seq and every answer it was given, which is what the oracle reads.
`FuzzModel` answers with the usage the command asks it to report, however large. `EffectTool`
is the tool the real Effector runs: each run is a row in a real SQLite file (the world's
record of effects), keyed by the event and call it performs.
"""

from __future__ import annotations

import json
import sqlite3

from beam_agents._protos import ToolResult
from beam_agents.errors import LlmCallError
from beam_agents.intents.signing import Keyring
from beam_agents.runtime.context import LlmResponse

__all__ = [
    "EFFECT_TOOL",
    "INTENT_RING",
    "MODEL",
    "BadStr",
    "EffectTool",
    "FuzzAgent",
    "FuzzModel",
    "load_intent_ring",
    "read_effects",
]

MODEL = "fuzz-model"
EFFECT_TOOL = "fx.effect"
INTENT_RING = Keyring({"fuzz-2026-12": bytes(range(1, 33))}, active="fuzz-2026-12")


def load_intent_ring() -> Keyring:
    return INTENT_RING


class BadStr(Exception):
    """An agent's exception whose text cannot be read: `str()` of it raises."""

    def __str__(self) -> str:
        raise RuntimeError("this exception has no text")


def _ask(ctx, spec: dict) -> None:
    """One model call asking for `spec` (the usage the model reports, or its failure); a
    refusal the spec says to catch is got over, as an agent may."""
    try:
        ctx.llm([{"role": "user", "content": json.dumps(spec, sort_keys=True)}], model=MODEL)
    except LlmCallError:
        if not spec.get("catch"):
            raise


def _raise(command: dict, point: str) -> None:
    if command.get("raise_at") == point:
        if command.get("raise") == "bad_str":
            raise BadStr()
        raise RuntimeError(f"raised at {point}")


class FuzzAgent:
    """start: model call, tool calls, then suspend (with `deadline_ms`) or complete; resume:
    an optional model call, then complete with every answer it got. See the module
    docstring."""

    adapter = "tests.fuzz/v1"

    def start(self, ctx, event: bytes):
        command = json.loads(event)
        _raise(command, "start")
        if "llm" in command:
            _ask(ctx, command["llm"])
        if command.get("calls"):
            ctx.call_tools(
                [(EFFECT_TOOL, {"event": command["name"], "n": n}) for n in range(command["calls"])]
            )
        _raise(command, "after_call")
        if ctx.intents:
            return ctx.suspend(snapshot=event, deadline_ms=command.get("deadline_ms"))
        return ctx.complete(_output(command, ctx, []))

    def resume(self, ctx, answers):
        command = json.loads(ctx.resume_of.snapshot or b"{}")
        _raise(command, "resume")
        if "llm_on_resume" in command:
            _ask(ctx, command["llm_on_resume"])
        seen = [
            [
                a.intent.intent_id,
                ToolResult.Status.Name(a.result.status) if a.result else ("ok" if a.ok else "no"),
                a.result.error_message if a.result else "",
            ]
            for a in answers
        ]
        return ctx.complete(_output(command, ctx, seen))


def _output(command: dict, ctx, answers: list) -> bytes:
    return json.dumps(
        {"event": command.get("name", ""), "seq": ctx.seq, "at": ctx.now_ms, "answers": answers},
        sort_keys=True,
    ).encode()


class FuzzModel:
    """Answers a request whose last message is a JSON spec: `in`/`out` tokens reported (a lie
    of any size), `fail` ("busy": retryable, "down": not), `refuse` (billed, then refused)."""

    def complete(self, request):
        spec = json.loads(request.messages[-1]["content"])
        tokens = {"input_tokens": spec.get("in", 0), "output_tokens": spec.get("out", 0)}
        if spec.get("fail"):
            raise LlmCallError("the model failed", model=request.model, retryable=True)
        if spec.get("refuse"):
            raise LlmCallError(
                "refused after billing", model=request.model, retryable=False, **tokens
            )
        return LlmResponse(f"answer {spec.get('text', '')}", request.model, **tokens)


class EffectTool:
    """The effect of a call, recorded in a SQLite file: (intent_id, event, n) per run."""

    def __init__(self, path: str) -> None:
        self._path = path
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE IF NOT EXISTS effects (intent_id TEXT, event TEXT, n INT)")

    def __call__(self, args: dict, tool_intent) -> bytes:
        with sqlite3.connect(self._path) as db:
            db.execute(
                "INSERT INTO effects VALUES (?, ?, ?)",
                (tool_intent.intent_id, str(args.get("event")), int(args.get("n", 0))),
            )
        return b"done"


def read_effects(path: str) -> list[tuple[str, str, int]]:
    with sqlite3.connect(path) as db:
        return list(db.execute("SELECT intent_id, event, n FROM effects ORDER BY rowid"))
