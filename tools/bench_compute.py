"""The compute statement at a frontier run's width: a run folder of N rank journals (default 16,384) written through
the real parts (rank keys certified by one run key, the monitor, NVML energy samples, rank 0's countersigned anchor,
each rank's compute_totaled), its statement built (``trainledger compute``: verify, replay and prove every rank),
and the statement checked offline by ``trainledger verify-proof`` in a fresh process, with only the statement and the
run key: wall time, CPU time and peak memory of that process, beside the machine's load.

    .venv/bin/python tools/bench_compute.py [--ranks 16384] [--out docs/bench/compute.txt]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _timed(argv: list[str]) -> tuple[int, float, float, int, str]:
    """(exit code, wall s, CPU s, peak RSS bytes, output) of one child process, from its own rusage (wait4)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode(errors="replace")
    return p.returncode, wall, ru.ru_utime + ru.ru_stime, ru.ru_maxrss * 1024, text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=16384)
    ap.add_argument("--steps", type=int, default=20, help="steps per rank journal (default 20)")
    ap.add_argument("--out", default=None, help="also write the report here")
    args = ap.parse_args()
    from trainledger.journal import Signer
    from tests.helpers.compute_runs import write_run_folder

    lines = [f"# tools/bench_compute.py --ranks {args.ranks} --steps {args.steps}",
             f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, load average "
             f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} at the start"]
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        issuer = Signer.generate()
        pub = d / "run.pub"
        pub.write_text(issuer.public.line() + "\n")
        t0 = time.perf_counter()
        write_run_folder(d / "run", issuer, run="bench-run", world=args.ranks, steps=args.steps)
        lines.append(f"wrote {args.ranks:,} rank journals ({args.steps} steps each) in {time.perf_counter() - t0:.1f} s")
        exe = str(ROOT / ".venv" / "bin" / "trainledger")
        st = d / "statement.json"
        code, wall, cpu, rss, out = _timed([exe, "compute", str(d / "run"), "--pubkey", str(pub), "--out", str(st)])
        if code != 0:
            print(out)
            return 1
        lines.append(f"trainledger compute (verify, replay, prove every rank): {wall:.1f} s wall, {cpu:.1f} s CPU, "
                     f"peak RSS {rss / 2**20:.0f} MiB; statement {st.stat().st_size / 2**20:.1f} MiB")
        code, wall, cpu, rss, out = _timed([exe, "verify-proof", str(st), "--pubkey", str(pub)])
        if code != 0:
            print(out)
            return 1
        lines.append(f"trainledger verify-proof STATEMENT (every rank's signature, certificate and proofs; every "
                     f"figure recomputed): {wall:.2f} s wall, {cpu:.2f} s CPU, peak RSS {rss / 2**20:.0f} MiB")
        lines.append("  " + out.splitlines()[0])
    lines.append(f"# load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
