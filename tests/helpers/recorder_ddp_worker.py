"""A plain-PyTorch DDP loop with the Recorder on every rank, as a user writes it (run by test_recorder_ddp.py).

    python -m torch.distributed.run --nproc_per_node=2 --max-restarts=1 recorder_ddp_worker.py RUN_DIR KEY STEPS [DIE_AT]

With DIE_AT, on the first attempt rank 1 kills itself (SIGKILL) at that step, just before the checkpoint every
rank saves there: rank 0 has saved it, rank 1 has not, and the restarted group must resume both from the newest
step they both have.
"""

import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from trainledger.training import Recorder
from trainledger.training.distributed.ranks import init_process_group


def main() -> None:
    run_dir, key, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    die_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
    torch.set_num_threads(1)
    init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rec = Recorder(run_dir, key=key, model=model, optimizer=opt)
    torch.manual_seed(1 + rank + 100 * rec.start)  # each rank's own batches
    for step in range(rec.start, steps):
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
