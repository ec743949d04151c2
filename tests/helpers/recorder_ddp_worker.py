"""A plain-PyTorch DDP loop with the Recorder on every rank, as a user writes it (run by test_recorder_ddp.py and
test_recorder_stragglers.py).

    python -m torch.distributed.run --nproc_per_node=2 --max-restarts=1 recorder_ddp_worker.py RUN_DIR KEY STEPS \
        [DIE_AT|- [EVERY SLOW_X]]

With DIE_AT, on the first attempt rank 1 kills itself (SIGKILL) at that step, just before the checkpoint every
rank saves there: rank 0 has saved it, rank 1 has not, and the restarted group must resume both from the newest
step they both have. With EVERY and SLOW_X, each step a rank "computes" for 100 ms before its forward pass (a
sleep, so that the verdicts do not depend on the machine's load), rank 1 for SLOW_X times that; the all-reduce then
makes both ranks' steps as long as the slowest's, and the Recorder scores each rank's own time in windows of EVERY
steps.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainledger.training import Recorder
from trainledger.training.distributed.ranks import init_process_group


def main() -> None:
    run_dir, key, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    die_at = int(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] != "-" else None
    every, slow_x = (int(sys.argv[5]), float(sys.argv[6])) if len(sys.argv) > 6 else (None, None)
    torch.set_num_threads(1)
    init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rec = Recorder(run_dir, key=key, model=model, optimizer=opt, straggler_every=every)
    torch.manual_seed(1 + rank + 100 * rec.start)  # each rank's own batches
    for step in range(rec.start, steps):
        if slow_x is not None:
            time.sleep(0.100 * (slow_x if rank == 1 else 1.0))  # this rank's own work: its data, its forward
        x = torch.randn(16, 8)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rec.step(step, loss.item(), tokens=16, batch_size=16)
        if (step + 1) % 5 == 0:
            if die_at == step and rank == 1 and os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
                os.kill(os.getpid(), signal.SIGKILL)
            rec.checkpoint(step, data_state={"step": step})
    rec.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
