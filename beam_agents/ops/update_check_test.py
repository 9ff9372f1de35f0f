"""`beam-agents update-check` on real pipeline graphs: a compatible pair, a renamed transform,
a swapped state coder, a timer in another domain."""

from __future__ import annotations

import hashlib
import inspect

import apache_beam as beam
import pytest
from apache_beam.portability.api import beam_runner_api_pb2

from beam_agents.examples.support_triage import triage
from beam_agents.ops.cli import main
from beam_agents.ops.update_check import describe_graph, differences, read_graph, write_graph
from beam_agents.runtime import RunAgent


def _graph(tmp_path, name: str, label: str = "RunAgent"):
    pipeline = beam.Pipeline()
    _ = pipeline | "Envelopes" >> beam.Create([b""]) | label >> RunAgent(triage)
    path = tmp_path / name
    write_graph(pipeline, path)
    return path


def test_the_same_build_is_compatible(tmp_path, capsys):
    assert main(["update-check", str(_graph(tmp_path, "old")), str(_graph(tmp_path, "new"))]) == 0
    assert "compatible: --update keeps every step and its state" in capsys.readouterr().out


def test_the_graph_names_the_state_specs_and_their_coders(tmp_path):
    described = describe_graph(read_graph(_graph(tmp_path, "g").read_bytes()))
    stateful = described["RunAgent/Activate/ParDo(_AgentDoFn)"]
    assert stateful["state"]["memory"] == {
        "kind": "read_modify_write_spec",
        "coder": "DeterministicProtoCoder(beam_agents.v1.MemoryBlob)",
    }
    assert stateful["timers"] == {
        "deadline": {"domain": "EVENT_TIME"},
        "ttl": {"domain": "EVENT_TIME"},
    }


def test_a_renamed_transform_is_refused_naming_it(tmp_path, capsys):
    old, new = _graph(tmp_path, "old"), _graph(tmp_path, "new", label="Agent")
    assert main(["update-check", str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "RunAgent/Activate/ParDo(_AgentDoFn) is gone" in out
    assert "NOT compatible" in out


ACTIVATE = "RunAgent/Activate/ParDo(_AgentDoFn)"


def _edited(path, edit):
    """The graph at `path` with its stateful step's ParDo payload edited, written back: the
    graph of a build that made that change."""
    graph = read_graph(path.read_bytes())
    (transform,) = [t for t in graph.components.transforms.values() if t.unique_name == ACTIVATE]
    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    edit(payload, graph.components)
    transform.spec.payload = payload.SerializeToString()
    path.write_bytes(graph.SerializeToString())
    return path


def _bytes_coder_id(components) -> str:
    (found,) = [i for i, c in components.coders.items() if c.spec.urn == "beam:coder:bytes:v1"][:1]
    return found


@pytest.mark.parametrize("spec_id", ["memory", "seq"])
def test_a_swapped_state_coder_is_named(tmp_path, capsys, spec_id):
    def swap(payload, components):
        payload.state_specs[spec_id].read_modify_write_spec.coder_id = _bytes_coder_id(components)

    old, new = _graph(tmp_path, "old"), _edited(_graph(tmp_path, "new"), swap)
    assert main(["update-check", str(old), str(new)]) == 1
    (found, verdict) = capsys.readouterr().out.splitlines()
    assert f"state '{spec_id}' changed" in found and "beam:coder:bytes:v1" in found
    assert "lost or misread on --update" in found and verdict.startswith("NOT compatible")


def test_a_timer_in_another_domain_is_named(tmp_path):
    def processing_time(payload, components):
        payload.timer_family_specs[
            "ts-ttl"
        ].time_domain = beam_runner_api_pb2.TimeDomain.PROCESSING_TIME

    old = describe_graph(read_graph(_graph(tmp_path, "old").read_bytes()))
    new_path = _edited(_graph(tmp_path, "new"), processing_time)
    (found,) = differences(old, describe_graph(read_graph(new_path.read_bytes())))
    assert "timers 'ttl' changed" in found and "PROCESSING_TIME" in found


def test_what_is_no_graph_is_a_usage_error(tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.write_bytes(b"\xff\xff")
    assert main(["update-check", str(bad), str(bad)]) == 2
    assert "not a pipeline graph" in capsys.readouterr().err


def _one_stateful_step(fill) -> bytes:
    graph = beam_runner_api_pb2.Pipeline()
    step = graph.components.transforms["step"]
    step.unique_name = "step"
    step.spec.urn = "beam:transform:pardo:v1"
    payload = beam_runner_api_pb2.ParDoPayload()
    fill(payload)
    step.spec.payload = payload.SerializeToString()
    return graph.SerializeToString()


def test_a_state_spec_or_timer_domain_this_beam_does_not_name_is_compared_not_a_traceback(
    tmp_path, capsys
):
    def unnamed(payload):
        payload.state_specs["memory"].SetInParent()
        payload.timer_family_specs["ts-ttl"].time_domain = 77

    def named(payload):
        payload.state_specs["memory"].read_modify_write_spec.coder_id = ""
        payload.timer_family_specs["ts-ttl"].time_domain = 1

    (tmp_path / "old").write_bytes(_one_stateful_step(unnamed))
    (tmp_path / "new").write_bytes(_one_stateful_step(named))
    assert main(["update-check", str(tmp_path / "old"), str(tmp_path / "old")]) == 0
    assert main(["update-check", str(tmp_path / "old"), str(tmp_path / "new")]) == 1
    out = capsys.readouterr().out
    assert "'memory' changed from" in out and "TimeDomain 77" in out


def test_against_the_manifest_a_graph_of_runagent_alone_is_compatible(tmp_path, capsys):
    # ExecuteIntents is in the manifest but not in this graph: only RunAgent's part compares.
    assert main(["update-check", "--manifest", str(_graph(tmp_path, "g"))]) == 0
    assert "compatible" in capsys.readouterr().out


def test_against_the_manifest_a_renamed_stateful_step_is_refused(tmp_path, capsys):
    graph = _graph(tmp_path, "g")
    _edited(
        graph,
        lambda payload, components: payload.state_specs["renamed"].CopyFrom(
            payload.state_specs.pop("memory")
        ),
    )
    assert main(["update-check", "--manifest", str(graph)]) == 1
    out = capsys.readouterr().out
    assert f"{ACTIVATE} state 'memory' removed" in out
    assert f"{ACTIVATE} state 'renamed' added" in out


def test_against_the_manifest_one_graph_is_given_and_applies_a_composite(tmp_path, capsys):
    graph, other = _graph(tmp_path, "g"), _graph(tmp_path, "h", label="Agent")
    assert main(["update-check", "--manifest", str(graph), str(graph)]) == 2
    assert main(["update-check", str(graph)]) == 2
    assert main(["update-check", "--manifest", str(other)]) == 2
    assert "applies none of the manifest's composites" in capsys.readouterr().err


#: SHA-256 of DataflowRunner.run_pipeline's source in the Beam whose rewrites `runner_graph`
#: repeats (apache-beam 2.77.0, the lock's).
_RUN_PIPELINE_READ = "9a6b52047917e2aa7367d1142c333f4daec1c265a32a3b1f1a9e3991070247cb"


def test_the_dataflow_rewrites_repeated_are_those_of_the_beam_installed():
    from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

    source = inspect.getsource(DataflowRunner.run_pipeline)
    assert hashlib.sha256(source.encode()).hexdigest() == _RUN_PIPELINE_READ, (
        "DataflowRunner.run_pipeline changed with this Beam: read it again, make "
        "update_check.runner_graph repeat its rewrites up to where it serializes the pipeline, "
        "and record the new digest here"
    )
