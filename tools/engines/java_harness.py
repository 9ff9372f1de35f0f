"""Boots one Java SDK harness for one Flink job: the command of the expanded Kafka
transforms' PROCESS environment (tools/engines.sh `start java`).

Flink starts it once per job and task manager with Beam's container contract flags
(--id, --provision_endpoint, ...), and kills it when the job ends. That is the point: a
shared pool of Java workers (Beam's ExternalWorkerService) runs every job's harness as
threads of one JVM, where a cancelled job's Kafka producers and consumers are never torn
down. Here a job's harness, and everything it opened, dies with the job.

What Beam's own Go boot program does (sdks/java/container/boot.go) minus what only a
container needs: it asks the provision service for the job's pipeline options and
endpoints, and execs the harness JVM with them in its environment. The classpath is the
engines' Java closure, which holds every transform the expansion service can expand, so the
artifacts the job server stages for the environment are not read. A failure is one line on
stderr (the wrapper tools/engines.sh writes logs it) and a non-zero exit, which Flink reports
as the environment's process dying.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import grpc
from apache_beam.portability.api import (
    beam_provision_api_pb2,
    beam_provision_api_pb2_grpc,
    endpoints_pb2,
)
from google.protobuf import json_format, text_format

#: Per job and task manager, beside Flink's own task manager heap.
_HEAP = "-Xmx512m"
_PROVISION_TIMEOUT_S = 60


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--id", required=True)
    parser.add_argument("--provision_endpoint", required=True)
    parser.add_argument("--classpath", required=True, help="the Java engines' lib directory")
    parser.add_argument("--engines", required=True, help="the run directory of these engines")
    # The contract's other flags; the provision service's answer overrides them, as in boot.go.
    for flag in ("logging_endpoint", "artifact_endpoint", "control_endpoint", "semi_persist_dir"):
        parser.add_argument(f"--{flag}", default="")
    args = parser.parse_args(argv)

    try:
        with grpc.insecure_channel(args.provision_endpoint) as channel:
            info = (
                beam_provision_api_pb2_grpc.ProvisionServiceStub(channel)
                .GetProvisionInfo(
                    beam_provision_api_pb2.GetProvisionInfoRequest(),
                    metadata=[("worker_id", args.id)],
                    timeout=_PROVISION_TIMEOUT_S,
                )
                .info
            )
    except grpc.RpcError as e:
        print(
            f"java_harness: worker {args.id}: no provision info from {args.provision_endpoint}:"
            f" {e.code().name} {e.details()}",
            file=sys.stderr,
        )
        return 1
    logging = info.logging_endpoint.url or args.logging_endpoint
    control = info.control_endpoint.url or args.control_endpoint
    if not logging or not control:
        print(f"java_harness: no logging or control endpoint for worker {args.id}", file=sys.stderr)
        return 2

    def descriptor(url: str) -> str:
        return text_format.MessageToString(endpoints_pb2.ApiServiceDescriptor(url=url))

    env = dict(os.environ)
    env.update(
        HARNESS_ID=args.id,
        PIPELINE_OPTIONS=json.dumps(json_format.MessageToDict(info.pipeline_options)),
        LOGGING_API_SERVICE_DESCRIPTOR=descriptor(logging),
        CONTROL_API_SERVICE_DESCRIPTOR=descriptor(control),
        RUNNER_CAPABILITIES=" ".join(info.runner_capabilities),
    )
    if info.HasField("status_endpoint"):
        env["STATUS_API_SERVICE_DESCRIPTOR"] = descriptor(info.status_endpoint.url)
    classpath = str(Path(args.classpath) / "*")
    # The engines' run directory on the command line lets tools/engines.sh find and signal
    # the harnesses of its own engines (freeze-workers), not another checkout's.
    java = ["java", _HEAP, f"-Dbeam_agents.engines={args.engines}", "-cp", classpath]
    try:
        os.execvpe("java", [*java, "org.apache.beam.fn.harness.FnHarness"], env)
    except OSError as e:
        print(f"java_harness: worker {args.id}: cannot run java: {e}", file=sys.stderr)
        return 1
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
