"""Time ``tools/setup.sh`` on a fresh clone: the main job's install (no flag) against the tests' (``--dev``).

Each variant clones the committed tree into a new temporary folder and runs its setup there as a whole process
(wall time, CPU time of the process and its children, peak memory), then reports the venv's size and how many
packages it holds. pip's own cache is left as the machine has it (the output says whether it was there): a
machine that has never installed these wheels downloads them too, so its figures are larger for both.

    .venv/bin/python tools/bench_setup.py --out docs/bench/setup.txt
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def run(flag: str | None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="tl-setup-"))
    try:
        subprocess.run(["git", "clone", "-q", str(ROOT), str(work / "repo")], check=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(["bash", "tools/setup.sh", *([flag] if flag else [])], cwd=work / "repo", check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        venv = work / "repo" / ".venv"
        pkgs = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                              capture_output=True, text=True, check=True).stdout.split()
        ladder_ok = subprocess.run([str(venv / "bin" / "python"), "-c",
                                    "import torch, scipy, matplotlib, trainledger.ladder.runner"],
                                   capture_output=True).returncode == 0
        return {"flag": flag or "(none)", "wall_s": wall, "cpu_s": (after.ru_utime + after.ru_stime)
                - (before.ru_utime + before.ru_stime), "peak_mib": after.ru_maxrss / 1024,
                "venv_mib": _size(venv) / 2**20, "packages": len(pkgs), "main_job_imports": ladder_ok}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None, help="also write the table here")
    args = ap.parse_args()
    cache = Path(os.environ.get("PIP_CACHE_DIR", Path.home() / ".cache" / "pip"))
    lines = [f"tools/setup.sh on a fresh clone, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} before; pip cache "
             f"{'present' if cache.is_dir() else 'absent'} ({cache})",
             f"{'setup.sh flag':<14} {'wall s':>8} {'CPU s':>8} {'peak MiB':>9} {'venv MiB':>9} {'packages':>9}  "
             "main job imports"]
    for flag in (None, "--dev"):
        r = run(flag)
        lines.append(f"{r['flag']:<14} {r['wall_s']:>8.1f} {r['cpu_s']:>8.1f} {r['peak_mib']:>9.0f} "
                     f"{r['venv_mib']:>9.0f} {r['packages']:>9}  {'yes' if r['main_job_imports'] else 'NO'}")
    lines.append(f"load {os.getloadavg()[0]:.2f} after")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
