"""The frozen shape of beam_agents' keyed state: the names of the transforms RunAgent and
ExecuteIntents apply, and every stateful DoFn's state spec ids, coders and timer domains, as
committed in state_manifest.json.

Dataflow `--update` (and a Flink savepoint restore) matches state by transform name and state
spec id and decodes it with the new binary's coder. Renaming a transform (a label, or a DoFn
class, which Beam puts in the name of its ParDo), renaming a spec, changing its coder or moving
a timer to another time domain therefore refuses the update or loses every key's state: no
schema-version bump can license it. `state_manifest_test.py` fails on any difference
between the DoFns and the committed file; only a deliberate, drained (not updated) release
regenerates it:

    python -m beam_agents.state_manifest --write
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from apache_beam.transforms import userstate

__all__ = ["MANIFEST", "describe", "differences", "main"]

MANIFEST = Path(__file__).with_name("state_manifest.json")


def _stateful_dofns() -> dict[str, type]:
    from beam_agents.effector import _ExecuteOnce
    from beam_agents.runtime.run_agent import _AgentDoFn

    # Keyed by the transform label each is applied under: what --update matches.
    return {"ExecuteIntents/ExecuteOnce": _ExecuteOnce, "RunAgent/Activate": _AgentDoFn}


def _transform_names() -> dict[str, list[str]]:
    """The leaf transforms each composite applies, relative to its own label."""
    import apache_beam as beam

    from beam_agents.effector import ExecuteIntents, VerifyMode
    from beam_agents.runtime import RunAgent, agent

    @agent(name="state_manifest.names_only")
    def names_only(ctx, event: bytes) -> bytes:  # names do not depend on the agent
        return event

    composites = {
        "RunAgent": RunAgent(names_only),
        "ExecuteIntents": ExecuteIntents({}, mode=VerifyMode.OFF),
    }
    pipeline = beam.Pipeline()
    created = pipeline | beam.Create([b""])
    for label, composite in composites.items():
        _ = created | label >> composite
    transforms = pipeline.to_runner_api().components.transforms.values()
    return {
        label: sorted(
            t.unique_name.removeprefix(label + "/")
            for t in transforms
            if t.unique_name.startswith(label + "/") and not t.subtransforms
        )
        for label in composites
    }


def _coder(coder) -> dict[str, str]:
    described = {"coder": f"{type(coder).__module__}.{type(coder).__qualname__}"}
    message = getattr(coder, "proto_message_type", None)
    if message is not None:
        described["message"] = message.DESCRIPTOR.full_name
    return described


def describe() -> dict:
    """The manifest of the transforms and DoFns in this binary."""
    manifest: dict = {"transform_names": _transform_names()}
    for transform, dofn in _stateful_dofns().items():
        states = {}
        timers = {}
        for value in vars(dofn).values():
            if isinstance(value, userstate.StateSpec):
                states[value.name] = {"kind": type(value).__name__, **_coder(value.coder)}
            elif isinstance(value, userstate.TimerSpec):
                timers[value.name.removeprefix("ts-")] = {"domain": value.time_domain}
        manifest[transform] = {
            "dofn": f"{dofn.__module__}.{dofn.__qualname__}",
            "state": dict(sorted(states.items())),
            "timers": dict(sorted(timers.items())),
        }
    return manifest


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite state_manifest.json")
    args = parser.parse_args(argv)
    text = json.dumps(describe(), indent=2, sort_keys=True) + "\n"
    if args.write:
        MANIFEST.write_text(text)
        print(f"wrote {MANIFEST}")
        return 0
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
