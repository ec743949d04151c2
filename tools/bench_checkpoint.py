#!/usr/bin/env python3
"""Training-thread stall per checkpoint: blocking versus background saves.

    .venv/bin/python tools/bench_checkpoint.py

A causal LM with about 100 MB of checkpointed state (weights plus AdamW's two
moments) trains on the CPU; every few steps it checkpoints, either blocking
(write, fsync, hash, record) or in the background (snapshot to host memory
in the training thread; write, fsync, hash and record in another thread).
The stall is the time the training thread spends inside the save call.
Reported: median stall per checkpoint for each mode and their ratio, and the
wall time of the whole run for each (the background writer shares the CPU).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainledger.journal import Journal, Signer  # noqa: E402
from trainledger.training.checkpoints.state import Checkpointer  # noqa: E402
from trainledger.training.reference.corpus import BatchSampler, MarkovSource  # noqa: E402
from trainledger.training.reference.model import build_causal_lm  # noqa: E402


def run(tmp: Path, background: bool, steps: int, every: int) -> dict:
    torch.manual_seed(0)
    model = build_causal_lm(vocab=8192, d_model=512, n_layer=2, n_head=8, block=64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sampler = BatchSampler(MarkovSource(64, seed=0).sample(20_000, seed=1), 4, 64, seed=2)
    run_dir = tmp / ("bg" if background else "block")
    j = Journal.create(run_dir / "journal.jsonl", signer=Signer.generate())
    ck = Checkpointer(run_dir, j)
    stalls = []
    t_run = time.perf_counter()
    for step in range(steps):
        x, y = sampler.next()
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % every == 0:
            t = time.perf_counter()
            ck.save(step=step, background=background, model=model, optimizer=opt, sampler=sampler)
            stalls.append(time.perf_counter() - t)
    ck.wait()
    wall = time.perf_counter() - t_run
    j.close()
    state_mb = sum(p.numel() * p.element_size() for p in model.parameters()) * 3 / 1e6
    size_mb = next((run_dir / "checkpoints").iterdir()).stat().st_size / 1e6
    return {"stall_median_s": statistics.median(stalls), "stalls": len(stalls), "wall_s": wall,
            "state_mb": state_mb, "file_mb": size_mb}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=8)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="tl-ckpt-"))
    try:
        block = run(tmp, False, args.steps, args.every)
        bg = run(tmp, True, args.steps, args.every)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"model state ≈ {block['state_mb']:.0f} MB (weights + AdamW moments), checkpoint file {block['file_mb']:.0f} MB, "
          f"{block['stalls']} checkpoints per run")
    print(f"blocking save: training-thread stall median {block['stall_median_s'] * 1e3:.0f} ms; run wall {block['wall_s']:.1f} s")
    print(f"background save: training-thread stall median {bg['stall_median_s'] * 1e3:.0f} ms; run wall {bg['wall_s']:.1f} s")
    print(f"background stall ÷ blocking stall = {bg['stall_median_s'] / block['stall_median_s']:.1%} (target ≤ 25%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
