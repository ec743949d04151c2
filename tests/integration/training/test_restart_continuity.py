"""Restart continuity with a real tiny model: a full-state resume passes, a weights-only one is flagged."""

from __future__ import annotations

import copy
import math

import torch

from trainledger.training.reference.corpus import MarkovSource, random_batches
from trainledger.training.reference.model import build_causal_lm
from trainledger.training.health.monitor import TrainingHealthMonitor

STEPS, CKPT = 160, 120


def _schedule(step: int) -> float:
    warm = 10
    return (step + 1) / warm if step < warm else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warm) / STEPS))


def _setup():
    torch.manual_seed(0)
    model = build_causal_lm(vocab=32, d_model=32, n_layer=2, n_head=2, block=16, dropout=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule)
    return model, opt, sched


def _step(model, opt, sched, batch):
    x, y = batch
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    opt.zero_grad()
    loss.backward()
    gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    opt.step()
    sched.step()
    return float(loss.item()), float(gn.item())


def _run_until_checkpoint():
    tokens = MarkovSource(32, seed=0).sample(30_000, seed=1)
    batches = list(b for _, b in zip(range(STEPS), random_batches(tokens, 16, 16, seed=0)))
    model, opt, sched = _setup()
    monitor = TrainingHealthMonitor(loss_window=64, loss_min_periods=16)
    ckpt = None
    for step in range(STEPS):
        loss, gn = _step(model, opt, sched, batches[step])
        monitor.observe_step(step, loss, grad_norm=gn)
        if step == CKPT:
            ckpt = {"model": copy.deepcopy(model.state_dict()), "opt": copy.deepcopy(opt.state_dict()),
                    "sched": sched.state_dict(), "rng": torch.get_rng_state(), "monitor": monitor.state()}
    return batches, ckpt, monitor


def _resume_and_run(batches, ckpt, monitor, *, full_state: bool):
    model, opt, sched = _setup()
    model.load_state_dict(ckpt["model"])
    if full_state:
        opt.load_state_dict(ckpt["opt"])
        sched.load_state_dict(ckpt["sched"])
        torch.set_rng_state(ckpt["rng"])
    else:  # weights only: optimizer moments and the schedule are lost; Adam restarts at a high rate
        opt = torch.optim.AdamW(model.parameters(), lr=5e-2)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    monitor.observe_resume(CKPT, checkpoint=f"step-{CKPT}")
    found = []
    for step in range(CKPT + 1, CKPT + 8):
        loss, gn = _step(model, opt, sched, batches[step])
        found += monitor.observe_step(step, loss, grad_norm=gn)
    return found, monitor.report()["restarts"]


def test_full_state_resume_is_continuous():
    batches, ckpt, monitor = _run_until_checkpoint()
    found, restarts = _resume_and_run(batches, ckpt, monitor, full_state=True)
    assert found == []
    assert restarts["count"] == 1 and restarts["continuity_ok"] is True


def test_weights_only_resume_is_a_discontinuity():
    batches, ckpt, monitor = _run_until_checkpoint()
    found, restarts = _resume_and_run(batches, ckpt, monitor, full_state=False)
    assert "restart_discontinuity" in [a.kind for a in found]
    assert restarts["continuity_ok"] is False
