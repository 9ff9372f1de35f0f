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

    python -m beam_agents.ops.state_manifest --write
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["MANIFEST", "describe", "main"]

MANIFEST = Path(__file__).with_name("state_manifest.json")


def describe() -> dict:
    """The manifest of this binary: the graph of a pipeline applying RunAgent and
    ExecuteIntents, described as Beam itself sees it (update_check.describe_graph)."""
    import apache_beam as beam

    from beam_agents.intents.effector import ExecuteIntents, VerifyMode
    from beam_agents.ops.update_check import describe_graph, manifest_view
    from beam_agents.runtime import RunAgent, agent

    @agent(name="state_manifest.names_only")
    def names_only(ctx, event: bytes) -> bytes:  # neither names nor specs depend on the agent
        return event

    composites = {
        "RunAgent": RunAgent(names_only),
        "ExecuteIntents": ExecuteIntents({}, mode=VerifyMode.OFF),
    }
    pipeline = beam.Pipeline()
    created = pipeline | "Inputs" >> beam.Create([b""])
    for label, composite in composites.items():
        _ = created | label >> composite
    return manifest_view(describe_graph(pipeline.to_runner_api()), composites)


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
