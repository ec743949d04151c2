#!/usr/bin/env bash
# Create .venv and install trainledger into it. torch is pinned to the local CPU build by constraints.txt
# (pyproject keeps an open range).
#   (no flag)  what the main job needs, `trainledger ladder`: the torch, report and scaling extras, and serve (the
#              dashboard the ladder ends by pointing at)
#   --dev      also the dev extra: pytest and the real frameworks, servers and tools the tests drive
#   --browser  --dev, and Debian's chromium for the browser tests and softhsm2 for the PKCS#11 tests (root or sudo)
# docs/bench/setup.txt has the time each takes, measured on a fresh clone.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
EXTRAS="torch,report,scaling,serve"
case "${1:-}" in
  "") ;;
  --dev) EXTRAS="dev,$EXTRAS" ;;
  --browser) EXTRAS="dev,$EXTRAS" ;;
  *) echo "setup.sh: unknown option ${1}; use --dev or --browser (or nothing, for the main job)" >&2; exit 2 ;;
esac
NEED=""
if [ "${1:-}" = "--browser" ]; then
  command -v chromium >/dev/null 2>&1 || NEED="$NEED chromium"
  command -v softhsm2-util >/dev/null 2>&1 || NEED="$NEED softhsm2"
  command -v openssl >/dev/null 2>&1 || NEED="$NEED openssl"  # 'openssl ts': the RFC 3161 authority of the tests
  # Go and its x/mod (sumdb/note, sumdb/tlog): the independent check of the team log's C2SP formats
  command -v go >/dev/null 2>&1 || NEED="$NEED golang-go"
  [ -d /usr/share/gocode/src/golang.org/x/mod/sumdb ] || NEED="$NEED golang-golang-x-mod-dev"
  # the PCI ID Repository's list: the accelerator variants' names are held to it
  [ -f /usr/share/misc/pci.ids ] || NEED="$NEED pci.ids"
fi
if [ -n "$NEED" ]; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup.sh: --browser needs root or sudo to install$NEED" >&2; exit 1; }
    SUDO=sudo
  fi
  echo "setup.sh: installing Debian's$NEED for the browser, PKCS#11, time-stamping, C2SP and PCI ID tests" >&2
  $SUDO apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $NEED >/dev/null
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[$EXTRAS]"
