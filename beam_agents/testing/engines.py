"""The real engines from tests: Kafka, the Java expansion service and workers, a Flink session
cluster with Beam's job server, all started by `tools/engines.sh` of a source checkout and
stopped by PID.

`Engines.up(names)` starts those that are not running and remembers which it started;
`down()` stops exactly those; `run(...)` is any other engines.sh command (a fault: a task or
job manager killed, the broker stopped and started on its data). Processes the tests start
are beam_agents.ops.processes.Launched; Flink's REST API is beam_agents.bus.flink's.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

__all__ = ["ROOT", "Engines", "overridden"]

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

    def flink_options(self, overrides: Sequence[str] = ()) -> list[str]:
        """The pipeline options that run a job on the Flink cluster, `overridden`."""
        return overridden(_engines("flink-options").split(), overrides)


def overridden(options: Sequence[str], overrides: Sequence[str]) -> list[str]:
    """`options`, then `overrides`: an option named in both (`--NAME=VALUE`) takes the value
    in `overrides`, whatever each parser would do with the name given twice."""
    named = {o.split("=", 1)[0] for o in overrides}
    return [*(o for o in options if o.split("=", 1)[0] not in named), *overrides]
