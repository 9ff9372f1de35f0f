"""The real engines from tests: Kafka, the Java expansion service and workers, a Flink session
cluster with Beam's job server, all started by `tools/engines.sh` of a source checkout and
stopped by PID.

`Engines.up(names)` starts those that are not running and remembers which it started;
`down()` stops exactly those; `run(...)` is any other engines.sh command (a fault: a task or
job manager killed, the broker stopped and started on its data). `Launched` is a job
launcher (a Python process whose LOOPBACK workers run the job's Python stages) or any service
process, with its output in a log file and a stop that never leaves it behind. Flink's REST
API is beam_agents.flink's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["ROOT", "Engines", "Launched"]

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
