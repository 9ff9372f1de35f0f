"""RunAgent's inputs from outside, through the real DoFn in real Beam pipelines (the
DirectRunner, or the runner $BEAM_AGENTS_PIPELINE_OPTIONS names): budget questions under
OnBudget.ASK, restored and agent-built Continuations, an agent's exception that cannot print
itself, a model's reported usage, a transport's idempotency key. Each was a crashed bundle that
wedged its key; each is now a result or a named dead letter."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from beam_agents._protos import Continuation, LlmCacheBlob, StateSnapshot, ToolIntent
from beam_agents.intents.identity import intent_id
from beam_agents.ops.rounds import Advance, env_options, run_round
from beam_agents.runtime import (
    COMPLETIONS,
    ERRORS,
    AtDeadline,
    DeadlinePolicy,
    LlmResponse,
    RunAgent,
    RuntimeConfig,
    ScriptedLlmClient,
    agent,
)
from beam_agents.runtime.budget import BUDGET_TOOL, Budget, OnBudget
from beam_agents.runtime.context import Suspension
from beam_agents.runtime.machine_state import COUNTERS, INT64_MAX
from beam_agents.runtime.run_agent import _AgentDoFn
from beam_agents.testing.probe import (
    KEY,
    SEQ,
    T0,
    Probe,
    approval,
    command,
    continuation,
    event,
    export,
    probe,
)

_RUNTIME = Path(__file__).parent


def _reasons(outputs) -> list[str]:
    return [record.reason for record in outputs.values("errors")]


# Item 4: every counter the machine counts is one the DoFn declares ---------------------------


def _counted_names() -> set[str]:
    """Every name the runtime's modules pass to `count(...)`, read from their source."""
    names = set()
    for path in _RUNTIME.glob("*.py"):
        if path.name.endswith("_test.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "count"
                # itertools.count() makes a counter of numbers, not of the DoFn's metrics.
                and not (
                    isinstance(node.func.value, ast.Name) and node.func.value.id == "itertools"
                )
            ):
                (name,) = node.args
                assert isinstance(name, ast.Constant), f"{path.name}: count() of a non-literal"
                names.add(name.value)
    return names


def test_every_counter_the_machine_counts_is_declared_by_the_dofn_from_one_list():
    dofn = _AgentDoFn(Probe(), None, {}, RuntimeConfig(), None)
    assert _counted_names() == set(COUNTERS) == set(dofn._counters)


def _asking() -> RuntimeConfig:
    return RuntimeConfig(
        budget=Budget(key_tokens=1, on_exceed=OnBudget.ASK, raise_tokens=10_000),
        intent_ttl_ms=1000,
        suspend_deadline_ms=1000,
    )


_QUESTION = ToolIntent(intent_id=intent_id(KEY, SEQ, 2**31), entity_key=KEY)
_COSTLY = "a question that costs more than one token"


def test_on_budget_ask_puts_the_budget_before_a_person_whose_approval_lets_the_key_go_on(
    tmp_path,
):
    outputs = run_round(
        probe(_asking()),
        [
            command(T0, llm=_COSTLY),
            Advance(T0 + 10),
            approval(T0 + 20, _QUESTION),
            Advance(T0 + 30),
            export(T0 + 40, "end"),
        ],
        tmp_path,
    )
    assert _reasons(outputs) == []
    (asked,) = outputs.values("intents")
    assert (asked.intent_id, asked.tool_name) == (_QUESTION.intent_id, BUDGET_TOOL)
    assert outputs.values("completions") == [b"done"]
    (snapshot,) = outputs.values("snapshots")
    assert (snapshot.llm_cache.budget_grants, snapshot.llm_cache.token_allowance) == (1, 10_000)


@pytest.mark.parametrize(
    "answer",
    [[approval(T0 + 20, _QUESTION, approved=False)], []],
    ids=["declined", "unanswered by its deadline"],
)
def test_on_budget_ask_a_budget_no_one_raises_ends_with_its_event_in_the_record(tmp_path, answer):
    outputs = run_round(
        probe(_asking()),
        [command(T0, llm=_COSTLY), Advance(T0 + 10), *answer, Advance(T0 + 5000)],
        tmp_path,
    )
    (record,) = outputs.values("errors")
    assert record.reason == "budget_exceeded"
    assert json.loads(record.input.external_event) == {"llm": _COSTLY}
    assert outputs.values("completions") == []


# Item 5: Continuations restored or built by an agent are checked where they come in ---------


def _restore(suspended: Continuation, pending=()) -> StateSnapshot:
    return StateSnapshot(
        entity_key=KEY, snapshot_at_ms=T0, seq=SEQ, continuation=suspended, pending=pending
    )


def _escalating() -> RuntimeConfig:
    return RuntimeConfig(deadline_policy=DeadlinePolicy(action=AtDeadline.ESCALATE))


def test_a_restored_retry_of_a_start_with_no_event_is_an_invalid_snapshot_not_a_wedged_key(
    tmp_path,
):
    deferred = continuation(seq=SEQ, pending_intent_ids=[], deadline_ms=T0 + 5, retry_at_ms=T0 + 5)
    outputs = run_round(
        probe(),
        [_restore(deferred), Advance(T0 + 10), command(T0 + 20), Advance(T0 + 30)],
        tmp_path,
    )
    assert _reasons(outputs) == ["invalid_snapshot"]
    assert outputs.values("completions") == [b"done"]


def test_a_restored_suspension_with_a_negative_seq_is_an_invalid_snapshot_under_escalation(
    tmp_path,
):
    suspended = continuation(seq=-1, pending_intent_ids=["i-0"], deadline_ms=T0 + 5)
    pending = [ToolIntent(intent_id="i-0", entity_key=KEY, tool_name="a.tool")]
    outputs = run_round(
        probe(_escalating()),
        [_restore(suspended, pending), Advance(T0 + 10), command(T0 + 20), Advance(T0 + 30)],
        tmp_path,
    )
    assert _reasons(outputs) == ["invalid_snapshot"]
    assert outputs.values("completions") == [b"done"]


class _Builder:
    """Suspends on a Continuation it builds itself from the fields its event names (JSON)."""

    adapter = "tests.builder/v1"

    def start(self, ctx, event: bytes):
        (emitted,) = ctx.call_tools([("a.tool", {})])
        fields = {"seq": ctx.seq, "pending_intent_ids": [emitted.intent_id], **json.loads(event)}
        return Suspension(
            Continuation(state_schema_version=1, adapter=self.adapter, deadline_ms=T0 + 5, **fields)
        )

    def resume(self, ctx, answers):
        return ctx.complete(b"resumed")


def test_continuations_an_agent_builds_out_of_shape_are_contract_breaches_not_wedged_keys(
    tmp_path,
):
    built = [
        {"seq": -1},  # escalated at its deadline, a negative seq failed the timer's bundle
        {"pending_intent_ids": [], "retry_at_ms": T0 + 5},  # a retry of a start with no event
    ]
    outputs = run_round(
        RunAgent(_Builder(), config=_escalating()),
        [
            *[event(T0 + i, json.dumps(fields).encode()) for i, fields in enumerate(built)],
            Advance(T0 + 10),
        ],
        tmp_path,
    )
    assert _reasons(outputs) == ["agent_contract"] * 2
    assert outputs.values("completions") == []


# Item 6: an agent's exception that cannot print itself --------------------------------------


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


@agent(name="tests.unprintable/v1")
def _raises_unprintably(ctx, event: bytes) -> bytes:
    raise _Unprintable()


def test_an_agent_exception_whose_text_raises_is_an_agent_raised_dead_letter(tmp_path):
    outputs = run_round(RunAgent(_raises_unprintably), [event(T0, b"a")], tmp_path)
    (record,) = outputs.values("errors")
    assert record.reason == "agent_raised"
    assert "_Unprintable: (its text raised RuntimeError)" in record.detail


# Item 7: a model's reported usage --------------------------------------------------------------


def _reporting(usage: dict[str, tuple[int, int]]) -> ScriptedLlmClient:
    """A model that reports, for each prompt, the usage `usage` names."""
    return ScriptedLlmClient(
        lambda request: LlmResponse("ok", request.model, *usage[request.messages[-1]["content"]])
    )


def test_a_models_huge_or_negative_token_counts_saturate_the_keys_usage_and_never_shrink_it(
    tmp_path,
):
    huge = 2**62
    outputs = run_round(
        RunAgent(
            Probe(), llm_client=_reporting({"a": (huge, huge), "b": (huge, huge), "c": (-5, -5)})
        ),
        [
            command(T0, llm="a"),
            command(T0 + 1, llm="b"),
            command(T0 + 2, llm="c"),
            export(T0 + 10, "end"),
        ],
        tmp_path,
    )
    assert _reasons(outputs) == []
    assert outputs.values("completions") == [b"done"] * 3
    (snapshot,) = outputs.values("snapshots")
    usage = snapshot.llm_cache
    # Each count is taken as at most 2**53 - 1 (what the replay cache's JSON carries exactly).
    assert (usage.input_tokens, usage.output_tokens) == (2 * (2**53 - 1), 2 * (2**53 - 1))


def test_a_keys_usage_at_the_end_of_int64_saturates_there(tmp_path):
    restored = StateSnapshot(
        entity_key=KEY,
        snapshot_at_ms=T0,
        llm_cache=LlmCacheBlob(state_schema_version=1, input_tokens=INT64_MAX - 5),
    )
    outputs = run_round(
        RunAgent(Probe(), llm_client=_reporting({"a": (100, 7)})),
        [restored, command(T0 + 1, llm="a"), export(T0 + 10, "end")],
        tmp_path,
    )
    assert _reasons(outputs) == []
    (snapshot,) = outputs.values("snapshots")
    assert (snapshot.llm_cache.input_tokens, snapshot.llm_cache.output_tokens) == (INT64_MAX, 7)


class _AnswersNothing:
    def complete(self, request):
        return None


def test_a_model_client_answering_no_llm_response_is_an_llm_failed_dead_letter(tmp_path):
    outputs = run_round(
        RunAgent(Probe(), llm_client=_AnswersNothing()), [command(T0, llm="a")], tmp_path
    )
    (record,) = outputs.values("errors")
    assert record.reason == "llm_failed" and "answered a NoneType" in record.detail


# Item 8: a transport's idempotency key -----------------------------------------------------


class _HeaderText(str):
    """A transport client's str type: Beam's default coder pickles it, so it crosses a
    PCollection as it is (a plain str with a lone surrogate fails the coder's size sampling
    first, but only for the elements it samples)."""


def test_a_string_idempotency_key_with_a_lone_surrogate_marks_its_event_like_any_other():
    with beam.Pipeline(options=env_options()) as pipeline:
        outputs = (
            pipeline
            | beam.Create([(0, b"\xff"), (1, b"\xff"), (2, b"\xfe")], reshuffle=False)
            | beam.MapTuple(
                lambda at, raw: (
                    command(T0 + at).SerializeToString(),
                    # How a str from bytes that are not UTF-8 often comes: a lone surrogate.
                    _HeaderText(raw.decode("utf-8", "surrogateescape")),
                )
            )
            | RunAgent(Probe())
        )
        assert_that(outputs[COMPLETIONS] | beam.Values(), equal_to([b"done", b"done"]))
        assert_that(outputs[ERRORS], equal_to([]), label="no errors")


def test_idempotency_keys_of_any_bytes_type_mark_their_event_and_another_type_is_a_dead_letter():
    keys = [bytearray(b"k"), b"k", b"k", None, 7]
    with beam.Pipeline(options=env_options()) as pipeline:
        outputs = (
            pipeline
            | beam.Create(list(enumerate(keys)), reshuffle=False)
            | beam.MapTuple(lambda at, key: (command(T0 + at).SerializeToString(), key))
            | RunAgent(Probe())
        )
        # The three copies keyed b"k" (a bytearray among them) run once; the one with no key
        # runs; the one keyed by an int is refused with its envelope.
        assert_that(outputs[COMPLETIONS] | beam.Values(), equal_to([b"done", b"done"]))
        assert_that(
            outputs[ERRORS] | beam.Map(lambda kv: (kv[1].reason, kv[1].input.event_time_ms)),
            equal_to([("undecodable_envelope", T0 + 4)]),
            label="errors",
        )


def test_the_intake_stamps_its_dead_letters_at_their_elements_time_and_takes_none_as_no_key():
    from apache_beam.utils.timestamp import Timestamp

    from beam_agents._protos import AgentEnvelope
    from beam_agents.runtime.run_agent import _ENVELOPE, _KeyAndTag

    intake = _KeyAndTag(_ENVELOPE)
    at = Timestamp(micros=(T0 + 7) * 1000 + 999)
    refused = [
        *intake.process(b"\xff\xff", timestamp=at),  # no AgentEnvelope
        *intake.process(AgentEnvelope(external_event=b"x"), timestamp=at),  # no entity_key
        *intake.process((command(T0), 7), timestamp=at),  # no idempotency key
    ]
    assert [(r.value[1].reason, r.value[1].event_time_ms) for r in refused] == [
        ("undecodable_envelope", T0 + 7),
        ("no_entity_key", T0 + 7),
        ("undecodable_envelope", T0 + 7),
    ]
    # None is a transport's "no key": the envelope goes in as one that came alone.
    alone = list(intake.process(command(T0), timestamp=at))
    assert list(intake.process((command(T0), None), timestamp=at)) == alone
    assert alone == [(KEY, b"E" + command(T0).SerializeToString())]


def test_inputs_other_than_envelopes_and_snapshots_are_refused_by_name_when_the_graph_is_built():
    pipeline = beam.Pipeline()
    events = pipeline | "Events" >> beam.Create([b""])
    with pytest.raises(ValueError, match=r"envelopes and snapshots, not \['answers'\]"):
        _ = {"envelopes": events, "answers": events} | RunAgent(_raises_unprintably)
