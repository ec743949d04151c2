#!/usr/bin/env python3
"""query and replay on a 1,000,000-step journal, side by side with DuckDB's own read_json.

    .venv/bin/python tools/bench_query.py [--steps N]

Writes a journal of N steps through the health monitor, then times, each in a
fresh process: DuckDB's read_json aggregate (loss mean, max grad norm) over
the file; `journal.query.connect` (verify + load + views) plus the same
aggregate; and `journal.replay.replay` end to end (verification included).
"""

from __future__ import annotations

import argparse
import json
import random
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
    "trainledger query (verify + load + views)": (
        "import time; from journal import load_public_key; from journal.query import connect; "
        "t = time.perf_counter(); con = connect(['{p}'], keys=[load_public_key('{k}')]); "
        "r = con.execute('SELECT avg(loss), max(grad_norm) FROM steps').fetchall(); print(time.perf_counter() - t)"),
    "trainledger replay (end to end)": (
        "import time; from journal import load_public_key; from journal.replay import replay; "
        "t = time.perf_counter(); rec = replay('{p}', keys=[load_public_key('{k}')]); assert rec.ok; "
        "print(time.perf_counter() - t)"),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1_000_000)
    args = ap.parse_args()
    from journal import Journal, Signer
    from training.monitor import TrainingHealthMonitor

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
    results = {}
    for name, code in CHILD.items():
        out = subprocess.run([sys.executable, "-c", code.format(p=p, k=k)], capture_output=True, text=True, check=True)
        results[name] = float(out.stdout.strip().splitlines()[-1])
    print(f"{args.steps:,} steps, {p.stat().st_size / 1e6:.0f} MB")
    for name, secs in results.items():
        print(f"  {name}: {secs:.2f} s")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
