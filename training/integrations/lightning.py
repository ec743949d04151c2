"""trainledger in a Lightning ``Trainer``: one callback (and, optionally, a logger for ``self.log`` metrics).

    from trainledger.training.integrations.lightning import TrainledgerCallback
    trainer = L.Trainer(callbacks=[TrainledgerCallback("runs/mine", key="keys/t.key"), ModelCheckpoint(...)])

The journal is ``RUN_DIR/journal.jsonl``, or ``rank-NNNNN.jsonl`` on every rank of a multi-process run. It records:

- every optimizer step on every rank: the loss (from ``training_step``'s ``outputs``; the mean over the step's
  micro-batches under gradient accumulation), the gradient norm before clipping (``on_before_optimizer_step``),
  the learning rate, the wall time from the step's first micro-batch to its last, and tokens where the batch has
  ``input_ids``. Values stay tensors and are converted in one transfer every ``sync_every`` steps or 0.2 s,
  whichever comes first, and on an exception; the monitor works on them in
  batches (its verdicts, and a ``stop_on`` stop, lag by at most that). A process killed outright (SIGKILL) loses
  that window plus the lines the journal had not flushed (every ``flush_interval_s``, 1 s by default): the steps of
  up to about 1.2 s;
- checkpoints: ``on_save_checkpoint`` writes the journal's head ``(seq, hash)`` and the monitor's snapshot into the
  checkpoint dict (``checkpoint["trainledger"]``); once ``ModelCheckpoint`` has written the file, its digest is
  recorded (``checkpoint_saved``) at the next step, validation end or fit end (files written by a direct
  ``trainer.save_checkpoint(path)`` are not seen: record those with ``record_checkpoint(path)``);
- a resume (``fit(ckpt_path=...)``): ``on_load_checkpoint`` checks the file against its signed record and the head
  it carries against the journal, and records ``run_resumed``, or ``resume_rejected`` and raises
  :class:`ResumeRejected`, which ends ``fit`` before a step runs;
- a crash: ``on_exception`` journals ``run_stopped`` (rule ``exception``) and leaves the journal open for the resume;
- anomalies in ``stop_on`` (a NaN or infinite loss or gradient norm by default) stop the run
  (``trainer.should_stop``) with ``run_stopped``.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback
from lightning.pytorch.loggers import Logger

from trainledger.training.health.mfu import record_compute
from trainledger.journal import Journal, Signer, read_signed_events
from trainledger.training.kinds import CheckpointSaved, MetricsLogged, ResumeRejectedEvent, RunStopped, metric_values

from trainledger.training.checkpoints.state import ResumeRejected, file_sha256
from trainledger.training.health.monitor import TrainingHealthMonitor
from trainledger.journal.errors import UsageError
from trainledger.training.integrations.hooks import (StepBuffer, export_settings, fingerprint_batch, learn_run_key,
                      monitor_options, training_dtype, open_run_journal, previous_run, record_checkpoint, run_key_for_rank, step_loss, tap_clip,
                      norm_parts, untap_clip, replica_options)

__all__ = ["TrainledgerCallback", "TrainledgerLogger", "ResumeRejected"]

_STOP_ON = ("nan_loss", "inf_loss", "nan_grad_norm", "inf_grad_norm")


def _journal_name(trainer: Any) -> str:
    from trainledger.training.distributed.ranks import rank_journal_name

    return rank_journal_name(trainer.global_rank) if trainer.world_size > 1 else "journal.jsonl"


def _open(run_dir: Path, signer: Signer, trainer: Any, meta: dict[str, Any]) -> Journal:
    """This rank's journal: ``journal.jsonl`` alone, ``rank-NNNNN.jsonl`` in a multi-process run (the rank as
    Lightning numbers it, whatever launched the processes)."""
    info = None
    if trainer.world_size > 1:
        import socket

        from trainledger.training.distributed.ranks import RankInfo

        run = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("TRAINLEDGER_RUN") or run_dir.name
        info = RankInfo(run=run, rank=trainer.global_rank, world_size=trainer.world_size,
                        local_rank=trainer.local_rank, node=socket.gethostname(),
                        restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0))
    return open_run_journal(run_dir, signer, meta, info=info)[0]


class TrainledgerCallback(Callback):
    """See the module docstring."""

    def __init__(self, run_dir: str | os.PathLike, *, key: str | os.PathLike | None = None,
                 signer: Signer | None = None, flop_config: Any = None, peak_flops_per_sec: float | None = None,
                 sync_every: int = 16, stop_on: tuple[str, ...] = _STOP_ON,
                 continue_from: str | os.PathLike | None = None, batch_fingerprint: bool = False,
                 export_dir: str | os.PathLike | None = None, release_key: str | os.PathLike | None = None,
                 base_model: str | os.PathLike | None = None, compute_thresholds: dict[str, float] | None = None,
                 carried_flops: float | None = None, device_kind: str | None = None, stragglers: bool = True,
                 straggler_every: int | None = None, straggler_threshold: float = 0.8,
                 fingerprints: bool | None = None, fingerprint_every: int | None = None,
                 fingerprint_exclude: Any = (), on_divergence: str = "raise", sdc_check: int | None = None,
                 tsa: str | None = None, team_log: str | os.PathLike | None = None,
                 team_log_key: str | os.PathLike | None = None):
        from trainledger.training.integrations.hooks import Publisher

        Publisher.check(team_log, team_log_key)
        #: an RFC 3161 authority and the team's log (docs/publishing.md), as the Recorder takes them
        self._publish = {"tsa": tsa, "team_log": team_log, "team_log_key": team_log_key}
        self._publisher: Any = None
        self.signer = run_key_for_rank(key, signer, continue_from=continue_from)
        #: the replicas' states held to each other (docs/sdc.md), as the Recorder does: by default when Lightning's
        #: strategy wraps the module in DistributedDataParallel on more than one rank
        self._fingerprint_options = replica_options(fingerprints, fingerprint_every, fingerprint_exclude,
                                                    on_divergence, sdc_check)
        self._watch: Any = None
        #: replay checks (docs/sdc.md): the first step and every ``sdc_check`` steps, ``training_step`` and its
        #: backward pass run again in ``on_before_optimizer_step`` and held to the first, bit for bit
        self._sdc_every = sdc_check
        self._replay: Any = None
        self._replay_at: tuple[Any, Any, Any] | None = None  # (batch, batch_idx, the first pass's loss)
        #: on more than one rank: each rank's own compute time (the DDP model's communication hook: its last
        #: gradient bucket ready, before it waits on the others), journaled as ``compute_time_s`` and scored in
        #: straggler windows, as the Recorder does (docs/distributed.md)
        self._straggler_options = {"every": straggler_every, "threshold": straggler_threshold} if stragglers else None
        self._stragglers: Any = None
        self._clock: Any = None
        #: what the Recorder takes for the compute statement (docs/compute.md): the thresholds watched beside the
        #: defaults, the model FLOPs of earlier runs counted toward them (default: a continued run's predecessor's
        #: total) and the device kind (default: the module's device's name); recorded in run_configured
        self._compute = {"compute_thresholds": compute_thresholds, "carried_flops": carried_flops,
                         "device_kind": device_kind}
        self._monitor_options: dict[str, Any] = {}
        #: at the end of fit the module's weights are saved here (its ``model.save_pretrained`` when it wraps a
        #: Hugging Face model, else its state dict as ``model.safetensors``) and recorded as ``model_exported``;
        #: ``release_key``: then released (docs/provenance.md); ``base_model``: the released model it fine-tunes
        self.export_dir, self.release_key, self.base_model = export_settings(export_dir, release_key, base_model)
        self._checkpoints: list[CheckpointSaved] = []
        #: a finished run's folder this run goes on from (``trainer.fit(model, ckpt_path="OLD/.../last.ckpt")``
        #: with this callback on a new folder): the checkpoint is checked against that run's journal
        self.continue_from = None if continue_from is None else Path(continue_from)
        self._prev: tuple[Any, list[Any]] | None = None
        #: fingerprint every step's batch (the tensors of the batch Lightning hands ``on_train_batch_end``, summed
        #: over the step's micro-batches): a step run again after a resume on another batch than the first time is
        #: a ``data_divergence`` anomaly, which replay recomputes
        self.fingerprint = bool(batch_fingerprint)
        self._fp: Any = None
        self.run_dir = Path(run_dir)
        self.flop_config, self.peak, self.stop_on = flop_config, peak_flops_per_sec, frozenset(stop_on)
        self.buffer = StepBuffer(sync_every)
        self.journal: Journal | None = None
        self.monitor: TrainingHealthMonitor | None = None
        self._losses: list[torch.Tensor] = []
        self._tokens = 0
        self._t0: float | None = None
        self._grad_norm: Any = None
        self._params: list[Any] | None = None
        self._clip_norm: Any = None  # Lightning's own pre-clip norm this step, from the wrapped clip_grad_norm_
        self._tapped = False  # seen: the callback stops computing its own
        self._thread = threading.get_ident()
        self._lr: float | None = None
        self._step = 0
        self._recorded: dict[str, float] = {}  # checkpoint file -> mtime when recorded
        self._pending_resume: dict[str, Any] | None = None
        self._continued = False
        self.stopped: str | None = None

    # -------------------------------------------------------------- start

    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or self.journal is not None:
            return
        import lightning

        meta: dict[str, Any] = {"integration": "lightning", "lightning": lightning.__version__}
        if self.continue_from is not None and not (self.run_dir / _journal_name(trainer)).exists():
            rep, history = previous_run(self.continue_from, self.signer)
            self._prev = ({"run_id": rep.run_id, "head": rep.head, "folder": self.continue_from.name}, history)
            meta["continues"] = self._prev[0]
        self.journal = _open(self.run_dir, self.signer, trainer, meta)
        from trainledger.training.integrations.hooks import Publisher

        self._publisher = Publisher(self.journal, **self._publish, lead=trainer.global_rank == 0)
        learn_run_key(self.signer, self.journal)
        precision = str(getattr(trainer, "precision", ""))
        self._monitor_options = monitor_options(pl_module, previous=self._prev[1] if self._prev is not None else None,
                                                peak=self.peak, dtype=training_dtype(
                                                    pl_module, bf16=precision.startswith("bf16"),
                                                    fp16=precision.startswith("16")), **self._compute)
        self.monitor = None
        self._params = None

    def on_train_start(self, trainer, pl_module) -> None:
        if self._prev is not None and not self._continued:
            self.journal.suspend()
            raise UsageError(f"continue_from={str(self.continue_from)!r} needs trainer.fit(model, ckpt_path=...) "
                             f"naming one of its checkpoints (e.g. '{self.continue_from}/checkpoints/last.ckpt')")
        # Once: walking a large module's parameters costs tens of microseconds a step (every parameter, frozen or
        # not: the norm takes whichever have a gradient at that step).
        self._params = list(pl_module.parameters())
        if trainer.gradient_clip_val:  # Lightning will compute the norm itself to clip by it: read it there
            self._thread = threading.get_ident()
            tap_clip(self)
        from trainledger.training.distributed.state_watch import _is_ddp

        if self._straggler_options is not None and trainer.world_size > 1 and self._stragglers is None:
            from trainledger.training.distributed.ranks import ComputeClock, StragglerDetector

            self._clock = ComputeClock.attach(trainer.strategy.model)
            self._stragglers = StragglerDetector(self.journal, **self._straggler_options)
        if self._sdc_every is not None and self._replay is None:
            self._replay = self._replay_check(trainer, pl_module)
        fo = self._fingerprint_options
        if self._watch is None and fo["fingerprints"] is not False:
            from trainledger.training.distributed.state_watch import StateWatch

            wrapped = trainer.strategy.model
            if fo["fingerprints"] or fo["every"] is not None or (trainer.world_size > 1 and _is_ddp(wrapped)):
                opt = trainer.optimizers[0] if len(trainer.optimizers) == 1 else None
                if opt is None:
                    raise UsageError("fingerprints: this callback fingerprints one optimizer's state; the module "
                                     f"has {len(trainer.optimizers)} (fingerprints=False leaves them out)")
                self._watch = StateWatch(self.journal, wrapped, opt, every=fo["every"], exclude=fo["exclude"],
                                         on_divergence=fo["on_divergence"])

    def _replay_check(self, trainer, pl_module) -> Any:
        from trainledger.training.distributed.ranks import ComputeClock
        from trainledger.training.distributed.state_watch import ReplayCheck, _is_ddp

        if not pl_module.automatic_optimization:
            raise UsageError("sdc_check runs training_step again under Lightning's automatic optimization; with "
                             "manual optimization use the Recorder's backward(step, closure) in training_step")
        if trainer.accumulate_grad_batches != 1:
            raise UsageError(f"sdc_check compares one batch's gradients; accumulate_grad_batches="
                             f"{trainer.accumulate_grad_batches} sums several (use 1 with sdc_check)")
        if getattr(trainer.precision_plugin, "scaler", None) is not None:
            raise UsageError("sdc_check compares gradients bit for bit; 16-bit mixed precision's loss scaler unscales "
                             "them in between (use precision='bf16-mixed' or 32 with sdc_check)")
        wrapped = trainer.strategy.model
        if _is_ddp(wrapped) and self._clock is None:
            self._clock = ComputeClock.attach(wrapped)
        return ReplayCheck(self.journal, wrapped, every=self._sdc_every, clock=self._clock,
                           on_mismatch=self._fingerprint_options["on_divergence"])

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if self._replay_at is not None:
            self._replay_at = (*self._replay_at[:2], loss)

    def _check_replay(self, trainer, pl_module) -> None:
        """The replay check of this step (docs/sdc.md): ``training_step`` and its backward pass again, on the
        batch kept at its start, ``self.log`` quiet (the step is logged once)."""
        batch, batch_idx, loss = self._replay_at
        self._replay_at = None
        step = trainer.global_step
        if loss is None:  # training_step returned None: Lightning skipped the backward, nothing to compare
            self._replay.disarm()
            return
        if self.monitor is not None:
            self._drain(trainer)  # the steps before it on record first

        def again() -> Any:
            quiet = {"log": lambda *a, **k: None, "log_dict": lambda *a, **k: None}
            pl_module.__dict__.update(quiet)
            try:
                out = trainer.strategy.training_step(batch, batch_idx)
            finally:
                for name in quiet:
                    pl_module.__dict__.pop(name, None)
            loss2 = out.get("loss") if isinstance(out, dict) else out
            pl_module.backward(loss2)
            return loss2

        self._replay.finish(step, loss, again)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        """A resume: the file against its signed record, and the head it carries against the journal."""
        j = self.journal
        path = Path(trainer.ckpt_path) if trainer.ckpt_path else None
        rel = self._rel(path) if path is not None else "?"

        def reject(code: str, detail: str) -> None:
            j.append(ResumeRejectedEvent(path=rel, reason=code, detail=detail), durable=True)
            j.suspend()
            raise ResumeRejected(code, f"{rel}: {detail}")

        if j is None:
            return
        if self._prev is not None:
            return self._continue(path, checkpoint)
        if path is None or rel is None:
            reject("resume-invalid-path", "the checkpoint is not a file inside the run folder")
        record = None
        events = list(read_signed_events(j.path, [j.public_key])) if j.public_key is not None else []
        for ev in events:
            if isinstance(ev, CheckpointSaved) and ev.path == rel:
                record = ev
        if record is None:
            reject("resume-invalid-unknown-checkpoint", "no signed checkpoint_saved records this file")
        if file_sha256(path)[0] != record.sha256:
            reject("resume-invalid-digest", "the file differs from its signed record")
        mine = checkpoint.get("trainledger")
        mine = mine if isinstance(mine, dict) else {}
        head = mine.get("head") if isinstance(mine.get("head"), str) else ""
        seq_s, _, h = head.partition(":")
        if not seq_s.isdigit() or not any(e.seq == int(seq_s) and e.h == h for e in events):
            reject("resume-invalid-journal", f"the journal head the checkpoint carries ({head[:24]}) is not in "
                                             "this journal's signed events")
        from trainledger.journal import RunResumed

        j.append(RunResumed(reason="checkpoint", from_step=record.step, checkpoint=rel,
                            detail={"sha256": record.sha256, "head": head}), durable=True)
        snap = mine.get("monitor")
        if isinstance(snap, dict):
            self.monitor = TrainingHealthMonitor.resumed(snap, journal=j, checkpoint=record, later=events,
                                                         after_seq=int(seq_s))
        self._recorded[rel] = path.stat().st_mtime

    def _continue(self, path: Path | None, checkpoint: dict[str, Any]) -> None:
        """A new run going on from a finished one: the file against its signed record in the previous run's
        journal, and the head it carries against that journal's signed events; then ``run_resumed`` (reason
        ``continued``) naming the previous run."""
        j, (link, history) = self.journal, self._prev
        try:
            rel = path.resolve().relative_to(self.continue_from.resolve()).as_posix() if path else None
        except ValueError:
            rel = None

        def reject(code: str, detail: str) -> None:
            j.append(ResumeRejectedEvent(path=str(path), reason=code, detail=detail), durable=True)
            j.suspend()
            raise ResumeRejected(code, f"{path}: {detail}")

        if rel is None:
            reject("resume-invalid-path", f"continue_from={str(self.continue_from)!r}, but the checkpoint is not a "
                                          "file inside that folder")
        record = next((e for e in reversed(history) if isinstance(e, CheckpointSaved) and e.path == rel), None)
        if record is None:
            reject("resume-invalid-unknown-checkpoint", "no signed checkpoint_saved of the previous run records it")
        if file_sha256(path)[0] != record.sha256:
            reject("resume-invalid-digest", "the file differs from its signed record in the previous run's journal")
        mine = checkpoint.get("trainledger")
        head = mine.get("head") if isinstance(mine, dict) and isinstance(mine.get("head"), str) else ""
        seq_s, _, h = head.partition(":")
        if not seq_s.isdigit() or not any(e.seq == int(seq_s) and e.h == h for e in history):
            reject("resume-invalid-journal", f"the journal head the checkpoint carries ({head[:24]}) is not in the "
                                             "previous run's signed events")
        from trainledger.journal import RunResumed

        link = {**link, "checkpoint": rel, "sha256": record.sha256, "step": record.step}
        j.append(RunResumed(reason="continued", from_step=record.step, checkpoint=rel,
                            detail={"continues": link}), durable=True)
        self.monitor = TrainingHealthMonitor(journal=j, flop_config=self.flop_config, **self._monitor_options)
        self.monitor.observe_resume(record.step, reason="continued", checkpoint=rel, append=False)
        self._continued = True

    def _rel(self, path: Path) -> str | None:
        try:
            return path.resolve().relative_to(self.run_dir.resolve()).as_posix()
        except ValueError:
            return None

    # -------------------------------------------------------------- steps

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._record_checkpoints(trainer)
        self._clip_norm = None
        if self._replay is not None:
            self._replay_at = (batch, batch_idx, None) if self._replay.begin(trainer.global_step) else None
        if self._t0 is None:
            self._t0 = time.perf_counter()
            if self._clock is not None:
                self._clock.start = self._t0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not self._tapped:  # before Lightning clips
            params = self._params if self._params is not None else pl_module.parameters()
            self._grad_norm = norm_parts([p.grad for p in params if p.grad is not None])
        self._lr = float(optimizer.param_groups[0]["lr"])
        if self._replay_at is not None:  # before the optimizer step (and Lightning's clipping)
            self._check_replay(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._losses.append(loss.detach())
        if self.fingerprint:
            fp = fingerprint_batch(batch)
            self._fp = fp if self._fp is None or fp is None else self._fp + fp
        ids = batch.get("input_ids") if isinstance(batch, dict) else None
        if isinstance(ids, torch.Tensor):
            self._tokens += ids.numel()
        done = trainer.global_step  # read once: Lightning's property walks its loops each time
        if done == self._step:
            return  # a micro-batch of an accumulation: the optimizer has not stepped yet
        if self.monitor is None:
            self.monitor = TrainingHealthMonitor(journal=self.journal, flop_config=self.flop_config,
                                                 **self._monitor_options)
        step = done - 1
        self._step = done
        if self._clip_norm is not None:  # Lightning clipped through torch: its own pre-clip norm
            self._grad_norm = self._clip_norm
            self._tapped = True
        elif self._tapped:  # no clipping this step: the gradients are as the backward left them
            self._grad_norm = norm_parts([p.grad for p in self._params if p.grad is not None])
        now = time.perf_counter()
        dt = now - (self._t0 or 0)
        ct = None
        if self._stragglers is not None:  # more than one rank: this rank's own time, and the straggler windows
            ct = self._clock.take(now) if self._clock is not None else None
            self._stragglers.observe(step, ct if ct is not None else dt)
        due = self.buffer.add(step, step_loss(self._losses), self._grad_norm, {"lr": self._lr, "tokens": self._tokens or None,
                                                          "step_time_s": dt, "batch_fingerprint": self._fp,
                                                          "compute_time_s": ct})
        self._losses, self._tokens, self._t0, self._grad_norm, self._fp = [], 0, None, None, None
        w = self._watch
        if w is not None and (w.every is None or step % w.every == 0):  # fingerprint now, after the steps before
            self._drain(trainer)
            w.after_step(step, dt)
        elif due:
            self._drain(trainer)

    def _drain(self, trainer) -> None:
        stop = self.buffer.observe(self.monitor, self.journal, self.stop_on if self.stopped is None else frozenset())
        if stop is not None:
            self.stopped = stop.rule
            trainer.should_stop = True

    # -------------------------------------------------------------- checkpoints

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        if self.journal is None:
            return
        if self.monitor is not None:
            self._drain(trainer)
        if self._watch is not None:  # the replicas compared before their state is saved (a divergence raises here)
            self._watch.check(trainer.global_step - 1, at="checkpoint")
        seq, h = self.journal.seal(durable=True, signed=True) or self.journal.head  # a signed head
        checkpoint["trainledger"] = {"head": f"{seq}:{h}",
                                     "monitor": self.monitor.state() if self.monitor is not None else None}

    def record_checkpoint(self, path: str | os.PathLike, *, step: int) -> CheckpointSaved:
        """Record a checkpoint file this callback did not see written (``trainer.save_checkpoint(path)``)."""
        p = Path(path)
        ev = record_checkpoint(self.journal, self.run_dir, p, step=step,
                               contents=["model", "optimizer", "scheduler", "counters", "sampler", "rng",
                                         "accumulation", "manifest_id", "scaler"])
        self._recorded[ev.path] = p.stat().st_mtime
        self._checkpoints.append(ev)
        return ev

    def _export(self, pl_module) -> None:
        """Save the module's weights to ``export_dir`` and record them (model_exported)."""
        from trainledger.journal.statements.release.export import base_of, checkpoint_of, record_export

        self.export_dir.mkdir(parents=True, exist_ok=True)
        inner = getattr(pl_module, "model", None)
        if inner is not None and hasattr(inner, "save_pretrained"):
            inner.save_pretrained(self.export_dir)
        else:
            state = {k: v.detach().cpu().contiguous() for k, v in pl_module.state_dict().items()}
            try:
                from safetensors.torch import save_file
            except ImportError:  # safetensors comes with transformers; without it, torch's own format
                torch.save(state, self.export_dir / "model.pt")
            else:
                save_file(state, str(self.export_dir / "model.safetensors"))
        step = self.monitor.last_step if self.monitor is not None else None
        base, base_release, lineage = base_of(self.base_model) if self.base_model is not None else (None, None, None)
        record_export(self.journal, self.export_dir, step=step, checkpoint=checkpoint_of(self._checkpoints, step),
                      base=base, base_release=base_release, relative_to=self.run_dir, lineage=lineage)

    def _record_checkpoints(self, trainer) -> None:
        """Record the files ModelCheckpoint wrote since the last look."""
        if self.journal is None or not trainer.is_global_zero:
            return
        for cb in trainer.checkpoint_callbacks:
            names = {*getattr(cb, "best_k_models", {}), getattr(cb, "last_model_path", ""),
                     getattr(cb, "best_model_path", "")} - {""}
            for name in sorted(names):
                p = Path(name)
                rel = self._rel(p)
                if rel is None or not p.is_file() or self._recorded.get(rel) == p.stat().st_mtime:
                    continue
                # Looked at from the next step's start (or validation's or fit's end): the file holds the state
                # after the last completed step, global_step - 1.
                self.record_checkpoint(p, step=trainer.global_step - 1)
                if self._publisher is not None:
                    self._publisher.after_seal()

    def on_validation_end(self, trainer, pl_module) -> None:
        self._record_checkpoints(trainer)

    # -------------------------------------------------------------- end

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        untap_clip(self)
        if self.journal is None or self.journal.closed or isinstance(exception, ResumeRejected):
            return
        if self.monitor is not None:
            self.buffer.observe(self.monitor, self.journal, frozenset())  # the steps still queued are on record too
        self.journal.append(RunStopped(rule="exception", reason=f"{type(exception).__name__}: {exception}"[:500]),
                            durable=True)
        self.journal.suspend()  # open: the run can be resumed from its last checkpoint
        self.journal = None

    def on_fit_end(self, trainer, pl_module) -> None:
        untap_clip(self)
        if self.journal is None:
            return
        if self.monitor is not None:
            self._drain(trainer)
        if self._stragglers is not None:
            self._stragglers.finish()  # the last, partial window (every rank ends the fit together)
        self._record_checkpoints(trainer)
        exported = self.export_dir is not None and trainer.is_global_zero
        if exported:
            self._export(pl_module)
        record_compute(self.journal)
        self._publisher.before_close()
        if self.stopped:
            self.journal.close(status="stopped", reason=self.stopped)
        else:
            self.journal.close()
        self._publisher.after_close([self.signer.public])
        path, self.journal = self.journal.path, None
        if exported and self.release_key is not None:
            from trainledger.journal.statements.release.attest import release
            from trainledger.journal.statements.release.keys import load_release_key

            release(self.export_dir, path, load_release_key(self.release_key), keys=[self.signer.public])


class TrainledgerLogger(Logger):
    """``self.log(...)`` metrics into the callback's journal, as ``metrics_logged`` (what was logged, as logged).
    Give it the callback: ``L.Trainer(logger=TrainledgerLogger(cb), callbacks=[cb])``."""

    def __init__(self, callback: TrainledgerCallback):
        super().__init__()
        self.callback = callback

    @property
    def name(self) -> str:
        return "trainledger"

    @property
    def version(self) -> str:
        return "0"

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """The module's and datamodule's hyperparameters (``save_hyperparameters``) as ``config_logged`` (source
        ``lightning``): the run table's configuration columns. Lightning calls it after the callback's ``setup``
        has opened the journal; before that they wait for the first metrics."""
        from trainledger.training.kinds import config_values

        try:
            cfg = config_values(params if hasattr(params, "items") else vars(params), what="hyperparameters")
        except (ValueError, TypeError):  # keys that are not strings: the metrics still go in
            return
        if cfg:
            self._pending_config = {**getattr(self, "_pending_config", {}), **cfg}
            self._record_config()

    def _record_config(self) -> None:
        j = self.callback.journal
        pending = getattr(self, "_pending_config", None)
        if j is not None and pending:
            from trainledger.training.kinds import ConfigLogged

            j.append(ConfigLogged(config=pending, source="lightning"))
            self._pending_config = {}

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        j = self.callback.journal
        if j is None:
            return
        self._record_config()
        try:  # as Recorder.log and the W&B calls convert them (a tensor or NumPy scalar by its value)
            clean = metric_values(metrics, what="Lightning's metrics")
        except ValueError:  # something that is not a number: the numbers kept, the run never stopped by a log
            clean = {str(k): float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        if clean:
            j.append(MetricsLogged(step=-1 if step is None else int(step), metrics=clean, source="lightning"))
