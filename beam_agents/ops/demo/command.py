"""`beam-agents demo` and `python -m beam_agents.ops.demo`: the command line, which runs the demo
on local pipelines or (`--bus kafka`) on Kafka."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from beam_agents.ops.demo.bus import run_bus_demo
from beam_agents.ops.demo.local import run_demo

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m beam_agents.ops.demo [--bus kafka ...] [Beam pipeline options]`; 2 when Beam
    refuses the options."""
    parser = argparse.ArgumentParser(prog="beam-agents demo", add_help=False)
    parser.add_argument("--bus", choices=["rounds", "kafka"], default="rounds")
    parser.add_argument("--kafka_bootstrap")
    parser.add_argument("--expansion_service")
    parser.add_argument("--console", action="store_true")
    parser.add_argument("--console_port", type=int, default=8080)
    # On Flink: the cluster's REST address, for the stalled-read watchdog (beam_agents.bus.flink).
    parser.add_argument("--flink_rest")
    args, pipeline_args = parser.parse_known_args(list(argv) if argv is not None else sys.argv[1:])
    options = PipelineOptions(pipeline_args)
    try:
        beam.Pipeline(options=options)  # Beam checks the runner and its options here
    except ValueError as e:
        print(f"beam-agents demo: {e}", file=sys.stderr)
        return 2
    if args.console and args.bus != "kafka":
        print("beam-agents demo: --console needs --bus kafka", file=sys.stderr)
        return 2
    if args.bus == "rounds":
        return run_demo(options)
    if not args.kafka_bootstrap or not args.expansion_service:
        print("beam-agents demo: --bus kafka needs --kafka_bootstrap and --expansion_service",
              file=sys.stderr)  # fmt: skip
        return 2
    return run_bus_demo(
        options,
        kafka_bootstrap=args.kafka_bootstrap,
        expansion_service=args.expansion_service,
        console_port=args.console_port if args.console else None,
        flink_rest=args.flink_rest,
    )
