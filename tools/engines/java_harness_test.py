"""java_harness.py against a real provision service on 127.0.0.1 (gRPC, Beam's own stubs) and
a stand-in `java` on PATH that records what it was started with: the harness gets the job's
options and endpoints, and a provision service that cannot be reached, or answers without an
endpoint, is one line naming the worker and a non-zero exit."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from apache_beam.portability.api import (
    beam_provision_api_pb2,
    beam_provision_api_pb2_grpc,
    endpoints_pb2,
)
from google.protobuf import struct_pb2

SCRIPT = Path(__file__).with_name("java_harness.py")


class Provision(beam_provision_api_pb2_grpc.ProvisionServiceServicer):
    def __init__(self, info: beam_provision_api_pb2.ProvisionInfo) -> None:
        self.info = info
        self.workers: list[str] = []

    def GetProvisionInfo(self, request, context):
        self.workers.append(dict(context.invocation_metadata()).get("worker_id", ""))
        return beam_provision_api_pb2.GetProvisionInfoResponse(info=self.info)


@pytest.fixture
def provision():
    options = struct_pb2.Struct()
    options.update({"options": {"jobName": "j1", "streaming": True}})
    servicer = Provision(
        beam_provision_api_pb2.ProvisionInfo(
            pipeline_options=options,
            logging_endpoint=endpoints_pb2.ApiServiceDescriptor(url="127.0.0.1:7001"),
            control_endpoint=endpoints_pb2.ApiServiceDescriptor(url="127.0.0.1:7002"),
            runner_capabilities=["beam:protocol:a:v1", "beam:protocol:b:v1"],
        )
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    beam_provision_api_pb2_grpc.add_ProvisionServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        server.stop(None)


def _boot(
    tmp_path: Path, endpoint: str, *flags: str
) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Runs the boot program (with Beam's contract `flags`) and a `java` that writes its argv
    and environment to a file."""
    bin_dir, record = tmp_path / "bin", tmp_path / "java.json"
    bin_dir.mkdir()
    java = bin_dir / "java"
    java.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"out = open({str(record)!r}, 'w')\n"
        "out.write(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}))\n"
    )
    java.chmod(0o755)
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--id",
            "w7",
            "--provision_endpoint",
            endpoint,
            "--classpath",
            "/engines/lib",
            "--engines",
            "/engines/run",
            *flags,
        ],
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done, json.loads(record.read_text()) if record.exists() else None


def test_the_harness_starts_with_the_jobs_options_and_the_provisioned_endpoints(
    provision, tmp_path
):
    servicer, endpoint = provision
    done, started = _boot(
        tmp_path, endpoint, "--logging_endpoint=flag:1", "--control_endpoint=flag:2"
    )
    assert done.returncode == 0, done.stderr
    assert servicer.workers == ["w7"]  # it asked as its worker
    env, argv = started["env"], started["argv"]
    assert env["HARNESS_ID"] == "w7"
    assert json.loads(env["PIPELINE_OPTIONS"]) == {"options": {"jobName": "j1", "streaming": True}}
    # The provision service's endpoints win over the flags, as in Beam's own boot program.
    assert env["LOGGING_API_SERVICE_DESCRIPTOR"].strip() == 'url: "127.0.0.1:7001"'
    assert env["CONTROL_API_SERVICE_DESCRIPTOR"].strip() == 'url: "127.0.0.1:7002"'
    assert env["RUNNER_CAPABILITIES"] == "beam:protocol:a:v1 beam:protocol:b:v1"
    assert "STATUS_API_SERVICE_DESCRIPTOR" not in env
    assert argv == [
        "-Xmx512m",
        "-Dbeam_agents.engines=/engines/run",
        "-cp",
        "/engines/lib/*",
        "org.apache.beam.fn.harness.FnHarness",
    ]


def test_a_provision_service_it_cannot_reach_is_one_line_naming_the_worker(tmp_path):
    with socket.socket() as bound:  # an address nothing listens on once closed
        bound.bind(("127.0.0.1", 0))
        endpoint = f"127.0.0.1:{bound.getsockname()[1]}"
    done, started = _boot(tmp_path, endpoint)
    assert done.returncode == 1 and started is None
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("java_harness:")]
    assert f"worker w7: no provision info from {endpoint}: UNAVAILABLE" in line


def test_no_control_endpoint_from_the_service_or_the_flags_starts_no_harness(provision, tmp_path):
    servicer, endpoint = provision
    servicer.info.ClearField("control_endpoint")
    done, started = _boot(tmp_path, endpoint, "--logging_endpoint=flag:1")
    assert done.returncode == 2 and started is None
    assert "no logging or control endpoint for worker w7" in done.stderr
