"""A small training run used by the resume tests, run in fresh processes.

    python resume_run.py MODE RUN_DIR KEY OUT      MODE: control | first | resume

control: 30 steps straight. first: 15 steps, checkpoint, stop without closing.
resume: reopen the journal, restore the checkpoint, run steps 16-30.
OUT gets the losses and final parameters (torch.save).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from trainledger.journal import Journal, StepObserved, load_signer  # noqa: E402
from trainledger.training.checkpoints.state import restore_checkpoint, save_checkpoint  # noqa: E402
from trainledger.training.reference.corpus import BatchSampler, MarkovSource  # noqa: E402
from trainledger.training.reference.model import build_causal_lm  # noqa: E402

TOTAL, CUT = 30, 15


def build(seed: int = 0):
    torch.manual_seed(seed)
    model = build_causal_lm(vocab=32, d_model=32, n_layer=2, n_head=2, block=16, dropout=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)

    def lr(step):  # warm-up then cosine
        return (step + 1) / 5 if step < 5 else 0.5 * (1 + math.cos(math.pi * (step - 5) / TOTAL))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr)
    sampler = BatchSampler(MarkovSource(32, seed=0).sample(20_000, seed=1), 8, 16, seed=7)
    return model, opt, sched, sampler


def train_step(model, opt, sched, sampler):
    model.train()
    x, y = sampler.next()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
    return loss.item()


def main() -> None:
    mode, run_dir, key, out = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)  # bitwise-reproducible CPU reductions across processes
    losses = []
    if mode == "control":
        model, opt, sched, sampler = build()
        for _ in range(TOTAL):
            losses.append(train_step(model, opt, sched, sampler))
    elif mode == "first":
        model, opt, sched, sampler = build()
        j = Journal.create(run_dir / "journal.jsonl", signer=load_signer(key), background=False)
        for step in range(CUT):
            losses.append(train_step(model, opt, sched, sampler))
            j.append(StepObserved(step=step, loss=losses[-1]))
        save_checkpoint(run_dir, j, step=CUT - 1, model=model, optimizer=opt, scheduler=sched, sampler=sampler,
                        tokens=CUT * 8 * 16)
        j.suspend()  # the process "dies" here; the run stays open
    elif mode == "resume":
        model, opt, sched, sampler = build(seed=123)  # a fresh process with other initial weights
        j = Journal.open_append(run_dir / "journal.jsonl", signer=load_signer(key), background=False)
        restore_checkpoint(run_dir, j, f"checkpoints/step-{CUT - 1:09d}.pt", model=model, optimizer=opt,
                           scheduler=sched, sampler=sampler)
        for step in range(CUT, TOTAL):
            losses.append(train_step(model, opt, sched, sampler))
            j.append(StepObserved(step=step, loss=losses[-1]))
        j.close()
    else:
        raise SystemExit(f"unknown mode {mode}")
    torch.save({"losses": losses, "params": {k: v.clone() for k, v in model.state_dict().items()}}, out)


if __name__ == "__main__":
    main()
