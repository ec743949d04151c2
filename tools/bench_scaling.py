#!/usr/bin/env python3
"""The scaling-law fit measured against its targets:

    .venv/bin/python tools/bench_scaling.py [--seeds 0 1 2]

1. ``fit_scaling_law`` on 30 points drawn from Hoffmann et al.'s law with 0.5% noise: time (median of 5) and the
   recovered exponents.
2. The scaling preset (``trainledger ladder``'s default) on each seed, end to end through ``run_pilot_ladder``:
   wall time, the fit's leave-one-out error, the fitted E against the corpus's true entropy rate, and rung iv's
   prediction error and whether its held-out loss fell inside F5's 90% interval. ``--compare``: the six pilots the
   preset had before its IsoFLOP grid (tokens growing with size; their fit put E at 0) on the same seeds, one after
   the other, the same headline rung sizing from them.
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
    ap.add_argument("--compare", action="store_true", help="also the six pilots the preset had before its grid")
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
    layouts = [("grid", scaling())] + ([("six", _six_pilots(scaling()))] if args.compare else [])
    for seed, (layout, preset) in ((s, lay) for s in args.seeds for lay in layouts):
        rungs = [dataclasses.replace(r, seed=seed) for r in preset]
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
        warned = len(f5.choice.get("fit_warnings") or [])
        print(f"2. seed {seed}, {layout}: {wall:.1f} s end to end; LOO error {f5.loo_error:.2%}; fitted E "
              f"{f5.params['E']:.3g} vs true {f5.entropy_rate:.4g}, beta {f5.params['beta']:.3f}, {warned} fit "
              f"warning{'s' if warned != 1 else ''}; headline {f5.choice['candidate']['name']} predicted {predicted:.4f}, "
              f"measured {measured:.4f} (error {abs(measured - predicted) / measured:.2%}), "
              f"{'inside' if lo <= measured <= hi else 'OUTSIDE'} [{lo:.4f}, {hi:.4f}]; "
              f"ladder {'passed' if res.halted_at is None else 'halted at ' + res.halted_at}", flush=True)
    return 0


def _six_pilots(preset: list) -> list:
    """The preset's pilots as they were before the IsoFLOP grid (widths 4-16, 150-1,200 steps, tokens growing with
    size), before the same headline rung."""
    import dataclasses

    first, head = preset[0], preset[-1]
    six = [(4, 1, 150), (4, 1, 600), (8, 1, 250), (8, 1, 900), (12, 2, 400), (16, 2, 1200)]
    return [dataclasses.replace(first, name=f"pilot_{k + 1}_d{w}_L{n}_{steps}", d_model=w, n_layer=n,
                                n_head=max(1, w // 8), steps=steps) for k, (w, n, steps) in enumerate(six)] + [head]


if __name__ == "__main__":
    sys.exit(main())
