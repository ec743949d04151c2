"""Run under real torchrun by the resharding test: ``save`` (2 ranks) trains a tiny model, saves it sharded and
leaves the journals open (a preempted job); ``restore`` (1 rank) restores it into a world of one, then again
after a byte of rank 1's shard changed (rank 0 checks rank 1's shards against rank 1's journal).

    python -m torch.distributed.run --standalone --nproc_per_node=N dist_reshard_worker.py RUN_DIR KEY save|restore
Results go to RUN_DIR/../reshard-MODE-RANK.txt.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from trainledger.journal import load_signer
from trainledger.training.checkpoints.state import ResumeRejected
from trainledger.training.distributed.ranks import init_process_group, open_rank_journal, restore_sharded, save_sharded


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 1))


def total(m) -> str:
    return f"{sum(p.double().sum().item() for p in m.parameters()):.12f}"


def main() -> None:
    run_dir, key, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    init_process_group("gloo")
    rank = dist.get_rank()
    out = []
    j = open_rank_journal(run_dir, load_signer(key))
    if mode == "save":
        m = model()
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for step in range(3):
            torch.manual_seed(step)
            loss = m(torch.randn(4, 64)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        save_sharded(run_dir, j, {"model": m.state_dict()}, step=2)
        out.append(f"SAVED {total(m)}")
        j.suspend()  # preempted: the journal stays open for the next launch
    else:
        fresh = model()
        sd = {"model": fresh.state_dict()}
        got = restore_sharded(run_dir, j, sd)
        fresh.load_state_dict(sd["model"])
        out.append(f"RESTORED {got.step} resharded={got.resharded} from={got.saved_world_size} {total(fresh)}")
        shard = Path(run_dir) / got.path / "__1_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 1
        shard.write_bytes(bytes(data))
        try:
            restore_sharded(run_dir, j, {"model": model().state_dict()})
            out.append("NOT REJECTED")
        except ResumeRejected as e:
            out.append(f"REJECTED {e}")
        j.close()
    (Path(run_dir).parent / f"reshard-{mode}-{rank}.txt").write_text("\n".join(out) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
