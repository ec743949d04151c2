#!/usr/bin/env python3
"""The Parquet export measured: its rate, its re-verification, and an audit query over it against ``trainledger
query`` over the journals, side by side in one run.

    .venv/bin/python tools/bench_parquet.py [--ranks 8] [--steps 50000] [--rounds 3] [--out docs/bench/parquet.txt]

Writes a signed run folder of ``--ranks`` rank journals of ``--steps`` steps each through the health monitor (seals
every 1,000 events), then runs each measure as a whole process under ``/usr/bin/time`` (CPU = user + sys of the
process and its children; peak RSS the largest of them), alternating the measures round by round, and prints the
medians:

- ``verify RUN_DIR``: the folder checked whole (the floor any export pays).
- ``export parquet --lines``: one verifying pass per journal, every table written as it goes; events per
  CPU-second. ``typed only``: the same without the lines.
- ``verify OUT``: the export re-verified from its lines, every typed cell held to them.
- ``query (JSONL, cold)``: the audit SQL through ``trainledger query`` over the journals, no cache: journals this
  large are read through the Parquet form (a private streaming export, then DuckDB over it). ``in memory``: the
  same through ``query.connect``, which loads every line into DuckDB's memory (the command's load before, and
  the API's still). ``cached``: the command again once the cache refresher's copy exists (built untimed, from
  the Parquet form).
- ``duckdb over the export``: the same SQL by DuckDB over the exported Parquet (``read_parquet``, one thread).
- ``query over the export``: the same SQL through ``trainledger query OUT`` (the export copied, re-verified from its
  lines, then read in place), again (the listing remembered as verified: the copy's files checked against it),
  and with ``--no-verify`` (copied, not checked: labelled so).

``--ray`` adds ``tools/bench_ray.py``'s measures to the same run, on the same folder: ``verify RUN_DIR`` with one
worker process against ``--ray`` on a local Ray of 1 and of 2 CPUs (the whole process tree's CPU, Ray's start
timed apart).

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
#: the in-memory load (query.connect, no cold load): argv key, SQL
MEM = ("import sys; from trainledger.journal import load_public_key; from trainledger.journal.views.query import connect; "
       "print(connect([sys.argv[1]], use_cache=False, keys=[load_public_key(sys.argv[2])]).execute(sys.argv[3])"
       ".fetchall())")
#: the cache refresher's copy, from the Parquet form (what a cold query starts in the background)
BUILD = ("import sys; from trainledger.journal import load_public_key; from trainledger.journal.views.query import "
         "build_cache; from trainledger.journal.views.parquet.journals import load_journals; "
         "build_cache([sys.argv[1]], cold=load_journals, keys=[load_public_key(sys.argv[2])])")
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
    ap.add_argument("--ray", action="store_true", help="also verify on a local Ray of 1 and 2 CPUs (bench_ray.py)")
    a = ap.parse_args()
    lines = []
    ray_res: dict[str, list[dict]] = {}

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
            import shutil

            typed = tmp / f"typed{rnd}"
            results.setdefault("  typed only", []).append(
                timed([TL, "export", "parquet", str(run), str(typed), "--pubkey", str(key), "--json"], env))
            shutil.rmtree(typed)

            events = _j.loads(r["stdout"])["events"]
            parquet = sum(p.stat().st_size for p in ex.rglob("*.parquet"))
            for name, cmd in (("verify RUN_DIR", [TL, "verify", str(run), "--pubkey", str(key)]),
                              ("verify OUT", [TL, "verify", str(ex), "--pubkey", str(key)]),
                              ("query (JSONL, cold)", [TL, "query", str(run), AUDIT, "--pubkey", str(key),
                                                       "--format", "csv", "--no-cache"]),
                              ("  in memory (query.connect)", [PY, "-c", MEM, str(run), str(key), AUDIT]),
                              ("  cached", [TL, "query", str(run), AUDIT, "--pubkey", str(key), "--format", "csv"]),
                              ("duckdb over the export", [PY, "-c", dk, str(ex), AUDIT]),
                              ("query over the export", [TL, "query", str(ex), AUDIT, "--pubkey", str(key),
                                                         "--format", "csv"]),
                              ("  again (verified before)", [TL, "query", str(ex), AUDIT, "--pubkey", str(key),
                                                             "--format", "csv"]),
                              ("  the same, --no-verify", [TL, "query", str(ex), AUDIT, "--no-verify",
                                                           "--format", "csv"])):
                if name == "  cached":  # the refresher's copy, built untimed
                    subprocess.run([PY, "-c", BUILD, str(run), str(key)], check=True, env=env)
                if name == "query over the export":  # cold: nothing remembers this listing verified
                    for memo in (tmp / "cache").glob("x-*.verified"):
                        memo.unlink()
                results.setdefault(name, []).append(timed(cmd, env))
            if a.ray:
                sys.path.insert(0, str(Path(__file__).resolve().parent))
                from bench_ray import measure_round

                measure_round(run, key, ray_res, env)
            if rnd < a.rounds - 1:
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
        say(f"  typed only: {events / med['  typed only']['cpu']:,.0f} events per CPU-second "
            f"({med['  typed only']['cpu'] / med['verify RUN_DIR']['cpu']:.1f}x verify's CPU)")
        dk_cpu = med["duckdb over the export"]["cpu"]
        for k in ("query (JSONL, cold)", "  in memory (query.connect)", "  cached", "query over the export",
                  "  again (verified before)"):
            say(f"  the audit SQL, {k.strip()}: {med[k]['cpu']:.2f} s CPU, {med[k]['cpu'] / dk_cpu:.1f}x DuckDB over "
                f"the export; peak RSS {med[k]['rss']:.0f} MiB against DuckDB's {med['duckdb over the export']['rss']:.0f}")
        if ray_res:
            say(f"  verify RUN_DIR on Ray (bench_ray.py's measure, same folder, medians of {a.rounds}):")
            from bench_ray import table

            for line in table(ray_res):
                say(line)
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
