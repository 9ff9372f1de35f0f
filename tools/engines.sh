#!/usr/bin/env bash
# The real engines beam_agents runs on, fetched from the registries and cached under
# .cache/engines/ (re-running is cheap: a cached engine is reused).
#
#   bash tools/engines.sh prism           build Beam's Prism runner, print its path
#   bash tools/engines.sh prism-options   the pipeline options that run a pipeline on it
#
# Prism is github.com/apache/beam/sdks/v2/go/cmd/prism at the Beam version of
# requirements_lock.txt, built from the Go module proxy; `go install` checks every module
# against the Go checksum database. Pipelines start and stop it themselves (PrismRunner with
# --prism_location), so no process is left behind.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="$root/.cache/engines"
beam_version="$(sed -n 's/^apache-beam==\([0-9.]*\).*/\1/p' "$root/requirements_lock.txt")"

prism() {
  local home="$cache/prism-$beam_version"
  if [[ ! -x "$home/prism" ]]; then
    mkdir -p "$home"
    echo "tools/engines.sh: building Prism $beam_version (about a minute, once)" >&2
    GOBIN="$home" GOFLAGS=-mod=mod \
      go install "github.com/apache/beam/sdks/v2/go/cmd/prism@v$beam_version" >&2
  fi
  echo "$home/prism"
}

case "${1:-}" in
  prism) prism ;;
  prism-options)
    echo "--runner=PrismRunner --prism_location=$(prism) --environment_type=LOOPBACK" ;;
  *) sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
