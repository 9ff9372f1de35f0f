"""The launcher's Dataflow path without Google Cloud: the wheel `pip wheel` builds, staged with
`--extra_package` as the guide's command stages it, installed by Beam's own boot program into
a worker environment that holds Beam and nothing of this project, and run there.

`tools/engines.sh worker` builds that worker (Beam's Python boot program from the Go module
proxy, over a virtual environment of apache-beam's locked closure) and Prism starts it as the
job's PROCESS environment. The boot program fetches the staged wheel from the runner's artifact
service and pip-installs it, resolving its declared dependencies, into a fresh environment of
its own; the SDK harness then unpickles the job's DoFns there. The same job run with LOOPBACK
workers, which import this checkout, writes the same messages.

The workers keep their folders (BEAM_AGENTS_WORKER_KEEP) so the test can show where
beam_agents came from: the staged artifact, installed into the worker's own environment, and
not the Beam-only environment beneath it, nor this checkout (no PYTHONPATH reaches the worker
and it runs in its own folder).

The guide's other way to reach the workers, a `--requirements_file` for the extras the user's
code imports, runs the same way with the `otel` extra: a requirements.txt pins its packages (the
ones Beam does not bring) at requirements_lock.txt's versions, as `pip freeze` would; Beam's
stager `pip download`s each of them at launch and stages the files, and the boot program
installs them from there into the worker's environment before the wheel.

A user's own project, as `beam-agents new` writes it, depends on `beam-agents`, which is not on
PyPI: the guide stages beam_agents' wheel and then the project's, and the boot program installs
`extra_packages.txt` in that order (installExtraPackages, piputil.go), each wheel with its
dependencies, so the project's dependency is met by the wheel installed before it. A job of the
project's agent, staged that way, runs on the same worker.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from beam_agents._protos import AgentEnvelope
from beam_agents.examples.support_triage import ticket
from beam_agents.ops.scaffold import new_project
from beam_agents.testing.engines import Engines
from beam_agents.wire.fields import join_delimited
from tools.build_files import _normalize
from tools.distributions import installed_closure
from tools.workspace import build_wheel, source_root

pytestmark = pytest.mark.engines

LAUNCHER = source_root() / "examples" / "dataflow_launch.py"
T0 = 1_764_460_800_000
#: The outputs the launcher writes in its local file mode (tag -> file in --output_dir).
OUTPUTS = ("intents", "completions", "errors", "traces", "snapshots")


@pytest.fixture(scope="module")
def engines() -> Engines:
    return Engines()


@pytest.fixture(scope="module")
def staged(tmp_path_factory) -> Path:
    """A launch folder holding dist/beam_agents-0.1.0-py3-none-any.whl, as after the guide's
    `pip wheel --no-deps -w dist .`, and the envelopes to process."""
    folder = tmp_path_factory.mktemp("launch")
    built = build_wheel(source_root(), tmp_path_factory.mktemp("wheel"))
    (folder / "dist").mkdir()
    built.rename(folder / "dist" / built.name)
    (folder / "envelopes.binpb").write_bytes(
        join_delimited(
            [
                AgentEnvelope(
                    entity_key=b"c-1",
                    event_time_ms=T0,
                    external_event=ticket("t-1", "c-1", "I was charged twice"),
                ),
                AgentEnvelope(
                    entity_key=b"c-2",
                    event_time_ms=T0 + 1,
                    external_event=ticket("t-2", "c-2", "How do I export my data?"),
                ),
                AgentEnvelope(entity_key=b"c-3", event_time_ms=T0, external_event=b"not json"),
            ]
        )
    )
    return folder


def _launch(folder: Path, out: Path, *environment: str) -> None:
    """Runs the launcher as the guide does (`python examples/dataflow_launch.py ...`) from the
    launch folder, on Prism, in its local file mode."""
    out.mkdir()
    prism = Engines().run("prism")
    command = [
        sys.executable,
        str(LAUNCHER),
        "--runner=PrismRunner",
        f"--prism_location={prism}",
        *environment,
        "--extra_package=dist/beam_agents-0.1.0-py3-none-any.whl",
        f"--input_file={folder / 'envelopes.binpb'}",
        f"--output_dir={out}",
    ]
    done = subprocess.run(
        command,
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-5000:]


def _messages(out: Path) -> dict[str, list[bytes]]:
    """Each output's serialized messages, sorted (bundles order them differently)."""
    return {
        tag: sorted(bytes.fromhex(line) for line in (out / tag).read_text().splitlines())
        for tag in OUTPUTS
    }


def _isolated(python: Path, code: str, cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    done = subprocess.run(
        [str(python), "-I", "-c", code], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.fixture(scope="module")
def loopback(staged, tmp_path_factory) -> dict[str, list[bytes]]:
    """The messages the launcher writes with LOOPBACK workers, which import this checkout."""
    out = tmp_path_factory.mktemp("loopback") / "out"
    _launch(staged, out, "--environment_type=LOOPBACK")
    return _messages(out)


def _run_on_worker(engines: Engines, staged: Path, tmp_path: Path, *options: str) -> Path:
    """Launches on PROCESS workers made like Dataflow's, which keep their folders; returns the
    folder of the one worker Prism started (the job writes to tmp_path/process)."""
    command = engines.run("worker")
    workers = tmp_path / "workers"
    config = {
        "command": command,
        "env": {"BEAM_AGENTS_WORKER_HOME": str(workers), "BEAM_AGENTS_WORKER_KEEP": "1"},
    }
    _launch(
        staged,
        tmp_path / "process",
        "--environment_type=PROCESS",
        f"--environment_config={json.dumps(config)}",
        *options,
    )
    (worker,) = workers.iterdir()
    return worker


def _in_worker(worker: Path, code: str) -> list:
    """What `code` prints as JSON, run by the Python of the worker's own environment."""
    return json.loads(_isolated(worker / "venv" / "bin" / "python", code, worker))


def _beam_only(engines: Engines) -> Path:
    """The Python of the Beam-only environment beneath every worker's own."""
    return Path(engines.run("worker")).parent / "env" / "bin" / "python"


def test_the_staged_wheel_runs_in_a_dataflow_like_worker_as_on_loopback(
    engines, staged, loopback, tmp_path
):
    worker = _run_on_worker(engines, staged, tmp_path)

    process = _messages(tmp_path / "process")
    assert process == loopback
    assert process["intents"] and process["errors"] and process["traces"]

    # Where the worker's beam_agents came from: the staged wheel, installed by the boot
    # program into the worker's own environment with the dependencies the wheel declares.
    spec = "import importlib.util as u; print(u.find_spec('beam_agents'), u.find_spec('rfc8785'))"
    assert _isolated(_beam_only(engines), spec, worker.parent) == "None None"
    code = (
        "import beam_agents, rfc8785, importlib.metadata as m, json\n"
        "d = m.distribution('beam-agents')\n"
        "print(json.dumps([beam_agents.__file__, rfc8785.__file__,"
        " json.loads(d.read_text('direct_url.json'))['url']]))\n"
    )
    module, rfc, url = _in_worker(worker, code)
    assert module.startswith(str(worker / "venv")) and rfc.startswith(str(worker / "venv"))
    assert url == f"file://{worker}/staged/beam_agents-0.1.0-py3-none-any.whl"


def _pins(requirements: Path) -> dict[str, str]:
    """A requirements file's `name==version` lines, by normalized name."""
    found = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", requirements.read_text(), re.M)
    return {_normalize(name): version for name, version in found}


def _extra_requirements(extra: str, beam_closure: Path) -> dict[str, str]:
    """The distributions the project's `extra` brings beyond the Beam-only worker's
    (`beam_closure`, its requirements file), each at its requirements_lock.txt version."""
    project = tomllib.loads((source_root() / "pyproject.toml").read_text())["project"]
    named = {Requirement(line).name for line in project["optional-dependencies"][extra]}
    pins = _pins(source_root() / "requirements_lock.txt")
    beyond_beam = installed_closure(named) - _pins(beam_closure).keys()
    return {name: pins[name] for name in sorted(beyond_beam)}


def test_a_requirements_file_installs_an_extra_on_the_worker_as_the_guide_says(
    engines, staged, loopback, tmp_path
):
    wanted = _extra_requirements("otel", Path(engines.run("worker")).parent / "requirements.txt")
    assert {"opentelemetry_sdk", "opentelemetry_exporter_otlp_proto_http"} <= wanted.keys()
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("".join(f"{name}=={version}\n" for name, version in wanted.items()))

    worker = _run_on_worker(
        engines,
        staged,
        tmp_path,
        f"--requirements_file={requirements}",
        f"--requirements_cache={tmp_path / 'requirements-cache'}",
    )
    assert _messages(tmp_path / "process") == loopback

    # The stager downloaded each pinned distribution at launch and staged its file beside the
    # wheel; the boot program installed them into the worker's own environment, where the
    # extra's modules import (and not into the Beam-only one beneath it).
    staged_files = {_normalize(f.name.split("-")[0]) for f in (worker / "staged").iterdir()}
    assert wanted.keys() <= staged_files
    spec = "import importlib.util as u; print(u.find_spec('opentelemetry'))"
    assert _isolated(_beam_only(engines), spec, worker.parent) == "None"
    code = (
        "import json, importlib.metadata as m\n"
        "import opentelemetry.sdk.trace as sdk\n"
        "import opentelemetry.exporter.otlp.proto.http.trace_exporter as http\n"
        f"names = {sorted(wanted)!r}\n"
        "print(json.dumps([sdk.__file__, http.__file__,"
        " {n: m.distribution(n).version for n in names}]))\n"
    )
    sdk, http, versions = _in_worker(worker, code)
    assert sdk.startswith(str(worker / "venv")) and http.startswith(str(worker / "venv"))
    assert versions == wanted


#: A job of the project `beam-agents new shop` writes, run from the project's folder: one order
#: to its agent, each intent the agent asks for written as a line (tool, args, signing key).
#: The keys are the worker's: Keyring.from_environment runs there.
_SHOP_JOB = f"""\
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from beam_agents import INTENTS, AgentEnvelope, Keyring, RunAgent
from shop.agent import scripted_model, shop

order = AgentEnvelope(
    entity_key=b"customer-1", event_time_ms={T0}, external_event=b"I would like a pen"
)
with beam.Pipeline(options=PipelineOptions(sys.argv[2:])) as pipeline:
    outputs = (
        pipeline
        | beam.Create([order.SerializeToString()], reshuffle=False)
        | RunAgent(shop, llm_client=scripted_model(), keyring_loader=Keyring.from_environment)
    )
    _ = (
        outputs[INTENTS]
        | beam.MapTuple(lambda key, i: f"{{i.tool_name}} {{i.args_json}} {{i.signing_key_id}}")
        | beam.io.WriteToText(sys.argv[1], shard_name_template="")
    )
"""


@pytest.fixture(scope="module")
def shop_project(tmp_path_factory) -> Path:
    """`beam-agents new shop`, its wheel built as the guide builds it (dist/), and its job."""
    folder = new_project("shop", tmp_path_factory.mktemp("project"))
    built = build_wheel(folder, tmp_path_factory.mktemp("shop-wheel"))
    (folder / "dist").mkdir()
    built.rename(folder / "dist" / built.name)
    (folder / "job.py").write_text(_SHOP_JOB)
    return folder


def test_a_new_projects_agent_runs_on_the_worker_with_beam_agents_wheel_staged_first(
    engines, staged, shop_project, tmp_path
):
    workers = tmp_path / "workers"
    key = base64.b64encode(bytes(32)).decode()
    ring = json.dumps({"active": "intents-1", "keys": {"intents-1": key}})
    config = {
        "command": engines.run("worker"),
        "env": {
            "BEAM_AGENTS_WORKER_HOME": str(workers),
            "BEAM_AGENTS_WORKER_KEEP": "1",
            "BEAM_AGENTS_SIGNING_KEYS": ring,
        },
    }
    launcher = {k: v for k, v in os.environ.items() if not k.startswith("BEAM_AGENTS_SIGNING")}
    done = subprocess.run(
        [
            sys.executable,
            "job.py",
            str(tmp_path / "intents"),
            "--runner=PrismRunner",
            f"--prism_location={engines.run('prism')}",
            "--environment_type=PROCESS",
            f"--environment_config={json.dumps(config)}",
            # The guide's order: beam_agents' wheel (built in its checkout), then the project's.
            f"--extra_package={staged / 'dist' / 'beam_agents-0.1.0-py3-none-any.whl'}",
            "--extra_package=dist/shop-0.1.0-py3-none-any.whl",
        ],
        cwd=shop_project,
        env=launcher,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    assert (tmp_path / "intents").read_text().splitlines() == [
        'stock.lookup {"item":"pen"} intents-1'
    ]

    # The stager listed the two wheels in the order given and the worker installed both from
    # what was staged, into its own environment; the agent's module came from the project's.
    (worker,) = workers.iterdir()
    assert (worker / "staged" / "extra_packages.txt").read_text().splitlines() == [
        "beam_agents-0.1.0-py3-none-any.whl",
        "shop-0.1.0-py3-none-any.whl",
    ]
    code = (
        "import shop.agent, importlib.metadata as m, json\n"
        "urls = [json.loads(m.distribution(n).read_text('direct_url.json'))['url']"
        " for n in ('beam-agents', 'shop')]\n"
        "print(json.dumps([shop.agent.__file__, *urls]))\n"
    )
    module, beam_agents_url, shop_url = _in_worker(worker, code)
    assert module.startswith(str(worker / "venv"))
    assert beam_agents_url == f"file://{worker}/staged/beam_agents-0.1.0-py3-none-any.whl"
    assert shop_url == f"file://{worker}/staged/shop-0.1.0-py3-none-any.whl"
