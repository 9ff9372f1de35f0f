"""A generative adversarial harness for RunAgent's DoFn: generated scenarios
(`fuzz_scenarios`) run as real Beam pipelines on two runners, and invariants as the oracle.

`run(scenario, runner, workdir)` runs RunAgent (its real `_AgentDoFn`) over all of a
scenario's keys in one pipeline, so one pipeline checks many generated sequences: on Beam's
portable FnApiRunner ("fnapi"), which hands back the very object stored in state as Prism,
Flink and Dataflow do, or on the BundleBasedDirectRunner ("direct"), which copies; in this
process or in a child one. Then a real Effector on a real SQLite file executes every intent
emitted, at the event time it was emitted; an intent the agent was told had expired also goes
to a second Effector at the time it was told. `check(scenario, runs)` returns the `Finding`s,
each naming the invariant it breaks (`INVARIANTS`):

* `bundle_failed`: no bundle ever fails (a failed bundle wedges its key on a real runner);
* `unnamed_dead_letter`: every failure is a dead letter with a reason of `dead_letters.REASONS`;
* `noise_dead_letter`: no dead letter says that nothing happened (`stale_timer`);
* `intent_ran_twice`: the Effector runs each intent id at most once;
* `double_effect`: an event's tool call acts at most once, whatever intent id it ran under;
* `event_ran_twice`: an event (each scripted event is distinct) completes at most once;
* `answer_lost`: every answer not dead-lettered reaches the agent or a dead letter's answers;
* `told_expired_may_still_run`: the agent is never told EXPIRED for an intent an Effector
  still runs at that time;
* `born_expired`: no intent is emitted already expired (the Effector refuses it at once; an
  event stamped past the key's clock is judged at the key's clock, `_execute`);
* `usage_shrank`: a key's usage and budget counters in its exports only grow;
* `runners_differ`: every output and the exported state are byte-identical on both runners
  (and in another process, when a run is made there).

A bounded pipeline ends by advancing the watermark to infinity, so every timer still set fires
late, after all inputs: a scenario's last suspensions end there, by their policy.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import pickle
import subprocess
import sys
import traceback
from pathlib import Path

import apache_beam as beam
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.transforms import window

from beam_agents._protos import (
    ActivationErrorRecord,
    StateSnapshot,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.intents.effector import Effector, Route, VerifyMode
from beam_agents.ops.rounds import OPTIONS_ENV, ManualClock, _AppendLines, _read, env_options
from beam_agents.runtime import RunAgent
from beam_agents.runtime.dead_letters import REASONS
from beam_agents.runtime.machine_inputs import USAGE_FIELDS
from beam_agents.testing.fuzz_scenarios import OPEN, Answer, Restore, Scenario
from beam_agents.testing.fuzz_world import (
    EFFECT_TOOL,
    INTENT_RING,
    EffectTool,
    FuzzAgent,
    FuzzModel,
    load_intent_ring,
    read_effects,
)

__all__ = [
    "CAUGHT_BY",
    "INVARIANTS",
    "RUNNERS",
    "Finding",
    "Run",
    "check",
    "examples_budget",
    "run",
    "run_both",
]

_EXPIRED_BY_RUNTIME = "no answer by"

INVARIANTS = (
    "bundle_failed",
    "unnamed_dead_letter",
    "noise_dead_letter",
    "intent_ran_twice",
    "double_effect",
    "event_ran_twice",
    "answer_lost",
    "told_expired_may_still_run",
    "born_expired",
    "usage_shrank",
    "runners_differ",
)

# The reason of the dead letter that said nothing happened (issue 37 item 13): gone from
# REASONS with its fix, kept here so the finding names it rather than only `unnamed_dead_letter`.
STALE_TIMER = "stale_timer"


#: The invariants that catch the defect of each item of issue 37 the harness was seeded from.
CAUGHT_BY = {
    1: frozenset({"double_effect", "event_ran_twice"}),
    2: frozenset({"double_effect", "event_ran_twice"}),
    3: frozenset({"told_expired_may_still_run"}),
    4: frozenset({"bundle_failed"}),
    5: frozenset({"bundle_failed"}),
    6: frozenset({"bundle_failed"}),
    7: frozenset({"bundle_failed", "usage_shrank"}),
    8: frozenset({"bundle_failed"}),
    9: frozenset({"born_expired"}),
    11: frozenset({"runners_differ", "usage_shrank"}),
    13: frozenset({"noise_dead_letter"}),
}


def examples_budget(default: int = 6) -> int:
    """How many scenarios a run generates: $BEAM_AGENTS_FUZZ_EXAMPLES, else `default`."""
    return int(os.environ.get("BEAM_AGENTS_FUZZ_EXAMPLES", default))


# -- running a scenario ----------------------------------------------------------------------

RUNNERS = ("fnapi", "direct")


def _pipeline_of(runner: str) -> beam.Pipeline:
    """A pipeline on `runner`: "fnapi", "direct", or "env", the runner the suite's
    $BEAM_AGENTS_PIPELINE_OPTIONS names (Prism on .ci/run's second pass)."""
    if runner == "env":
        return beam.Pipeline(options=env_options())
    return beam.Pipeline(runner=FnApiRunner() if runner == "fnapi" else BundleBasedDirectRunner())


class _HeaderText(str):
    """A transport client's str type: Beam's default coder pickles it, so a lone surrogate
    crosses into RunAgent (a plain str fails Beam's own size sampling of the element before
    any of RunAgent's code runs, which no transform of ours can catch)."""


class _Feed(beam.DoFn):
    """Script rows to RunAgent's inputs, with their event times; a str idempotency key is
    made here (it need not survive a coder: a lone surrogate has no UTF-8)."""

    def process(self, row):
        at, kind, data, idempotency = row
        if kind == "S":
            yield beam.pvalue.TaggedOutput("snapshots", window.TimestampedValue(data, at / 1000))
            return
        if kind == "U":
            idempotency = _HeaderText(idempotency.decode("utf-8", "surrogatepass"))
        element = data if idempotency is None else (data, idempotency)
        yield beam.pvalue.TaggedOutput("envelopes", window.TimestampedValue(element, at / 1000))


def _element_time(ms: int) -> int:
    # Element timestamps must fall inside the global window; an envelope's own time may not.
    return max(0, min(ms, 2**52))


@dataclasses.dataclass
class Run:
    """One runner's run of a scenario: its outputs (as rounds.Outputs rows), what the Effector
    did with its intents, or the error that failed the pipeline."""

    runner: str
    rows: dict = dataclasses.field(default_factory=dict)
    error: str = ""
    #: intent_id -> (element time emitted, time the agent was told it expired or None, whether
    #: an Effector ran it at that time, the status of the Effector's result when emitted)
    executions: dict = dataclasses.field(default_factory=dict)
    effects: list = dataclasses.field(default_factory=list)


def run(scenario: Scenario, runner: str, workdir, *, process: str = "") -> Run:
    """Runs `scenario` on `runner` (see `_pipeline_of`) in this process, or with `process`
    ("child") in a new Python process (`_child`), then its intents through the Effector."""
    folder = Path(workdir) / (runner + process)
    folder.mkdir(parents=True, exist_ok=True)
    outcome = Run(runner + process)
    if process:
        (folder / "scenario.pickle").write_bytes(pickle.dumps(scenario))
        child = subprocess.run(
            [sys.executable, "-c", f"from {__name__} import _child; _child()", runner, str(folder)],
            capture_output=True,
            text=True,
            check=False,
        )
        outcome.error = (folder / "error").read_text() if (folder / "error").exists() else ""
        if child.returncode and not outcome.error:
            outcome.error = f"the child process failed: {child.stderr[-500:]}"
    else:
        outcome.error = _pipeline(scenario, runner, folder)
    if not outcome.error:
        outcome.rows = {tag: _read(folder / tag) for tag in _TAGS}
        _execute(outcome, folder)
    return outcome


_TAGS = ("completions", "intents", "traces", "errors", "snapshots")


def _child() -> None:
    """A child process's run (`run(process="child")`): argv is the runner and the folder."""
    runner, folder = sys.argv[1], Path(sys.argv[2])
    scenario = pickle.loads((folder / "scenario.pickle").read_bytes())
    error = _pipeline(scenario, runner, folder)
    if error:
        (folder / "error").write_text(error)


def _pipeline(scenario: Scenario, runner: str, folder: Path) -> str:
    """Runs the pipeline, its outputs written under `folder`; the error that failed it, or
    ""."""
    rows = []
    for at, _, message, idempotency in scenario.envelopes():
        data = message.SerializeToString(deterministic=True)
        if isinstance(message, StateSnapshot):
            rows.append((_element_time(at), "S", data, None))
        elif isinstance(idempotency, str):
            rows.append(
                (_element_time(at), "U", data, idempotency.encode("utf-8", "surrogatepass"))
            )
        else:
            rows.append((_element_time(at), "E", data, idempotency))
    try:
        with _pipeline_of(runner) as pipeline:
            feed = (
                pipeline
                | beam.Create(rows, reshuffle=False)
                | beam.ParDo(_Feed()).with_outputs("snapshots", "envelopes")
            )
            outputs = {"envelopes": feed.envelopes, "snapshots": feed.snapshots} | RunAgent(
                FuzzAgent(),
                llm_client=FuzzModel(),
                keyring_loader=load_intent_ring,
                config=scenario.config,
            )
            for tag, pcollection in outputs.items():
                pcollection | f"Write{tag}" >> beam.ParDo(_AppendLines(str(folder / tag)))
    except Exception as e:  # the finding: a bundle failed
        return f"{type(e).__name__}: {_last_line(e)}"
    return ""


def _last_line(error: Exception) -> str:
    lines = [
        line
        for line in "".join(traceback.format_exception_only(error)).splitlines()
        if line.strip()
    ]
    cause = [line for line in str(error).splitlines() if "Error" in line or "Exception" in line]
    return (cause[-1] if cause else lines[-1])[:500]


def _told_expired(rows) -> dict[str, int]:
    """intent_id -> the time the runtime told the agent it had expired."""
    told = {}
    for _, _, output in rows.get("completions", []):
        done = json.loads(output)
        for answered, status, message in done["answers"]:
            if status == "EXPIRED" and message.startswith(_EXPIRED_BY_RUNTIME):
                told.setdefault(answered, done["at"])
    return told


def _effector(folder: Path, name: str, clock: ManualClock) -> Effector:
    return Effector(
        {EFFECT_TOOL: EffectTool(str(folder / f"{name}-world.sqlite"))},
        mode=VerifyMode.REQUIRE,
        store=str(folder / f"{name}-executions.sqlite"),
        keyring=INTENT_RING,
        clock=clock,
    )


def _clamped_starts(rows) -> dict[tuple[bytes, int, int], int]:
    """(key, seq, element time) -> the activation's "now", for each start of an event the
    runtime took as stamped past the key's clock: its own time is the element's (its trace
    names it, `beam_agents.event_time_ms`) and it ran earlier, at the key's clock (issue 37
    item 1: an event may move a key's clock by at most ttl_ms, clamped, not refused)."""
    clamped = {}
    for at, key, trace in rows.get("traces", []):
        own = trace.attributes.get("beam_agents.event_time_ms")
        if (
            trace.event_type == TraceEvent.ACTIVATION_START
            and own == str(at)
            and trace.start_ms < at
        ):
            clamped[(key, trace.seq, at)] = trace.start_ms
    return clamped


def _execute(outcome: Run, folder: Path) -> None:
    """Every intent emitted goes to one real Effector on a real SQLite file at the event time
    it was emitted; one the agent was told had expired also goes, at the time it was told, to
    a second Effector on a file of its own: whether a call could still act then.

    But for an intent of an event the runtime took as stamped past the key's clock
    (`_clamped_starts`): that element's time is its sender's clock, which the runtime rightly
    does not believe, so no Effector's clock is there; it runs at the key's clock, its
    activation's "now". (Any other start runs no earlier than the input that emitted it:
    queued, deferred or held, at the time it is drained or retried; so `born_expired` still
    judges those by the element's time.)"""
    clock, then = ManualClock(0), ManualClock(0)
    effector, later = _effector(folder, "effector", clock), _effector(folder, "told", then)
    told = _told_expired(outcome.rows)
    clamped = _clamped_starts(outcome.rows)
    for emitted, key, intent in outcome.rows.get("intents", []):
        if intent.kind != ToolIntent.TOOL:
            continue
        clock.now_ms = clamped.get((key, intent.seq, emitted), emitted)
        output = effector(intent)
        status = output.result.tool_result.status if output.route is Route.RESULT else None
        ran_when_told = None
        if intent.intent_id in told:
            then.now_ms = told[intent.intent_id]
            ran_when_told = later(intent).ran_tool
        outcome.executions.setdefault(
            intent.intent_id, (emitted, told.get(intent.intent_id), ran_when_told, status)
        )
    outcome.effects = read_effects(str(folder / "effector-world.sqlite"))


def run_both(scenario: Scenario, workdir) -> list[Run]:
    """The runs on the FnApiRunner and the DirectRunner, and on the runner
    $BEAM_AGENTS_PIPELINE_OPTIONS names when it is set."""
    runners = (*RUNNERS, "env") if os.environ.get(OPTIONS_ENV) else RUNNERS
    return [run(scenario, runner, workdir) for runner in runners]


# -- the oracle ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Finding:
    invariant: str
    runner: str
    key: bytes
    detail: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.runner} {self.key!r}: {self.detail}"


def check(scenario: Scenario, runs: list[Run], *, open_items=OPEN) -> list[Finding]:
    """Every invariant broken by `runs` of `scenario`. Ordinary inputs reach two open items'
    defects, so while they are open their invariants are left out here rather than their
    inputs from the generator: item 13's noise (also left out of the comparison of the
    runners, where it would hide every other difference) and item 9's intents born expired
    (an event queued behind any suspension that ends late)."""
    findings = []
    noise_open = 13 in open_items
    for outcome in runs:
        if outcome.error:
            findings.append(Finding("bundle_failed", outcome.runner, b"", outcome.error))
            continue
        findings += _check_run(scenario, outcome, noise_open, born_open=9 in open_items)
    # Prism (the "env" runner on .ci/run) does not keep a key's inputs in the order of a
    # bounded Create: its outputs are checked, not compared.
    complete = [r for r in runs if not r.error and r.runner != "env"]
    for other in complete[1:]:
        findings += _compare(scenario, complete[0], other, noise_open)
    return findings


def _check_run(scenario: Scenario, outcome: Run, noise_open: bool, born_open: bool):
    found, name = [], outcome.runner
    rows = outcome.rows
    for _, key, record in rows["errors"]:
        if record.reason not in REASONS:
            found.append(
                Finding("unnamed_dead_letter", name, key, f"{record.reason!r}: {record.detail}")
            )
        if record.reason == STALE_TIMER and not noise_open:
            found.append(Finding("noise_dead_letter", name, key, record.detail))
    runs_of = collections.Counter(intent for intent, _, _ in outcome.effects)
    for intent, count in runs_of.items():
        if count > 1:
            found.append(Finding("intent_ran_twice", name, b"", f"{intent} ran {count} times"))
    by_call = collections.defaultdict(set)
    owner = {i.intent_id: k for _, k, i in rows["intents"]}
    for intent, event, n in outcome.effects:
        by_call[(owner.get(intent, b""), event, n)].add(intent)
    for (key, event, n), ids in sorted(by_call.items()):
        if len(ids) > 1:
            found.append(
                Finding("double_effect", name, key, f"call {n} of {event} ran under {sorted(ids)}")
            )
    completed = collections.Counter(
        (key, json.loads(v)["event"]) for _, key, v in rows["completions"]
    )
    for (key, event), count in sorted(completed.items()):
        if count > 1 and event != "restored":
            found.append(Finding("event_ran_twice", name, key, f"{event} completed {count} times"))
    found += _lost_answers(scenario, outcome)
    for intent, (emitted, expired_at, ran_when_told, status) in sorted(outcome.executions.items()):
        key = owner.get(intent, b"")
        if ran_when_told:
            found.append(
                Finding(
                    "told_expired_may_still_run",
                    name,
                    key,
                    f"{intent}: told EXPIRED at {expired_at}, an Effector runs it then",
                )
            )
        if status == ToolResult.EXPIRED and not born_open:
            found.append(
                Finding("born_expired", name, key, f"{intent} emitted at {emitted} already expired")
            )
    found += _usage_growth(outcome)
    return found


def _lost_answers(scenario: Scenario, outcome: Run) -> list[Finding]:
    rows, found = outcome.rows, []
    dead = {
        (r.input.tool_result.intent_id, r.input.tool_result.status)
        for _, _, r in rows["errors"]
        if r.input.HasField("tool_result")
    }
    reached = {
        (a.tool_result.intent_id, a.tool_result.status)
        for _, _, r in rows["errors"]
        for a in r.answers
        if a.HasField("tool_result")
    }
    for _, _, output in rows["completions"]:
        for answered, status, _ in json.loads(output)["answers"]:
            if status in ToolResult.Status.keys():  # noqa: SIM118 (an enum wrapper, no dict)
                reached.add((answered, ToolResult.Status.Value(status)))
    issued = {i.intent_id for _, _, i in rows["intents"]}
    for script in scenario.keys:
        for item in script.inputs:
            if not isinstance(item, Answer) or item.intent_id not in issued:
                continue
            answer = (item.intent_id, item.status)
            # An answer identical to one recorded, or a second one after the first was taken,
            # is a duplicate: lost only when no answer to that intent reached anything.
            if (
                answer not in dead
                and answer not in reached
                and not any(r[0] == item.intent_id for r in reached)
            ):
                found.append(
                    Finding("answer_lost", outcome.runner, script.key, f"{answer} vanished")
                )
    return found


_USAGE = (*USAGE_FIELDS, "budget_grants")


def _usage_growth(outcome: Run) -> list[Finding]:
    found, last = [], {}
    for _, key, snapshot in outcome.rows["snapshots"]:
        usage = tuple(getattr(snapshot.llm_cache, f) for f in _USAGE)
        before = last.get(key)
        if any(u < 0 for u in usage) or (
            before is not None and any(a < b for a, b in zip(usage, before, strict=True))
        ):
            found.append(Finding("usage_shrank", outcome.runner, key, f"{before} then {usage}"))
        last[key] = usage
    return found


def _canonical(rows, noise_open: bool) -> dict:
    per_key = collections.defaultdict(list)
    for tag, tagged in rows.items():
        for _, key, value in tagged:
            if tag == "errors" and noise_open and value.reason == STALE_TIMER:
                continue
            data = (
                value if isinstance(value, bytes) else value.SerializeToString(deterministic=True)
            )
            per_key[(key, tag)].append(data)
    return {k: sorted(v) for k, v in per_key.items()}


def _compare(scenario: Scenario, first: Run, second: Run, noise_open: bool) -> list[Finding]:
    """Differences of outputs and exported state, key by key. A key restored from a snapshot
    is left out: RunAgent does not order its two inputs, and the runners order them
    differently (a snapshot lands before or after the envelopes: issue 37 item 15)."""
    a, b = _canonical(first.rows, noise_open), _canonical(second.rows, noise_open)
    raced = {s.key for s in scenario.keys if any(isinstance(i, Restore) for i in s.inputs)}
    found = []
    for key, tag in sorted(set(a) | set(b)):
        if key in raced:
            continue
        mine, theirs = a.get((key, tag), []), b.get((key, tag), [])
        if mine != theirs:
            only = [_show(tag, v) for v in mine if v not in theirs][:1]
            other = [_show(tag, v) for v in theirs if v not in mine][:1]
            found.append(
                Finding(
                    "runners_differ",
                    f"{first.runner}/{second.runner}",
                    key,
                    f"{tag}: {len(mine)} vs {len(theirs)}; only {first.runner}: {only}; "
                    f"only {second.runner}: {other}",
                )
            )
    return found


def _show(tag: str, data: bytes) -> str:
    """An output, short: what a reader of a difference needs."""
    if tag == "completions":
        return data.decode(errors="replace")
    if tag == "errors":
        record = ActivationErrorRecord.FromString(data)
        return f"{record.reason}: {record.detail}"
    if tag == "snapshots":
        snapshot = StateSnapshot.FromString(data)
        cache = snapshot.llm_cache
        return f"snapshot seq {snapshot.seq} usage {cache.input_tokens}/{cache.output_tokens}"
    return f"{len(data)} bytes"
