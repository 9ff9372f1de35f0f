"""Hostile traffic for the shadow (issue 42 item 4) through a pipeline: a key's records out of
their order (the shadow says they can be), and a long-lived key that never diverges
(shadow_order_test generates deliveries against the DoFn itself)."""

from __future__ import annotations

import os

import apache_beam as beam

from beam_agents._protos import AgentEnvelope, TraceEvent
from beam_agents.examples.support_triage import TOOLS, scripted_model
from beam_agents.ops.shadow import REPORTS, TRACES, ShadowAgent
from beam_agents.runtime import ERRORS, agent
from beam_agents.testing.recorded_history import T0, record_history, triage_approver
from beam_agents.testing.review_agents import counter


@agent(name="review.counted/v1")
def counted(ctx, event: bytes) -> bytes:
    """Notes each activation it runs in the file $REVIEW_RUNS names (the pipeline runs a copy of
    the agent, so a counter in this module would not see them)."""
    runs = os.environ.get("REVIEW_RUNS")
    if runs:
        with open(runs, "ab") as out:
            out.write(b".")
    return b"ok " + event


def _history(candidate, count: int):
    events = [
        AgentEnvelope(entity_key=b"k", event_time_ms=T0 + n * 60_000, external_event=b"e%d" % n)
        for n in range(count)
    ]
    return record_history(
        candidate, events, tools=TOOLS, approver=triage_approver, llm_client=scripted_model()
    )


def _shadow(candidate, records, tmp_path) -> dict[str, list]:
    found = {}
    with beam.Pipeline() as pipeline:
        outputs = pipeline | beam.Create([(b"k", r) for r in records]) | ShadowAgent(candidate)
        for tag in (REPORTS, TRACES, ERRORS):
            _ = (
                outputs[tag]
                | f"Hex{tag}" >> beam.MapTuple(lambda _, m: m.SerializeToString().hex())
                | f"Write{tag}" >> beam.io.WriteToText(str(tmp_path / tag), num_shards=1)
            )
    for tag in (REPORTS, TRACES, ERRORS):
        (written,) = tmp_path.glob(f"{tag}-*")
        found[tag] = written.read_text().splitlines()
    return found


def test_a_later_start_arriving_before_an_earlier_one_is_no_divergence(tmp_path):
    # The live agent itself in the shadow: it can never diverge. Its records reach the shadow
    # in another order than they ran (seq 1 after seq 2), as the module says they can.
    history = _history(counter, 4)
    outputs = _shadow(counter, [history[0], history[2], history[1], history[3]], tmp_path)
    assert outputs[ERRORS] == []
    assert outputs[REPORTS] == []  # a divergence reported, and the key never shadowed again
    assert len(outputs[TRACES]) == 4


def test_a_long_lived_key_is_not_run_again_from_its_start_on_every_record(tmp_path, monkeypatch):
    # A key that never diverges (an entity per customer, a session): its whole history stays
    # in the shadow's bag, with no TTL, and is run again from the start at each new record.
    count = 120
    history = _history(counted, count)
    runs = tmp_path / "runs"
    monkeypatch.setenv("REVIEW_RUNS", str(runs))
    outputs = _shadow(counted, history, tmp_path)
    assert outputs[REPORTS] == [] and outputs[ERRORS] == []
    # Incremental shadowing would run each activation about once; this is count**2 / 2.
    ran = len(runs.read_bytes())
    assert ran <= 3 * count, f"{ran} candidate activations for {count} records"


@agent(name="review.echo/v1")
def echo(ctx, event: bytes) -> bytes:
    return b"ok " + event


def test_each_record_is_spanned_once_when_a_later_start_arrives_first(tmp_path):
    # A stateless agent: order cannot make it diverge. The span count kept per key says how
    # many records (in history order) are spanned, so when seq 1 arrives after seq 2, seq 2 is
    # spanned again and seq 1 never: a dashboard counts one activation twice, one not at all.
    history = _history(echo, 4)
    outputs = _shadow(echo, [history[0], history[2], history[1], history[3]], tmp_path)
    assert outputs[REPORTS] == [] and outputs[ERRORS] == []
    spans = [TraceEvent.FromString(bytes.fromhex(line)) for line in outputs[TRACES]]
    assert sorted(span.seq for span in spans) == [r.seq for r in history]
