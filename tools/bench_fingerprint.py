#!/usr/bin/env python3
"""What ``batch_fingerprint`` costs per call, beside the training step it rides on, on the CPU with one thread.

    .venv/bin/python tools/bench_fingerprint.py            # a 64x256 float batch and its 64 labels, 5 rounds

Each round times 2,000 calls of ``batch_fingerprint(x, y)`` and 2,000 steps of an MLP 256-256-1 (AdamW) on the
same batch, and reports the median of the per-round means; the process's CPU time and peak memory and the load
average are printed with them (output kept in docs/bench/fingerprint.txt).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch

    from trainledger.training.health.fingerprint import batch_fingerprint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 256, generator=g), torch.randint(0, 10, (64,), generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    target = y.float().unsqueeze(1)
    load0, t0, c0 = os.getloadavg()[0], time.perf_counter(), time.process_time()
    fps, steps = [], []
    for _ in range(args.rounds):
        s = time.perf_counter()
        for _ in range(args.calls):
            batch_fingerprint(x, y)
        fps.append((time.perf_counter() - s) / args.calls)
        s = time.perf_counter()
        for _ in range(args.calls):
            loss = torch.nn.functional.mse_loss(model(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
        steps.append((time.perf_counter() - s) / args.calls)
    fp, st = statistics.median(fps), statistics.median(steps)
    print(f"batch_fingerprint(64x256 float, 64 int64 labels): {fp * 1e6:.1f} µs a call "
          f"(rounds {min(fps) * 1e6:.1f}-{max(fps) * 1e6:.1f})")
    print(f"the MLP 256-256-1 AdamW step on that batch: {st * 1e6:.0f} µs; the fingerprint is {fp / st:.1%} of it")
    print(f"one thread; wall {time.perf_counter() - t0:.1f} s, CPU {time.process_time() - c0:.1f} s, peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB, load {load0:.2f} -> "
          f"{os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
