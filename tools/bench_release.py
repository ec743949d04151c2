#!/usr/bin/env python3
"""Release and verify-model on a model folder, side by side with ``sha256sum`` (the hashing floor) and OpenSSF model
signing's own CLI doing the same jobs.

    .venv/bin/python tools/bench_release.py                       # a 1 GiB folder, 3 repeats
    .venv/bin/python tools/bench_release.py --gib 0.1 --repeats 1  # a quick look

The folder: four weight files of a quarter of the size each (random bytes) and a config, recorded in a signed
journal (the Journal API, torch-free) as ``model_exported``, the run closed with its ``compute_totaled``. Each
command runs as its own process, in turn, ``--repeats`` times; the figures are each one's median wall time and its
CPU time (user + system) and peak RSS as GNU time reports them. The folder is read once before the first timing, so
every command reads it from the page cache alike (the hashing, not the disk, is what is compared). Targets: hashing
at >= 0.9x ``sha256sum``'s rate per core; verify-model under 0.2 s beyond the hashing (the fastest one-core SHA-256
here, ``openssl dgst`` or ``sha256sum``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BIN = Path(sys.executable).parent


def _make(tmp: Path, gib: float) -> dict[str, Path]:
    from trainledger.journal import Journal, Signer, StepObserved
    from trainledger.journal.statements.release.export import record_export
    from trainledger.journal.statements.release.keys import ReleaseKey
    from trainledger.training.health.mfu import record_compute

    model = tmp / "model"
    model.mkdir()
    each = int(gib * (1 << 30)) // 4
    block = os.urandom(1 << 20)
    for i in range(4):
        with open(model / f"model-0000{i + 1}-of-00004.safetensors", "wb") as f:
            left = each
            while left > 0:
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
                block = block[1:] + block[:1]  # every MiB different
    (model / "config.json").write_text('{"model_type": "gpt2", "n_layer": 2}')
    signer = Signer.generate()
    (tmp / "trainledger.pub").write_text(signer.public.line() + "\n")
    j = Journal.create(tmp / "journal.jsonl", signer=signer)
    for i in range(100):
        j.append(StepObserved(step=i, loss=3.0 - i * 0.01, tokens=4096, step_time_s=0.1))
    record_export(j, model, step=99)
    record_compute(j)
    j.close()
    ReleaseKey.generate().save(tmp / "release.key")
    return {"model": model, "journal": tmp / "journal.jsonl", "key": tmp / "release.key", "pub": tmp / "release.pub",
            "run_pub": tmp / "trainledger.pub"}


def _run(cmd: list[str], cwd: Path) -> dict[str, float]:
    """One command's wall time, and its own CPU time and peak RSS, as GNU time reports them for it (a child forked
    from this Python would count this process's pages in its peak)."""
    rep = cwd / "time.out"
    t = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%U %S %M", "-o", str(rep), *cmd], cwd=cwd, capture_output=True)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        msg = (done.stderr or done.stdout).decode(errors="replace")[-500:]
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {msg}")
    user, system, kib = rep.read_text().split()[-3:]
    return {"wall": wall, "cpu": float(user) + float(system), "rss_mib": int(kib) / 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="the folder's size in GiB (1)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="also write the table here")
    args = ap.parse_args()
    if not Path("/usr/bin/time").is_file():
        ap.error("needs GNU time (/usr/bin/time; Debian's package 'time') for each command's own CPU time and peak RSS")
    tmp = Path(tempfile.mkdtemp(prefix="tl-release-"))
    load0 = os.getloadavg()[0]
    try:
        p = _make(tmp, args.gib)
        files = sorted(str(f) for f in p["model"].iterdir())
        size = sum(f.stat().st_size for f in p["model"].iterdir())
        subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)  # into the page cache
        tl, ms = str(BIN / "trainledger"), str(BIN / "model_signing")
        sig = tmp / "ms.sig"
        jobs = {
            "sha256sum (coreutils: every file, one core)": ["sha256sum", *files],
            "openssl dgst -sha256 (every file, one core)": ["openssl", "dgst", "-sha256", *files],
            "model_signing sign key (its CLI)": [ms, "sign", "key", "--private_key", str(p["key"]), "--signature",
                                                 str(sig), str(p["model"])],
            "model_signing verify key (its CLI)": [ms, "verify", "key", "--public_key", str(p["pub"]), "--signature",
                                                   str(sig), str(p["model"])],
            "trainledger release": [tl, "release", str(p["model"]), str(p["journal"]), "--key", str(p["key"]),
                                    "--pubkey", str(p["run_pub"]), "--out", str(tmp / "rel"), "--no-progress"],
            "trainledger verify-model": [tl, "verify-model", str(p["model"]), "--release-key", str(p["pub"]),
                                         "--pubkey", str(p["run_pub"]), "--signature", str(tmp / "rel" / "model.sig"),
                                         "--provenance", str(tmp / "rel" / "model.provenance.json"), "--no-progress"],
            "python -c 'import trainledger.cli' (start-up alone)": [sys.executable, "-c", "import trainledger.cli"],
        }
        res: dict[str, list[dict[str, float]]] = {k: [] for k in jobs}
        for _ in range(args.repeats):
            for name, cmd in jobs.items():  # in turn, so drift on a busy machine hits every command alike
                res[name].append(_run(cmd, tmp))
        med = {k: {f: statistics.median(x[f] for x in v) for f in ("wall", "cpu", "rss_mib")} for k, v in res.items()}
        floor = med["sha256sum (coreutils: every file, one core)"]
        fastest = min(med["openssl dgst -sha256 (every file, one core)"]["wall"], floor["wall"])
        lines = [f"# .venv/bin/python tools/bench_release.py {' '.join(sys.argv[1:])}",
                 f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load {load0:.2f} "
                 f"before; a folder of {size / (1 << 30):.2f} GiB (4 weight files and a config), read from the page "
                 f"cache; medians of {args.repeats}",
                 "", "| command | wall s | CPU s | peak RSS MiB | rate vs sha256sum (CPU) |", "|---|---:|---:|---:|---:|"]
        for name, m in med.items():
            rate = floor["cpu"] / m["cpu"] if m["cpu"] > 0 and "start-up" not in name else None
            lines.append(f"| {name} | {m['wall']:.2f} | {m['cpu']:.2f} | {m['rss_mib']:.0f} | "
                         f"{'-' if rate is None else f'{rate:.2f}x'} |")
        ver, start = med["trainledger verify-model"], med["python -c 'import trainledger.cli' (start-up alone)"]
        lines += ["", f"verify-model beyond the fastest one-core hashing here ({fastest:.2f} s): "
                      f"{ver['wall'] - fastest:.2f} s (the interpreter and imports alone: {start['wall']:.2f} s); "
                      "sha256sum here does not use the CPU's SHA instructions, OpenSSL (which hashlib uses) does",
                  f"# load {os.getloadavg()[0]:.2f} after"]
        text = "\n".join(lines) + "\n"
        sys.stdout.write(text)
        if args.out:
            Path(args.out).write_text(text)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
