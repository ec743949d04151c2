#!/usr/bin/env python3
"""Training-thread stall of a sharded checkpoint: blocking ``dcp.save`` against ``async_save``, under torchrun.

    .venv/bin/python tools/bench_sharded_checkpoint.py [--ranks 2] [--mb 64] [--rounds 3]

Launches ``torchrun --standalone`` with gloo on the CPU; each rank holds a model of about ``--mb`` MB of fp32
weights and saves it ``--rounds`` times each way through ``training.distributed.ShardedCheckpointer`` (which also
hashes and records every shard). Prints, per rank, the median time the training thread is held: the whole save
when blocking, the staging when in the background (hashing and recording happen after DCP's writes finish).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

WORKER = r"""
import statistics, sys, time, torch
import torch.distributed as dist
from trainledger.journal import Signer
from trainledger.training.distributed import ShardedCheckpointer, init_process_group, open_rank_journal
init_process_group("gloo")
run, mb, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
width = int((mb * 2**20 / 4 / 8) ** 0.5)
m = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(8)])
with open_rank_journal(run, Signer.generate()) as j:
    ck = ShardedCheckpointer(run, j)
    block, stall = [], []
    for r in range(rounds):
        t = time.perf_counter(); ck.save({"model": m.state_dict()}, step=2 * r); block.append(time.perf_counter() - t)
        t = time.perf_counter(); ck.save({"model": m.state_dict()}, step=2 * r + 1, background=True)
        stall.append(time.perf_counter() - t)
        ck.wait()
print(f"rank {dist.get_rank()}: {sum(p.numel() for p in m.parameters()) * 4 / 2**20:.0f} MB; blocking save "
      f"{statistics.median(block):.3f} s, background stall {statistics.median(stall):.3f} s "
      f"({statistics.median(stall) / statistics.median(block):.1%})", flush=True)
dist.destroy_process_group()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tl-dcp-") as d:
        script = Path(d) / "worker.py"
        script.write_text(WORKER)
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc_per_node={args.ranks}", str(script), str(Path(d) / "run"), str(args.mb),
                               str(args.rounds)], capture_output=True, text=True, cwd=d,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines = sorted(x for x in proc.stdout.splitlines() if x.startswith("rank "))
    print("\n".join(lines) if lines else proc.stderr[-3000:])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
