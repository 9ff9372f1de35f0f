"""`beam-agents update-check OLD NEW`: will Dataflow `--update` take NEW over a job running OLD?

OLD and NEW are two builds' pipeline graphs: Beam's runner-API Pipeline protos, serialized, as
`write_graph` (or `examples/dataflow_launch.py --graph_out=FILE`) writes them from the job a
launcher builds. Dataflow matches the running job's steps by transform name, and each stateful
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
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners import pipeline_context

__all__ = ["describe_graph", "differences", "read_graph", "write_graph"]

_PARDO = "beam:transform:pardo:v1"
_PICKLED_PYTHON = "beam:coder:pickled_python:v1"


def write_graph(pipeline: beam.Pipeline, path: str | os.PathLike) -> None:
    """Writes the pipeline's graph (without running it) for `beam-agents update-check`."""
    with open(path, "wb") as out:
        out.write(pipeline.to_runner_api().SerializeToString(deterministic=True))


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


def differences(committed: dict, current: dict) -> list[str]:
    """Each way `current` differs from `committed`, with what it would do to an update."""
    found = []
    for composite in sorted(set(committed["transform_names"]) | set(current["transform_names"])):
        old = set(committed["transform_names"].get(composite, []))
        new = set(current["transform_names"].get(composite, []))
        for name in sorted(old - new):
            found.append(
                f"{composite}/{name} is gone: --update matches steps and their state by "
                "transform name, so a running job's state for it would be dropped"
            )
        for name in sorted(new - old):
            found.append(
                f"{composite}/{name} is new: a renamed step starts with empty state on --update"
            )
    stateful = [t for t in set(committed) | set(current) if t != "transform_names"]
    for transform in sorted(stateful):
        old, new = committed.get(transform), current.get(transform)
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
