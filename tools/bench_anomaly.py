#!/usr/bin/env python3
"""Detection quality of the health monitor's defaults against published spike rules.

    .venv/bin/python tools/bench_anomaly.py            # 5 seeds x 10,000 steps x 2 noises x 2 series

Synthetic curves, seeded: a loss that decays as a power law toward a floor,
and a grad norm that decays likewise on a log scale, plus Gaussian noise or
heavy-tailed Student-t(3) noise. Twenty spikes per curve, each 15 robust
sigma high at its first step and halving for three more steps. NaN and inf
values are injected too. Every detector sees the same curves:

- trainledger: ``training.health.detectors`` with the monitor's defaults (window 64,
  16 warm-up values, z > 8 on the robust z-score of the log loss and log grad norm, confirmation rule);
- OLMo-core: value > mean + 6 std of the previous 128 values;
- Megatron: value > 10 x the max of the first 100 values;
- llm-foundry: value > 2 x the mean of the previous 100 values, 4 steps in a row (patience 4);
- Lightning: value > 3 x the mean of the previous 100 values.

The baselines are our reimplementations of those rules as documented, not
the projects' code. A spike counts as found when flagged within one step of
its start; any other flag is a false alarm (a flag inside a spike's four
steps is neither).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import deque
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainledger.journal import StepObserved  # noqa: E402
from trainledger.training.health.detectors import HealthProjection, RunConfigured  # noqa: E402

STEPS = 10_000
SPIKES = 20
SPIKE_SIGMA = 15.0
DECAY = [1.0, 0.5, 0.25, 0.125]
# Robust sigma (1.4826 x MAD) of unit-scale noise: 1 for a Gaussian, 1.4826 x 0.7649 for Student-t(3).
ROBUST_SIGMA = {"gaussian": 1.0, "student_t3": 1.4826 * 0.76489}


def make_series(seed: int, noise: str, series: str):
    rng = np.random.default_rng(seed * 1000 + (noise == "student_t3") * 7 + (series == "grad_norm") * 13)
    t = np.arange(STEPS, dtype=np.float64)
    if series == "loss":
        base, scale = 2.0 + 3.0 * (1 + t / 50) ** -0.5, 0.02
    else:  # log grad norm
        base, scale = np.log(0.8 + 0.5 * (1 + t / 100) ** -0.5), 0.05
    eps = rng.standard_normal(STEPS) if noise == "gaussian" else rng.standard_t(3, STEPS)
    x = base + scale * eps
    sigma = scale * ROBUST_SIGMA[noise]
    starts = []
    while len(starts) < SPIKES:
        s = int(rng.integers(300, STEPS - 10))
        if all(abs(s - o) > 200 for o in starts):
            starts.append(s)
    starts.sort()
    for s in starts:
        for j, f in enumerate(DECAY):
            x[s + j] += SPIKE_SIGMA * sigma * f
    if series == "grad_norm":
        x = np.exp(x)
    return x.tolist(), starts


# ---------------------------------------------------------------- detectors: step -> flagged steps


def ours(values, series, **params):
    params.setdefault("loss_scale", "log")  # the monitor's defaults (TrainingHealthMonitor): the log scale (1.4)
    if params["loss_scale"] == "log" and params.get("spike_rule", "range") == "range":  # ... and the range rule (1.6)
        from trainledger.training.health.detectors import RANGE_DEFAULTS

        params = {**RANGE_DEFAULTS, **params}
    proj = HealthProjection(RunConfigured(**params))
    flagged = []
    for i, v in enumerate(values):
        ev = StepObserved(step=i, loss=v) if series == "loss" else StepObserved(step=i, loss=1.0, grad_norm=v)
        for a in proj.apply(ev):
            flagged.append((a.step, a.detected_at if a.detected_at is not None else a.step))
    return flagged


def olmo_core(values, series):
    win: deque[float] = deque(maxlen=128)
    out = []
    for i, v in enumerate(values):
        if len(win) == 128:
            m = sum(win) / 128
            sd = math.sqrt(max(0.0, sum(w * w for w in win) / 128 - m * m)) if math.isfinite(m) else math.nan
            if v > m + 6 * sd:
                out.append((i, i))
        win.append(v)
    return out


def megatron(values, series):
    ref = max(values[:100])
    return [(i, i) for i, v in enumerate(values) if i >= 100 and v > 10 * ref]


def llm_foundry(values, series):
    win: deque[float] = deque(maxlen=100)
    out, run = [], 0
    for i, v in enumerate(values):
        if len(win) == 100 and v > 2 * sum(win) / 100:
            run += 1
            if run == 4:
                out.append((i - 3, i))
        else:
            run = 0
        win.append(v)
    return out


def lightning(values, series):
    win: deque[float] = deque(maxlen=100)
    out = []
    for i, v in enumerate(values):
        if len(win) == 100 and v > 3 * sum(win) / 100:
            out.append((i, i))
        win.append(v)
    return out


DETECTORS = {"trainledger (defaults)": ours, "OLMo-core (mean+6σ/128)": olmo_core,
             "Megatron (10× max of first 100)": megatron, "llm-foundry (2× mean, patience 4)": llm_foundry,
             "Lightning (3× mean)": lightning}


def score(flagged, starts):
    found, latencies, false_alarms = 0, [], 0
    spike_steps = {s + j for s in starts for j in range(len(DECAY))}
    by_step = {}
    for step, at in flagged:
        by_step.setdefault(step, at)
    for s in starts:
        hits = [by_step[k] - s for k in (s, s + 1) if k in by_step and by_step[k] - s <= 1]
        if hits:
            found += 1
            latencies.append(min(hits))
    for step, _ in flagged:
        if step not in spike_steps:
            false_alarms += 1
    return found, latencies, false_alarms


def nan_latency() -> dict[str, float | None]:
    """Latency of NaN and inf detection for each detector on a clean Gaussian loss curve."""
    values, _ = make_series(99, "gaussian", "loss")
    values = values[:2000]
    out = {}
    for name, det in DETECTORS.items():
        lat = []
        for bad_at, bad in ((500, math.nan), (1000, math.inf), (1500, math.nan)):
            v = list(values)
            v[bad_at] = bad
            hits = [at - bad_at for step, at in det(v, "loss") if step >= bad_at and at - bad_at <= 5]
            lat.append(min(hits) if hits else None)
        out[name] = None if any(x is None for x in lat) else max(lat)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    args = ap.parse_args()
    rows = []
    for noise in ("gaussian", "student_t3"):
        for series in ("loss", "grad_norm"):
            curves = [make_series(seed, noise, series) for seed in range(args.seeds)]
            for name, det in DETECTORS.items():
                found = total = fa = 0
                lats: list[int] = []
                for values, starts in curves:
                    f, lat, a = score(det(values, series), starts)
                    found += f
                    total += len(starts)
                    fa += a
                    lats += lat
                rows.append((noise, series, name, found / total, fa / (args.seeds * STEPS / 10_000),
                             statistics.fmean(lats) if lats else None))
    print(f"{args.seeds} seeds × {STEPS:,} steps per curve; {SPIKES} spikes of {SPIKE_SIGMA:g} robust σ per curve\n")
    print("| noise | series | detector | recall (≤1 step) | false alarms / 10k steps | mean latency (steps) |")
    print("|---|---|---|---:|---:|---:|")
    for noise, series, name, rec, fa, lat in rows:
        lat_s = "-" if lat is None else f"{lat:.2f}"
        print(f"| {noise} | {series} | {name} | {rec:.1%} | {fa:.1f} | {lat_s} |")
    print("\nNaN / inf loss: worst detection latency in steps (- = missed)\n")
    for name, lat in nan_latency().items():
        print(f"- {name}: {'-' if lat is None else lat}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
