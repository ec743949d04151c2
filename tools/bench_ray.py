#!/usr/bin/env python3
"""``verify RUN_DIR`` on Ray against one process, side by side in one run.

    .venv/bin/python tools/bench_ray.py [--ranks 8] [--steps 50000] [--rounds 3] [--out docs/bench/ray.txt]

Writes a signed run folder (``--ranks`` rank journals of ``--steps`` steps, anchored twice), then, round by round
and each in a fresh process: ``verify_run_dir`` with one worker process (``workers=1``), and
``verify_run_dir_ray`` on a local Ray started in that process with 1 and with 2 CPUs. Each process reports its
wall time and the CPU time of its whole process tree during the verification (itself and every process it started:
Ray's GCS, raylet and workers, read through psutil before they exit), and the medians are printed. Ray's start (a
few seconds of its own daemons) is timed apart and left out of the verification's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNNER = r"""
import json, os, sys, time
import psutil
mode, d, k = sys.argv[1], sys.argv[2], sys.argv[3]
from trainledger.journal import load_public_key
key = load_public_key(k)
me = psutil.Process()
seen = {}
def tree_cpu():
    for p in [me] + me.children(recursive=True):
        try:
            t = p.cpu_times()
            seen[p.pid] = t.user + t.system + getattr(t, "children_user", 0) + getattr(t, "children_system", 0)
        except psutil.Error:
            pass
    return sum(seen.values())
t0 = time.perf_counter(); c0 = tree_cpu()
start = 0.0
if mode == "one process":
    from trainledger.journal.audit.rundir import verify_run_dir
    rep = verify_run_dir(d, keys=[key], workers=1)
else:
    import ray
    ray.init(num_cpus=int(mode.split()[-2]), include_dashboard=False, log_to_driver=False, configure_logging=False)
    start = time.perf_counter() - t0
    c0 = tree_cpu()  # Ray's start is not the verification's
    from trainledger.journal.backends.ray import verify_run_dir_ray
    t1 = time.perf_counter()
    rep = verify_run_dir_ray(d, keys=[key])
    wall_verify = time.perf_counter() - t1
wall = time.perf_counter() - t0
cpu = tree_cpu() - c0
print(json.dumps({"wall": wall, "cpu": cpu, "start": start, "verify_wall": wall - start, "ranks": len(rep.ranks)}))
if mode != "one process":
    ray.shutdown()
"""


MODES = ("one process", "ray 1 cpus", "ray 2 cpus")


def measure_round(run: Path, key: Path, res: dict[str, list[dict]], env: dict | None = None) -> None:
    """One round: each mode in a fresh process, its figures appended to ``res[mode]``."""
    for m in MODES:
        out = subprocess.run([sys.executable, "-c", RUNNER, m, str(run), str(key)], capture_output=True, text=True,
                             env=env)
        if out.returncode != 0:
            raise SystemExit(f"{m}: exit {out.returncode}: {out.stderr[-1500:]}")
        res.setdefault(m, []).append(json.loads(out.stdout.strip().splitlines()[-1]))


def table(res: dict[str, list[dict]]) -> list[str]:
    """The medians, a line per mode under a header."""
    out = [f"  {'measure':24s} {'verify wall s':>14s} {'Ray start s':>12s} {'verify tree CPU s':>18s}"]
    for m, rs in res.items():
        med = {f: statistics.median(r[f] for r in rs) for f in ("verify_wall", "start", "cpu")}
        out.append(f"  {m:24s} {med['verify_wall']:14.2f} {med['start']:12.2f} {med['cpu']:18.2f}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", metavar="FILE")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_parquet import write_run

    lines = []

    def say(t=""):
        print(t, flush=True)
        lines.append(t)

    load0 = os.getloadavg()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        key = write_run(run, a.ranks, a.steps)
        size = sum(p.stat().st_size for p in run.glob("*.jsonl"))
        res: dict[str, list[dict]] = {m: [] for m in MODES}
        for _ in range(a.rounds):
            measure_round(run, key, res)
    say(f"tools/bench_ray.py --ranks {a.ranks} --steps {a.steps} --rounds {a.rounds}: "
        f"{time.perf_counter() - t_start:.0f} s; {os.cpu_count()} CPUs; load average "
        f"{' '.join(f'{x:.2f}' for x in load0)} before, {' '.join(f'{x:.2f}' for x in os.getloadavg())} after; "
        f"medians of {a.rounds} fresh processes each")
    say(f"{a.ranks} rank journals, {size / 2**20:,.0f} MiB")
    for line in table(res):
        say(line)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
