#!/usr/bin/env python3
"""``trainledger serve`` measured: how long until it serves, its first paint in a real browser, and its memory, at
1e5 and 1e6 steps, beside ``trainledger verify`` of the same journal (the floor: the server verifies every line
before it draws one).

    .venv/bin/python tools/bench_serve.py [--sizes 1e5,1e6] [--rounds 3] [--out docs/bench/serve.txt]

For each size, a signed journal is written through the health monitor (seals every 1,000 events); then, round by
round, each in a fresh process: ``trainledger verify`` under ``/usr/bin/time`` (CPU, wall, peak RSS), and
``trainledger serve --port 0``: the time until it prints its URL (everything verified and in its tables), the CPU
and peak RSS of the server process then, headless Chromium's first paint of the page (from ``goto`` until every
curve is drawn, read from the page's own counter), and the server's peak RSS and CPU after the paint. Medians are
printed with the load average before and after; the machine is shared, so read CPU time first.
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


def write_journal(path: Path, steps: int) -> Path:
    from trainledger.journal import Journal, Signer
    from trainledger.training.health.monitor import TrainingHealthMonitor

    s = Signer.generate()
    rng = random.Random(0)
    j = Journal.create(path, signer=s)
    m = TrainingHealthMonitor(journal=j, peak_flops_per_sec=1e12)
    for i in range(steps):
        m.observe_step(i, 2.0 + 3.0 * (1 + i / 50) ** -0.5 + rng.gauss(0, 0.02),
                       grad_norm=0.8 + abs(rng.gauss(0, 0.05)), step_time_s=0.25, tokens=4096)
    j.close()
    k = path.with_suffix(".pub")
    k.write_text(s.public.line() + "\n")
    return k


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
        page.close()
        cpu_after, rss_after = proc_figures(proc.pid)
        return {"ready": ready, "cpu_ready": cpu_ready, "rss_ready": rss_ready, "paint": paint,
                "cpu_after": cpu_after, "rss_after": rss_after, "points": points}
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e5,1e6")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", metavar="FILE")
    a = ap.parse_args()
    from playwright.sync_api import sync_playwright

    lines: list[str] = []

    def say(t: str = "") -> None:
        print(t, flush=True)
        lines.append(t)

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
        f"{'CPU s':>6s} {'RSS MiB':>8s} | {'first paint s':>13s} {'points':>7s} {'server RSS MiB':>15s} "
        f"{'CPU s':>6s}")
    for size, nbytes, wrote, v, m in rows:
        say(f"  {size:9,d} {nbytes / 2**20:6.0f} | {v['cpu']:12.2f} {v['wall']:7.2f} {v['rss']:8.0f} | "
            f"{m['ready']:15.2f} {m['cpu_ready']:6.2f} {m['rss_ready']:8.0f} | {m['paint']:13.2f} "
            f"{m['points']:7.0f} {m['rss_after']:15.0f} {m['cpu_after']:6.2f}")
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
