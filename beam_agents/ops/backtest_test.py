"""The backtest (issue 42 items 2 and 3): a candidate agent over a recorded history, answered
from the recording only, its divergences and the run's report; bad input as dead letters."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import apache_beam as beam
import pytest

from beam_agents._protos import ActivationRecord, AgentEnvelope, BacktestKeyReport
from beam_agents.examples.support_triage import (
    MODEL,
    TOOLS,
    scripted_model,
    ticket,
    triage,
)
from beam_agents.ops.backtest import (
    NO_LONGER,
    UNKNOWN,
    Backtest,
    BacktestOptions,
    backtest_key,
    backtest_markdown,
    backtest_summary,
    run_backtest,
    tool_changes,
)
from beam_agents.ops.cli import main
from beam_agents.ops.local_run import run_locally
from beam_agents.ops.rounds import env_options
from beam_agents.runtime import (
    LlmResponse,
    Price,
    Recording,
    RuntimeConfig,
    ScriptedLlmClient,
    agent,
)
from beam_agents.testing.recorded_history import (
    T0,
    expected_refund_changes,
    gold_only_refunds,
    record_history,
    triage_approver,
    triage_history,
)
from beam_agents.wire.fields import join_delimited, split_delimited

Divergence = BacktestKeyReport.Divergence


@agent(name="candidate.new_prompt/v2")
def new_prompt(ctx, event: bytes) -> bytes:
    """Asks the model in other words: a request the recording never made."""
    request = json.loads(event)
    ctx.call_tool("crm.lookup", {"customer_id": request["customer_id"]})
    reply = ctx.llm([{"role": "user", "content": "Triage: " + request["text"]}], model=MODEL)
    return reply.text.encode()


@agent(name="candidate.raises/v2")
def raises(ctx, event: bytes) -> bytes:
    ctx.call_tool("crm.lookup", {"customer_id": json.loads(event)["customer_id"]})
    raise RuntimeError("the candidate has a bug")


def _history(count: int, **kwargs) -> list[ActivationRecord]:
    return triage_history(count, **kwargs)


def test_a_changed_refund_rule_reports_exactly_the_keys_whose_refunds_change():
    count = 1_200
    history = _history(count)
    assert len({r.entity_key for r in history}) == count
    paid, asked = expected_refund_changes(count)
    assert paid and asked - paid  # both kinds of change occur

    reports, letters = run_backtest(history, gold_only_refunds)
    assert letters == []
    assert len(reports) == count
    changes = {r.entity_key: tool_changes(r) for r in reports}
    assert {k for k, c in changes.items() if c.get("payments.refund") == NO_LONGER} == paid
    assert {k for k, c in changes.items() if c.get("human.approval") == NO_LONGER} == asked
    assert not any(UNKNOWN in c.values() for c in changes.values())
    diverged = {r.entity_key: r.divergence for r in reports if r.HasField("divergence")}
    assert set(diverged) == asked
    assert {d.kind for d in diverged.values()} == {Divergence.KIND_APPROVAL}
    # The model was asked the same on every key: what it cost did not change.
    summary = backtest_summary(
        reports, price=Price(input_per_million=3_000_000, output_per_million=0)
    )
    assert summary.baseline_tokens == summary.candidate_tokens != (0, 0)
    assert summary.baseline_cost_micros == summary.candidate_cost_micros > 0
    assert summary.tools["payments.refund"][NO_LONGER] == len(paid)
    table = backtest_markdown(summary)
    assert f"| {count} | {count} | {len(asked)} | 0 | 0 |" in table
    assert f"| approval | {len(asked)} |" in table


def test_an_unchanged_candidate_does_not_diverge_and_no_graph_has_an_effector():
    history = _history(1_000)
    reports, letters = run_backtest(history, triage)
    assert letters == []
    assert len(reports) == 1_000
    assert [r for r in reports if r.HasField("divergence") or r.stopped] == []
    assert all(r.candidate_activations == r.baseline_activations for r in reports)
    pipeline = beam.Pipeline()
    _ = pipeline | beam.Create(history[:1]) | Backtest(triage)
    names = [t.unique_name for t in pipeline.to_runner_api().components.transforms.values()]
    assert not [n for n in names if "Execute" in n or "Effector" in n]


def test_a_history_runagent_recorded_backtests_without_divergence_in_a_pipeline():
    run = run_locally(
        triage,
        [ticket("t-1", "c-2", "I was charged twice this month")],
        tools=TOOLS,
        approver=triage_approver,
        llm_client=scripted_model(),
        options=env_options(),
        recording=Recording(),
    )
    assert len(run.records) == 4
    reports, letters = run_backtest(run.records, triage)
    assert letters == []
    (report,) = reports
    assert not report.HasField("divergence") and report.candidate_activations == 4
    (report,) = run_backtest(run.records, gold_only_refunds)[0]
    assert report.divergence.kind == Divergence.KIND_APPROVAL
    assert tool_changes(report) == {"human.approval": NO_LONGER, "payments.refund": NO_LONGER}
    assert json.loads(report.divergence.candidate_output)["outcome"] == "refund_not_offered"


def test_bad_input_is_a_named_dead_letter_never_a_failed_pipeline():
    history = _history(8)
    by_key = {}
    for record in history:
        by_key.setdefault(record.entity_key, []).append(record)
    keys = sorted(by_key)
    # A key's start lost (the recording began after it): incomplete.
    incomplete = [r for r in by_key[keys[0]] if not r.HasField("event")]
    # Another key's history mixed with one of another job: two records at one place.
    mixed = [*by_key[keys[1]], ActivationRecord()]
    mixed[-1].CopyFrom(mixed[-2])
    mixed[-1].output = b"what another job's run of the key answered"
    whole = by_key[keys[2]]
    data = whole[0].SerializeToString()
    inputs = [
        *incomplete,
        *mixed,
        *whole,
        data[: len(data) // 2],  # truncated
        whole[0].intents[0].SerializeToString(),  # a ToolIntent: another message
        ActivationRecord(entity_key=b"x").SerializeToString(),  # no adapter, no outcome
    ]
    reports, letters = run_backtest(inputs, triage)
    assert sorted(letter.reason for letter in letters) == [
        "history_incomplete",
        "history_out_of_order",
        "recording_undecodable",
        "recording_undecodable",
        "recording_undecodable",
    ]
    assert [r.entity_key for r in reports] == [keys[2]]


def test_a_candidate_that_raises_is_a_divergence_of_outcome():
    history = _history(4)
    reports, letters = run_backtest(history, raises)
    assert letters == [] and len(reports) == 4
    for report in reports:
        assert report.divergence.kind == Divergence.KIND_OUTCOME
        assert report.divergence.candidate_outcome == ActivationRecord.OUTCOME_FAILED
        assert "agent_raised" in report.divergence.detail


def test_an_answer_kept_as_a_digest_stops_the_key_with_a_dead_letter():
    history = _history(1, recording=Recording(max_answer_bytes=16))
    (key,) = {r.entity_key for r in history}
    report, letters = backtest_key(key, history, triage)
    assert [letter.reason for letter in letters] == ["recorded_answer_withheld"]
    assert report.stopped and not report.HasField("divergence")


def test_a_new_model_request_stops_the_run_or_goes_on_within_a_budget():
    history = _history(1)
    (key,) = {r.entity_key for r in history}
    report, _ = backtest_key(key, history, new_prompt)
    assert report.divergence.kind == Divergence.KIND_MODEL_REQUEST
    assert report.divergence.activation == 1
    answer = LlmResponse("a new answer", MODEL, input_tokens=5, output_tokens=7)
    model = ScriptedLlmClient(lambda request: answer)
    going_on = BacktestOptions(stop_at_divergence=False, continue_with=model, max_tokens=100)
    report, _ = backtest_key(key, history, new_prompt, going_on)
    assert report.divergence.kind == Divergence.KIND_MODEL_REQUEST
    assert not report.stopped and report.candidate_activations == 2
    assert json.loads(history[-1].output)["outcome"] == "refunded"
    assert (report.candidate_input_tokens, report.candidate_output_tokens) == (5, 7)
    broke = BacktestOptions(stop_at_divergence=False, continue_with=model, max_tokens=0)
    report, _ = backtest_key(key, history, new_prompt, broke)
    assert report.divergence.kind == Divergence.KIND_MODEL_REQUEST
    assert report.divergence.candidate_outcome == ActivationRecord.OUTCOME_FAILED


@pytest.mark.parametrize(
    "kwargs",
    [{"stop_at_divergence": False}, {"continue_with": ScriptedLlmClient(["x"])}],
)
def test_going_on_past_a_divergence_needs_a_model_and_says_so(kwargs):
    with pytest.raises(ValueError):
        BacktestOptions(**kwargs)


def test_the_command_prints_a_markdown_report_and_writes_each_keys_report(tmp_path, capsys):
    history = _history(60)
    records = tmp_path / "records.binpb"
    records.write_bytes(join_delimited(history))
    out = tmp_path / "reports.binpb"
    paid, asked = expected_refund_changes(60)
    page = tmp_path / "report.html"
    code = main(
        [
            "backtest",
            str(records),
            "--agent",
            CANDIDATE,
            "--report",
            str(out),
            "--html",
            str(page),
            "--price-per-million",
            "3000000",
            "1000000",
        ]
    )
    table = capsys.readouterr().out
    assert code == 1
    assert f"| 60 | 60 | {len(asked)} | 0 | 0 |" in table
    assert f"| payments.refund | 0 | {len(paid)} | 0 | 0 | 0 |" in table
    assert "| cost (micros) |" in table
    reports = [BacktestKeyReport.FromString(p) for p in split_delimited(out.read_bytes())]
    assert {r.entity_key for r in reports if r.HasField("divergence")} == asked
    # The page's charts: each bar is its count, scaled to the chart's largest.
    charts = _charts(page.read_text())
    assert charts["Keys"] == {"unchanged": 60 - len(asked), "diverged: approval": len(asked)}
    assert charts["Keys where payments.refund is"] == {"no longer called": len(paid)}
    assert charts["Keys where human.approval is"] == {"no longer called": len(asked)}
    assert set(charts["Tokens"]) == {
        f"{side} tokens, {run}"
        for side in ("input", "output")
        for run in ("recording", "candidate")
    }
    assert f"| 60 | 60 | {len(asked)} | 0 | 0 |" in page.read_text()
    assert main(["backtest", str(records), "--agent", f"{__name__}:triage_again"]) == 0
    records.write_bytes(records.read_bytes()[:-3])
    assert main(["backtest", str(records), "--agent", CANDIDATE]) == 2
    assert "beam-agents backtest:" in capsys.readouterr().err


class _Chart(HTMLParser):
    """Each chart of a backtest page: its title, and each bar's label and value, checked
    against the bar's width."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, dict[str, int]] = {}
        self._in: str = ""
        self._title = ""
        self._label = ""
        self._widths: list[tuple[int, int]] = []

    def handle_starttag(self, tag, attrs):
        self._in = tag
        if tag == "rect":
            found = dict(attrs)
            value, width = int(found["data-value"]), int(found["width"])
            self.charts[self._title][self._label] = value
            self._widths.append((value, width))

    def handle_data(self, data):
        if self._in == "h2" and data.strip():
            self._title = data.strip()
            self.charts[self._title] = {}
            self._check_widths()
        elif self._in == "text" and data.strip() and not data.strip().isdigit():
            self._label = data.strip()

    def _check_widths(self) -> None:
        if self._widths:
            top = max(value for value, _ in self._widths)
            for value, width in self._widths:
                assert width == round(360 * value / (top or 1))
        self._widths = []

    def close(self):
        super().close()
        self._check_widths()


def _charts(page: str) -> dict[str, dict[str, int]]:
    parser = _Chart()
    parser.feed(page)
    parser.close()
    return parser.charts


#: The candidate and the unchanged agent, as a command line names them.
CANDIDATE = "beam_agents.testing.recorded_history:gold_only_refunds"
triage_again = triage


@agent(name="review.notes/v1")
def notes(ctx, event: bytes) -> bytes:
    """Keeps 1 KiB of notes per event and says how many it holds: the memory budget evicts the
    least recent."""
    ctx.memory.put(f"note-{event.decode()}", bytes(1024))
    return f"{len(list(ctx.memory.keys()))} notes".encode()


#: The live job's limits: a memory budget of two notes.
LIVE_CONFIG = RuntimeConfig(memory_budget_bytes=2_500)


def test_the_command_runs_the_candidate_under_the_live_jobs_config(tmp_path, capsys):
    events = [
        AgentEnvelope(entity_key=b"k", event_time_ms=T0 + n * 60_000, external_event=b"e%d" % n)
        for n in range(3)
    ]
    history = record_history(
        notes,
        events,
        tools=TOOLS,
        approver=triage_approver,
        llm_client=scripted_model(),
        config=LIVE_CONFIG,
    )
    assert [r.output for r in history] == [b"1 notes", b"2 notes", b"2 notes"]
    records = tmp_path / "records.binpb"
    records.write_bytes(join_delimited(history))
    agent_spec = f"{__name__}:notes"
    # Under the default limits the unchanged agent keeps its third note: a false divergence.
    assert main(["backtest", str(records), "--agent", agent_spec]) == 1
    given = ["backtest", str(records), "--agent", agent_spec, "--config"]
    assert main([*given, f"{__name__}:LIVE_CONFIG"]) == 0
    capsys.readouterr()
    assert main([*given, f"{__name__}:notes"]) == 2
    assert "not a RuntimeConfig" in capsys.readouterr().err
