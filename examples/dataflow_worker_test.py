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
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from beam_agents._protos import AgentEnvelope
from beam_agents.examples.support_triage import ticket
from beam_agents.testing.engines import Engines
from beam_agents.wire.fields import join_delimited
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


def test_the_staged_wheel_runs_in_a_dataflow_like_worker_as_on_loopback(engines, staged, tmp_path):
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
    )
    _launch(staged, tmp_path / "loopback", "--environment_type=LOOPBACK")

    process, loopback = _messages(tmp_path / "process"), _messages(tmp_path / "loopback")
    assert process == loopback
    assert process["intents"] and process["errors"] and process["traces"]

    # Where the worker's beam_agents came from: the staged wheel, installed by the boot
    # program into the worker's own environment with the dependencies the wheel declares.
    base = Path(command).parent / "env" / "bin" / "python"
    spec = "import importlib.util as u; print(u.find_spec('beam_agents'), u.find_spec('rfc8785'))"
    assert _isolated(base, spec, workers) == "None None"
    (worker,) = workers.iterdir()
    code = (
        "import beam_agents, rfc8785, importlib.metadata as m, json\n"
        "d = m.distribution('beam-agents')\n"
        "print(json.dumps([beam_agents.__file__, rfc8785.__file__,"
        " json.loads(d.read_text('direct_url.json'))['url']]))\n"
    )
    module, rfc, url = json.loads(_isolated(worker / "venv" / "bin" / "python", code, worker))
    assert module.startswith(str(worker / "venv")) and rfc.startswith(str(worker / "venv"))
    assert url == f"file://{worker}/staged/beam_agents-0.1.0-py3-none-any.whl"
