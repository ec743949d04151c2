#!/usr/bin/env python3
"""What a key held in hardware costs: seal signing through PKCS#11 (Debian's SoftHSM, an Ed25519 key made in a
temporary token) beside the in-process Ed25519 key of a PEM file, signed in place or by the journal's signing thread
(format 1.7: the default for a token), and the training thread's cost of a seal a second and of the default seal
policy (every 1,000 events or second) inside a real training loop.

    .venv/bin/python tools/bench_keys.py                 # 2,000 signatures and seals each; 3 x 3,000 training steps
    .venv/bin/python tools/bench_keys.py --steps 500     # a quick look

Needs softhsm2 (tools/setup.sh --browser installs it) and python-pkcs11 (the dev or pkcs11 extra). Each figure is
from one process, the two keys alternated so that drift on a busy machine hits both alike.
"""

from __future__ import annotations

import argparse
import json
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
    from trainledger.journal.backends.hsm import generate_pkcs11_key
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
        lines += ["", "signatures alone (the key's own cost):", "| key | sign p50 µs | sign p99 µs |", "|---|---:|---:|"]
        for k in keys:
            lines.append(f"| {k} | {_pct(sign[k], .5) * 1e6:.0f} | {_pct(sign[k], .99) * 1e6:.0f} |")

        hsm = keys["SoftHSM (PKCS#11)"]
        variants = {"PEM file, signed in place": (keys["PEM file (in-process Ed25519)"], False),
                    "SoftHSM, signed in place": (hsm, False),
                    "SoftHSM, signed in the background (its default)": (hsm, True)}
        seal = {k: [] for k in variants}
        late: dict[str, list[int]] = {k: [] for k in variants}
        # the background thread on (it fsyncs a seal, off the appending thread, as in a run), its own seals and
        # flushes off: every seal here is one this loop asks for
        js = {k: Journal.create(tmp / f"seal-{i}.jsonl", signer=s, sign_in_background=bg, seal_every=10**9,
                                seal_interval_s=3600, flush_interval_s=3600)
              for i, (k, (s, bg)) in enumerate(variants.items())}
        for i in range(args.n):
            for k, j in js.items():
                j.append(StepObserved(step=i, loss=1.0))
                t = time.perf_counter()
                j.seal()
                seal[k].append(time.perf_counter() - t)
                while j._job is not None and not j._job.done.is_set():  # the next seal is not skipped
                    time.sleep(0.0001)
        for k, j in js.items():
            j.close()
            late[k] = [json.loads(x).get("waited_ms", 0) for x in j.path.read_text().splitlines()
                       if '"kind":"seal_signed"' in x]
        lines += ["", "a seal (the tree head, the line, its signature or its hand-off), timed on the appending thread; "
                      "for the background signer, how late the signature line came (waited_ms, the seal_signed "
                      "lines):", "| seal | appending thread p50 µs | p99 µs | signature late p50 ms | p99 ms |",
                  "|---|---:|---:|---:|---:|"]
        for k in variants:
            lt = late[k]
            lines.append(f"| {k} | {_pct(seal[k], .5) * 1e6:.0f} | {_pct(seal[k], .99) * 1e6:.0f} | "
                         f"{_pct(lt, .5) if lt else '-'} | {_pct(lt, .99) if lt else '-'} |")

        def loop(signer, r: int, policy: dict, bg: bool | None) -> tuple[float, list[float], float]:
            """Mean step time (ms) of an MLP (256-1024-1, batches of 256) on CPU, one thread, each step appended
            under ``policy``; the appends' own times (s); the process CPU time of the loop (s, every thread's)."""
            torch.manual_seed(r)
            model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1))
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            x, y = torch.randn(256, 256), torch.randn(256, 1)
            j = None if signer is None else Journal.create(tmp / f"loop-{time.time_ns()}.jsonl", signer=signer,
                                                           sign_in_background=bg, **policy)
            appends = []
            c0, t0 = time.process_time(), time.perf_counter()
            for step in range(args.steps):
                loss = torch.nn.functional.mse_loss(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                lv = float(loss.detach())  # the host sync every variant makes
                if j is not None:
                    a = time.perf_counter()
                    j.append(StepObserved(step=step, loss=lv))
                    appends.append(time.perf_counter() - a)
            dt = (time.perf_counter() - t0) / args.steps * 1e3
            cpu = time.process_time() - c0
            if j is not None:
                j.close()
            return dt, appends, cpu
        policies = {"no seal (baseline)": dict(seal_every=10**9, seal_interval_s=10**6),
                    "a seal a second": dict(seal_every=10**9, seal_interval_s=1.0),
                    "the default (1,000 events or a second)": {}}
        loop(None, -1, {}, None)  # warm-up: torch's first steps are slower
        lines += ["", f"a training loop, {args.steps:,} steps x {args.repeats} (an MLP 256-1024-1, batches of 256, CPU, "
                      "one thread), each step appended; the training thread's time in append() is the journal's cost "
                      "to the step (the step-time differences between runs are noise of a few percent); CPU: the "
                      "whole process's, every thread, per step:",
                  "| seal policy | key | step ms (median of runs) | append mean µs | append p99 µs | append / step | "
                  "seals / step (append time over the baseline's) | CPU ms a step |", "|---|---|---:|---:|---:|---:|---:|---:|"]
        base = [loop(None, r, {}, None) for r in range(args.repeats)]
        lines.append(f"| - | no journal | {statistics.median(b[0] for b in base):.3f} | | | | | "
                     f"{statistics.median(b[2] for b in base) / args.steps * 1e3:.3f} |")
        results: dict[tuple[str, str], tuple[float, float, float, float]] = {}
        for r in range(args.repeats):  # the variants interleaved, so that drift on a busy machine hits them alike
            for pname, policy in policies.items():
                for k, (s, bg) in variants.items():
                    results.setdefault((pname, k), []).append(loop(s, r, policy, bg))
        for (pname, k), got in results.items():
            step = statistics.median(g[0] for g in got)
            ap = [a for g in got for a in g[1]]
            mean = statistics.fmean(ap)
            b = statistics.fmean(a for g in results[("no seal (baseline)", k)] for a in g[1])
            extra = "" if pname.startswith("no seal") else f"{(mean - b) * 1e3 / step:+.3%}"
            lines.append(f"| {pname} | {k} | {step:.3f} | {mean * 1e6:.1f} | {_pct(ap, .99) * 1e6:.1f} | "
                         f"{mean * 1e3 / step:.3%} | {extra} | {statistics.median(g[2] for g in got) / args.steps * 1e3:.3f} |")
        import resource

        lines.append(f"# peak RSS of the whole process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} "
                     "MiB")
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
