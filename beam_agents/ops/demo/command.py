"""`beam-agents demo` and `python -m beam_agents.ops.demo`: the command line, which runs the demo
on local pipelines or (`--bus kafka`) on Kafka.

Its options are its own and Apache Beam's pipeline options, and nothing else: an argument
neither knows is a usage error (exit 2) before anything runs, never dropped with a warning
(Beam's own parser discards what it does not know). `--help` lists the demo's options and the
Beam options a local run needs; `--help-beam-options` lists every Beam option.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from apache_beam.options.pipeline_options import PipelineOptions

from beam_agents.errors import PrismNotFoundError
from beam_agents.ops.demo.bus import run_bus_demo
from beam_agents.ops.demo.local import run_demo
from beam_agents.ops.prism import pipeline, with_local_prism

__all__ = ["main"]

_DESCRIPTION = """\
Runs the support-triage agent end to end: RunAgent gives the customer's key a durable agent,
ExecuteIntents runs its signed tool intents once, a scripted approver answers its refund
request, and the rounds are chained through the key's exported StateSnapshot. With no option,
on local Beam pipelines (the DirectRunner), with no network and no keys. Exit codes: 0 the
agent completed; 1 it did not (a dead letter, named); 2 usage error."""

_EPILOG = """\
Any Apache Beam pipeline option is accepted too (--help-beam-options lists them all).
Prerequisites: Python 3.11 and this package. --runner=PrismRunner needs Prism, Beam's Go
runner: `bash tools/engines.sh prism` builds it once from the Go module proxy (it needs Go,
1.26 for Beam 2.77, and access to proxy.golang.org or a GOPROXY; about 3 CPU-minutes of
compiling the first time, up to 15 minutes on a busy 2-core machine), and the demo then finds
it without --prism_location. --bus kafka needs a Kafka broker and Beam's Java expansion
service (Java and Maven): `bash tools/engines.sh flink-demo` starts both and a Flink cluster,
and runs this demo on them."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="beam-agents demo",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--bus",
        choices=["rounds", "kafka"],
        default="rounds",
        help="rounds: local pipelines chained by snapshots (default); kafka: one streaming "
        "job on Kafka, the effector as its own process",
    )
    parser.add_argument("--kafka_bootstrap", metavar="HOST:PORT", help="--bus kafka: the broker")
    parser.add_argument(
        "--expansion_service",
        metavar="HOST:PORT",
        help="--bus kafka: Beam's Java expansion service (for KafkaIO)",
    )
    parser.add_argument(
        "--console",
        action="store_true",
        help="--bus kafka: a person approves in `beam-agents console` instead of the script",
    )
    parser.add_argument(
        "--console_port", type=int, default=8080, help="--console: its port (default 8080)"
    )
    parser.add_argument(
        "--flink_rest",
        metavar="URL",
        help="on Flink: the cluster's REST address, for the stalled-read watchdog",
    )
    parser.add_argument(
        "--help-beam-options",
        action="store_true",
        help="list every Apache Beam pipeline option and exit",
    )
    beam_group = parser.add_argument_group(
        "Beam pipeline options (the ones a local run needs; any other is accepted too)"
    )
    beam_group.add_argument(
        "--runner", help="DirectRunner (default), PrismRunner, FlinkRunner, DataflowRunner, ..."
    )
    beam_group.add_argument(
        "--prism_location",
        metavar="PATH",
        help="the Prism binary (default: the one `bash tools/engines.sh prism` built)",
    )
    beam_group.add_argument("--environment_type", help="e.g. LOOPBACK, for Prism and Flink")
    return parser


def _beam_parser() -> argparse.ArgumentParser:
    """Beam's own parser of every pipeline option (handed out by its public hook). Built from
    no arguments: given the command line, Beam would log a warning discarding its unknown
    options before our usage error names them."""
    parsers: list[argparse.ArgumentParser] = []
    PipelineOptions([]).get_all_options(add_extra_args_fn=parsers.append)
    return parsers[0]


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m beam_agents.ops.demo [--bus kafka ...] [Beam pipeline options]`; 2 when an
    option is unknown or Beam refuses the options."""
    argv = list(argv) if argv is not None else sys.argv[1:]
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.help_beam_options:
        _beam_parser().print_help()
        parser.exit()
    _, unknown = _beam_parser().parse_known_args(rest)
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    # The Beam options the group above names are Beam's: pass them on with the rest.
    given = {"runner": args.runner, "prism_location": args.prism_location,
             "environment_type": args.environment_type}  # fmt: skip
    pipeline_args = [f"--{name}={value}" for name, value in given.items() if value] + rest
    try:
        options = with_local_prism(PipelineOptions(pipeline_args))
        pipeline(options)  # Beam checks the runner and its options here
    except (PrismNotFoundError, ValueError) as e:
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
