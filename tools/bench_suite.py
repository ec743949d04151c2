"""The test suite's (or the main job's) cost as a user sees it: wall time, CPU time and peak memory of the whole
process tree, and how busy the machine was, optionally with CPU-burning processes beside it.

    .venv/bin/python tools/bench_suite.py -m unit                    # the fast tier
    .venv/bin/python tools/bench_suite.py                            # the whole suite
    .venv/bin/python tools/bench_suite.py --busy 2                   # the whole suite, two busy processes beside it
    .venv/bin/python tools/bench_suite.py --command ".venv/bin/trainledger ladder runs/ladder-bench"

Arguments after the options go to pytest. CPU time and peak RSS are the children's (``getrusage``: every process
the command waited for, the busy ones not; peak RSS is the largest single one). Output kept in docs/bench/suite.txt.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", type=int, default=0, help="CPU-burning processes to run beside it (default 0)")
    ap.add_argument("--command", default=None, help="time this shell command instead of pytest")
    ap.add_argument("--show", default=None, metavar="TEXT",
                    help="also print the command's output lines that contain TEXT (e.g. the ladder's own timing)")
    args, pytest_args = ap.parse_known_args()
    # a shell command as the README writes it (`bash tools/setup.sh && .venv/bin/trainledger ladder ...`): run by bash,
    # so && and $(...) mean what they mean there
    cmd = ["bash", "-c", args.command] if args.command else [sys.executable, "-m", "pytest", "-q", "-p",
                                                             "no:cacheprovider", *pytest_args]
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        load0 = os.getloadavg()
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        load1 = os.getloadavg()
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # before the burners are reaped: the command's alone
    finally:
        for b in burners:
            b.kill()
            b.wait()
    tail = [ln for ln in proc.stdout.splitlines() if ln.strip()][-1:] or ["(no output)"]
    print(f"command: {args.command or ' '.join(cmd)}")
    print(f"cores: {os.cpu_count()}; busy processes beside it: {args.busy}; load average before "
          f"{load0[0]:.2f}, after {load1[0]:.2f}")
    print(f"result: {tail[0]} (exit {proc.returncode})")
    if args.show:
        for ln in (proc.stdout + proc.stderr).splitlines():
            if args.show in ln:
                print(f"  {ln.strip()}")
    print(f"wall {wall:.1f} s; CPU user {ru.ru_utime:.1f} s, sys {ru.ru_stime:.1f} s; peak RSS of one process "
          f"{ru.ru_maxrss / 1024:.0f} MB")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
