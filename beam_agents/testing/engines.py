"""The real engines from tests: Kafka, the Java expansion service and workers, a Flink session
cluster with Beam's job server, all started by `tools/engines.sh` of a source checkout and
stopped by PID.

`Engines.up(names)` starts those that are not running and remembers which it started;
`down()` stops exactly those; `run(...)` is any other engines.sh command (a fault: a task or
job manager killed, the broker stopped and started on its data). `FlinkRest` is the part of
Flink's REST API a test needs: the jobs, their checkpoints and exceptions, stop-with-savepoint
and cancel. `Launched` is a job launcher (a Python
process whose LOOPBACK workers run the job's Python stages) or any service process, with its
output in a log file and a stop that never leaves it behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

__all__ = ["ROOT", "Engines", "FlinkRest", "Launched"]

ROOT = Path(__file__).resolve().parents[2]
_SCRIPT = ROOT / "tools" / "engines.sh"


def _engines(*args: str) -> str:
    done = subprocess.run(
        ["bash", str(_SCRIPT), *args], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"tools/engines.sh {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


class Engines:
    def __init__(self) -> None:
        self.started: list[str] = []
        self.endpoints = dict(
            line.split("=", 1) for line in _engines("endpoints").split() if "=" in line
        )

    def up(self, names: Sequence[str]) -> Engines:
        status = _engines("status")
        for name in names:
            if f"{name} running" not in status:
                _engines("start", name)
                self.started.append(name)
        return self

    def run(self, *args: str) -> str:
        """`tools/engines.sh ARGS`; its stdout."""
        return _engines(*args).strip()

    def down(self) -> None:
        for name in reversed(self.started):
            _engines("stop", name)
        self.started.clear()

    def flink_options(self) -> list[str]:
        return _engines("flink-options").split()


class FlinkRest:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")

    def _call(self, path: str, method: str = "GET", body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read()
        return json.loads(text) if text else {}

    def jobs(self) -> dict[str, str]:
        """{job id: state} of every job the cluster knows."""
        return {j["jid"]: j["state"] for j in self._call("/jobs/overview")["jobs"]}

    def wait_for_new_job(self, known: set[str], launcher: Launched, timeout_s: float = 180) -> str:
        """The id of a job not in `known` once it runs every task and completed a checkpoint
        (so its sources have started and a savepoint can be taken)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            launcher.check_alive()
            for jid, state in self.jobs().items():
                if jid in known or state != "RUNNING":
                    continue
                job = self._call(f"/jobs/{jid}")
                tasks_running = all(v["status"] == "RUNNING" for v in job["vertices"])
                checkpoints = self._call(f"/jobs/{jid}/checkpoints")["counts"]
                if tasks_running and checkpoints["completed"] > 0:
                    return jid
            time.sleep(1)
        raise TimeoutError(f"no new running job in {timeout_s} s; see {launcher.log}")

    def wait_for_checkpoint_after(self, jid: str, after_ms: int, timeout_s: float = 60) -> int:
        """Waits until a checkpoint of `jid` triggered after `after_ms` (epoch ms) completed,
        so it holds every state change made before then; returns its id."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            latest = self._call(f"/jobs/{jid}/checkpoints").get("latest", {}).get("completed")
            if latest and latest["trigger_timestamp"] > after_ms:
                return latest["id"]
            time.sleep(0.5)
        raise TimeoutError(f"no checkpoint of {jid} after {after_ms} in {timeout_s} s")

    def exceptions(self, jid: str) -> list[str]:
        history = self._call(f"/jobs/{jid}/exceptions").get("exceptionHistory", {})
        return [entry.get("stacktrace", "") for entry in history.get("entries", [])]

    def stop_with_savepoint(self, jid: str, directory: str, timeout_s: float = 120) -> str:
        """Stops `jid` with a savepoint into `directory`; returns the savepoint's path."""
        request = self._call(
            f"/jobs/{jid}/stop", "POST", {"drain": False, "targetDirectory": directory}
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self._call(f"/jobs/{jid}/savepoints/{request['request-id']}")
            if status["status"]["id"] == "COMPLETED":
                operation = status["operation"]
                if "location" not in operation:
                    raise RuntimeError(f"savepoint of {jid} failed: {operation}")
                return operation["location"]
            time.sleep(0.5)
        raise TimeoutError(f"savepoint of {jid} not done in {timeout_s} s")

    def cancel(self, jid: str) -> None:
        if self.jobs().get(jid) in {"RUNNING", "RESTARTING", "CREATED", "INITIALIZING"}:
            self._call(f"/jobs/{jid}?mode=cancel", "PATCH")

    def wait_for_state(self, jid: str, states: set[str], timeout_s: float = 60) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = self.jobs().get(jid)
            if state in states:
                return state
            time.sleep(0.5)
        raise TimeoutError(f"job {jid} not in {states} after {timeout_s} s")


class Launched:
    """A process started in its own session, its output in `log`; `stop` ends the whole
    process group: SIGTERM, then SIGKILL after `grace_s`."""

    def __init__(self, args: Sequence[str], log: Path) -> None:
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115 - closed in stop()
        # The child imports what this process imports, however its launcher (pip's venv,
        # Bazel's bootstrap) set up sys.path.
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
            "PYTHONUNBUFFERED": "1",
        }
        self.process = subprocess.Popen(
            list(args),
            stdout=self._out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    @classmethod
    def python(cls, module: str, args: Sequence[str], log: Path) -> Launched:
        return cls([sys.executable, "-m", module, *args], log)

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(
                f"{self.process.args[:3]} exited {self.process.returncode}:\n"
                f"{self.log.read_text(errors='replace')[-3000:]}"
            )

    def wait_for_output(self, text: str, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while text not in self.log.read_text(errors="replace"):
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {text!r} in {self.log} after {timeout_s} s")
            time.sleep(0.2)

    def wait(self, timeout_s: float) -> int:
        return self.process.wait(timeout_s)

    def stop(self, grace_s: float = 20) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self._out.close()
        return self.process.returncode
