"""Beam's Prism runner, as this checkout builds it.

Prism is a Go program. Asked for `--runner=PrismRunner` without `--prism_location`, Beam
downloads a release of it from the internet, which fails offline (and behind most proxies)
with a hundred lines of traceback. `bash tools/engines.sh prism` builds it instead, once, from
the Go module proxy at the Beam version of requirements_lock.txt, into
`.cache/engines/prism-VERSION/prism` of the checkout. It needs Go (Beam 2.77's module asks for
Go 1.26; an older `go` fetches that toolchain through the proxy) and access to proxy.golang.org
or a GOPROXY. The first build compiles for about 3 CPU-minutes (measured: 2 min 38 s of CPU,
15 min of wall time on a busy 2-core machine, with the modules already downloaded), then
nothing. So
`with_local_prism` gives such options that Prism, or says in one line how to get it.

Beam keeps one Prism job server per process, made with the options of the first pipeline that
asks for one, and Beam's DirectRunner asks first for any batch pipeline it can hand to Prism:
without `--prism_location` it tries to download Prism, and offline it falls back to running
the pipeline itself, leaving behind a job server that downloads on every later Prism pipeline
of the process, whatever location those name. `pipeline` runs Prism pipelines on
`LocalPrismRunner` instead, whose job server is shared only among pipelines naming the same
Prism.
"""

from __future__ import annotations

from pathlib import Path

import apache_beam
from apache_beam.options.pipeline_options import (
    DebugOptions,
    PipelineOptions,
    PrismRunnerOptions,
    StandardOptions,
)
from apache_beam.runners.portability.job_server import StopOnExitJobServer
from apache_beam.runners.portability.prism_runner import PrismJobServer, PrismRunner
from apache_beam.utils.shared import Shared

from beam_agents.errors import PrismNotFoundError

__all__ = [
    "ENGINES",
    "HOW_TO_GET_PRISM",
    "LocalPrismRunner",
    "beam_version",
    "pipeline",
    "with_local_prism",
]

#: Where `tools/engines.sh` keeps what it builds: .cache/engines of the checkout.
ENGINES = Path(__file__).resolve().parents[2] / ".cache" / "engines"

HOW_TO_GET_PRISM = (
    "--runner=PrismRunner needs Prism: run `bash tools/engines.sh prism` in a beam_agents "
    "checkout (needs Go and the Go module proxy; several minutes, once) or pass "
    "--prism_location=PATH"
)


def beam_version() -> str:
    """The installed Apache Beam's version: the Prism that runs its pipelines."""
    return apache_beam.__version__


def with_local_prism(options: PipelineOptions) -> PipelineOptions:
    """`options`, with `--prism_location` set to the Prism `tools/engines.sh` built when they
    ask for the PrismRunner and name none. Raises PrismNotFoundError (HOW_TO_GET_PRISM) when
    there is none, or when the location they name is a path to no file; other runners, or a
    given location (a file, or a URL for Beam to fetch), pass unchanged."""
    if not _names_prism(options):
        return options
    prism = options.view_as(PrismRunnerOptions)
    given = prism.prism_location
    if given:
        # A URL is Beam's to fetch; a path that is no file would fail deep in the runner.
        if "://" not in given and not Path(given).expanduser().is_file():
            raise PrismNotFoundError(f"--prism_location={given} is not a file; {HOW_TO_GET_PRISM}")
        return options
    built = ENGINES / f"prism-{beam_version()}" / "prism"
    if not built.is_file():
        raise PrismNotFoundError(HOW_TO_GET_PRISM)
    prism.prism_location = str(built)
    return options


class LocalPrismRunner(PrismRunner):
    """Beam's PrismRunner, with a job server shared only among the pipelines that name the same
    `--prism_location` (Beam's own is the first one the process made, whatever it named)."""

    _job_servers = Shared()

    def default_job_server(self, options: PipelineOptions) -> StopOnExitJobServer:
        if options.view_as(DebugOptions).lookup_experiment("disable_prism_server_singleton"):
            return super().default_job_server(options)
        return self._job_servers.acquire(
            lambda: StopOnExitJobServer(PrismJobServer(options)),
            tag=options.view_as(PrismRunnerOptions).prism_location,
        )


def pipeline(options: PipelineOptions) -> apache_beam.Pipeline:
    """A pipeline on the runner `options` name, with `with_local_prism`'s Prism, on
    LocalPrismRunner when that is Prism (raises PrismNotFoundError as with_local_prism does)."""
    options = with_local_prism(options)
    runner = LocalPrismRunner() if _names_prism(options) else None
    return apache_beam.Pipeline(runner=runner, options=options)


def _names_prism(options: PipelineOptions) -> bool:
    # Every spelling Beam's create_runner takes for it: any case, with or without "Runner",
    # or the class's qualified name.
    runner = options.view_as(StandardOptions).runner or ""
    return runner.rsplit(".", 1)[-1].lower() in ("prism", "prismrunner")
