#!/usr/bin/env python3
"""Training-thread stall of a sharded checkpoint: blocking ``dcp.save`` against ``async_save``, under torchrun.

    .venv/bin/python tools/bench_sharded_checkpoint.py [--ranks 2] [--mb 64] [--rounds 5]

Launches ``torchrun --standalone`` with gloo on the CPU; each rank holds a model of about ``--mb`` MB of fp32
weights and saves it ``--rounds`` times each of three ways through ``training.distributed.ShardedCheckpointer``
(which also hashes and records every shard): blocking; in the background with the staging buffers kept from one
save to the next (the default); in the background with fresh buffers every save (``reuse_staging=False``, DCP's
own default), the two background ways alternating. Prints, per rank, the median time the training thread is held:
the whole save when blocking, the staging when in the background (hashing and recording happen after DCP's writes
finish); the kept-buffers median leaves out the first save, which makes the buffers, and prints it apart.
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
from trainledger.training.distributed.ranks import ShardedCheckpointer, init_process_group, open_rank_journal
init_process_group("gloo")
run, mb, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
width = int((mb * 2**20 / 4 / 8) ** 0.5)
m = torch.nn.Sequential(*[torch.nn.Linear(width, width, bias=False) for _ in range(8)])
with open_rank_journal(run, Signer.generate()) as j:
    cks = {"kept": ShardedCheckpointer(run, j), "fresh": ShardedCheckpointer(run, j, reuse_staging=False)}
    block, stall = [], {k: [] for k in cks}
    step = 0
    for r in range(rounds):
        t = time.perf_counter(); cks["kept"].save({"model": m.state_dict()}, step=step); step += 1
        block.append(time.perf_counter() - t)
        for k in (("kept", "fresh") if r % 2 else ("fresh", "kept")):
            t = time.perf_counter(); cks[k].save({"model": m.state_dict()}, step=step, background=True); step += 1
            stall[k].append(time.perf_counter() - t)
            cks[k].wait()
    for ck in cks.values():
        ck.close()
b = statistics.median(block)
kept, fresh = statistics.median(stall["kept"][1:]), statistics.median(stall["fresh"])
line = (f"rank {dist.get_rank()}: {sum(p.numel() for p in m.parameters()) * 4 / 2**20:.0f} MB; blocking save "
      f"{b:.3f} s; background stall {kept:.3f} s ({kept / b:.1%}) with the staging buffers kept (the first save, "
      f"which makes them: {stall['kept'][0]:.3f} s), {fresh:.3f} s ({fresh / b:.1%}) with fresh ones every save "
      f"(DCP's default)")
with open(f"{run}.rank{dist.get_rank()}.txt", "w") as f:  # the ranks' stdout lines can interleave
    f.write(line + "\n")
dist.destroy_process_group()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tl-dcp-") as d:
        script = Path(d) / "worker.py"
        script.write_text(WORKER)
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc_per_node={args.ranks}", str(script), str(Path(d) / "run"), str(args.mb),
                               str(args.rounds)], capture_output=True, text=True, cwd=d,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
        lines = [f.read_text().strip() for f in sorted(Path(d).glob("run.rank*.txt"))]
    print("\n".join(lines) if lines else proc.stderr[-3000:])
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
