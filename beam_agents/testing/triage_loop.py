"""The support-triage agent as a Kafka loop job: `python -m beam_agents.testing.triage_loop`.

    python -m beam_agents.testing.triage_loop --kafka_bootstrap HOST:PORT --topic_prefix P
        --expansion_service HOST:PORT [--state_schema {CURRENT,NEXT}] [--unchained]
        [BEAM PIPELINE OPTIONS]

builds the demo's loop job (beam_agents.ops.demo.add_triage_loop), runs it and waits until the
runner ends the job. `--state_schema` is CURRENT_STATE_SCHEMA_VERSION unless given; the next
version is the second binary of the upgrade test: the same job with the synthetic migration
steps to CURRENT + 1 registered (beam_agents.testing.synthetic_next).
The transform names, and so the state a savepoint holds, are the same in both. `--unchained`
turns Flink's operator chaining off, so the job's savepoints can be restored at another
parallelism (beam_agents/bus/flink_upgrade_test.py).
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Sequence

import apache_beam as beam
import grpc
from apache_beam.options.pipeline_options import PipelineOptions

from beam_agents.bus import Topics
from beam_agents.ops.demo import add_triage_loop
from beam_agents.state.migration import CURRENT_STATE_SCHEMA_VERSION
from beam_agents.testing.synthetic_next import NEXT_STATE_SCHEMA_VERSION, registry_next

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m beam_agents.testing.triage_loop")
    parser.add_argument("--kafka_bootstrap", required=True)
    parser.add_argument("--topic_prefix", required=True)
    parser.add_argument("--expansion_service", required=True)
    parser.add_argument(
        "--state_schema",
        type=int,
        choices=[CURRENT_STATE_SCHEMA_VERSION, NEXT_STATE_SCHEMA_VERSION],
        default=CURRENT_STATE_SCHEMA_VERSION,
    )
    # Flink's runner option operator_chaining defaults to true, and Beam's Python side parses
    # a runner's boolean option as a flag that can only set it: false has to be a keyword.
    parser.add_argument("--unchained", action="store_true", help="Flink: no operator chaining")
    args, pipeline_args = parser.parse_known_args(argv)
    chaining = {"operator_chaining": False} if args.unchained else {}
    pipeline = beam.Pipeline(options=PipelineOptions(pipeline_args, **chaining))
    add_triage_loop(
        pipeline,
        kafka_bootstrap=args.kafka_bootstrap,
        topics=Topics(args.topic_prefix),
        expansion_service=args.expansion_service,
        registry=registry_next() if args.state_schema == NEXT_STATE_SCHEMA_VERSION else None,
    )
    result = pipeline.run()
    print(f"triage_loop: submitted, state schema {args.state_schema}", file=sys.stderr, flush=True)
    # With LOOPBACK this process hosts the pool that starts the job's Python workers, and
    # Beam's portable result stops that pool when its job state stream ends, which a job
    # server's death ends too: the job then restarts on Flink forever, with nowhere to start
    # its workers (flink_faults_test's job server SIGKILL). The pool is stopped here, once
    # the job has ended, and only then.
    stop_workers = getattr(result, "_cleanup_callbacks", ())
    result._cleanup_callbacks = ()
    try:
        result.wait_until_finish()
    except grpc.RpcError as lost:
        # The job server only submitted the job and reported its state; Flink runs it on.
        print(
            f"triage_loop: lost the job server ({lost.code().name}); the job's workers are "
            "served from here until this process is stopped",
            file=sys.stderr,
            flush=True,
        )
        threading.Event().wait()
    print(f"triage_loop: the job ended {result.state}", file=sys.stderr, flush=True)
    for stop in stop_workers:
        stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
