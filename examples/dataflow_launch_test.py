"""The Dataflow launcher builds its pipeline from Beam options and runs it on the DirectRunner
with the same options object; its RunAgent steps carry the committed names."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from beam_agents._protos import AgentEnvelope, ToolIntent
from beam_agents.examples.support_triage import ticket
from beam_agents.ops.cli import main as beam_agents
from beam_agents.ops.state_manifest import MANIFEST
from beam_agents.ops.update_check import read_graph
from beam_agents.wire.fields import join_delimited

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dataflow_launch

T0 = 1_764_460_800_000


def _options(tmp_path, *extra) -> PipelineOptions:
    envelopes = tmp_path / "envelopes.binpb"
    envelopes.write_bytes(
        join_delimited(
            [
                AgentEnvelope(
                    entity_key=b"c-1",
                    event_time_ms=T0,
                    external_event=ticket("t-1", "c-1", "I was charged twice"),
                ),
                AgentEnvelope(entity_key=b"c-2", event_time_ms=T0, external_event=b"not json"),
            ]
        )
    )
    return PipelineOptions(
        ["--runner=DirectRunner", f"--input_file={envelopes}", f"--output_dir={tmp_path}", *extra]
    )


def test_the_launcher_runs_its_pipeline_on_the_direct_runner(tmp_path):
    assert (
        dataflow_launch.main(
            _options(tmp_path).get_all_options(drop_default=True)
            and [f"--input_file={tmp_path / 'envelopes.binpb'}", f"--output_dir={tmp_path}"]
        )
        == 0
    )
    intents = [
        ToolIntent.FromString(bytes.fromhex(line))
        for line in (tmp_path / "intents").read_text().splitlines()
    ]
    assert [i.tool_name for i in intents] == ["crm.lookup"]
    errors = [
        AgentEnvelope.FromString(bytes.fromhex(line))
        for line in (tmp_path / "errors").read_text().splitlines()
    ]
    assert [e.entity_key for e in errors] == [b"c-2"]  # the agent raised on bad JSON


def test_the_built_pipeline_has_the_committed_step_names(tmp_path):
    options = _options(tmp_path)
    pipeline = beam.Pipeline(options=options)
    dataflow_launch.build(pipeline, options)
    names = {t.unique_name for t in pipeline.to_runner_api().components.transforms.values()}
    committed = json.loads(MANIFEST.read_text())["transform_names"]["RunAgent"]
    assert {f"RunAgent/{name}" for name in committed} <= names


def test_without_an_input_the_launcher_is_a_usage_error(capsys):
    assert dataflow_launch.main([]) == 2
    assert "--input_subscription" in capsys.readouterr().err


def test_prism_at_no_file_is_one_line_before_anything_is_built(tmp_path, capsys):
    missing = tmp_path / "no-prism"
    assert dataflow_launch.main(["--runner=PrismRunner", f"--prism_location={missing}"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "bash tools/engines.sh prism" in err, err


#: The guide's Dataflow command (docs/dataflow.md), up to the wheel.
DATAFLOW = [
    "--runner=DataflowRunner",
    "--project=project",
    "--region=us-central1",
    "--streaming",
    "--temp_location=gs://bucket/tmp",
    "--job_name=support-triage",
    "--input_subscription=projects/project/subscriptions/agent-envelopes",
    "--intents_topic=projects/project/topics/tool-intents",
    "--completions_topic=projects/project/topics/completions",
    "--errors_topic=projects/project/topics/agent-errors",
]


def test_the_dataflow_job_graph_has_the_committed_names_and_state_specs(
    tmp_path, monkeypatch, capsys
):
    """The graph the launcher builds for the DataflowRunner, as the runner rewrites it before it
    submits the job, written offline (no project, no credentials) and checked by
    `beam-agents update-check --manifest`: the names --update matches on are Dataflow's."""
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "none.json"))
    graph = tmp_path / "dataflow.binpb"
    assert dataflow_launch.main([*DATAFLOW, f"--graph_out={graph}"]) == 0
    transforms = read_graph(graph.read_bytes()).components.transforms.values()
    # DataflowRunner's streaming override made the Pub/Sub writes its native sink: this is the
    # runner's graph, not the one the pipeline was built as.
    assert {
        t.spec.urn for t in transforms if t.unique_name.endswith("ParDo(_PubSubWriteDoFn)")
    } == {"beam:transform:pubsub_write:v1"}
    capsys.readouterr()
    assert beam_agents(["update-check", "--manifest", str(graph)]) == 0
    assert "compatible: --update keeps every step and its state" in capsys.readouterr().out
