#!/usr/bin/env bash
# A change's cost, measured: the main benchmarks of docs/performance.md at REF (built in a worktree, imported through
# a linked view, as tests/integration/journal/test_sanitizers.py does) and at this checkout, alternately, ROUNDS
# rounds, on one machine, each run's wall, CPU and peak RSS beside its figures (GNU time), with the load average.
#   bash tools/bench_before_after.sh REF [ROUNDS]     e.g. bash tools/bench_before_after.sh 4579e57 2
set -euo pipefail
REF=${1:?usage: bench_before_after.sh REF [ROUNDS]}
ROUNDS=${2:-2}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=$HERE/.venv/bin/python
WORK=$(mktemp -d /tmp/tl-before-XXXX)
trap 'git -C "$HERE" worktree remove --force "$WORK/tree" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT
git -C "$HERE" worktree add -f "$WORK/tree" "$REF" -q
(cd "$WORK/tree" && "$PY" setup.py -q build_ext --inplace >/dev/null 2>&1)
mkdir -p "$WORK/view/trainledger"
for item in "$WORK"/tree/src/trainledger/*; do ln -s "$item" "$WORK/view/trainledger/"; done
for pkg in journal training ladder; do ln -s "$WORK/tree/$pkg" "$WORK/view/trainledger/$pkg"; done
run() {  # label tree pythonpath args...
  local label=$1 tree=$2 pp=$3; shift 3
  echo "### $label: $*   (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
  (cd "$tree" && PYTHONPATH=$pp /usr/bin/time -f "wall %e s, user %U s, sys %S s, peak RSS %M KB" "$PY" "$@" 2>&1) \
    | grep -E "trainledger|sustained|verify|replay|export|typed only|wall .* s, user" | head -40
}
echo "before: $REF ($(git -C "$HERE" log -1 --format=%h "$REF")); after: this checkout ($(git -C "$HERE" log -1 --format=%h)); $(nproc) CPUs"
for round in $(seq "$ROUNDS"); do
  for side in before after; do
    if [ $side = before ]; then tree=$WORK/tree; pp=$WORK/view; else tree=$HERE; pp=; fi
    run "$side r$round emitter" "$tree" "$pp" tools/bench_journal.py --skip-verify --steps 200000 --repeats 3 \
      --peer-steps 200 --mlflow-steps 1 --sustained 300000 --out "$WORK/$side-$round-e.json"
    run "$side r$round verify" "$tree" "$pp" tools/bench_journal.py --only-verify --verify-events 1000000 \
      --out "$WORK/$side-$round-v.json"
    run "$side r$round monitor" "$tree" "$pp" tools/bench_monitor.py --steps 100000 --tb-steps 100 \
      --replay-steps 300000 --repeats 3 --loop-steps 200
    run "$side r$round parquet" "$tree" "$pp" tools/bench_parquet.py --ranks 4 --steps 20000 --rounds 2
  done
done
