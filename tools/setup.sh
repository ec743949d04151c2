#!/usr/bin/env bash
# Create .venv and install trainledger into it. torch is pinned to the local CPU build by constraints.txt
# (pyproject keeps an open range).
#   (no flag)  what the main job needs, `trainledger ladder`: the torch, report and scaling extras
#   --dev      also the dev extra: pytest and the real frameworks, servers and tools the tests drive
#   --browser  --dev, and Debian's chromium for the browser tests (needs root or sudo)
# docs/bench/setup.txt has the time each takes, measured on a fresh clone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
EXTRAS="torch,report,scaling"
case "${1:-}" in
  "") ;;
  --dev) EXTRAS="dev,$EXTRAS" ;;
  --browser) EXTRAS="dev,$EXTRAS" ;;
  *) echo "setup.sh: unknown option ${1}; use --dev or --browser (or nothing, for the main job)" >&2; exit 2 ;;
esac
if [ "${1:-}" = "--browser" ] && ! command -v chromium >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup.sh: --browser needs root or sudo to install chromium" >&2; exit 1; }
    SUDO=sudo
  fi
  echo "setup.sh: installing Debian's chromium for the browser test" >&2
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[$EXTRAS]"
