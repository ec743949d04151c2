#!/usr/bin/env bash
# Create .venv and install trainledger with its test and torch extras.
# torch is pinned to the local CPU build by constraints.txt (pyproject keeps an open range).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev,torch]"
