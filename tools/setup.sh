#!/usr/bin/env bash
# Create .venv and install trainledger with its test, torch and report extras.
# torch is pinned to the local CPU build by constraints.txt (pyproject keeps an open range).
#   --browser  also install Debian's chromium (the report's browser test drives it); needs root or sudo.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
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
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev,torch,report]"
