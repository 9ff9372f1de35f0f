#!/usr/bin/env bash
# Installs what the console's browser tests drive: Debian's chromium and its chromedriver, from
# the distribution's own packages (no browser download of its own). Idempotent: a machine that
# has both is left alone. Prints the paths of the two binaries.
set -euo pipefail

if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
  sudo=""
  [[ "$(id -u)" == 0 ]] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    chromium chromium-driver >/dev/null
fi
echo "CHROMIUM=$(command -v chromium)"
echo "CHROMEDRIVER=$(command -v chromedriver)"
