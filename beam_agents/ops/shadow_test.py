"""Shadow mode (issue 42 item 4): a candidate beside the live agent on a streaming pipeline,
its divergences the backtest's for the same events, acting on nothing, added by a legal
--update (update-check names only its own new steps)."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.typehints import Tuple

from beam_agents._protos import AgentEnvelope, BacktestKeyReport, TraceEvent
from beam_agents.examples.support_triage import TOOLS, scripted_model, triage
from beam_agents.ops.backtest import REPORTS, backtest_key, in_history_order, kind_name
from beam_agents.ops.rounds import env_options, run_round
from beam_agents.ops.shadow import TRACES, ShadowAgent
from beam_agents.ops.update_check import describe_graph, differences
from beam_agents.runtime import ERRORS, INTENTS, RECORDS, Recording, RunAgent
from beam_agents.runtime.machine_answers import answered_intent_id
from beam_agents.testing.recorded_history import (
    expected_refund_changes,
    gold_only_refunds,
    record_history,
    triage_approver,
    triage_history,
    triage_tickets,
)


class _LiveWithShadow(beam.PTransform):
    """The triage agent live, recording, with the gold-only candidate as its shadow."""

    def expand(self, inputs):
        live = inputs | RunAgent(triage, llm_client=scripted_model(), recording=Recording())
        shadow = live[RECORDS] | "Shadow" >> ShadowAgent(gold_only_refunds)
        return {
            **live,
            "shadow": shadow[REPORTS],
            "shadow_errors": shadow[ERRORS],
            "shadow_traces": shadow[TRACES],
        }


def _traffic(count: int) -> list[AgentEnvelope]:
    """The tickets and every answer the effector and the people gave them, in time order."""
    events = triage_tickets(count)
    answers = {}
    for record in record_history(
        triage, events, tools=TOOLS, approver=triage_approver, llm_client=scripted_model()
    ):
        for answer in record.answers:
            answers[answered_intent_id(answer)] = answer
    return sorted([*events, *answers.values()], key=lambda e: e.event_time_ms)


def test_the_shadow_reports_what_the_backtest_does_and_emits_no_intent(tmp_path):
    count = 16
    outputs = run_round(_LiveWithShadow(), _traffic(count), tmp_path, options=env_options())
    live = outputs.values(RECORDS)
    assert outputs.values("shadow_errors") == []
    shadow = {r.entity_key: r for r in outputs.values("shadow")}
    _, asked = expected_refund_changes(count)
    assert set(shadow) == asked
    # The backtest over the live records, after the fact, finds the same divergences.
    by_key = {}
    for record in live:
        by_key.setdefault(record.entity_key, []).append(record)
    for key, records in by_key.items():
        report, _ = backtest_key(key, records, gold_only_refunds)
        if key in shadow:
            assert shadow[key].divergence == report.divergence
        else:
            assert not report.HasField("divergence")
    # Every intent out of the pipeline is the live agent's: the shadow has no intents output.
    live_intents = [i.intent_id for r in live for i in r.intents]
    assert sorted(i.intent_id for i in outputs.values(INTENTS)) == sorted(live_intents)

    # A span per live activation compared, up to the divergent one, each once, a child of the
    # live activation's own span in its trace: the divergence rate a dashboard shows.
    spans = outputs.values("shadow_traces")
    assert len({span.span_id for span in spans}) == len(spans)
    live_spans = {
        (e.trace_id, e.span_id)
        for e in outputs.values(TRACES)
        if e.event_type == TraceEvent.ACTIVATION_START
    }
    assert {(span.trace_id, span.parent_span_id) for span in spans} <= live_spans
    for key, records in by_key.items():
        ordered = in_history_order(records)
        mine = sorted(
            (s for s in spans if s.entity_key == key), key=lambda s: (s.seq, s.step_index)
        )
        if key in shadow:
            ordered = ordered[: shadow[key].divergence.activation + 1]
        assert [(s.seq, s.step_index, s.start_ms) for s in mine] == [
            (r.seq, r.first_step, r.now_ms) for r in ordered
        ]
        assert {s.event_type for s in mine} == {TraceEvent.SHADOW_ACTIVATION}
        assert {s.attributes["gen_ai.agent.name"] for s in mine} == {gold_only_refunds.adapter}
        diverged = [s for s in mine if s.attributes["beam_agents.shadow.diverged"] == "true"]
        if key in shadow:
            (span,) = diverged
            assert span is mine[-1]
            assert span.attributes["beam_agents.shadow.divergence.kind"] == kind_name(
                shadow[key].divergence.kind
            )
        else:
            assert diverged == []


def test_the_shadow_emits_only_reports_spans_and_dead_letters():
    pipeline = beam.Pipeline()
    live = pipeline | beam.Create([b""]) | RunAgent(triage, recording=Recording())
    shadow = live[RECORDS] | "Shadow" >> ShadowAgent(gold_only_refunds)
    assert set(shadow) == {REPORTS, TRACES, ERRORS}
    assert shadow[REPORTS].element_type == Tuple[bytes, BacktestKeyReport]
    assert shadow[TRACES].element_type == Tuple[bytes, TraceEvent]


def test_records_arriving_out_of_order_are_spanned_once_each_as_in_order(tmp_path):
    """A key's records can reach the shadow in any order: a history that lacks its start waits,
    and once it is whole each record gets its one span, the same spans as in order."""
    live = triage_history(12)
    by_key = {}
    for record in live:
        by_key.setdefault(record.entity_key, []).append(record)
    # Keys of more than one activation, whose records can come in the wrong order.
    keys = [key for key, records in by_key.items() if len(records) > 1]
    assert keys

    def spans(order) -> list[bytes]:
        with beam.Pipeline(options=env_options()) as pipeline:
            records = pipeline | beam.Create(
                [(key, record.SerializeToString()) for key in keys for record in order(by_key[key])]
            )
            shadow = records | ShadowAgent(gold_only_refunds)
            found = shadow[TRACES] | beam.MapTuple(lambda _, span: span.SerializeToString().hex())
            found | beam.io.WriteToText(str(tmp_path / order.__name__), num_shards=1)
        (written,) = tmp_path.glob(f"{order.__name__}-*")
        return sorted(written.read_text().splitlines())

    def in_order(records):
        return in_history_order(records)

    def reversed_order(records):
        return list(reversed(in_history_order(records)))

    assert spans(in_order) and spans(reversed_order) == spans(in_order)


def test_adding_a_shadow_to_a_job_is_a_legal_update():
    def graph(shadowed: bool):
        pipeline = beam.Pipeline()
        events = pipeline | beam.Create([b""])
        if shadowed:
            live = events | RunAgent(triage, recording=Recording())
            _ = live[RECORDS] | "Shadow" >> ShadowAgent(gold_only_refunds)
        else:
            _ = events | RunAgent(triage)
        return describe_graph(pipeline.to_runner_api())

    before, after = graph(False), graph(True)
    # Nothing of the live job is gone and RunAgent's state is as it was: update-check passes.
    assert differences(before, after) == []
    # Taking the shadow out drops its state: update-check names the shadow's steps, and only
    # them (Dataflow wants them mapped away with --transform_name_mapping).
    found = differences(after, before)
    assert found and all(line.startswith(("pipeline/Shadow", "Shadow/")) for line in found)
    assert all(" is gone" in line for line in found)
    assert differences(graph(False), before) == []
