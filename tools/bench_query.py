#!/usr/bin/env python3
"""query and replay on a 1,000,000-step journal, side by side with DuckDB's own read_json.

    .venv/bin/python tools/bench_query.py [--steps N]

Writes a journal of N steps through the health monitor, then times, each in a
fresh process (3 rounds, medians): DuckDB's read_json aggregate (loss mean,
max grad norm) over the file; sha256sum of the file (the floor under any
verification: every byte is hashed); `journal.query.connect` cold (verify +
load + views, no cache) plus the same aggregate; the same with verification
skipped; `build_cache` (what the background refresher does); the warm path
(the cached columnar copy); and `journal.replay.replay` end to end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHILD = {
    "duckdb read_json": (
        "import duckdb, time, sys; t = time.perf_counter(); "
        "r = duckdb.sql(\"SELECT avg(TRY_CAST(loss AS DOUBLE)), max(TRY_CAST(grad_norm AS DOUBLE)) FROM "
        "read_json('{p}', format='newline_delimited', columns={{'loss': 'VARCHAR', 'grad_norm': 'VARCHAR', 'kind': 'VARCHAR'}}) "
        "WHERE kind = 'step_observed'\").fetchall(); print(time.perf_counter() - t)"),
    "sha256sum (floor of verification)": (
        "import subprocess, time; t = time.perf_counter(); "
        "subprocess.run(['sha256sum', '{p}'], check=True, capture_output=True); print(time.perf_counter() - t)"),
    "trainledger query cold (verify + load + views)": (
        "import time; from trainledger.journal import load_public_key; from trainledger.journal.views.query import connect; "
        "t = time.perf_counter(); con = connect(['{p}'], keys=[load_public_key('{k}')], use_cache=False); "
        "r = con.execute('SELECT avg(loss), max(grad_norm) FROM steps').fetchall(); print(time.perf_counter() - t)"),
    "trainledger query cold --no-verify (load + views)": (
        "import time; from trainledger.journal.views.query import connect; "
        "t = time.perf_counter(); con = connect(['{p}'], verify_first=False); "
        "r = con.execute('SELECT avg(loss), max(grad_norm) FROM steps').fetchall(); print(time.perf_counter() - t)"),
    "build_cache (background, after a cold query)": (
        "import time; from trainledger.journal import load_public_key; from trainledger.journal.views.query import build_cache; "
        "t = time.perf_counter(); build_cache(['{p}'], keys=[load_public_key('{k}')]); print(time.perf_counter() - t)"),
    "trainledger query warm (cached columnar copy)": (
        "import time; from trainledger.journal import load_public_key; from trainledger.journal.views.query import open_views; "
        "t = time.perf_counter(); con, src = open_views(['{p}'], keys=[load_public_key('{k}')]); assert src.origin == 'cache'; "
        "r = con.execute('SELECT avg(loss), max(grad_norm) FROM steps').fetchall(); print(time.perf_counter() - t)"),
    "trainledger replay (end to end)": (
        "import time; from trainledger.journal import load_public_key; from trainledger.audit import replay; "
        "t = time.perf_counter(); rec = replay('{p}', keys=[load_public_key('{k}')]); assert rec.ok; "
        "print(time.perf_counter() - t)"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from trainledger.journal import Journal, Signer
    from trainledger.training.health.monitor import TrainingHealthMonitor

    tmp = Path(tempfile.mkdtemp(prefix="tl-q-"))
    p, k = tmp / "j.jsonl", tmp / "k.pub"
    s = Signer.generate()
    k.write_text(s.public.line() + "\n")
    rng = random.Random(0)
    with Journal.create(p, signer=s, background=False) as j:
        m = TrainingHealthMonitor(journal=j, peak_flops_per_sec=1e12)
        for i in range(args.steps):
            m.observe_step(i, 2.0 + 3.0 * (1 + i / 50) ** -0.5 + rng.gauss(0, 0.02),
                           grad_norm=0.8 + abs(rng.gauss(0, 0.05)), step_time_s=0.25, tokens=4096)
    env = dict(os.environ, TRAINLEDGER_CACHE_DIR=str(tmp / "cache"))
    runs: dict[str, list[float]] = {name: [] for name in CHILD}
    for _ in range(args.rounds):
        for name, code in CHILD.items():
            out = subprocess.run([sys.executable, "-c", code.format(p=p, k=k)], capture_output=True, text=True,
                                 check=True, env=env)
            runs[name].append(float(out.stdout.strip().splitlines()[-1]))
    results = {name: statistics.median(v) for name, v in runs.items()}
    peer = results["duckdb read_json"]
    print(f"{args.steps:,} steps, {p.stat().st_size / 1e6:.0f} MB; medians of {args.rounds} fresh processes each")
    for name, secs in results.items():
        print(f"  {name}: {secs:.3f} s  ({secs / peer:.2f}x read_json)")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
