#!/usr/bin/env python3
"""``trainledger serve`` measured: how long until it serves, its first paint in a real browser, and its memory, at
1e5 and 1e6 steps, beside ``trainledger verify`` of the same journal (the floor: the server verifies every line
before it draws one).

    .venv/bin/python tools/bench_serve.py [--sizes 1e5,1e6] [--rounds 3] [--out docs/bench/serve.txt]
    .venv/bin/python tools/bench_serve.py --fleet 50x1e5,1e6 [--out docs/bench/serve_fleet.txt]
    .venv/bin/python tools/bench_serve.py --fleet 100x1e5 --metrics 10 [--out docs/bench/serve_metrics.txt]

For each size, a signed journal is written through the health monitor (seals every 1,000 events); then, round by
round, each in a fresh process: ``trainledger verify`` under ``/usr/bin/time`` (CPU, wall, peak RSS), and
``trainledger serve --port 0``: the time until it prints its URL (everything verified and in its tables), the CPU
and peak RSS of the server process then, headless Chromium's first paint of the page (from ``goto`` until every
curve is drawn, read from the page's own counter), and the server's peak RSS and CPU after the paint. Medians are
printed with the load average before and after; the machine is shared, so read CPU time first.

``--fleet 50x1e5,1e6``: one folder of runs (50 of 1e5 steps and one of 1e6, each written through the monitor, each
its own loss curve) served as one page: the library's ``verify`` of every journal in one process (the floor), then
``trainledger serve DIR``: the time until it serves (every journal verified), the first paint (the page's default
eight runs overlaid, then all 51), a zoom's server time (the per-pixel query of the 1e6-step run for a range, timed
by HTTP round trips on the loopback, medians of 5) and a zoom's redraw in the page (every chart of the ticked runs
fetched again), and the server's peak RSS against DuckDB's limit (one database for every run's tables, 256 MB).

``--metrics 10`` with ``--fleet 100x1e5``: W&B-style runs (ten scalars logged a step, no monitor), the issue's 100
runs x 100,000 steps x 10 metrics: the time until serving, the first chart drawn (from the page's own clock: when the
first chart with points was drawn), the whole first view, then live updates (run 0 gains rows, sealed every 0.5 s)
and the bytes the page fetches an update, against the first view's.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = str(Path(sys.executable))
TL = str(Path(sys.executable).with_name("trainledger"))


def write_journal(path: Path, steps: int, signer=None, seed: int = 0) -> Path:
    from trainledger.journal import Journal, Signer
    from trainledger.training.health.monitor import TrainingHealthMonitor

    s = signer or Signer.generate()
    rng = random.Random(seed)
    j = Journal.create(path, signer=s)
    m = TrainingHealthMonitor(journal=j, peak_flops_per_sec=1e12)
    floor, scale = 2.0 + 0.01 * seed, 3.0 * (1 + 0.02 * seed)  # each run its own curve
    for i in range(steps):
        m.observe_step(i, floor + scale * (1 + i / 50) ** -0.5 + rng.gauss(0, 0.02),
                       grad_norm=0.8 + abs(rng.gauss(0, 0.05)), step_time_s=0.25, tokens=4096)
    j.close()
    k = path.with_suffix(".pub")
    k.write_text(s.public.line() + "\n")
    return k


#: the names a W&B-style run logs every step (--metrics takes the first N, and makes up more past these)
LOGGED = ["train/loss", "train/acc", "train/lr", "train/grad_norm", "train/tokens_per_s", "eval/loss", "eval/acc",
          "eval/perplexity", "system/gpu_util", "system/memory_gb"]


def logged_names(metrics: int) -> list[str]:
    """The first ``metrics`` names of :data:`LOGGED`, and made-up ones past it."""
    return (LOGGED + [f"extra/m{i}" for i in range(max(0, metrics - len(LOGGED)))])[:metrics]


def verify_floor(pub: Path, root: Path, *, allow_unsealed: bool = False) -> dict[str, float]:
    """The floor: every journal under ``root`` verified by the library, one process, one worker; its CPU, wall
    time and peak RSS (MiB), from ``/usr/bin/time``."""
    code = ("import sys, pathlib; from trainledger.journal import verify, TrustPolicy, load_public_key; "
            "t = TrustPolicy(keys=[load_public_key(sys.argv[1])]); "
            f"[verify(p, trust=t, workers=1, allow_unsealed={allow_unsealed}) "
            "for p in sorted(pathlib.Path(sys.argv[2]).rglob('journal.jsonl'))]")
    out = subprocess.run(["/usr/bin/time", "-f", "TIME %U %S %e %M", PY, "-c", code, str(pub), str(root)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"verify: {out.stderr[-1000:]}")
    u, s_, e, m = out.stderr.strip().splitlines()[-1].split()[1:]
    return {"cpu": float(u) + float(s_), "wall": float(e), "rss": int(m) / 1024}


def start_serve(root: Path, pub: Path) -> tuple[subprocess.Popen, str, float]:
    """``trainledger serve ROOT`` on a free port: the process, its URL and the seconds until it printed it (every
    journal verified and in its tables). The caller terminates it."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([TL, "serve", str(root), "--pubkey", str(pub), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline()
    while line and " at http" not in line:
        line = proc.stdout.readline()
    ready = time.perf_counter() - t0
    if " at http" not in line:
        proc.terminate()
        raise SystemExit(f"serve: {line}")
    return proc, line.split(" at ", 1)[1].split()[0], ready


def write_logged(path: Path, steps: int, signer, seed: int, metrics: int, *, close: bool = True) -> None:
    """A W&B-style run: ``metrics`` scalars every step, one ``metrics_logged`` a step, as ``wandb.log(row)`` writes
    them (a row queued, made into its event at the journal's drain); a spike in train/loss at step 60% of the way
    in run 0. ``close=False`` leaves the journal open (sealed: a run still going)."""
    from trainledger.journal import Journal
    from trainledger.training.kinds import logged_row

    names = logged_names(metrics)
    rng = random.Random(seed)
    j = Journal.create(path, signer=signer, run_id=f"bench-{seed:03d}")
    floor, scale = 2.0 + 0.01 * seed, 3.0 * (1 + 0.02 * seed)
    spike = int(steps * 0.6) if seed == 0 else -1
    for i in range(steps):
        loss = floor + scale * (1 + i / 50) ** -0.5 + rng.gauss(0, 0.02) + (40.0 if i == spike else 0.0)
        row = {n: loss * (1 + 0.01 * k) if k != 2 else 3e-4 for k, n in enumerate(names)}
        j.append_later(logged_row, (row, i, "wandb"))
    if close:
        j.close()
    else:
        j.suspend()


def _write_run(args: tuple) -> None:
    from trainledger.journal import load_signer

    folder, steps, key, seed, metrics = args
    folder.mkdir(parents=True, exist_ok=True)
    if metrics:
        write_logged(folder / "journal.jsonl", steps, load_signer(key), seed, metrics, close=seed != 0)
    else:
        write_journal(folder / "journal.jsonl", steps, load_signer(key), seed)


def write_fleet(root: Path, spec: str, metrics: int = 0) -> tuple[Path, list[tuple[str, int]]]:
    """The folder of runs ``spec`` asks for (``50x1e5,1e6``), all under one key, written two at a time; the public
    key's path and (run name, steps) of each. ``metrics``: W&B-style runs of that many scalars a step instead of the
    monitor's steps (the first left open, for the live updates)."""
    from concurrent.futures import ProcessPoolExecutor

    from trainledger.journal import keygen

    runs: list[tuple[str, int]] = []
    for part in spec.split(","):
        n, _, size = part.rpartition("x")
        for _ in range(int(n or 1)):
            runs.append((f"run-{len(runs):03d}-{int(float(size)):.0e}".replace("+", ""), int(float(size))))
    priv, pub = keygen(root.parent / "keys")
    jobs = [(root / name, steps, priv, k, metrics) for k, (name, steps) in enumerate(runs)]
    jobs.sort(key=lambda x: -x[1])  # the longest first: the two workers end together
    with ProcessPoolExecutor(2) as pool:
        list(pool.map(_write_run, jobs))
    return pub, runs


def _get_json(url: str) -> dict:
    import json
    import urllib.request

    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def fleet(a, say) -> None:
    """The --fleet measurement (see the module doc)."""
    import urllib.parse

    from playwright.sync_api import sync_playwright

    from trainledger.serve.fleet import MEMORY_LIMIT

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed: bash tools/setup.sh --browser")
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        t = time.perf_counter()
        pub, runs = write_fleet(root, a.fleet)
        wrote = time.perf_counter() - t
        steps = sum(n for _, n in runs)
        nbytes = sum(p.stat().st_size for p in root.rglob("*.jsonl"))
        ver = verify_floor(pub, root)
        proc, url, ready = start_serve(root, pub)
        try:
            base, _, query = url.partition("?")
            token = urllib.parse.parse_qs(query).get("token", [None])[0]
            cpu_ready, rss_ready = proc_figures(proc.pid)
            big = max(runs, key=lambda r: r[1])

            def api(path: str, **params) -> dict:
                if token:
                    params["token"] = token
                return _get_json(base.rstrip("/") + "/" + path + "?" + urllib.parse.urlencode(params))

            zooms = []
            for lo, hi in ((0, big[1] - 5), (big[1] // 2, big[1] // 2 + big[1] // 10),
                           (big[1] // 2, big[1] // 2 + 999)):
                times, points = [], 0
                for k in range(5):  # each a range not asked before: the board keeps a curve asked again
                    t = time.perf_counter()
                    body = api("api/series", run=big[0], metric="loss", width=1200, lo=lo + k, hi=hi + k)
                    times.append(time.perf_counter() - t)
                    points = sum(len(x["x"]) for x in body["series"])
                zooms.append((lo, hi, statistics.median(times), points))
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                             args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1280, "height": 1000})
                t = time.perf_counter()
                page.goto(url)
                page.wait_for_function("() => window.__trainledger && window.__trainledger.drawn > 0",
                                       timeout=120_000, polling=10)
                paint8 = time.perf_counter() - t
                drawn8 = page.evaluate("() => window.__trainledger.data.loss.runs")
                t = time.perf_counter()
                page.evaluate("() => { const n = window.__trainledger.drawn; "
                              "const a = document.getElementById('runs-all'); a.checked = true; window.__n = n; "
                              "a.dispatchEvent(new Event('change')); }")
                page.wait_for_function(f"() => window.__trainledger.data.loss.runs === {len(runs)}",
                                       timeout=120_000, polling=10)
                paint_all = time.perf_counter() - t
                drawn_all = page.evaluate("() => window.__trainledger.data.loss.runs")
                redraws = []
                for lo, hi in ((40_000, 60_000), (50_000, 50_999)):
                    t = time.perf_counter()
                    page.evaluate(f"() => {{ window.__n = window.__trainledger.drawn; "
                                  f"window.__trainledger.zoom({lo}, {hi}); }}")
                    page.wait_for_function(f"() => JSON.stringify(window.__trainledger.data.loss.zoom) === "
                                           f"'[{lo},{hi}]'", timeout=120_000, polling=10)
                    redraws.append((lo, hi, time.perf_counter() - t,
                                    page.evaluate("() => window.__trainledger.data.loss.points")))
                browser.close()
            cpu_after, rss_after = proc_figures(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
            proc.stdout.close()
    say(f"tools/bench_serve.py --fleet {a.fleet}: {time.perf_counter() - t_start:.0f} s; {os.cpu_count()} CPUs; "
        f"load average {' '.join(f'{x:.2f}' for x in load0)} before, "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} after")
    say(f"  a folder of {len(runs)} runs, {steps:,d} steps, {nbytes / 2**20:,.0f} MiB of journals (written in "
        f"{wrote:.0f} s, two processes, through the health monitor)")
    say(f"  floor: verify every journal, one process, one worker: {ver['cpu']:.2f} s CPU, {ver['wall']:.2f} s wall, "
        f"{ver['rss']:.0f} MiB peak RSS")
    say(f"  trainledger serve DIR: serving after {ready:.2f} s (every journal verified and in its tables), "
        f"{cpu_ready:.2f} s CPU, {rss_ready:.0f} MiB peak RSS then")
    say(f"  first paint (the page's default {drawn8} runs overlaid, 4 charts): {paint8:.2f} s from goto")
    say(f"  every run ticked ({drawn_all} runs overlaid, 4 charts): drawn again in {paint_all:.2f} s")
    for lo, hi, med, pts in zooms:
        say(f"  zoom, server: the {big[1]:,d}-step run's loss for steps {lo:,d}-{hi:,d} at 1,200 px: "
            f"{med * 1000:.0f} ms a request (HTTP round trip, median of 5 ranges each new), {pts:,d} points")
    for lo, hi, sec, pts in redraws:
        say(f"  zoom, page: steps {lo:,d}-{hi:,d} with every run ticked, every chart fetched again and drawn: "
            f"{sec:.2f} s, {pts:,d} loss points")
    say(f"  server after all that: {cpu_after:.2f} s CPU, {rss_after:.0f} MiB peak RSS "
        f"(DuckDB's limit {MEMORY_LIMIT} for the {len(runs)} runs' tables together, on disk past it)")


_LIVE = """
import sys, time
from trainledger.journal import Journal, load_signer
from trainledger.training.kinds import logged_row
path, key, start, updates, rows, names = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6].split(",")
j = Journal.open_append(path, signer=load_signer(key))
step = start
for u in range(updates):
    for _ in range(rows):
        j.append_later(logged_row, ({n: 1.0 + 1.0 / (step + 1) for n in names}, step, "wandb"))
        step += 1
    j.seal(durable=True)
    time.sleep(0.5)
j.suspend()
"""


def fleet_metrics(a, say) -> None:
    """--fleet with --metrics: W&B-style runs (see the module doc)."""

    from playwright.sync_api import sync_playwright

    from trainledger.serve.fleet import MEMORY_LIMIT

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed: bash tools/setup.sh --browser")
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        t = time.perf_counter()
        pub, runs = write_fleet(root, a.fleet, a.metrics)
        wrote = time.perf_counter() - t
        priv = pub.with_suffix(".key")
        steps = sum(n for _, n in runs)
        nbytes = sum(p.stat().st_size for p in root.rglob("*.jsonl"))
        ver = verify_floor(pub, root, allow_unsealed=True)  # run 0 is left open
        proc, url, ready = start_serve(root, pub)
        try:
            cpu_ready, rss_ready = proc_figures(proc.pid)
            names = logged_names(a.metrics)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                             args=["--no-sandbox", "--disable-gpu"])
                page = browser.new_page(viewport={"width": 1280, "height": 1000})
                t = time.perf_counter()
                page.goto(url)
                page.wait_for_function("() => window.__trainledger && window.__trainledger.drawn > 0",
                                       timeout=600_000, polling=10)
                paint = time.perf_counter() - t
                first = page.evaluate("() => window.__trainledger.first") / 1000
                view = page.evaluate("() => { const d = window.__trainledger.data; const k = Object.keys(d)"
                                     ".filter(x => x.startsWith('m:')); return {charts: k.length, "
                                     "runs: d['m:train/loss'].runs, points: k.reduce((n, x) => n + d[x].points, 0), "
                                     "clipped: d['m:train/loss'].clipped, bytes: window.__trainledger.bytes}; }")
                # live: run 0 (left open) gains rows, sealed every update; the page adds what is new to each chart
                b0, a0, d0 = page.evaluate("() => [window.__trainledger.bytes, window.__trainledger.appended, "
                                           "window.__trainledger.drawn]")
                updates, rows = 10, 20
                subprocess.run([PY, "-c", _LIVE, str(root / runs[0][0] / "journal.jsonl"), str(priv),
                                str(runs[0][1]), str(updates), str(rows), ",".join(names)], check=True, timeout=600)
                want = a0 + updates * rows * len(names)
                page.wait_for_function(f"() => window.__trainledger.appended >= {want} && !window.__trainledger.busy",
                                       timeout=600_000, polling=50)
                b1, a1, d1 = page.evaluate("() => [window.__trainledger.bytes, window.__trainledger.appended, "
                                           "window.__trainledger.drawn]")
                live_points = (a1 - a0) / max(1, len(names))
                browser.close()
            cpu_after, rss_after = proc_figures(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
            proc.stdout.close()
    say(f"tools/bench_serve.py --fleet {a.fleet} --metrics {a.metrics}: {time.perf_counter() - t_start:.0f} s; "
        f"{os.cpu_count()} CPUs; load average {' '.join(f'{x:.2f}' for x in load0)} before, "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} after")
    say(f"  a folder of {len(runs)} runs, {steps:,d} steps of {a.metrics} logged metrics each "
        f"({steps * a.metrics:,d} points), {nbytes / 2**20:,.0f} MiB of journals (written in {wrote:.0f} s, two "
        "processes, as wandb.log writes them)")
    say(f"  floor: verify every journal, one process, one worker: {ver['cpu']:.2f} s CPU, {ver['wall']:.2f} s wall, "
        f"{ver['rss']:.0f} MiB peak RSS")
    say(f"  trainledger serve DIR: serving after {ready:.2f} s (every journal verified and in its tables), "
        f"{cpu_ready:.2f} s CPU, {rss_ready:.0f} MiB peak RSS then")
    say(f"  first chart drawn {first:.2f} s after the page opened; the whole first view ({view['charts']} charts, "
        f"the default {view['runs']} runs overlaid, {view['points']:,d} points, {view['bytes'] / 1024:,.0f} KiB "
        f"fetched) {paint:.2f} s from goto; run 0's spike clipped and marked: {view['clipped']} point(s)")
    say(f"  live: run 0 gained {updates} x {rows} rows ({live_points:,.0f} points a chart, sealed each 0.5 s): "
        f"{d1 - d0} page updates fetched {(b1 - b0) / 1024:,.1f} KiB in all, {(b1 - b0) / max(1, d1 - d0) / 1024:,.1f} "
        f"KiB an update against {view['bytes'] / 1024:,.0f} KiB for the first view")
    say(f"  server after all that: {cpu_after:.2f} s CPU, {rss_after:.0f} MiB peak RSS "
        f"(DuckDB's limit {MEMORY_LIMIT} for the {len(runs)} runs' tables together, on disk past it)")


def proc_figures(pid: int) -> tuple[float, float]:
    """(CPU seconds, peak RSS MiB) of a live process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / tick
    hwm = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return cpu, hwm


def verify_once(j: Path, k: Path) -> dict:
    out = subprocess.run(["/usr/bin/time", "-f", "TIME %U %S %e %M", TL, "verify", str(j), "--pubkey", str(k)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"verify: {out.stderr[-1000:]}")
    u, s, e, m = out.stderr.strip().splitlines()[-1].split()[1:]
    return {"cpu": float(u) + float(s), "wall": float(e), "rss": int(m) / 1024}


def serve_once(j: Path, k: Path, browser) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.Popen([TL, "serve", str(j), "--pubkey", str(k), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        ready = time.perf_counter() - t0
        if " at http" not in line:
            raise SystemExit(f"serve: {line}{proc.stdout.read()[-1000:]}")
        url = line.split(" at ", 1)[1].split()[0]
        cpu_ready, rss_ready = proc_figures(proc.pid)
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        t1 = time.perf_counter()
        page.goto(url)
        while not page.evaluate("() => !!(window.__trainledger && window.__trainledger.drawn > 0)"):
            time.sleep(0.01)
        paint = time.perf_counter() - t1
        points = page.evaluate("() => window.__trainledger.data.loss.points")
        first = page.evaluate("() => window.__trainledger.first") / 1000  # the page's own clock, from its opening
        page.close()
        cpu_after, rss_after = proc_figures(proc.pid)
        return {"ready": ready, "cpu_ready": cpu_ready, "rss_ready": rss_ready, "paint": paint, "first": first,
                "cpu_after": cpu_after, "rss_after": rss_after, "points": points}
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e5,1e6")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fleet", metavar="SPEC", help="a folder of runs instead: 50x1e5,1e6 (runs x steps, ...)")
    ap.add_argument("--metrics", type=int, default=0, help="with --fleet: W&B-style runs of this many logged "
                                                               "scalars a step (the first run left open, for live updates)")
    ap.add_argument("--out", metavar="FILE")
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    lines: list[str] = []

    def say(t: str = "") -> None:
        print(t, flush=True)
        lines.append(t)

    if a.fleet:
        (fleet_metrics if a.metrics else fleet)(a, say)
        if a.out:
            Path(a.out).write_text("\n".join(lines) + "\n")
        return 0

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("chromium is not installed: bash tools/setup.sh --browser")
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"])
        for size in [int(float(x)) for x in a.sizes.split(",")]:
            j = Path(tmp) / f"j{size}.jsonl"
            t = time.perf_counter()
            k = write_journal(j, size)
            wrote = time.perf_counter() - t
            ver, srv = [], []
            for _ in range(a.rounds):
                ver.append(verify_once(j, k))
                srv.append(serve_once(j, k, browser))
            med = {f: statistics.median(r[f] for r in srv) for f in srv[0]}
            vmed = {f: statistics.median(r[f] for r in ver) for f in ver[0]}
            rows.append((size, j.stat().st_size, wrote, vmed, med))
        browser.close()
    say(f"tools/bench_serve.py --sizes {a.sizes} --rounds {a.rounds}: {time.perf_counter() - t_start:.0f} s; "
        f"{os.cpu_count()} CPUs; load average {' '.join(f'{x:.2f}' for x in load0)} before, "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} after; medians of {a.rounds} fresh processes each")
    say(f"  {'steps':>9s} {'MiB':>6s} | {'verify CPU s':>12s} {'wall s':>7s} {'RSS MiB':>8s} | {'serving after s':>15s} "
        f"{'CPU s':>6s} {'RSS MiB':>8s} | {'first chart s':>13s} {'first paint s':>13s} {'points':>7s} "
        f"{'server RSS MiB':>15s} {'CPU s':>6s}")
    for size, nbytes, wrote, v, m in rows:
        say(f"  {size:9,d} {nbytes / 2**20:6.0f} | {v['cpu']:12.2f} {v['wall']:7.2f} {v['rss']:8.0f} | "
            f"{m['ready']:15.2f} {m['cpu_ready']:6.2f} {m['rss_ready']:8.0f} | {m['first']:13.2f} {m['paint']:13.2f} "
            f"{m['points']:7.0f} {m['rss_after']:15.0f} {m['cpu_after']:6.2f}")
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
