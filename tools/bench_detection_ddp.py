"""One rank of tools/bench_detection.py's LM under torchrun (DDP over gloo, 2 ranks on the CPU):

    python -m torch.distributed.run --standalone --nproc_per_node=2 tools/bench_detection_ddp.py \
        SEED STEPS FAULT AT OUT_DIR

The reference causal LM of bench_detection's ``charlm`` (d 48, 2 layers, context 32, this repository's docs as
bytes at tools/bench_corpus.py's commit, AdamW 3e-3 with warm-up and cosine decay), wrapped in
DistributedDataParallel; each rank draws its own batches (a generator seeded by (seed, rank, step)). ``FAULT`` (``none``, ``loss_x50``, ``lr_x50``,
``corrupt_batch``, ``random_tokens``) is injected at step ``AT``: on rank 1's batch alone (its loss and, through
the averaged gradient, both ranks' grad norms), and for ``lr_x50`` on every rank's update. Each rank writes
OUT_DIR/rank-R.json: its per-step loss (its own batch's) and the grad norm before clipping (the averaged gradient).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    seed, steps, fault, at, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), Path(sys.argv[5])
    import torch
    import torch.distributed as dist

    from trainledger.training.reference.model import build_causal_lm
    from bench_corpus import corpus_bytes  # (tools/, this script's folder)

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tokens = torch.tensor(list(corpus_bytes()), dtype=torch.long)  # the docs at a fixed commit
    block = 32
    torch.manual_seed(seed)   # the same initial weights on every rank
    model = torch.nn.parallel.DistributedDataParallel(build_causal_lm(vocab=256, d_model=48, n_layer=2, n_head=4,
                                                                      block=block))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    warm = 100
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * (0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))) + 0.05))
    params = list(model.parameters())
    losses, norms = [], []
    for step in range(steps):
        gen = torch.Generator().manual_seed((seed * 1_000_003 + step) * 7 + rank)
        starts = torch.randint(0, tokens.numel() - block - 1, (16,), generator=gen).tolist()
        x = torch.stack([tokens[s:s + block] for s in starts])
        y = torch.stack([tokens[s + 1:s + 1 + block] for s in starts])
        hit = step == at
        if hit and rank == 1 and fault == "corrupt_batch":
            y = x.clone()
        if hit and rank == 1 and fault == "random_tokens":
            x = torch.randint(0, 256, x.shape, generator=gen)
            y = torch.randint(0, 256, y.shape, generator=gen)
        if hit and fault == "lr_x50":
            for grp in opt.param_groups:
                grp["lr"] *= 50
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        if hit and rank == 1 and fault == "loss_x50":
            loss = loss * 50
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
        opt.step()
        sched.step()   # LambdaLR sets each group's lr from its base: an lr x50 lasts one update
        losses.append(float(loss.item()))
        norms.append(float(norm.item()))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank-{rank}.json").write_text(json.dumps({"loss": losses, "grad_norm": norms}))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
