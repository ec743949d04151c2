#!/usr/bin/env python3
"""False alarms of the loss-spike detector on curves with no spike in them, beside its recall on the held-out spikes.

    .venv/bin/python tools/bench_false_alarms.py             # the MLP (20,000 steps, 2 seeds) + 40 synthetic curves
    .venv/bin/python tools/bench_false_alarms.py --steps 2000 --seeds 1    # a quick look

Every curve is folded through the health projection three times: with ``loss_scale="linear"`` (the rule before
journal format 1.4: the robust z-score of the raw loss), ``loss_scale="log"`` (formats 1.4-1.5: of its logarithm)
and the default from 1.6 (the log scale and the "range" rule).
Any loss flag on these curves is a false alarm (none has a spike in it):

- **MLP regression**, the case a user reported: a 32-256-256-1 ReLU MLP (AdamW, lr 1e-3, batches of 64, fresh
  batches every step) fitting ``y = sin(x . w / 4)`` for a fixed random ``w``, so the loss falls toward 1e-4 and each batch's loss
  is heavy-tailed around its level; real torch on the CPU, one thread;
- **converging synthetic curves**: a power-law or exponential decay toward a floor near zero (1e-5 to 1e-2) with
  multiplicative noise, log-normal or log-Student-t(3), of width 0.1 to 0.8 in log units; seeded.

Then the held-out spike benchmark (``tools/bench_anomaly.py``'s curves, 20 spikes of 15 robust sigma) is scored
under both scales: recall within one step, false alarms and latency, so a change that cut false alarms by going
blind shows here.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainledger.journal import StepObserved  # noqa: E402
from trainledger.training.health.detectors import RANGE_DEFAULTS, HealthProjection, RunConfigured  # noqa: E402

#: the rules compared: the seed's (raw loss), formats 1.4-1.5's (log loss), and the default from 1.6
RULES = {"linear": {"loss_scale": "linear"}, "log": {"loss_scale": "log", "spike_rule": None},
         "range": {"loss_scale": "log", **RANGE_DEFAULTS}}



def mlp_losses(steps: int, seed: int) -> list[float]:
    """The per-step batch losses of the reported MLP regression (real training, one thread)."""
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    w = torch.randn(32, 1, generator=g)
    student = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                  torch.nn.ReLU(), torch.nn.Linear(256, 1))
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    out = []
    for _ in range(steps):
        x = torch.randn(64, 32, generator=g)
        with torch.no_grad():
            y = torch.sin(x @ w / 4)
        loss = torch.nn.functional.mse_loss(student(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def synthetic(seed: int, steps: int) -> list[float]:
    """A converging curve with multiplicative noise and no spike (see the module docstring)."""
    rng = np.random.default_rng(10_000 + seed)
    t = np.arange(steps, dtype=np.float64)
    floor = 10.0 ** rng.uniform(-5, -2)
    start = rng.uniform(0.5, 3.0)
    if seed % 2:
        level = floor + (start - floor) * (1 + t / rng.uniform(20, 200)) ** -rng.uniform(0.5, 2.0)
    else:
        level = floor + (start - floor) * np.exp(-t / rng.uniform(steps / 20, steps / 4))
    width = rng.uniform(0.1, 0.8)
    eps = rng.standard_normal(steps) if seed % 4 < 2 else rng.standard_t(3, steps) * 0.6
    return (level * np.exp(width * eps)).tolist()


def loss_flags(values: list[float], rule: str, ratios: list[float] | None = None) -> int:
    """The loss_spike flags on ``values`` under ``RULES[rule]``; ``ratios`` gets each flagged value over its baseline
    median."""
    import math

    proj = HealthProjection(RunConfigured(**RULES[rule]))
    n = 0
    for i, v in enumerate(values):
        for a in proj.apply(StepObserved(step=i, loss=v)):
            if a.anomaly == "loss_spike":
                n += 1
                if ratios is not None:
                    # formats 1.4-1.5 report the log's median; the range rule reports the loss's own (as linear)
                    base = math.exp(a.baseline_median) if rule == "log" else a.baseline_median
                    ratios.append(a.value / base if base > 0 else math.inf)
    return n


def held_out(seeds: int) -> dict[str, tuple[float, float, float]]:
    """bench_anomaly's loss curves (Gaussian and Student-t noise): recall, false alarms / 10k steps, latency."""
    import bench_anomaly as B

    out = {}
    for scale in RULES:
        found = total = fa = 0
        lats: list[int] = []
        for noise in ("gaussian", "student_t3"):
            for seed in range(seeds):
                values, starts = B.make_series(seed, noise, "loss")
                f, lat, a = B.score(B.ours(values, "loss", **RULES[scale]), starts)
                found, total, fa, lats = found + f, total + len(starts), fa + a, lats + lat
        out[scale] = (found / total, fa / (2 * seeds * B.STEPS / 10_000), statistics.fmean(lats) if lats else -1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20_000, help="MLP steps per seed (20,000)")
    ap.add_argument("--seeds", type=int, default=2, help="MLP seeds (2)")
    ap.add_argument("--curves", type=int, default=40, help="synthetic curves (40)")
    ap.add_argument("--curve-steps", type=int, default=10_000)
    args = ap.parse_args()
    t0, c0 = time.perf_counter(), time.process_time()
    load = os.getloadavg()[0]
    print(f"# {platform.node()} ({os.cpu_count()} cores), load {load:.2f} at start\n")
    print("| curves | steps | final loss (median) | loss flags per 1,000 steps: linear | log (1.4-1.5) | "
          "default (1.6) |")
    print("|---|---:|---:|---:|---:|---:|")
    mlp = [mlp_losses(args.steps, s) for s in range(args.seeds)]
    rows = [("MLP 32-256-256-1 regression", mlp),
            ("synthetic, converging to 1e-5..1e-2", [synthetic(s, args.curve_steps) for s in range(args.curves)])]
    for name, curves in rows:
        steps = sum(len(c) for c in curves)
        flags = {sc: sum(loss_flags(c, sc) for c in curves) for sc in RULES}
        final = statistics.median(statistics.median(c[-200:]) for c in curves)
        print(f"| {name} ({len(curves)}) | {steps:,} | {final:.2g} | {1000 * flags['linear'] / steps:.2f} "
              f"| {1000 * flags['log'] / steps:.2f} | {1000 * flags['range'] / steps:.2f} |")
        if curves is mlp:
            ratios: dict[str, list[float]] = {"linear": [], "log": [], "range": []}
            per = {r: [f"{1000 * loss_flags(c, r, ratios[r]) / len(c):.2f}" for c in curves] for r in ("log", "range")}
            for c in curves:
                loss_flags(c, "linear", ratios["linear"])
            q = {k: sorted(v) for k, v in ratios.items()}
            seeds_line = (f"per MLP seed: {', '.join(per['log'])} flags per 1,000 steps under 1.4-1.5's rule, "
                          f"{', '.join(per['range'])} under the default. A flagged step's loss over its window's "
                          "median: " + "; ".join(f"{k} rule min {v[0]:.1f}x, median {statistics.median(v):.1f}x"
                                                 for k, v in q.items() if v))
    print(f"\n{seeds_line}")
    print("\nHeld-out spikes (tools/bench_anomaly.py's loss curves, 5 seeds x 2 noises, 20 spikes of 15 robust σ each)\n")
    print("| loss_scale | recall (≤1 step) | false alarms / 10k steps | mean latency (steps) |")
    print("|---|---:|---:|---:|")
    for scale, (rec, fa, lat) in held_out(5).items():
        print(f"| {scale} | {rec:.1%} | {fa:.1f} | {lat:.2f} |")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nwall {time.perf_counter() - t0:.1f} s, CPU {time.process_time() - c0:.1f} s, peak RSS {peak:.0f} MiB, "
          f"load {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
