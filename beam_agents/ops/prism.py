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
"""

from __future__ import annotations

from pathlib import Path

import apache_beam
from apache_beam.options.pipeline_options import (
    PipelineOptions,
    PrismRunnerOptions,
    StandardOptions,
)

from beam_agents.errors import PrismNotFoundError

__all__ = ["ENGINES", "HOW_TO_GET_PRISM", "beam_version", "with_local_prism"]

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
    runner = options.view_as(StandardOptions).runner or ""
    prism = options.view_as(PrismRunnerOptions)
    # Every spelling Beam's create_runner takes for it: any case, with or without "Runner",
    # or the class's qualified name.
    if runner.rsplit(".", 1)[-1].lower() not in ("prism", "prismrunner"):
        return options
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
