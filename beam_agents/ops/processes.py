"""Child processes the demo and the engines tests start (a job launcher, whose LOOPBACK
workers run a job's Python stages, or a service such as the effector or the console): each in
its own session, its output in a log file, and a stop that never leaves one behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["Launched"]


class Launched:
    """A process started in its own session, its output in `log`; `stop` ends the whole
    process group: SIGTERM, then SIGKILL after `grace_s`."""

    def __init__(self, args: Sequence[str], log: Path, *, path_first: Sequence[Path] = ()) -> None:
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115 - closed in stop()
        # The child imports what this process imports, however its launcher (pip's venv,
        # Bazel's bootstrap) set up sys.path; `path_first` shadows it (another release's
        # source tree, as the upgrade test's older binary).
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([*map(str, path_first), *(p for p in sys.path if p)]),
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
    def python(
        cls, module: str, args: Sequence[str], log: Path, *, path_first: Sequence[Path] = ()
    ) -> Launched:
        # -P: `python -m` would put the working directory (this release's checkout, in the
        # tests) before `path_first`.
        safe_path = ["-P"] if path_first else []
        return cls([sys.executable, *safe_path, "-m", module, *args], log, path_first=path_first)

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
