"""A plain-PyTorch DDP loop with the Recorder on every rank, one rank's compute slower (run by
test_recorder_stragglers.py).

    python -m torch.distributed.run --nproc_per_node=2 straggler_ddp_worker.py RUN_DIR KEY STEPS EVERY SLOW_X

Each step a rank "computes" for 100 ms before its forward pass (a sleep, so that the verdicts do not depend on the
machine's load), rank 1 for SLOW_X times that; the all-reduce then makes both ranks' steps as long as the slowest's. The
Recorder scores each rank's own time in windows of EVERY steps.
"""

import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainledger.training import Recorder
from trainledger.training.distributed.ranks import init_process_group


def main() -> None:
    run_dir, key, steps, every, slow_x = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
    torch.set_num_threads(1)
    init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rec = Recorder(run_dir, key=key, model=model, optimizer=opt, straggler_every=every)
    torch.manual_seed(1 + rank)
    for step in range(rec.start, steps):
        time.sleep(0.100 * (slow_x if rank == 1 else 1.0))  # this rank's own work: its data, its forward
        x = torch.randn(16, 8)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rec.step(step, loss.item(), tokens=16, batch_size=16)
    rec.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
