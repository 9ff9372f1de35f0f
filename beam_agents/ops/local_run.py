"""Run an agent locally, end to end: `run_locally(agent, events, tools=..., approver=...)`.

In production a message bus closes the loop: RunAgent emits signed ToolIntents, an effector
executes each once, a person answers approval requests, and the answers flow back to the key as
AgentEnvelopes. A Beam pipeline cannot loop, so a local run is a sequence of rounds, each one
real pipeline of `RunAgent` on the DirectRunner (or the runner `options` name: Prism, Flink),
run by `beam_agents.ops.rounds.run_round` on a manual clock:

1. Round 1 takes the events; every later round takes each key's StateSnapshot exported at the
   end of the round before (`Outputs.carried`) and the answers that round produced.
2. After each round, the intents it emitted go to an in-process `Effector` (the same gate a
   production effector service runs: decode, verify the signature, run the tool once, sign
   the result), with its records in a SQLite file of the run's working folder. An approval
   intent goes to `approver(intent)`, a stand-in for the person at the console: its yes or no
   becomes a signed Approval bound to the intent's content.
3. The run stops when a round produces nothing to feed back: every key completed, failed, or
   waits for an answer nobody gives (`LocalRun.pending`).

The transcript shows the model calls too (`ModelCall`: what was asked, what was answered, and
whether the key's replay cache answered it). The model's words are nowhere in RunAgent's
outputs (its traces carry the model and the token counts only, as a production trace should),
so the run hands RunAgent a recording wrapper of `llm_client` that writes each paid call's
request and answer to a file of the working folder; each LLM_CALL trace event is then matched
to its request exactly, by recomputing the event's span id from the request (the id is a pure
function of the key, the activation and the call's replay-cache key).

Signing is real: the run makes three keys of its own (intents, results, approvals), RunAgent
signs intents and verifies answers with them and the effector verifies intents in
`VerifyMode.REQUIRE`, so an agent that runs here signs and verifies as it will in production;
no key needs to be configured. A tool is an ordinary function `tool(args: dict, intent) ->
bytes` (or a `ToolSpec`), run in this process, so it may be a closure.

    run = run_locally(my_agent, [b"first event", b"second event"],
                      tools={"stock.lookup": stock_lookup}, approver=lambda intent: True,
                      llm_client=ScriptedLlmClient(lambda request: "pen"))
    run.completions, run.dead_letters, print(run.transcript())
    run.completions[0].entity_key  # each completion is the agent's bytes, with its key

The pipeline options default to $BEAM_AGENTS_PIPELINE_OPTIONS (`rounds.env_options`), so the
same code runs on Prism with `options=PipelineOptions(["--runner=PrismRunner",
"--prism_location=PATH"])`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from apache_beam.options.pipeline_options import PipelineOptions

from beam_agents._protos import (
    ActivationErrorRecord,
    ActivationRecord,
    AgentEnvelope,
    StateSnapshot,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.intents.effector import INQUIRY_TOOL, Effector, Route, Tool, VerifyMode
from beam_agents.intents.identity import content_digest
from beam_agents.intents.signing import Keyring, sign
from beam_agents.ops.prism import with_local_prism
from beam_agents.ops.rounds import Advance, ManualClock, run_round
from beam_agents.runtime import (
    COMPLETIONS,
    ERRORS,
    INTENTS,
    RECORDS,
    TRACES,
    Agent,
    LlmClient,
    LlmRequest,
    LlmResponse,
    Recording,
    RunAgent,
    RuntimeConfig,
)
from beam_agents.runtime.context import llm_cache_key
from beam_agents.runtime.trace_ids import span_id

__all__ = [
    "Approver",
    "Completed",
    "LocalRun",
    "ModelCall",
    "Step",
    "approval_answer",
    "run_locally",
]

#: The stand-in for the person at the console: an approval intent in, approved or not out.
#: `json.loads(intent.args_json)` holds the question and the details the agent gave.
Approver = Callable[[ToolIntent], bool]

#: How far apart the rounds are in event time (ms): answers arrive 10 ms into the next.
_ROUND_MS = 1000
_ANSWER_DELAY_MS = 10


class Completed(bytes):
    """What the agent returned for one activation (its bytes, as they are: `json.loads` reads
    them), and `entity_key`, the key it completed for."""

    entity_key: bytes

    def __new__(cls, output: bytes, entity_key: bytes) -> Completed:
        completed = super().__new__(cls, output)
        completed.entity_key = entity_key
        return completed


@dataclasses.dataclass(frozen=True)
class ModelCall:
    """One `ctx.llm` call: the `model`, what it was `asked` (the last message's content), what
    it `answered` (its text, and the tools it asked to call), and whether the key's replay
    cache answered it (`cached`: a rerun after an answer, not paid again). `asked` and
    `answered` are "?" for a call the run cannot match to a request it recorded (one given a
    `replay_key`); a request the model answered differently at two places of the run shows
    its latest answer."""

    model: str
    asked: str
    answered: str
    cached: bool


@dataclasses.dataclass(frozen=True)
class Step:
    """One line of a local run's conversation: in `round` (1, 2, ...), for `entity_key`, a
    `kind` of message: "event" (an AgentEnvelope in), "model" (a `ModelCall`), "intent" (a
    ToolIntent out), "result" and "approval" (the answers fed back, AgentEnvelopes),
    "completion" (the agent's bytes) or "dead_letter" (an ActivationErrorRecord)."""

    round: int
    kind: str
    entity_key: bytes
    message: object

    def describe(self) -> str:
        """The step as one line of text."""
        m = self.message
        if self.kind == "event":
            what = _text(m.external_event)
        elif self.kind == "model":
            asked, answered = (json.dumps(t, ensure_ascii=False) for t in (m.asked, m.answered))
            what = f"{m.model} asked {asked}, answered {answered}" + (" (cached)" * m.cached)
        elif self.kind == "intent":
            what = f"{m.tool_name} {m.args_json}"
        elif self.kind == "result":
            result = m.tool_result
            what = f"{ToolResult.Status.Name(result.status)} " + (
                _text(result.payload) if result.payload else result.error_message
            )
        elif self.kind == "approval":
            decision = m.approval
            what = f"{'approved' if decision.approved else 'declined'} by {decision.approver}"
        elif self.kind == "completion":
            what = _text(m)
        else:
            what = f"{m.reason}: {m.detail}"
        key = self.entity_key.decode(errors="replace")
        return f"round {self.round}  {key}  {self.kind}: {what}"


def _text(data: bytes) -> str:
    return data.decode(errors="replace")


@dataclasses.dataclass
class LocalRun:
    """What a local run did (`run_locally`)."""

    #: Every step in order: events, intents, answers, completions, dead letters.
    conversation: list[Step] = dataclasses.field(default_factory=list)
    #: Approval intents nobody answered (no `approver` was given): their keys wait for them.
    pending: list[ToolIntent] = dataclasses.field(default_factory=list)
    #: Each key's StateSnapshot at the end: restore it to carry on (`RunAgent`'s snapshots).
    snapshots: dict[bytes, StateSnapshot] = dataclasses.field(default_factory=dict)
    #: The agent's trace events (OpenTelemetry GenAI spans, `beam_agents.integrations.telemetry`).
    traces: list[TraceEvent] = dataclasses.field(default_factory=list)
    #: How many rounds (pipelines) ran.
    rounds: int = 0
    #: With `recording`: an ActivationRecord per activation, in order (RunAgent's RECORDS).
    records: list[ActivationRecord] = dataclasses.field(default_factory=list)

    @property
    def completions(self) -> list[Completed]:
        """What the agent returned, one per completed activation, in order: each the agent's
        bytes, with the key it completed for (`Completed.entity_key`)."""
        return [
            Completed(step.message, step.entity_key)
            for step in self.conversation
            if step.kind == "completion"
        ]

    @property
    def model_calls(self) -> list[ModelCall]:
        """Every `ctx.llm` call, paid or answered from the replay cache, in order."""
        return self._of("model")

    @property
    def dead_letters(self) -> list[ActivationErrorRecord]:
        """RunAgent's and the effector's dead letters, each with its `reason` and `detail`."""
        return self._of("dead_letter")

    @property
    def intents(self) -> list[ToolIntent]:
        """Every ToolIntent the agent emitted (tool calls and approval requests)."""
        return self._of("intent")

    def _of(self, kind: str) -> list:
        return [step.message for step in self.conversation if step.kind == kind]

    def transcript(self) -> str:
        """The conversation as text, one line per step: events, model calls (asked, answered,
        cached), intents, answers, completions and dead letters, round by round; then the
        approval requests left waiting, when no approver answered them."""
        lines = [step.describe() for step in self.conversation]
        lines += [
            f"waiting: {intent.tool_name} {intent.intent_id} of {intent.entity_key!r}, no approver"
            " answered it (run_locally(approver=...))"
            for intent in self.pending
        ]
        return "\n".join(lines)


def approval_answer(
    intent: ToolIntent,
    *,
    approved: bool,
    approver: str,
    keyring: Keyring,
    decided_at_ms: int,
) -> AgentEnvelope:
    """A person's decision on an APPROVAL intent, as the AgentEnvelope that answers it: bound to
    the intent's content (`content_digest`) and signed with `keyring`'s active key (the ring
    RunAgent's `approval_keyring_loader` verifies with)."""
    decision = AgentEnvelope.Approval(
        intent_id=intent.intent_id,
        approved=approved,
        approver=approver,
        decided_at_ms=decided_at_ms,
        intent_digest=content_digest(intent.SerializeToString(deterministic=True)),
    )
    return AgentEnvelope(
        entity_key=intent.entity_key,
        event_time_ms=decided_at_ms,
        approval=sign(decision, keyring),
    )


def run_locally(
    agent: Agent,
    events: Iterable[bytes | str | tuple[bytes, bytes] | AgentEnvelope],
    *,
    tools: Mapping[str, Tool],
    approver: Approver | None = None,
    llm_client: LlmClient | None = None,
    key: bytes = b"local",
    options: PipelineOptions | None = None,
    config: RuntimeConfig | None = None,
    workdir: str | os.PathLike | None = None,
    max_rounds: int = 16,
    recording: Recording | None = None,
) -> LocalRun:
    """Runs `agent` on `events` round by round until nothing is left to answer.

        `events`: bytes or str (an external event for `key`), (entity_key, bytes) pairs, or
        AgentEnvelopes; they arrive a millisecond apart in this order. `tools` maps tool names to
        `tool(args, intent) -> bytes` callables or `ToolSpec`s, run once per intent by an
        in-process `Effector`. `approver(intent) -> bool` answers approval requests; without one
        they stay `pending`. `llm_client` answers `ctx.llm` (a `ScriptedLlmClient` in tests, a
        provider's client otherwise). `options` are the pipelines' (default: the DirectRunner, or
        $BEAM_AGENTS_PIPELINE_OPTIONS); `workdir` keeps the rounds' files and the effector's
        store (default: a temporary folder, removed after). `recording` turns RunAgent's recording
    on: the run's `records` hold an ActivationRecord per activation, what `beam-agents backtest`
    runs a changed agent over. `--runner=PrismRunner` without
        `--prism_location` uses the Prism `tools/engines.sh prism` built (PrismNotFoundError, saying
        how to get it, when there is none). Raises ValueError past `max_rounds` rounds (an agent
        that never stops calling tools).
    """
    if not isinstance(tools, Mapping):
        raise TypeError(
            f"tools maps each tool's name to its function or ToolSpec, not {type(tools).__name__}:"
            ' e.g. tools={"stock.lookup": lookup}'
        )
    if workdir is None:
        with tempfile.TemporaryDirectory(prefix="beam-agents-local-") as scratch:
            return _LocalLoop(
                agent, tools, approver, llm_client, options, config, scratch, recording
            ).run(events, key, max_rounds)
    return _LocalLoop(agent, tools, approver, llm_client, options, config, workdir, recording).run(
        events, key, max_rounds
    )


def _ring(name: str) -> Keyring:
    return Keyring({name: os.urandom(32)}, active=name)


class _LocalLoop:
    def __init__(
        self, agent, tools, approver, llm_client, options, config, workdir, recording
    ) -> None:
        self._rings = {name: _ring(f"local-{name}") for name in ("intent", "result", "approval")}
        # Loaders, not rings: RunAgent loads its keys on the worker (a partial pickles).
        loaders = {
            name: functools.partial(Keyring, ring.keys, active=ring.active)
            for name, ring in self._rings.items()
        }
        self._asked = Path(workdir) / "model-calls.jsonl"
        if llm_client is not None:
            llm_client = _RecordingClient(llm_client, str(self._asked))
        # A transform belongs to the pipeline it was applied in: one RunAgent a round.
        self._run_agent = functools.partial(
            RunAgent,
            agent,
            llm_client=llm_client,
            keyring_loader=loaders["intent"],
            result_keyring_loader=loaders["result"],
            approval_keyring_loader=loaders["approval"],
            config=config,
            recording=recording,
        )
        self._clock = ManualClock(int(time.time() * 1000))
        self._effector = Effector(
            tools,
            mode=VerifyMode.REQUIRE,
            store=Path(workdir) / "effector.sqlite",
            keyring=self._rings["intent"],
            result_keyring=self._rings["result"],
            approval_keyring=self._rings["approval"],
            clock=self._clock,
        )
        self._approver = approver
        self._options = None if options is None else with_local_prism(options)
        self._workdir = workdir
        self._run = LocalRun()

    def run(self, events, key: bytes, max_rounds: int) -> LocalRun:
        inputs: list = [
            _envelope(event, key, self._clock.now_ms + i) for i, event in enumerate(events)
        ]
        for number in range(1, max_rounds + 1):
            self._clock.advance(_ROUND_MS)
            answers = self._round(number, inputs)
            if not answers:
                return self._run
            inputs = [*self._run.snapshots.values(), *answers]
        raise ValueError(f"the agent was still calling tools after {max_rounds} rounds")

    def _round(self, number: int, inputs: list) -> list[AgentEnvelope]:
        run, now = self._run, self._clock.now_ms
        run.rounds = number
        for envelope in inputs:
            if isinstance(envelope, AgentEnvelope) and envelope.HasField("external_event"):
                run.conversation.append(Step(number, "event", envelope.entity_key, envelope))
        outputs = run_round(
            self._run_agent(), [*inputs, Advance(now)], self._workdir, options=self._options
        )
        run.snapshots = dict(outputs.carried)
        traces = outputs.values(TRACES)
        run.traces.extend(traces)
        run.records.extend(outputs.values(RECORDS))
        run.conversation.extend(
            Step(number, "model", event.entity_key, call)
            for event, call in _model_calls(traces, _recorded(self._asked))
        )
        for tag, kind in ((COMPLETIONS, "completion"), (ERRORS, "dead_letter")):
            rows = outputs.rows.get(tag, [])
            run.conversation.extend(Step(number, kind, key, value) for _, key, value in rows)
        answers = []
        for _, entity_key, intent in outputs.rows.get(INTENTS, []):
            run.conversation.append(Step(number, "intent", entity_key, intent))
            answer = self._answer(intent, now)
            if answer is not None:
                kind = "approval" if answer.HasField("approval") else "result"
                run.conversation.append(Step(number, kind, entity_key, answer))
                answer.event_time_ms = now + _ANSWER_DELAY_MS
                answers.append(answer)
        return answers

    def _answer(self, intent: ToolIntent, now: int) -> AgentEnvelope | None:
        """The effector's answer to `intent`, or the approver's; None when there is none yet."""
        output = self._effector(intent)
        if output.route is Route.APPROVAL:
            asked = output.approval
            if self._approver is None:
                self._run.pending.append(asked)
                return None
            approved = self._approver(asked)
            if not isinstance(approved, bool):
                # "no" is truthy: a person's refusal must never read as a yes.
                raise TypeError(
                    f"the approver answered {approved!r} to {asked.tool_name} "
                    f"({asked.intent_id}): it must return True or False"
                )
            decision = approval_answer(
                asked,
                approved=approved,
                approver="run_locally approver",
                keyring=self._rings["approval"],
                decided_at_ms=now,
            )
            if asked.tool_name != INQUIRY_TOOL:
                return decision
            # A lost call's inquiry is the effector's question: its answer settles the call.
            output = self._effector.resolve(decision)
            if output is None:
                return None
        if output.route is Route.DEAD_LETTER:
            record = output.dead_letter
            self._run.conversation.append(
                Step(self._run.rounds, "dead_letter", record.entity_key, record)
            )
            return None
        return output.result


def _envelope(event, key: bytes, at_ms: int) -> AgentEnvelope:
    if isinstance(event, AgentEnvelope):
        return event
    if isinstance(event, tuple):
        key, event = event
    if isinstance(event, str):
        event = event.encode()
    if not isinstance(event, bytes) or not isinstance(key, bytes):
        raise TypeError(
            "an event is bytes, str, an (entity_key, bytes) pair or an AgentEnvelope, "
            f"not {type(event).__name__}"
        )
    return AgentEnvelope(entity_key=key, event_time_ms=at_ms, external_event=event)


class _RecordingClient:
    """`client`, writing each call's canonical request, question and answer as a line of JSON
    to the file `path` (DoFns run on copies: only a file reaches the run). Picklable when
    `client` is."""

    def __init__(self, client: LlmClient, path: str) -> None:
        self._client = client
        self._path = path

    def complete(self, request: LlmRequest) -> LlmResponse:
        response = self._client.complete(request)
        line = {
            "canonical": request.canonical(),
            "asked": _asked(request),
            "answered": _answered(response),
        }
        with open(self._path, "a") as calls:
            calls.write(json.dumps(line) + "\n")
        return response


def _asked(request: LlmRequest) -> str:
    content = request.messages[-1].get("content", "") if request.messages else ""
    return content if isinstance(content, str) else json.dumps(content)


def _answered(response: object) -> str:
    text = getattr(response, "text", "")
    calls = [getattr(call, "name", "?") for call in getattr(response, "tool_calls", ())]
    if not calls:
        return text if isinstance(text, str) else repr(text)
    return f"{text} (calls {', '.join(calls)})" if text else f"(calls {', '.join(calls)})"


def _recorded(path: Path) -> dict[str, dict]:
    """The recorded calls by canonical request (the same request gets the same answer)."""
    if not path.exists():
        return {}
    calls = (json.loads(line) for line in path.read_text().splitlines())
    return {call["canonical"]: call for call in calls}


def _model_calls(traces: list[TraceEvent], recorded: dict[str, dict]):
    """(trace event, ModelCall) for each LLM_CALL event of `traces`, in order."""
    calls = [e for e in traces if e.event_type == TraceEvent.LLM_CALL]
    in_activation: dict[bytes, int] = {}
    for event in calls:
        in_activation[event.parent_span_id] = in_activation.get(event.parent_span_id, 0) + 1
    for event in calls:
        found = _match(event, recorded, in_activation[event.parent_span_id])
        yield (
            event,
            ModelCall(
                model=event.attributes.get("gen_ai.request.model", ""),
                asked=found["asked"] if found else "?",
                answered=found["answered"] if found else "?",
                cached=event.attributes.get("beam_agents.replayed") == "true",
            ),
        )


def _match(event: TraceEvent, recorded: dict[str, dict], calls: int) -> dict | None:
    """The recorded call whose request made `event`: its span id is a function of the key, the
    activation and the call's replay-cache key (position in the activation, request)."""
    parent = event.parent_span_id.hex()
    for position in range(calls):
        for canonical, call in recorded.items():
            cache_key = llm_cache_key(event.entity_key, event.seq, position, canonical)
            if span_id(event.entity_key, event.seq, "llm", parent, cache_key) == event.span_id:
                return call
    return None
