"""Automatic spike rewind: a confirmed loss spike becomes a recorded restore, a skipped data window, a resume.

PaLM (Chowdhery et al. 2022, section 5.1) recovered from loss spikes by
restarting from a checkpoint about 100 steps before the spike and skipping
200-500 data batches; :class:`RewindPolicy` holds those numbers (scale them to
the run: a tiny run checkpoints every few steps). Each rewind is a sequence of
events: ``rewind_decided``, the restore's ``run_resumed``,
``data_window_skipped``; past ``max_rewinds`` within ``window_steps`` the run
stops with ``run_stopped`` naming the rule.
"""

from __future__ import annotations

import dataclasses

from trainledger.training.kinds import DataWindowSkipped, RewindDecided, RunStopped

__all__ = ["RewindPolicy", "RewindDecided", "DataWindowSkipped", "RunStopped", "TRIGGERS"]

#: Anomaly kinds that trigger a rewind.
TRIGGERS = frozenset({"loss_spike", "restart_discontinuity", "nan_loss", "inf_loss", "nan_grad_norm", "inf_grad_norm"})


@dataclasses.dataclass(frozen=True)
class RewindPolicy:
    lookback_steps: int = 100  # restart from a checkpoint at least this far before the spike
    skip_batches: int = 200  # data batches skipped from the restored cursor (at least through the spike)
    lr_scale: float = 1.0  # learning-rate multiplier applied after the rewind
    max_rewinds: int = 3  # rewinds allowed within window_steps before the run stops
    window_steps: int = 1000

    @classmethod
    def for_run(cls, steps: int, ckpt_every: int, **overrides) -> RewindPolicy:
        """PaLM's recipe scaled to a run of ``steps`` steps (PaLM 540B: about 255k steps).

        Restart about 100/255k of the run before the spike and skip about
        350/255k of it (the middle of 200-500 batches), but never less than
        half a checkpoint interval back or one interval skipped: a rewind
        needs a checkpoint to land on and data to leave behind.
        """
        lookback = max(ckpt_every // 2, round(steps * 100 / 255_000))
        skip = max(ckpt_every, round(steps * 350 / 255_000))
        return cls(**{"lookback_steps": lookback, "skip_batches": skip, **overrides})

    def __post_init__(self) -> None:
        if self.lookback_steps < 0 or self.skip_batches < 0 or self.max_rewinds < 1 or self.window_steps < 1:
            raise ValueError("RewindPolicy: lookback_steps and skip_batches >= 0, max_rewinds and window_steps >= 1")
        if not 0 < self.lr_scale <= 10:
            raise ValueError(f"RewindPolicy.lr_scale must be in (0, 10], got {self.lr_scale!r}")
