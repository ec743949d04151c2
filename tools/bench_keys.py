#!/usr/bin/env python3
"""What a key held in hardware costs: seal signing through PKCS#11 (Debian's SoftHSM, an Ed25519 key made in a
temporary token) beside the in-process Ed25519 key of a PEM file, and the step-time overhead of the default seal
policy (a seal every 1,000 events or second) inside a real training loop.

    .venv/bin/python tools/bench_keys.py                 # 2,000 signatures and seals each; 3 x 3,000 training steps
    .venv/bin/python tools/bench_keys.py --steps 500     # a quick look

Needs softhsm2 (tools/setup.sh --browser installs it) and python-pkcs11 (the dev or pkcs11 extra). Each figure is
from one process, the two keys alternated so that drift on a busy machine hits both alike.
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
MODULE = next((p for p in ("/usr/lib/softhsm/libsofthsm2.so", "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so")
               if Path(p).is_file()), None)


def _token(tmp: Path) -> str:
    (tmp / "tokens").mkdir()
    conf = tmp / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {tmp / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n")
    os.environ["SOFTHSM2_CONF"] = str(conf)
    subprocess.run(["softhsm2-util", "--init-token", "--free", "--label", "bench", "--pin", "1234", "--so-pin", "5678"],
                   check=True, capture_output=True)
    pin = tmp / "pin"
    pin.write_text("1234")
    pin.chmod(0o600)
    return f"pkcs11:token=bench;object=run?module-path={MODULE}&pin-source=file:{pin}"


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="signatures and seals timed per key (2,000)")
    ap.add_argument("--steps", type=int, default=3000, help="training steps per loop run (3,000)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="also write the output here")
    args = ap.parse_args()
    if MODULE is None or shutil.which("softhsm2-util") is None:
        ap.error("needs Debian's softhsm2 (tools/setup.sh --browser installs it)")
    import torch

    from trainledger.journal import Journal, Signer, StepObserved
    from trainledger.journal.hsm import generate_pkcs11_key
    from trainledger.journal.keys import load_signer

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="tl-keys-"))
    load0 = os.getloadavg()[0]
    lines = [f"# .venv/bin/python tools/bench_keys.py {' '.join(sys.argv[1:])}",
             f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load {load0:.2f} before"]
    try:
        uri = _token(tmp)
        generate_pkcs11_key(uri)
        keys = {"PEM file (in-process Ed25519)": Signer.generate(), "SoftHSM (PKCS#11)": load_signer(uri)}
        msg = b"trainledger/run-id\n123456\n" + b"A" * 44 + b"\n" + b"B" * 70  # a checkpoint note's size
        sign = {k: [] for k in keys}
        for _ in range(args.n):
            for k, s in keys.items():
                t = time.perf_counter()
                s.sign(msg)
                sign[k].append(time.perf_counter() - t)
        seal = {k: [] for k in keys}
        js = {k: Journal.create(tmp / f"seal-{i}.jsonl", signer=s, background=False) for i, (k, s) in
              enumerate(keys.items())}
        for i in range(args.n):
            for k, j in js.items():
                j.append(StepObserved(step=i, loss=1.0))
                t = time.perf_counter()
                j.seal()
                seal[k].append(time.perf_counter() - t)
        for j in js.values():
            j.close()
        lines += ["", "| key | sign p50 µs | sign p99 µs | seal p50 µs | seal p99 µs |", "|---|---:|---:|---:|---:|"]
        for k in keys:
            lines.append(f"| {k} | {_pct(sign[k], .5) * 1e6:.0f} | {_pct(sign[k], .99) * 1e6:.0f} | "
                         f"{_pct(seal[k], .5) * 1e6:.0f} | {_pct(seal[k], .99) * 1e6:.0f} |")

        def loop(signer, r: int) -> float:
            """Mean step time (ms) of an MLP (256-1024-1, batches of 256) on CPU, one thread, each step appended; the
            journal's default seal policy (every 1,000 events or second)."""
            torch.manual_seed(r)
            model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            x, y = torch.randn(256, 256), torch.randn(256, 1)
            j = None if signer is None else Journal.create(tmp / f"loop-{time.time_ns()}.jsonl", signer=signer)
            t0 = time.perf_counter()
            for step in range(args.steps):
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                lv = float(loss.detach())  # the host sync every variant makes
                if j is not None:
                    j.append(StepObserved(step=step, loss=lv))
            dt = (time.perf_counter() - t0) / args.steps * 1e3
            if j is not None:
                j.close()
            return dt
        runs = {"no journal": [], **{k: [] for k in keys}}
        loop(None, -1)  # warm-up: torch's first steps are slower
        for r in range(args.repeats):
            runs["no journal"].append(loop(None, r))
            for k, s in keys.items():
                runs[k].append(loop(s, r))
        base = statistics.median(runs["no journal"])
        lines += ["", f"a training loop, {args.steps:,} steps x {args.repeats} (an MLP 256-1024-1, batches of 256, CPU, one "
                      "thread), each step "
                      "appended, the default seal policy:", "| journal | mean step ms (median of runs) | over no "
                      "journal |", "|---|---:|---:|"]
        for k, v in runs.items():
            m = statistics.median(v)
            lines.append(f"| {k} | {m:.3f} | {'' if k == 'no journal' else f'{(m - base) / base:+.2%}'} |")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    lines.append(f"# load {os.getloadavg()[0]:.2f} after")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
