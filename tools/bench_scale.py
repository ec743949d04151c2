#!/usr/bin/env python3
"""Costs as a run grows: replay, cold query, verify and the live monitor at 1e5, 1e6 and 1e7
steps, each beside its peer in the same run.

    .venv/bin/python tools/bench_scale.py [--sizes 1e5,1e6,1e7] [--rounds 3] [--out docs/bench/scale.txt]
    .venv/bin/python tools/bench_scale.py --compare ../before --only verify,replay   # an A/B against another commit

For each size one signed journal is written through the health monitor (the training loop's own calls: a step's
loss, grad norm, step time and tokens, seals every 1,000 events), then every measure runs as a whole fresh process,
the measures alternated round by round (so the machine's load falls on all of them alike), and the medians are
printed. Each process reports its wall time, its CPU time (user + sys of the process and every child it waited for:
verify's workers, sha256sum), its peak RSS (the larger of its own high-water mark and its largest child's) and the
bytes it wrote (``/proc/self/io`` ``wchar``, the process itself; the workers write nothing but pipes).

- ``replay``: ``trainledger.audit.replay`` end to end, against DuckDB ``read_ndjson`` of the same file (an
  aggregate over the step lines: DuckDB parses every line, as replay must).
- ``query cold``: ``trainledger.journal.views.query.connect`` (verify + load + views, no cache) and one aggregate, against
  the same DuckDB aggregate.
- ``verify``: ``verify(workers=1)`` (one core), CPU per line, against ``sha256sum`` of the file per line.
- ``verify_out``: ``verify OUT`` of the journal's ``export parquet --lines``, against ``verify`` of the journal (the
  target) and ``duckdb_read_export``: DuckDB reading every cell of every file of that export (verify + that: the
  floor, since the check must verify the lines and read every cell it holds to them).
- ``query_out``: ``trainledger query OUT`` of that export once a first one has verified it whole (the listing
  remembered: the export copied, its files held to the listing, then read), against ``duckdb_export``: DuckDB's
  same aggregate over the export's steps files in place.
- ``export``: ``trainledger export parquet --lines``, against ``duckdb_copy``: DuckDB's ``COPY (SELECT ... FROM
  read_ndjson(...)) TO ... (FORMAT parquet)`` of the same file (the issue's peer: no lines, snappy), and
  ``duckdb_copy_lines``: the same with each line's text beside its fields and zstd, as the export writes them.
- ``monitor``: a process that drives ``TrainingHealthMonitor.observe_step`` for the size's steps into a journal;
  how much its resident memory grew from the first step to the last (after a collection), per step.

The load average before and after is printed; the machine is shared, so read CPU time first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNNER = r"""
import json, os, re, resource, sys, time
mode, p, k, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def query_command(target, *flags):
    # `trainledger query TARGET` (in this process) of the steps aggregate every query measure runs: its row count
    import contextlib, io
    from trainledger.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["query", target, "--pubkey", k, *flags, "--format", "csv",
                     "SELECT count(*), avg(loss), max(grad_norm) FROM steps"]) == 0
    return int(out.getvalue().splitlines()[1].split(",")[0])

t0 = time.perf_counter()
extra = {}
if mode == "duckdb":
    import duckdb
    con = duckdb.connect()
    con.execute("SET threads = 1")
    con.execute("SET enable_progress_bar = false")  # it draws on stdout after two seconds
    extra["rows"] = con.execute(
        "SELECT count(*), avg(loss), max(grad_norm) FROM read_ndjson(?, columns={'kind': 'VARCHAR', 'loss': 'DOUBLE', "
        "'grad_norm': 'DOUBLE', 'step': 'BIGINT'}) WHERE kind = 'step_observed'", [p]).fetchall()[0][0]
elif mode == "replay":
    from trainledger.audit import replay
    from trainledger.journal import load_public_key
    rec = replay(p, keys=[load_public_key(k)])
    assert rec.ok, rec.differences[:3]
    extra["rows"] = rec.health["steps"]
elif mode == "query":
    from trainledger.journal import load_public_key
    from trainledger.journal.views.query import connect
    con = connect([p], keys=[load_public_key(k)], use_cache=False)
    extra["rows"] = con.execute("SELECT count(*), avg(loss), max(grad_norm) FROM steps").fetchall()[0][0]
elif mode == "verify":
    from trainledger.journal import load_public_key, verify
    extra["rows"] = verify(p, keys=[load_public_key(k)], workers=1).events
elif mode == "sha256sum":
    import subprocess
    subprocess.run(["sha256sum", p], check=True, capture_output=True)
elif mode == "openssl":
    import subprocess
    subprocess.run(["openssl", "dgst", "-sha256", p], check=True, capture_output=True)
elif mode == "query_cold":
    # the command over the journal read cold (verified, through the Parquet form), its load not kept
    extra["rows"] = query_command(p, "--no-cache")
elif mode == "query_warm":
    # the command, right after a cold one over the same journal (run() ran that one first, unmeasured)
    extra["rows"] = query_command(p)
elif mode == "duckdb_parquet":
    # the peer of a repeat query: DuckDB over a Parquet copy of the same steps (run() made it, unmeasured)
    import duckdb
    con = duckdb.connect()
    con.execute("SET threads = 1")
    extra["rows"] = con.execute("SELECT count(*), avg(loss), max(grad_norm) FROM read_parquet(?)",
                                [p[:-len(".jsonl")] + ".steps.parquet"]).fetchall()[0][0]
elif mode == "query_out":
    # query OUT of the journal's export parquet --lines, its listing remembered as verified (run() made the export and
    # ran one query OUT over it first, unmeasured): copied, its files checked against the listing, then read
    extra["rows"] = query_command(p[:-len(".jsonl")] + ".export")
elif mode == "duckdb_export":
    # the peer of query_out: DuckDB over the same export's steps files, in place
    import duckdb
    con = duckdb.connect()
    con.execute("SET threads = 1")
    extra["rows"] = con.execute("SELECT count(*), avg(loss), max(grad_norm) FROM read_parquet(?)",
                                [p[:-len(".jsonl")] + ".export/steps/*/*.parquet"]).fetchall()[0][0]
elif mode == "verify_out":
    # verify of the journal's export parquet --lines (run() made it, unmeasured)
    from trainledger.journal import load_public_key
    from trainledger.journal.views.parquet.check import verify_export
    extra["rows"] = verify_export(p[:-len(".jsonl")] + ".export", keys=[load_public_key(k)]).events
elif mode == "duckdb_read_export":
    # the floor beside verify OUT: DuckDB (one thread) reading every cell of every file of the same export, as Arrow
    # batches (what verify OUT must read of it besides verifying the lines)
    import duckdb, glob
    con = duckdb.connect()
    con.execute("SET threads = 1")
    rows = 0
    for f in sorted(glob.glob(p[:-len(".jsonl")] + ".export/*/*/*.parquet")):
        for b in con.sql(f"SELECT * FROM read_parquet('{f}')").to_arrow_reader(65536):
            rows += b.num_rows
    extra["rows"] = rows
elif mode == "export":
    # export parquet --lines of the journal (a new folder each round, removed by run())
    from trainledger.cli import main
    out = p[:-len(".jsonl")] + ".export-bench"
    assert main(["export", "parquet", p, out, "--lines", "--pubkey", k, "--no-progress"]) == 0
    extra["rows"] = n
elif mode in ("duckdb_copy", "duckdb_copy_lines"):
    # the peer of export: DuckDB writing the step lines' columns to Parquet from read_ndjson (the issue's peer: no
    # lines, snappy); _lines: the peer doing what the export does, each line's exact text beside them, zstd (DuckDB
    # reads the lines a second time as one-column CSV, joined by position)
    import duckdb
    con = duckdb.connect()
    con.execute("SET threads = 1")
    con.execute("SET enable_progress_bar = false")
    src = (f"read_ndjson('{p}', columns={{'kind': 'VARCHAR', 'step': 'BIGINT', 'loss': 'DOUBLE', 'grad_norm': "
           "'DOUBLE', 'step_time_s': 'DOUBLE', 'tokens': 'BIGINT', 'seq': 'BIGINT', 'ts': 'BIGINT', 'h': 'VARCHAR'})")
    opts = "FORMAT parquet"
    if mode == "duckdb_copy_lines":
        src += (f" POSITIONAL JOIN read_csv('{p}', columns={{'line': 'VARCHAR'}}, delim='\\x01', quote='', escape='', "
                "header=false, auto_detect=false)")
        opts += ", COMPRESSION zstd"
    con.execute(f"COPY (SELECT * FROM {src}) TO '{p[:-len('.jsonl')]}.copy-bench.parquet' ({opts})")
    extra["rows"] = n
elif mode == "monitor":
    import gc
    from trainledger.journal import Journal, Signer
    from trainledger.training.health.monitor import TrainingHealthMonitor
    import random
    def rss():
        gc.collect()
        return int(re.search(r"VmRSS:\s+(\d+)", open("/proc/self/status").read()).group(1)) * 1024
    rng = random.Random(1)
    with Journal.create(p, signer=Signer.generate(), background=False) as j:
        m = TrainingHealthMonitor(journal=j, peak_flops_per_sec=1e12)
        m.observe_step(0, 5.0, grad_norm=0.8, step_time_s=0.25, tokens=4096)
        base = rss()
        for i in range(1, n):
            m.observe_step(i, 2.0 + 3.0 * (1 + i / 50) ** -0.5 + rng.gauss(0, 0.02),
                           grad_norm=0.8 + abs(rng.gauss(0, 0.05)), step_time_s=0.25, tokens=4096)
        extra["held_bytes"] = rss() - base
    extra["rows"] = n
wall = time.perf_counter() - t0
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
extra["code"] = getattr(sys.modules.get("trainledger.journal"), "__file__", None)  # which checkout ran (no import)
hwm = int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1))
wchar = int(re.search(r"wchar:\s+(\d+)", open("/proc/self/io").read()).group(1))
print(json.dumps({"wall": wall, "cpu": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
                  "rss_mb": max(hwm, kids.ru_maxrss) / 1024, "wchar": wchar, **extra}))
"""


def write_journal(path: Path, n: int) -> tuple[Path, object]:
    """A signed journal of ``n`` steps through the health monitor; returns the public key file and the monitor
    (``tests/integration/training/test_bounded_memory.py`` looks into its detectors)."""
    from trainledger.journal import Journal, Signer
    from trainledger.training.health.monitor import TrainingHealthMonitor

    s = Signer.generate()
    rng = random.Random(0)
    with Journal.create(path, signer=s, background=False) as j:
        m = TrainingHealthMonitor(journal=j, peak_flops_per_sec=1e12)
        for i in range(n):
            m.observe_step(i, 2.0 + 3.0 * (1 + i / 50) ** -0.5 + rng.gauss(0, 0.02),
                           grad_norm=0.8 + abs(rng.gauss(0, 0.05)), step_time_s=0.25, tokens=4096)
    k = path.with_suffix(".pub")
    k.write_text(s.public.line() + "\n")
    return k, m


def prepare(mode: str, p: Path, k: Path, path: Path | None = None) -> None:
    """What a measure reads that is not the journal, made once, unmeasured: the cold query a warm one follows, the
    Parquet copy of the steps DuckDB reads, the export verify OUT checks, the first query OUT of it."""
    env = dict(os.environ, TRAINLEDGER_CACHE_DIR=str(p.parent / "cache"))
    if path is not None:  # the cold query a warm one follows, made by the code measured (--compare)
        env.update(PYTHONPATH=str(path), TRAINLEDGER_CACHE_DIR=str(p.parent / "cache-compare"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as run() measures: bytecode cached
    tl = str(Path(sys.executable).with_name("trainledger"))
    if mode == "query_warm":
        subprocess.run([tl, "query", str(p), "--pubkey", str(k), "SELECT 1"], check=True, capture_output=True,
                       env=env)
    elif mode == "duckdb_parquet" and not p.with_suffix(".steps.parquet").exists():
        import duckdb

        con = duckdb.connect()
        con.execute(f"COPY (SELECT * FROM read_ndjson('{p}', columns={{'kind': 'VARCHAR', 'step': 'BIGINT', "
                    "'loss': 'DOUBLE', 'grad_norm': 'DOUBLE', 'step_time_s': 'DOUBLE', 'tokens': 'BIGINT'}) "
                    f"WHERE kind = 'step_observed') TO '{p.with_suffix('.steps.parquet')}' (FORMAT parquet)")
        con.close()
    if mode in ("verify_out", "duckdb_read_export", "query_out", "duckdb_export") \
            and not p.with_suffix(".export").exists():
        subprocess.run([tl, "export", "parquet", str(p), str(p.with_suffix(".export")), "--lines", "--pubkey",
                        str(k), "--no-progress"], check=True, capture_output=True)
    if mode == "query_out":  # verified whole once: the user's cache remembers the listing
        subprocess.run([tl, "query", str(p.with_suffix(".export")), "--pubkey", str(k), "SELECT 1"], check=True,
                       capture_output=True, env=env)


def package_view(tree: Path, where: Path) -> Path:
    """A folder to put first on PYTHONPATH so that ``import trainledger`` is the checkout ``tree``'s code (its
    accelerator built there, as ``setup.py build_ext --inplace`` builds it): ``trainledger/`` (the face, ``src/trainledger/``) with the project's
    folders linked in as the installed layout has them."""
    pkg = where / "trainledger"
    pkg.mkdir(parents=True)
    face = tree / "src" / "trainledger"  # the installed face: src/trainledger/ (trainledger/ in trees before 0.2)
    for item in (face if face.is_dir() else tree / "trainledger").iterdir():
        if item.name != "__pycache__":
            (pkg / item.name).symlink_to(item)
    for name in ("journal", "training", "ladder"):
        (pkg / name).symlink_to(tree / name)
    return where


def run(mode: str, p: Path, k: Path, n: int, path: Path | None = None) -> dict:
    prepare(mode, p, k, path)
    env = dict(os.environ, TRAINLEDGER_CACHE_DIR=str(p.parent / "cache"), OPENBLAS_NUM_THREADS="1")
    if path is not None:  # another checkout's code (--compare): its cache kept apart
        env.update(PYTHONPATH=str(path), TRAINLEDGER_CACHE_DIR=str(p.parent / "cache-compare"))
    # as on a user's machine: the modules' bytecode cached (a shell that sets PYTHONDONTWRITEBYTECODE would make
    # every measured process compile trainledger's sources again, tens of milliseconds the peers never pay)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    # run from the journal's folder: ``python -c`` puts its working folder first on sys.path, and this checkout's
    # trainledger/ there would shadow the code --compare measures
    out = subprocess.run([sys.executable, "-c", RUNNER, mode, str(p), str(k), str(n)], capture_output=True, text=True,
                         env=env, cwd=p.parent)
    shutil.rmtree(p.with_suffix(".export-bench"), ignore_errors=True)  # export's and the peer's output, each round
    p.with_suffix(".copy-bench.parquet").unlink(missing_ok=True)
    if out.returncode != 0:
        raise SystemExit(f"{mode} on {p.name}: exit {out.returncode}: {out.stderr[-1500:]}")
    got = json.loads(out.stdout.strip().splitlines()[-1])
    code = got.get("code")
    if code is not None and (path is not None) != code.startswith(str(path)):
        raise SystemExit(f"{mode}: measured {code}, not the code asked for")
    return got


def med(rs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e5,1e6,1e7")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="duckdb,replay,query,verify,sha256sum,openssl,query_cold,query_warm,"
                                     "duckdb_parquet,verify_out,duckdb_read_export,query_out,duckdb_export,export,duckdb_copy,"
                                     "duckdb_copy_lines,monitor",
                    help="the measures to run (comma-separated)")
    ap.add_argument("--out", metavar="FILE", help="also write the table here")
    ap.add_argument("--compare", metavar="DIR", help="also measure a checkout's code (another commit: git worktree "
                    "add DIR REV, then its accelerator built there with setup.py build_ext --inplace), each measure "
                    "alternated with this checkout's in every round: rows named MODE@DIR")
    a = ap.parse_args()
    sizes = [int(float(x)) for x in a.sizes.split(",")]
    modes = [m for m in a.only.split(",") if m]
    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    load0 = os.getloadavg()
    t_start = time.perf_counter()
    results: dict[int, dict[str, list[dict]]] = {}
    meta: dict[int, dict] = {}
    with tempfile.TemporaryDirectory(prefix="tl-scale-") as tmp:
        other = package_view(Path(a.compare).resolve(), Path(tmp) / "compare") if a.compare else None
        tag = f"@{Path(a.compare).name}" if a.compare else ""
        for n in sizes:
            p = Path(tmp) / f"j{n}.jsonl"
            t = time.perf_counter()
            k, _ = write_journal(p, n)
            meta[n] = {"bytes": p.stat().st_size, "write_s": time.perf_counter() - t}
            results[n] = {m: [] for m in modes}
            if other is not None:
                results[n].update({m + tag: [] for m in modes})
            for rnd in range(a.rounds):
                for m in modes:
                    target = Path(tmp) / "monitor.jsonl" if m == "monitor" else p
                    pair = [(m, None), (m + tag, other)] if other is not None else [(m, None)]
                    # which goes first alternates round by round: the first after a measure that wrote hundreds of
                    # MiB reads the journal with colder caches
                    for key, path in pair if rnd % 2 == 0 else pair[::-1]:
                        if path is not None and m in ("duckdb", "duckdb_parquet", "duckdb_copy", "duckdb_copy_lines",
                                                      "duckdb_export", "sha256sum",
                                                      "openssl", "duckdb_read_export"):
                            continue  # the peers are the same either way
                        results[n][key].append(run(m, target, k, n, path))
                        if m == "monitor":
                            target.unlink(missing_ok=True)
            results[n] = {m: r for m, r in results[n].items() if r}
            p.unlink()
    load1 = os.getloadavg()
    say(f"tools/bench_scale.py --sizes {a.sizes} --rounds {a.rounds}: {time.perf_counter() - t_start:.0f} s; "
        f"{os.cpu_count()} CPUs; load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f} before, "
        f"{load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} after; medians of {a.rounds} whole processes each")
    for n in sizes:
        r = results[n]
        say(f"\n{n:,} steps: {meta[n]['bytes'] / 2**20:,.0f} MiB journal (written in {meta[n]['write_s']:.1f} s)")
        say(f"  {'measure':<26} {'CPU s':>9} {'wall s':>9} {'peak RSS MiB':>13} {'MiB written':>12}")
        for m, rs in r.items():
            say(f"  {m:<26} {med(rs, 'cpu'):>9.2f} {med(rs, 'wall'):>9.2f} {max(x['rss_mb'] for x in rs):>13.0f} "
                f"{med(rs, 'wchar') / 2**20:>12.1f}")
        if "duckdb" in r:
            duck = med(r["duckdb"], "cpu")
            for m in ("replay", "query"):
                if m in r:
                    say(f"  {m}: {med(r[m], 'cpu') / duck:.1f}x DuckDB's CPU, peak RSS "
                        f"{max(x['rss_mb'] for x in r[m]):.0f} MiB vs DuckDB's {max(x['rss_mb'] for x in r['duckdb']):.0f}")
            if "verify" in r:  # the targets: verification's cost plus the peer's own
                v = med(r["verify"], "cpu")
                for m, times in (("replay", 2.0), ("query_cold", 1.0)):
                    if m in r:
                        c = med(r[m], "cpu")
                        say(f"  {m}: {c:.2f} s CPU vs verify {v:.2f} s + {times:g}x DuckDB's read {duck:.2f} s = "
                            f"{v + times * duck:.2f} s ({c / (v + times * duck):.2f}x that)")
        if "export" in r and "duckdb_copy" in r and "verify" in r:
            e, c, v = med(r["export"], "cpu"), med(r["duckdb_copy"], "cpu"), med(r["verify"], "cpu")
            say(f"  export parquet --lines: {e:.2f} s CPU vs verify {v:.2f} s + 1.5x DuckDB's COPY to Parquet {c:.2f} s"
                f" = {v + 1.5 * c:.2f} s ({e / (v + 1.5 * c):.2f}x that)")
            if "duckdb_copy_lines" in r:
                c = med(r["duckdb_copy_lines"], "cpu")
                say(f"  export parquet --lines vs a peer writing the lines too (zstd): verify {v:.2f} s + 1.5x "
                    f"{c:.2f} s = {v + 1.5 * c:.2f} s ({e / (v + 1.5 * c):.2f}x that; the peer alone {e / c:.2f}x)")
        if "verify" in r and "sha256sum" in r:
            lines_n = r["verify"][0]["rows"]  # every line of the file is an event
            v, s = med(r["verify"], "cpu") / lines_n * 1e6, med(r["sha256sum"], "cpu") / lines_n * 1e6
            say(f"  verify: {v:.2f} us CPU a line vs sha256sum's {s:.2f} us ({v / s:.2f}x), one core"
                + (f"; openssl dgst -sha256 {med(r['openssl'], 'cpu') / lines_n * 1e6:.2f} us"
                   if "openssl" in r else ""))
        if "query_warm" in r and "duckdb_parquet" in r:
            w, d = med(r["query_warm"], "cpu"), med(r["duckdb_parquet"], "cpu")
            say(f"  query right after a cold one: {w:.2f} s CPU vs DuckDB over a Parquet copy of the steps {d:.2f} s "
                f"({w / d:.1f}x; target 1.5x)" + (f"; the cold one {med(r['query_cold'], 'cpu'):.2f} s"
                                                   if "query_cold" in r else ""))
        if "verify_out" in r and "verify" in r:
            o, v = med(r["verify_out"], "cpu"), med(r["verify"], "cpu")
            say(f"  verify OUT (export parquet --lines): {o:.2f} s CPU vs verify of the journal {v:.2f} s "
                f"({o / v:.1f}x; target 1.2x), peak RSS {max(x['rss_mb'] for x in r['verify_out']):.0f} MiB")
            if "duckdb_read_export" in r:
                x = med(r["duckdb_read_export"], "cpu")
                say(f"  verify OUT's floor: verify {v:.2f} s + DuckDB reading every cell of the export {x:.2f} s = "
                    f"{v + x:.2f} s ({o / (v + x):.2f}x that)")
        if "query_out" in r and "duckdb_export" in r:
            q, d = med(r["query_out"], "cpu"), med(r["duckdb_export"], "cpu")
            say(f"  query OUT, its listing remembered as verified: {q:.2f} s CPU vs DuckDB over the export's steps "
                f"{d:.2f} s ({q / d:.1f}x; target 1.5x)")
        if "monitor" in r:
            held = med(r["monitor"], "held_bytes")
            say(f"  monitor: resident memory grew {held / 2**20:.1f} MiB from step 1 to step {n:,} "
                f"({held / n:.1f} bytes a step)")
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
