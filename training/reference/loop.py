"""The reference training loop: small and readable, the one the demo and the ladder use.

It trains the tiny causal LM on a seeded Markov corpus, records every step
through the health monitor into a signed journal, checkpoints every
``ckpt_every`` steps with the full contract, keeps the newest ``keep_last``
checkpoints (recording each deletion), and, when started on a run directory
whose journal is open, resumes from the newest valid checkpoint: same
journal (torn tail repaired), same results as a run that never stopped.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import torch

from trainledger.training.health.mfu import record_compute
from trainledger.training.reference.threads import in_own_threads
from trainledger.journal import Journal, Signer, verify
from trainledger.journal.paths import confined
from trainledger.training.audit import rewind_allowed
from trainledger.training.kinds import CheckpointDeleted

from trainledger.training.checkpoints.state import (
    CheckpointSaved,
    ResumeRejected,
    enforce_retention,
    live_checkpoints,
    restore_checkpoint,
    signed_history,
    save_checkpoint,
)
from trainledger.training.reference.corpus import BatchSampler, MarkovSource
from trainledger.training.health.flops import device_kind, flop_config_from_causal_lm
from trainledger.training.reference.model import build_causal_lm
from trainledger.training.health.monitor import TrainingHealthMonitor
from trainledger.training.checkpoints.rewind import TRIGGERS, DataWindowSkipped, RewindDecided, RewindPolicy, RunStopped

__all__ = ["LoopConfig", "CheckpointDeleted", "run_training", "train_step"]


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    vocab: int = 32
    d_model: int = 32
    n_layer: int = 2
    n_head: int = 2
    block: int = 16
    dropout: float = 0.1
    batch_size: int = 8
    steps: int = 60
    lr: float = 3e-3
    warmup: int = 5
    weight_decay: float = 0.1
    seed: int = 0
    corpus_tokens: int = 20_000
    ckpt_every: int = 10
    keep_last: int = 2
    #: Batches [start, end) replaced by garbage (random targets): a poisoned data shard, for
    #: demonstrating and testing spike rewind. None in real use.
    poison_batches: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "ckpt_every", "keep_last", "batch_size", "corpus_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"LoopConfig.{name} must be at least 1, got {getattr(self, name)!r}")


def warmup_cosine(warmup: int, total: int):
    """The LR factor by update: linear warm-up over ``warmup`` updates, then cosine to zero at ``total``."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return factor


def _build(cfg: LoopConfig):
    torch.manual_seed(cfg.seed)
    model = build_causal_lm(cfg.vocab, cfg.d_model, cfg.n_layer, cfg.n_head, cfg.block, dropout=cfg.dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(cfg.warmup, cfg.steps))
    tokens = MarkovSource(cfg.vocab, seed=cfg.seed).sample(cfg.corpus_tokens, seed=cfg.seed + 1)
    sampler = BatchSampler(tokens, cfg.batch_size, cfg.block, seed=cfg.seed + 2)
    return model, opt, sched, sampler


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, *,
               max_grad_norm: float) -> tuple[float, float]:
    """One optimizer step of next-token cross-entropy; return the loss and the (pre-clip) grad norm.

    The ``.item()`` and ``float()`` here are host-device syncs, one of each per step (fine on the CPU;
    see ``training/health/monitor.py`` for batching them on a GPU).
    """
    model.train()
    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_grad_norm)
    optimizer.step()
    return loss.item(), float(grad_norm)


def _rewind(run: Path, j: Journal, policy: RewindPolicy, spike: Any, target: CheckpointSaved, model, opt, sched,
            sampler) -> dict[str, Any]:
    """Record the decision, restore ``target``, skip the data window, scale the LR; return the restore's info."""
    bad_end = sampler.batches_drawn  # every batch up to the spike's has been drawn
    j.append(RewindDecided(spike_step=spike.step, anomaly=spike.kind, checkpoint=target.path, from_step=target.step,
                           skip_batches=policy.skip_batches, lr_scale=policy.lr_scale,
                           reason=f"{spike.kind} at step {spike.step} (value {spike.value:.4g})",
                           max_rewinds=policy.max_rewinds, window_steps=policy.window_steps), durable=True)
    info = restore_checkpoint(run, j, target.path, model=model, optimizer=opt, scheduler=sched, sampler=sampler)
    start_batch = sampler.batches_drawn
    sampler.skip(max(policy.skip_batches, bad_end - start_batch))
    j.append(DataWindowSkipped(start_batch=start_batch, end_batch=sampler.batches_drawn), durable=True)
    if policy.lr_scale != 1.0:
        sched.base_lrs = [lr * policy.lr_scale for lr in sched.base_lrs]
        for g in opt.param_groups:
            g["lr"] *= policy.lr_scale
    return info


@in_own_threads
def run_training(run_dir: str | Path, *, signer: Signer, config: LoopConfig = LoopConfig(),
                 peak_flops_per_sec: float | None = None, stop_after: int | None = None,
                 rewind: RewindPolicy | None = None) -> dict[str, Any]:
    """Train (or resume) the run in ``run_dir``; return the final losses, parameters and report.

    ``stop_after`` ends this invocation after that many steps without closing
    the run (tests use it, and a preempted job looks like it). ``rewind``
    turns a loss spike (or NaN/inf) into an automatic, recorded rewind.
    """
    cfg = config
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    jpath = run / "journal.jsonl"
    model, opt, sched, sampler = _build(cfg)
    flops = flop_config_from_causal_lm(model, seq_len=cfg.block)
    start = 0
    kept: list[CheckpointSaved] = []
    spent: list[int] = []  # spike steps of the rewinds recorded so far
    if jpath.exists():
        j = Journal.open_append(jpath, signer=signer)  # raises JournalClosed for a finished run
        history = signed_history(j)  # only what the signer's seals cover
        kept = live_checkpoints(run, history)
        # The rewind budget is folded from the journal, so a crash does not hand out a fresh one.
        spent = [e.spike_step for e in history if isinstance(e, RewindDecided)]
        ckpt = kept[-1] if kept else None
        monitor = None
        if ckpt is not None:
            try:
                info = restore_checkpoint(run, j, ckpt.path, model=model, optimizer=opt, scheduler=sched,
                                          sampler=sampler)
            except ResumeRejected:
                j.suspend()
                raise
            start = info["counters"]["step"] + 1
            monitor = TrainingHealthMonitor.resumed(info["extra"]["monitor"], journal=j, checkpoint=ckpt,
                                                    later=history)
        if monitor is None:  # no checkpoint yet: start over in the same journal
            monitor = TrainingHealthMonitor(journal=j, flop_config=flops, peak_flops_per_sec=peak_flops_per_sec,
                                              device_kind=device_kind(model))
    else:
        j = Journal.create(jpath, signer=signer, meta={"loop": dataclasses.asdict(cfg)})
        monitor = TrainingHealthMonitor(journal=j, flop_config=flops, peak_flops_per_sec=peak_flops_per_sec,
                                              device_kind=device_kind(model))
    losses = []
    try:
        step = start
        while step < cfg.steps:
            if stop_after is not None and step - start >= stop_after:
                j.suspend()
                return {"stopped_at": step, "losses": losses}
            t0 = time.perf_counter()
            batch_index = sampler.batches_drawn
            x, y = sampler.next()
            if cfg.poison_batches and cfg.poison_batches[0] <= batch_index < cfg.poison_batches[1]:
                y = torch.full_like(y, batch_index % cfg.vocab)  # every target one token: a corrupt shard
            loss_f, grad_norm = train_step(model, opt, x, y, max_grad_norm=1.0)
            sched.step()
            losses.append(loss_f)
            found = monitor.observe_step(step, loss_f, grad_norm=grad_norm,
                                         step_time_s=time.perf_counter() - t0, batch_size=cfg.batch_size,
                                         tokens=cfg.batch_size * cfg.block, lr=sched.get_last_lr()[0])
            spike = next((a for a in found if a.kind in TRIGGERS), None)
            if rewind is not None and spike is not None:
                allowed = rewind_allowed(spent, spike.step, rewind.max_rewinds, rewind.window_steps)
                target = next((c for c in reversed(kept) if c.step <= spike.step - rewind.lookback_steps), None)
                if not allowed or target is None:
                    rule = (f"max_rewinds={rewind.max_rewinds} per {rewind.window_steps} steps"
                            if not allowed else f"no checkpoint at least {rewind.lookback_steps} steps before the spike")
                    j.append(RunStopped(rule=rule, reason=f"{spike.kind} at step {spike.step}"), durable=True)
                    report = monitor.report()
                    record_compute(j)
                    j.close(status="stopped", reason=rule)
                    return {"losses": losses, "report": report, "stopped": rule,
                            "verify": verify(jpath, keys=[signer.public], require_closed=True)}
                spent.append(spike.step)
                info = _rewind(run, j, rewind, spike, target, model, opt, sched, sampler)
                for c in [c for c in kept if c.step > target.step]:  # a branch the run abandoned
                    confined(run, c.path, what="checkpoint path").unlink(missing_ok=True)
                    j.append(CheckpointDeleted(path=c.path, step=c.step, reason=f"rewound to step {target.step}"),
                             durable=True)
                kept = [c for c in kept if c.step <= target.step]
                # The live monitor has folded every step up to the spike, as replay does; the resume rewinds
                # its baseline to the checkpoint's step (run_resumed is recorded by the restore).
                monitor.observe_resume(target.step, checkpoint=target.path, append=False)
                step = target.step + 1
                continue
            if (step + 1) % cfg.ckpt_every == 0 or step + 1 == cfg.steps:
                ev = save_checkpoint(run, j, step=step, model=model, optimizer=opt, scheduler=sched,
                                     sampler=sampler, tokens=(step + 1) * cfg.batch_size * cfg.block,
                                     extra={"monitor": monitor.state()})
                kept.append(ev)
                enforce_retention(run, j, kept, cfg.keep_last)
            step += 1
        report = monitor.report()
        record_compute(j)
        j.close()
    except BaseException:
        if not j.closed:
            j.suspend()
        raise
    return {"losses": losses, "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "report": report, "verify": verify(jpath, keys=[signer.public], require_closed=True)}
