#!/usr/bin/env bash
# One entry point for the pip path (no Bazel): sets everything up on a fresh machine that has
# only Python 3.11, pip and npm, then runs what was asked.
#
#   bash tools/dev.sh run ARGS...   set up, then run the beam-agents command with ARGS
#   bash tools/dev.sh test [ARGS]   set up, then run the whole pytest suite (ARGS go to pytest),
#                                   one worker per core (pytest-xdist), a test module per worker;
#                                   the engines and browser tiers one test at a time
#   bash tools/dev.sh lint          set up, then ruff, buildifier, buf lint, breaking-change gate
#   bash tools/dev.sh docs          set up, then build the user guide (mkdocs --strict, .cache/site)
#   bash tools/dev.sh mutation [ARGS]  set up, then mutation-test ARGS (default: runtime/,
#                                   intents/, state/; see tools/mutation.py's docstring)
#   bash tools/dev.sh setup         set up only
#
# Set-up is idempotent and cheap when nothing changed: .venv/ is rebuilt from the hashed
# requirements_lock.txt only when the lock changes, node_modules/ from package-lock.json likewise.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
python="${PYTHON:-python3}"

setup_python() {
  local stamp="$venv/.lock-sha256" want
  want="$(sha256sum requirements_lock.txt pyproject.toml setup.py | sha256sum | cut -d' ' -f1)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return
  fi
  if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "tools/dev.sh: needs Python 3.11 (set PYTHON=/path/to/python3.11)" >&2
    exit 2
  fi
  rm -rf "$venv"
  "$python" -m venv "$venv"
  # --no-deps: the lock is uv's whole closure, so pip has nothing to resolve. Resolving anyway
  # lets pip 23's extras handling pick a newer release than the lock's pin (google-genai asks
  # for google-auth[requests]) and refuse it as unhashed; `pip check` proves the closure instead.
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-deps --require-hashes -r requirements_lock.txt
  "$venv/bin/python" -m pip check --disable-pip-version-check >&2
  # The lock already holds setuptools and wheel, so the build backend is hash-checked too.
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --no-deps --no-build-isolation -e .
  echo "$want" >"$stamp"
}

setup_node() {
  local stamp="node_modules/.lock-sha256" want
  want="$(sha256sum package-lock.json | cut -d' ' -f1)"
  if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    return
  fi
  npm ci --no-audit --no-fund --silent
  echo "$want" >"$stamp"
}

lint() {
  "$venv/bin/ruff" check .
  "$venv/bin/ruff" format --check .
  # The Bazel files git knows of (tracked or new, not ignored): a walk of the tree would enter
  # .cache/, where a running Flink creates and deletes its blobs under buildifier's feet.
  git ls-files -z --cached --others --exclude-standard -- \
    'MODULE.bazel' 'BUILD.bazel' '*/BUILD.bazel' '*.bzl' |
    xargs -0 node_modules/.bin/buildifier -mode=check -lint=warn
  "$venv/bin/buf" lint
  "$venv/bin/python" tools/check_breaking.py
  echo "lint: ruff, buildifier, buf lint and the breaking-change gate are clean"
}

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  setup) setup_python; setup_node ;;
  run) setup_python; exec "$venv/bin/beam-agents" "$@" ;;
  test)
    setup_python
    setup_node
    # A module's tests stay on one worker (--dist loadscope): some share a module fixture and
    # run in order. The engines and browser tests share one Kafka, Flink and browser, and wait
    # on them rather than on the CPU, so they run one at a time. A later -n in ARGS wins.
    workers=(-n auto --dist loadscope)
    [[ " $* " == *engines* || " $* " == *browser* ]] && workers=()
    exec "$venv/bin/python" -m pytest "${workers[@]}" "$@"
    ;;
  lint) setup_python; setup_node; lint ;;
  # A broken link, a page missing from the nav or an API reference to a name that no longer
  # exists fails the build (mkdocs.yml: strict); tools/docs_test.py runs the pages' code.
  # Not --quiet: it drops the warnings before strict mode counts them, and the build passes.
  docs) setup_python; NO_MKDOCS_2_WARNING=1 exec "$venv/bin/mkdocs" build --strict ;;
  mutation)
    setup_python
    [[ $# -gt 0 ]] || set -- beam_agents/runtime beam_agents/intents beam_agents/state
    PYTHONPATH="$root:$root/migrations${PYTHONPATH:+:$PYTHONPATH}" \
      exec "$venv/bin/python" tools/mutation.py "$@"
    ;;
  *)
    sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
