#!/usr/bin/env python3
"""The Parquet export measured: its rate, its re-verification, and an audit query over it against ``trainledger
query`` over the journals, side by side in one run.

    .venv/bin/python tools/bench_parquet.py [--ranks 8] [--steps 50000] [--rounds 3] [--out docs/bench/parquet.txt]

Writes a signed run folder of ``--ranks`` rank journals of ``--steps`` steps each through the health monitor (seals
every 1,000 events), then runs each measure as a whole process under ``/usr/bin/time`` (CPU = user + sys of the
process and its children; peak RSS the largest of them), alternating the measures round by round, and prints the
medians:

- ``verify RUN_DIR``: the folder checked whole (the floor any export pays).
- ``export parquet --lines``: verify, load and write every table; events per CPU-second.
- ``verify OUT``: the export re-verified from its lines, every typed cell held to them.
- ``query``: the audit SQL through ``trainledger query`` over the journals (verify + load, no cache).
- ``duckdb over the export``: the same SQL by DuckDB over the exported Parquet (``read_parquet``, one thread).
- ``query over the export``: the same SQL through ``trainledger query OUT`` (the export copied, re-verified from its
  lines, then read in place), again (the listing remembered as verified: the copy's files checked against it),
  and with ``--no-verify`` (copied, not checked: labelled so).

The load average before and after is printed; the machine is shared, so read CPU time first.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

AUDIT = ("SELECT rank, count(*) AS steps, avg(loss) AS loss, max(grad_norm) AS gmax, sum(tokens) AS tokens "
         "FROM steps GROUP BY rank ORDER BY rank")
PY = str(Path(sys.executable))
TL = str(Path(sys.executable).with_name("trainledger"))


def write_run(d: Path, ranks: int, steps: int):
    from trainledger.journal import Signer
    from trainledger.training.distributed.ranks import RankInfo, open_rank_journal
    from trainledger.training.health.monitor import TrainingHealthMonitor

    s = Signer.generate()
    for r in range(ranks):
        rng = random.Random(r)
        j = open_rank_journal(d, s, info=RankInfo(run="bench", rank=r, world_size=ranks, local_rank=0, node="n0",
                                                  restart_count=0))
        m = TrainingHealthMonitor(journal=j, peak_flops_per_sec=1e12)
        for i in range(steps):
            m.observe_step(i, 2.0 + 3.0 * (1 + i / 50) ** -0.5 + rng.gauss(0, 0.02),
                           grad_norm=0.8 + abs(rng.gauss(0, 0.05)), step_time_s=0.25, tokens=4096)
        j.close()
    k = d.parent / "bench.pub"
    k.write_text(s.public.line() + "\n")
    return k


def timed(cmd: list[str], env: dict) -> dict:
    out = subprocess.run(["/usr/bin/time", "-f", "TIME %U %S %e %M", *cmd], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {out.returncode}: {out.stderr[-1500:]}")
    u, s, e, m = out.stderr.strip().splitlines()[-1].split()[1:]
    return {"cpu": float(u) + float(s), "wall": float(e), "rss": int(m) / 1024, "stdout": out.stdout}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", metavar="FILE")
    a = ap.parse_args()
    lines = []

    def say(t=""):
        print(t, flush=True)
        lines.append(t)

    load0 = os.getloadavg()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run = tmp / "run"
        t = time.perf_counter()
        key = write_run(run, a.ranks, a.steps)
        t_write = time.perf_counter() - t
        size = sum(p.stat().st_size for p in run.glob("*.jsonl"))
        events = None
        env = dict(os.environ, TRAINLEDGER_CACHE_DIR=str(tmp / "cache"), OPENBLAS_NUM_THREADS="1")
        dk = ("import duckdb,sys; c=duckdb.connect(); c.execute('SET threads=1'); "
              "print(c.execute(sys.argv[2].replace('FROM steps', \"FROM read_parquet('\" + sys.argv[1] + "
              "\"/steps/**/*.parquet')\")).fetchall())")
        results: dict[str, list[dict]] = {}
        for rnd in range(a.rounds):
            ex = tmp / f"ex{rnd}"
            r = timed([TL, "export", "parquet", str(run), str(ex), "--lines", "--pubkey", str(key), "--json"], env)
            results.setdefault("export parquet --lines", []).append(r)
            import json as _j

            events = _j.loads(r["stdout"])["events"]
            parquet = sum(p.stat().st_size for p in ex.rglob("*.parquet"))
            for name, cmd in (("verify RUN_DIR", [TL, "verify", str(run), "--pubkey", str(key)]),
                              ("verify OUT", [TL, "verify", str(ex), "--pubkey", str(key)]),
                              ("query (JSONL, cold)", [TL, "query", str(run), AUDIT, "--pubkey", str(key),
                                                       "--format", "csv", "--no-cache"]),
                              ("duckdb over the export", [PY, "-c", dk, str(ex), AUDIT]),
                              ("query over the export", [TL, "query", str(ex), AUDIT, "--pubkey", str(key),
                                                         "--format", "csv"]),
                              ("  again (verified before)", [TL, "query", str(ex), AUDIT, "--pubkey", str(key),
                                                             "--format", "csv"]),
                              ("  the same, --no-verify", [TL, "query", str(ex), AUDIT, "--no-verify",
                                                           "--format", "csv"])):
                if name == "query over the export":  # cold: nothing remembers this listing verified
                    for memo in (tmp / "cache").glob("x-*.verified"):
                        memo.unlink()
                results.setdefault(name, []).append(timed(cmd, env))
            if rnd < a.rounds - 1:
                import shutil

                shutil.rmtree(ex)
        say(f"tools/bench_parquet.py --ranks {a.ranks} --steps {a.steps} --rounds {a.rounds}: "
            f"{time.perf_counter() - t_start:.0f} s; {os.cpu_count()} CPUs; load average "
            f"{' '.join(f'{x:.2f}' for x in load0)} before, {' '.join(f'{x:.2f}' for x in os.getloadavg())} after; "
            f"medians of {a.rounds} whole processes each")
        say(f"{a.ranks} rank journals, {events:,} events, {size / 2**20:,.0f} MiB of JSON lines (written in "
            f"{t_write:.0f} s before the measures); the export {parquet / 2**20:,.0f} MiB of Parquet")
        say(f"  {'measure':28s} {'CPU s':>8s} {'wall s':>8s} {'peak RSS MiB':>13s}")
        med = {k: {f: statistics.median(x[f] for x in v) for f in ("cpu", "wall", "rss")} for k, v in results.items()}
        for k, m in med.items():
            say(f"  {k:28s} {m['cpu']:8.2f} {m['wall']:8.2f} {m['rss']:13.0f}")
        ex_cpu = med["export parquet --lines"]["cpu"]
        say(f"  export: {events / ex_cpu:,.0f} events per CPU-second ({ex_cpu / med['verify RUN_DIR']['cpu']:.1f}x "
            f"verify's CPU)")
        say(f"  the audit SQL: query over the journals {med['query (JSONL, cold)']['cpu']:.2f} s CPU, DuckDB over the "
            f"export {med['duckdb over the export']['cpu']:.2f} s "
            f"({med['query (JSONL, cold)']['cpu'] / med['duckdb over the export']['cpu']:.0f}x)")
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
