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

from journal import Event, Journal, Signer, read_events, verify
from .checkpoint import CheckpointSaved, ResumeRejected, restore_checkpoint, save_checkpoint
from .corpus import BatchSampler, MarkovSource
from .flops import flop_config_from_causal_lm
from .model import build_causal_lm
from .monitor import TrainingHealthMonitor

__all__ = ["LoopConfig", "CheckpointDeleted", "run_training"]


class CheckpointDeleted(Event, tag="checkpoint_deleted", frozen=True, kw_only=True):
    """A checkpoint file removed on purpose, so the journal says why a referenced file is gone."""

    path: str
    step: int
    reason: str


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

    def __post_init__(self) -> None:
        for name in ("steps", "ckpt_every", "keep_last", "batch_size", "corpus_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"LoopConfig.{name} must be at least 1, got {getattr(self, name)!r}")


def _build(cfg: LoopConfig):
    torch.manual_seed(cfg.seed)
    model = build_causal_lm(cfg.vocab, cfg.d_model, cfg.n_layer, cfg.n_head, cfg.block, dropout=cfg.dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def lr_factor(step: int) -> float:  # linear warm-up, then cosine to zero at the last step
        if step < cfg.warmup:
            return (step + 1) / cfg.warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    tokens = MarkovSource(cfg.vocab, seed=cfg.seed).sample(cfg.corpus_tokens, seed=cfg.seed + 1)
    sampler = BatchSampler(tokens, cfg.batch_size, cfg.block, seed=cfg.seed + 2)
    return model, opt, sched, sampler


def _live_checkpoints(run_dir: Path, journal_path: Path) -> list[CheckpointSaved]:
    """Checkpoints the journal recorded, not recorded as deleted, whose files are there; oldest first."""
    deleted = set()
    saved: list[CheckpointSaved] = []
    for ev in read_events(journal_path):
        if isinstance(ev, CheckpointSaved):
            saved.append(ev)
        elif isinstance(ev, CheckpointDeleted):
            deleted.add(ev.path)
    return [ev for ev in saved if ev.path not in deleted and (run_dir / ev.path).exists()]


def run_training(run_dir: str | Path, *, signer: Signer, config: LoopConfig = LoopConfig(),
                 peak_flops_per_sec: float | None = None, stop_after: int | None = None) -> dict[str, Any]:
    """Train (or resume) the run in ``run_dir``; return the final losses, parameters and report.

    ``stop_after`` ends this invocation after that many steps without closing
    the run (tests use it, and a preempted job looks like it).
    """
    cfg = config
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    jpath = run / "journal.jsonl"
    model, opt, sched, sampler = _build(cfg)
    flops = flop_config_from_causal_lm(model, seq_len=cfg.block)
    start = 0
    kept: list[CheckpointSaved] = []
    if jpath.exists():
        j = Journal.open_append(jpath, signer=signer)  # raises JournalClosed for a finished run
        kept = _live_checkpoints(run, jpath)
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
            monitor = TrainingHealthMonitor.from_state(info["extra"]["monitor"], journal=j)
            monitor.observe_resume(ckpt.step, checkpoint=ckpt.path, append=False)  # run_resumed is recorded
        if monitor is None:  # no checkpoint yet: start over in the same journal
            monitor = TrainingHealthMonitor(journal=j, flop_config=flops, peak_flops_per_sec=peak_flops_per_sec)
    else:
        j = Journal.create(jpath, signer=signer, meta={"loop": dataclasses.asdict(cfg)})
        monitor = TrainingHealthMonitor(journal=j, flop_config=flops, peak_flops_per_sec=peak_flops_per_sec)
    losses = []
    try:
        for step in range(start, cfg.steps):
            if stop_after is not None and step - start >= stop_after:
                j.suspend()
                return {"stopped_at": step, "losses": losses}
            t0 = time.perf_counter()
            model.train()
            x, y = sampler.next()
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            opt.step()
            sched.step()
            loss_f = loss.item()  # host-device sync (one per step; fine on the CPU)
            losses.append(loss_f)
            monitor.observe_step(step, loss_f, grad_norm=float(grad_norm), step_time_s=time.perf_counter() - t0,
                                 batch_size=cfg.batch_size, tokens=cfg.batch_size * cfg.block,
                                 lr=sched.get_last_lr()[0])
            if (step + 1) % cfg.ckpt_every == 0 or step + 1 == cfg.steps:
                ev = save_checkpoint(run, j, step=step, model=model, optimizer=opt, scheduler=sched,
                                     sampler=sampler, tokens=(step + 1) * cfg.batch_size * cfg.block,
                                     extra={"monitor": monitor.state()})
                kept.append(ev)
                while len(kept) > cfg.keep_last:
                    old = kept.pop(0)
                    (run / old.path).unlink(missing_ok=True)
                    j.append(CheckpointDeleted(path=old.path, step=old.step,
                                               reason=f"retention: keep_last={cfg.keep_last}"), durable=True)
        report = monitor.report()
        j.close()
    except BaseException:
        if not j.closed:
            j.suspend()
        raise
    return {"losses": losses, "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "report": report, "verify": verify(jpath, keys=[signer.public], require_closed=True)}

