#!/usr/bin/env python3
"""The scaling-law fit measured against its targets:

    .venv/bin/python tools/bench_scaling.py [--seeds 0 1 2]

1. ``fit_scaling_law`` on 30 points drawn from Hoffmann et al.'s law with 0.5% noise: time (median of 5) and the
   recovered exponents.
2. The scaling preset (``trainledger ladder``'s default) on each seed, end to end through ``run_pilot_ladder``:
   wall time, the fit's leave-one-out error, the fitted E against the corpus's true entropy rate, and rung iv's
   prediction error and whether its held-out loss fell inside F5's 90% interval.
The Chinchilla benchmark (Epoch AI's extraction of Figure 4) is not here: its CSV could not be fetched.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    import torch

    from trainledger.journal import Journal, Signer, read_events
    from trainledger.ladder.presets import scaling
    from trainledger.ladder.runner import run_pilot_ladder
    from trainledger.ladder.scaling import fit_scaling_law

    true = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}
    rng = random.Random(0)
    pts = []
    for _ in range(30):
        n = 10 ** rng.uniform(7, 10)
        d = n * 10 ** rng.uniform(0.3, 2.0)
        law = true["E"] + true["A"] / n ** true["alpha"] + true["B"] / d ** true["beta"]
        pts.append((n, d, law * math.exp(rng.gauss(0, 0.005))))
    times = []
    for _ in range(5):
        t = time.perf_counter()
        fit = fit_scaling_law(pts)
        times.append(time.perf_counter() - t)
    p = fit.params
    print(f"1. fit_scaling_law, 30 points: {statistics.median(times):.3f} s median of 5 (target 2 s); alpha "
          f"{p['alpha']:.3f} beta {p['beta']:.3f} E {p['E']:.3f} (true 0.34, 0.28, 1.69)", flush=True)

    torch.set_num_threads(1)
    for seed in args.seeds:
        rungs = [dataclasses.replace(r, seed=seed) for r in scaling()]
        with tempfile.TemporaryDirectory() as d:
            j = Journal.create(Path(d) / "ladder.jsonl", signer=Signer.generate())
            t = time.perf_counter()
            res = run_pilot_ladder(rungs, peak_flops_per_sec=1e10, journal=j, work_dir=Path(d) / "rungs")
            wall = time.perf_counter() - t
            j.close()
            (f5,) = [e for e in read_events(Path(d) / "ladder.jsonl")
                     if type(e).__struct_config__.tag == "scaling_fitted"]
        head = res.outcomes[-1]
        measured, predicted = head.measured["eval_loss"], f5.choice["predicted_loss"]
        lo, hi = f5.choice["interval"]
        print(f"2. seed {seed}: {wall:.1f} s end to end; LOO error {f5.loo_error:.2%}; fitted E {f5.params['E']:.3g} "
              f"vs true {f5.entropy_rate:.4g}; headline {f5.choice['candidate']['name']} predicted {predicted:.4f}, "
              f"measured {measured:.4f} (error {abs(measured - predicted) / measured:.2%}), "
              f"{'inside' if lo <= measured <= hi else 'OUTSIDE'} [{lo:.4f}, {hi:.4f}]; "
              f"ladder {'passed' if res.halted_at is None else 'halted at ' + res.halted_at}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
