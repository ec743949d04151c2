"""The compute statement of a simulated frontier run, for docs/compute.md: 16,384 GPUs for 90 days. SIMULATED: no such
run was measured here (this machine has no GPU). Each rank's ``compute_totaled`` is made from stated assumptions (the
model's shape, tokens a step, a step's time at an assumed MFU against the datasheet peak, NVML energy at an assumed
mean power over an assumed share of the device time), and the statement's figures come from the same functions
``trainledger compute`` and ``verify-proof`` use (journal/statements/compute/figures.py).

    .venv/bin/python tools/compute_example.py [--out docs/bench/compute_example.txt]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the assumptions, each stated in the output
GPUS = 16_384
DAYS = 90
N_PARAMS, N_LAYER, N_HEAD, HEAD_DIM, SEQ = 405_000_000_000, 126, 128, 128, 8192  # a 405B dense transformer's shape
PEAK = 989e12  # H100 SXM dense BF16, datasheet
MFU = 0.40  # assumed
BUSY = 0.95  # share of the 90 days spent in steps (the rest: restarts, checkpoints, evaluation)
WATTS = 600.0  # assumed mean board power in steps
COVERED = 0.98  # share of device time the energy counter's samples span


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from trainledger.journal.statements.compute.figures import DEFAULT_COMPUTE_THRESHOLDS, model_figures, run_figures
    from trainledger.journal.statements.compute.render import as_markdown
    from trainledger.training.health.mfu import model_flops_per_token

    fpt = model_flops_per_token(N_PARAMS, N_LAYER, N_HEAD, HEAD_DIM, SEQ)
    span_s = DAYS * 86400.0
    busy_s = span_s * BUSY
    flops_per_gpu = MFU * PEAK * busy_s  # what each GPU's steps did
    tokens = int(flops_per_gpu // fpt)
    start = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z
    compute = {"kind": "compute_totaled", "steps": int(busy_s // 6.0), "tokens": tokens, "flops": float(tokens * fpt),
               "busy_s": busy_s,
               "hardware": [{"devices": 1, "peak_flops_per_sec": PEAK, "peak_source": "datasheet",
                             "device_kind": "NVIDIA H100 80GB HBM3", "steps": int(busy_s // 6.0), "busy_s": busy_s}],
               "started_ns": start, "ended_ns": start + int(span_s * 1e9),
               "energy_j": WATTS * span_s * COVERED, "energy_s": span_s * COVERED}
    runs = [{"run": "simulated-405b", "figures": run_figures([{"compute": compute}] * GPUS), "base_run": None,
             "path": "(simulated)", "world_size": GPUS, "continues": None, "base": None,
             "journals": [{"rank": r, "crossings": []} for r in range(GPUS)]}]
    st = {"runs": runs, "figures": model_figures(runs, DEFAULT_COMPUTE_THRESHOLDS), "findings": [], "notes": [],
          "not_proven": "SIMULATED from the assumptions above: nothing was measured."}
    head = (f"# tools/compute_example.py: SIMULATED, not measured. {GPUS:,} GPUs x {DAYS} days; a {N_PARAMS / 1e9:.0f}B "
            f"dense model (L={N_LAYER}, H={N_HEAD}, Q={HEAD_DIM}, T={SEQ}: {fpt:.3g} FLOP a token); MFU {MFU:.0%} of "
            f"the {PEAK / 1e12:.0f} TFLOP/s datasheet peak; {BUSY:.0%} of the time in steps; {WATTS:.0f} W mean board "
            f"power; the energy counter sampled over {COVERED:.0%} of the device time\n\n")
    text = head + as_markdown(st)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
