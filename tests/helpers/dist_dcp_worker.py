"""Run under real torchrun by the sharded-checkpoint test, in one launch: train a tiny model and save it with
DCP at step 4 (blocking) and steps 7 and 9 (in the background, async_save, the second into the staging buffers the
first left); the parameters are changed in place the moment the step-9 save returns, as the next step would; restore
the newest complete checkpoint into a fresh model (it must hold the step-9 values); then rank 1 flips a byte of its
shard and every rank tries again (every rank must refuse, naming rank 1's file).

    python -m torch.distributed.run --standalone --nproc_per_node=2 dist_dcp_worker.py RUN_DIR KEY
Each rank writes its results to RUN_DIR/../out-RANK.txt (their stdout would interleave).
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from trainledger.journal import load_signer
from trainledger.training.checkpoints.state import ResumeRejected
from trainledger.training.distributed.ranks import (
    ShardedCheckpointer,
    init_process_group,
    open_rank_journal,
    restore_sharded,
    save_sharded,
)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))


def total(m) -> str:
    return f"{sum(p.sum().item() for p in m.parameters()):.10f}"


def main() -> None:
    run_dir, key = sys.argv[1], sys.argv[2]
    init_process_group("gloo")
    rank = dist.get_rank()
    out = []
    with open_rank_journal(run_dir, load_signer(key)) as j:
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        with ShardedCheckpointer(run_dir, j) as ck:
            for step in range(10):
                torch.manual_seed(step)
                loss = m(torch.randn(4, 8)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if step == 4:
                    save_sharded(run_dir, j, {"model": m.state_dict()}, step=step)
                elif step in (7, 9):  # in the background (dcp.async_save): recorded once DCP reports it written
                    ck.save({"model": m.state_dict()}, step=step, background=True)
            out.append(f"SAVED {total(m)}")
            with torch.no_grad():  # what the next optimizer step does while the save is being written
                for p in m.parameters():
                    p.add_(1.0)
        # closed: the step-9 save is recorded and the staging buffers are freed
        fresh = model()
        sd = {"model": fresh.state_dict()}
        out.append(f"RESTORED {restore_sharded(run_dir, j, sd).step}")
        fresh.load_state_dict(sd["model"])
        out.append(f"SUM {total(fresh)}")
        if rank == 1:
            shard = Path(run_dir) / "checkpoints" / "step-000000009" / "__1_0.distcp"
            data = bytearray(shard.read_bytes())
            data[-1] ^= 1
            shard.write_bytes(bytes(data))
        dist.barrier()
        try:
            restore_sharded(run_dir, j, {"model": model().state_dict()})
            out.append("NOT REJECTED")
        except ResumeRejected as e:
            out.append(f"REJECTED {e}")
        try:  # the step-4 checkpoint holds no optimizer state: asked for one, every rank says what is missing
            restore_sharded(run_dir, j, {"model": model().state_dict(), "optimizer": {"lr": 0.1}}, step=4)
            out.append("NOT REJECTED")
        except ResumeRejected as e:
            out.append(f"REJECTED {e.code}")
    (Path(run_dir).parent / f"out-{rank}.txt").write_text("\n".join(out) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
