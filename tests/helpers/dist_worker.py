"""Run by the distributed tests under real ``torchrun`` (gloo, CPU): one journal per rank, anchors at checkpoints.

    python -m torch.distributed.run --standalone --nproc_per_node=N dist_worker.py RUN_DIR KEY STEPS [DIE_AT]

With DIE_AT, rank 1 kills itself (SIGKILL) at that step on the first attempt: torchrun restarts the group and
every rank continues its journal.
"""

import os
import signal
import sys
import time

import torch.distributed as dist

from trainledger.journal import StepObserved, load_signer
from trainledger.training.distributed.ranks import StragglerDetector, anchor_ranks, init_process_group, open_rank_journal


def main() -> None:
    run_dir, key, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    die_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
    init_process_group("gloo")  # a fresh key prefix each torchrun round (the gloo restart pitfall)
    rank = dist.get_rank()
    first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
    slow = float(os.environ.get("SLOW_RANK1_S", "0")) if dist.get_rank() == 1 else 0.0
    with open_rank_journal(run_dir, load_signer(key)) as j:
        detector = StragglerDetector(j, every=10)
        for step in range(steps):
            if die_at is not None and first_attempt and rank == 1 and step == die_at:
                os.kill(os.getpid(), signal.SIGKILL)
            t0 = time.perf_counter()
            sum(i * i for i in range(2000))  # the "step"
            if slow:
                time.sleep(slow)  # rank 1, when asked: a straggler
            step_time = time.perf_counter() - t0
            j.append(StepObserved(step=step, loss=3.0 - 0.01 * step + 0.001 * rank, step_time_s=step_time, tokens=64))
            detector.observe(step, step_time)
            if (step + 1) % 10 == 0:  # a checkpoint: every rank is here together
                anchor_ranks(j, step=step)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
