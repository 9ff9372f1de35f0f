"""`beam-agents update-check OLD NEW`: will Dataflow `--update` take NEW over a job running OLD?

OLD and NEW are two builds' pipeline graphs: Beam's runner-API Pipeline protos, serialized, as
`write_graph` (or `examples/dataflow_launch.py --graph_out=FILE`) writes them from the job a
launcher builds. For a pipeline whose options name the DataflowRunner, `write_graph` first
applies the rewrites DataflowRunner.run_pipeline applies before it serializes the job (its
visitors and transform overrides, the streaming Pub/Sub one among them), offline: the graph is
the one Dataflow receives, with no Google Cloud project or credentials. (Beam's own
`--dry_run` stops after those same steps, but needs the apache-beam[gcp] client libraries.)
`beam-agents update-check --manifest GRAPH` compares one graph with the committed state
manifest instead (`manifest_view`): the names and specs of each composite of the manifest the
graph applies. Dataflow matches the running job's steps by transform name, and each stateful
step's state by spec id, decoding it with the new coder; a timer keeps its time domain. So the
check names every transform of OLD missing from NEW (Dataflow refuses the update unless
`--transform_name_mapping` maps it), and for every stateful step each state spec added,
removed or recoded and each timer moved to another domain (state lost or misread).

Coders are described from the graph itself: portable coders by URN, Python-only ones (such as
DeterministicProtoCoder) by unpickling them, which runs code named in the file: check graphs of
your own builds only.

Exit codes: 0 compatible; 1 not (each difference named); 2 usage error.
"""

from __future__ import annotations

import os

import apache_beam as beam
from apache_beam.coders import coders
from apache_beam.options.pipeline_options import TypeOptions
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context
from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner
from apache_beam.runners.dataflow.ptransform_overrides import get_dataflow_transform_overrides

__all__ = [
    "against_manifest",
    "describe_graph",
    "differences",
    "manifest_view",
    "read_graph",
    "runner_graph",
    "write_graph",
]

_PARDO = "beam:transform:pardo:v1"
_PICKLED_PYTHON = "beam:coder:pickled_python:v1"


def write_graph(pipeline: beam.Pipeline, path: str | os.PathLike) -> None:
    """Writes the pipeline's graph (without running it) for `beam-agents update-check`."""
    with open(path, "wb") as out:
        out.write(runner_graph(pipeline).SerializeToString(deterministic=True))


def runner_graph(pipeline: beam.Pipeline) -> beam_runner_api_pb2.Pipeline:
    """The pipeline's graph as its runner submits it. For the DataflowRunner that is the graph
    after the rewrites of DataflowRunner.run_pipeline, in its order, up to where it serializes
    the pipeline (it then asks Google Cloud for the job, which is not done here); for other
    runners, the graph as built. It rewrites `pipeline`: build a fresh one to run.

    The rewrites are repeated from Beam's code, not called: a test pins the digest of
    DataflowRunner.run_pipeline's source it was read from, and fails on a Beam that changed it."""
    if not isinstance(pipeline.runner, DataflowRunner):
        return pipeline.to_runner_api()
    options = pipeline._options
    runner = DataflowRunner()
    pipeline.visit(runner.combinefn_visitor())
    pipeline.visit(
        runner.side_input_visitor(
            deterministic_key_coders=not options.view_as(
                TypeOptions
            ).allow_non_deterministic_key_coders
        )
    )
    pipeline.replace_all(DataflowRunner._PTRANSFORM_OVERRIDES)
    overrides = get_dataflow_transform_overrides(options)
    if overrides:
        pipeline.replace_all(overrides)
    runner._adjust_pipeline_for_dataflow_v2(pipeline)
    return pipeline.to_runner_api()


def read_graph(data: bytes) -> beam_runner_api_pb2.Pipeline:
    return beam_runner_api_pb2.Pipeline.FromString(data)


def _coder(components, coder_id: str) -> str:
    coder = components.coders[coder_id]
    if coder.spec.urn == _PICKLED_PYTHON:
        context = pipeline_context.PipelineContext(components)
        python = coders.Coder.from_runner_api(coder, context)
        message = getattr(python, "proto_message_type", None)
        name = type(python).__name__
        return f"{name}({message.DESCRIPTOR.full_name})" if message is not None else name
    parts = [_coder(components, c) for c in coder.component_coder_ids]
    return coder.spec.urn + (f"[{', '.join(parts)}]" if parts else "")


def _domain(number: int) -> str:
    domains = beam_runner_api_pb2.TimeDomain.Enum
    return domains.Name(number) if number in domains.values() else f"TimeDomain {number}"


def describe_graph(graph: beam_runner_api_pb2.Pipeline) -> dict:
    """The graph in the shape of the state manifest: every transform name, and the state and
    timer specs of every stateful step."""
    components = graph.components
    described: dict = {
        "transform_names": {
            "pipeline": sorted(t.unique_name for t in components.transforms.values())
        }
    }
    for transform in components.transforms.values():
        if transform.spec.urn != _PARDO:
            continue
        payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
        if not payload.state_specs and not payload.timer_family_specs:
            continue
        states = {}
        for spec_id, spec in payload.state_specs.items():
            # A kind or time domain this Beam does not name (a newer writer's, or a forged
            # file) is described as found, so it still compares instead of failing the check.
            kind = spec.WhichOneof("spec")
            detail = spec if kind is None else getattr(spec, kind)
            coder_id = getattr(detail, "coder_id", "") or getattr(detail, "element_coder_id", "")
            states[spec_id] = {"kind": kind, "coder": _coder(components, coder_id)}
        timers = {
            timer_id.removeprefix("ts-"): {"domain": _domain(spec.time_domain)}
            for timer_id, spec in payload.timer_family_specs.items()
        }
        described[transform.unique_name] = {
            "state": dict(sorted(states.items())),
            "timers": dict(sorted(timers.items())),
        }
    return described


def manifest_view(described: dict, labels) -> dict:
    """A graph's description (describe_graph) in the state manifest's shape, for the composites
    `labels`: the names under each label, relative to it, and the stateful steps under them."""
    names = described["transform_names"]["pipeline"]
    return {
        "transform_names": {
            label: sorted(n.removeprefix(label + "/") for n in names if n.startswith(label + "/"))
            for label in labels
        },
        **_under(described, labels),
    }


def against_manifest(described: dict, manifest: dict) -> tuple[dict, dict] | None:
    """The manifest and the graph's description, both cut to the manifest's composites the
    graph applies (a launcher applies RunAgent without ExecuteIntents), for `differences`;
    None when it applies none of them."""
    names = set(described["transform_names"]["pipeline"])
    labels = [label for label in manifest["transform_names"] if label in names]
    if not labels:
        return None
    committed = {
        "transform_names": {label: manifest["transform_names"][label] for label in labels},
        **_under(manifest, labels),
    }
    return committed, manifest_view(described, labels)


def _under(described: dict, labels) -> dict:
    return {
        transform: specs
        for transform, specs in described.items()
        if transform != "transform_names"
        and any(transform.startswith(label + "/") for label in labels)
    }


def differences(committed: dict, current: dict) -> list[str]:
    """Each way `current` differs from `committed`, with what it would do to an update.

    A step or stateful transform that is only added (nothing of the committed graph is gone)
    is no difference: an update starts it with empty state, as a new job would (a shadow, a
    recording output). When something is gone, each new name is named too, since it may be
    the gone one renamed, whose state would then start empty.
    """
    names_old, names_new = committed["transform_names"], current["transform_names"]
    stateful = [t for t in set(committed) | set(current) if t != "transform_names"]
    gone_somewhere = any(
        set(names_old[composite]) - set(names_new.get(composite, [])) for composite in names_old
    ) or any(t in committed and t not in current for t in stateful)
    found = []
    for composite in sorted(set(names_old) | set(names_new)):
        old = set(names_old.get(composite, []))
        new = set(names_new.get(composite, []))
        for name in sorted(old - new):
            found.append(
                f"{composite}/{name} is gone: --update matches steps and their state by "
                "transform name, so a running job's state for it would be dropped"
            )
        for name in sorted(new - old) if gone_somewhere else ():
            found.append(
                f"{composite}/{name} is new: a renamed step starts with empty state on --update"
            )
    for transform in sorted(stateful):
        old, new = committed.get(transform), current.get(transform)
        if old is None and not gone_somewhere:
            continue
        if old is None or new is None:
            what = "is new" if old is None else "is gone"
            found.append(
                f"{transform} {what}: an update matches state by transform name, so "
                "its state would start empty or be dropped"
            )
            continue
        for kind, consequence in (
            ("state", "every key's {name} state would be lost or misread on --update"),
            ("timers", "every key's set {name} timer would be lost or fire in another domain"),
        ):
            for name in sorted(set(old[kind]) | set(new[kind])):
                before, after = old[kind].get(name), new[kind].get(name)
                if before != after:
                    change = (
                        "added"
                        if before is None
                        else "removed"
                        if after is None
                        else f"changed from {before} to {after}"
                    )
                    found.append(
                        f"{transform} {kind} {name!r} {change}: "
                        + consequence.format(name=repr(name))
                    )
    return found
