"""trainledger in a Hugging Face ``transformers.Trainer``: one callback.

    from trainledger.training.integrations.hf import TrainledgerCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[TrainledgerCallback(key="keys/t.key")])

(``report_to`` is a closed list of integrations inside transformers, so trainledger comes in as a callback.) The
journal is ``OUTPUT_DIR/journal.jsonl`` (``run_dir=`` to put it elsewhere; checkpoints must be inside it), one per
rank under torchrun (``rank-NNNNN.jsonl``). It records:

- ``run_opened`` with the TrainingArguments (credentials and absolute paths scrubbed, the manifest linter's rules)
  and ``run_configured`` with the model's FLOP configuration derived from its config (layers, heads, head size,
  parameters that do matmul work), so MFU needs nothing from you (give ``peak_flops_per_sec=``);
- every optimizer step, per rank: the loss (the model's own ``loss`` output, the mean over the step's micro-batches),
  the gradient norm before clipping (the one the Trainer computes itself when it clips through
  ``torch.nn.utils.clip_grad_norm_``, read from that call: while a run trains, that function is wrapped, calling
  the original and handing the callback its return value, and the wrapper is removed at the end. Where the
  Trainer clips another way (DeepSpeed, mixed device meshes) the callback computes the norm itself: one foreach norm
  over every gradient once the last one is in, found by per-parameter hooks; under DDP, this rank's own gradients),
  the learning rate the step used, its wall time, and tokens (``input_ids`` counted from
  the batch's shape). Not the ``logging_steps`` window means ``on_log`` gets. Losses and norms stay tensors and are
  converted in one transfer every ``sync_every`` steps (16) or 0.2 s, whichever
  comes first, at every save, and at the end, on the CPU too: no extra host-device sync per step on a GPU, the
  monitor's work done in batches (a step's share is then a few microseconds; one step at a time, with the caches a
  training step leaves cold, it is tens), the health monitor's verdicts (and a ``stop_on`` stop) lag by at most
  that. A process killed outright (SIGKILL, a lost node) loses the steps of that window plus the lines the
  journal had not flushed yet (it writes every ``flush_interval_s``, 1 s by default, and lines past the last seal
  were never part of the signed record): the steps of up to about 1.2 s, not just the window;
- ``on_save``: the monitor's snapshot is written into ``checkpoint-N/`` (``trainledger-monitor.pt``) and every
  file of the folder is digested into ``checkpoint_saved`` (``files``); folders the Trainer rotated away
  (``save_total_limit``) are recorded as deleted;
- ``resume_from_checkpoint``: before the first step, the folder is checked file by file against its signed record
  and the verdict recorded: ``run_resumed``, or ``resume_rejected`` and :class:`ResumeRejected`, which ends
  ``train()``. The Trainer has loaded the folder by then (no callback runs earlier): to check it before anything
  is loaded, call :func:`check_resume` first;
- anomalies in ``stop_on`` (default: a NaN or infinite loss or gradient norm) stop the run: ``run_stopped`` and
  ``control.should_training_stop``, at the step whose values revealed it (within ``sync_every`` steps).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainerCallback

from trainledger.training.health.mfu import record_compute
from trainledger.journal import Signer
from trainledger.journal.errors import UsageError
from trainledger.training.kinds import CheckpointDeleted, CheckpointSaved, MetricsLogged, RunStopped, metric_values

from trainledger.training.checkpoints.state import ResumeRejected, signed_history
from trainledger.training.health.flops import check_recompute_ratio, flop_config_from_hf, is_checkpointing
from trainledger.training.health.monitor import TrainingHealthMonitor
from trainledger.training.integrations.hooks import (StepBuffer, check_folder, export_settings, fingerprint_batch,
                      monitor_options, training_dtype, learn_run_key, open_run_journal, previous_run, record_checkpoint, run_key_for_rank, signer_from, step_loss,
                      tap_clip, norm_parts, untap_clip, replica_options)

__all__ = ["TrainledgerCallback", "check_resume", "ResumeRejected", "ReplayCheckMixin", "ReplayCheckTrainer"]

_MONITOR_FILE = "trainledger-monitor.pt"
_STOP_ON = ("nan_loss", "inf_loss", "nan_grad_norm", "inf_grad_norm")
#: what a Trainer checkpoint folder holds, in the checkpoint contract's terms
_PARTS = {"model": ("model.safetensors", "pytorch_model.bin", "adapter_model.safetensors"),
          "optimizer": ("optimizer.pt",), "scheduler": ("scheduler.pt",), "scaler": ("scaler.pt",),
          "rng": ("rng_state",), "counters": ("trainer_state.json",), "sampler": ("trainer_state.json",)}


def check_resume(checkpoint: str | os.PathLike, *, run_dir: str | os.PathLike, key: str | os.PathLike | None = None,
                 signer: Signer | None = None) -> CheckpointSaved:
    """Check a Trainer checkpoint folder against the run's journal before ``trainer.train(resume_from_checkpoint=)``
    loads anything; records the verdict like the callback does. Returns the record, or raises ResumeRejected."""
    s = signer_from(key, signer)
    j, _ = open_run_journal(Path(run_dir), s, {})
    try:
        return check_folder(j, Path(run_dir), Path(checkpoint))
    finally:
        j.suspend()


def _previous_run(prev: Path, signer: Signer, global_step: int) -> tuple[dict[str, Any], list[Any]]:
    """A finished run this one continues: its journal verified under this run's key; (the link the new journal
    records, the previous journal's signed events)."""
    rep, history = previous_run(prev, signer)
    folder = f"checkpoint-{global_step}"
    record = next((e for e in reversed(history) if isinstance(e, CheckpointSaved) and e.path == folder), None)
    link = {"run_id": rep.run_id, "head": rep.head, "checkpoint": folder, "folder": prev.name,
            "sha256": None if record is None else record.sha256, "step": None if record is None else record.step}
    return link, history


class TrainledgerCallback(TrainerCallback):
    """See the module docstring."""

    def __init__(self, run_dir: str | os.PathLike | None = None, *, key: str | os.PathLike | None = None,
                 signer: Signer | None = None, peak_flops_per_sec: float | None = None, sync_every: int = 16,
                 stop_on: tuple[str, ...] = _STOP_ON, continue_from: str | os.PathLike | None = None,
                 batch_fingerprint: bool = False, export_dir: str | os.PathLike | None = None,
                 release_key: str | os.PathLike | None = None, base_model: str | os.PathLike | None = None,
                 compute_thresholds: dict[str, float] | None = None, carried_flops: float | None = None,
                 device_kind: str | None = None, stragglers: bool = True, straggler_every: int | None = None,
                 straggler_threshold: float = 0.8, fingerprints: bool | None = None,
                 fingerprint_every: int | None = None, fingerprint_exclude: Any = (), on_divergence: str = "raise",
                 sdc_check: int | None = None, tsa: str | None = None, team_log: str | os.PathLike | None = None,
                 team_log_key: str | os.PathLike | None = None, recompute_ratio: float | None = None):
        from trainledger.training.integrations.hooks import Publisher

        try:
            check_recompute_ratio(recompute_ratio)
        except ValueError as e:
            raise UsageError(str(e)) from None
        #: executed over model FLOPs of a step (format 1.10; measure_recompute_ratio), recorded with the FLOP shape
        self._recompute_ratio = recompute_ratio

        Publisher.check(team_log, team_log_key)
        #: an RFC 3161 authority and the team's log (docs/publishing.md), as the Recorder takes them
        self._publish = {"tsa": tsa, "team_log": team_log, "team_log_key": team_log_key}
        self._publisher: Any = None
        self.signer = run_key_for_rank(key, signer, continue_from=continue_from)
        #: the replicas' states held to each other (docs/sdc.md), as the Recorder does: by default when the Trainer
        #: runs plain DDP (not FSDP nor DeepSpeed, whose ranks hold different shards) on more than one rank
        self._fingerprint_options = replica_options(fingerprints, fingerprint_every, fingerprint_exclude,
                                                    on_divergence, sdc_check)
        self._watch: Any = None
        #: replay checks (docs/sdc.md): the first step and every ``sdc_check`` steps run twice and held to each
        #: other before the optimizer step; the Trainer runs them (a callback cannot): :class:`ReplayCheckTrainer`,
        #: or :class:`ReplayCheckMixin` in your own Trainer subclass
        self._sdc_every = sdc_check
        self._replay: Any = None
        self._replay_driver = False  # set by ReplayCheckMixin.train
        self._replaying = False  # the second pass is running: the callback's own hooks look away
        #: on more than one rank: each rank's own compute time (from the step's start to the moment every parameter
        #: has its gradient: the per-parameter hooks, kept for it, fire before DDP waits on the other ranks),
        #: journaled as ``compute_time_s`` and scored in straggler windows, as the Recorder does (the Trainer wraps
        #: the model in DDP itself, so no communication hook is the callback's to set)
        self._straggler_options = {"every": straggler_every, "threshold": straggler_threshold} if stragglers else None
        self._stragglers: Any = None
        self._ready: float | None = None
        #: what the Recorder takes for the compute statement (docs/compute.md): the thresholds watched beside the
        #: defaults, the model FLOPs of earlier runs counted toward them (default: a continued run's predecessor's
        #: total) and the device kind (default: the model's device's name); recorded in run_configured
        self._compute = {"compute_thresholds": compute_thresholds, "carried_flops": carried_flops,
                         "device_kind": device_kind}
        self._monitor_options: dict[str, Any] = {}
        #: at the end of training the model (and its tokenizer) is saved here with ``save_pretrained`` and recorded
        #: as ``model_exported``; with ``release_key`` (an ECDSA P-256 PEM, trainledger keygen --release) it is then
        #: released: model.sig and model.provenance.json beside it (docs/provenance.md);
        #: ``base_model``: a released model this run fine-tunes: its folder, whose digest (and the run its
        #: provenance names) the export records as its base
        self.export_dir, self.release_key, self.base_model = export_settings(export_dir, release_key, base_model)
        #: fingerprint every step's batch (the tensors the Trainer hands the model: ``input_ids``, ``labels``,
        #: ``attention_mask``; summed over the step's micro-batches): a step run again after a resume on another
        #: batch than the first time is a ``data_divergence`` anomaly, which replay recomputes
        self.fingerprint = bool(batch_fingerprint)
        self._fp: Any = None
        #: a finished run's folder this run goes on from (``trainer.train(resume_from_checkpoint=
        #: "OLD/checkpoint-N")`` into a new ``output_dir``): its checkpoint is checked against that run's journal
        self.continue_from = None if continue_from is None else Path(continue_from)
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.peak, self.stop_on = peak_flops_per_sec, frozenset(stop_on)
        self.buffer = StepBuffer(sync_every)
        self.journal = None
        self.monitor: TrainingHealthMonitor | None = None
        self.rank: int | None = None
        self._hooks: list[Any] = []
        self._losses: list[torch.Tensor] = []
        self._tokens = 0
        self._params: list[torch.Tensor] = []
        self._fired: list[torch.Tensor] = []
        self._expected = 0
        self._seq_len: int | None = None
        self._t0 = 0.0
        self._lr: float | None = None
        self._grad_norm: Any = None
        self._clip_norm: Any = None  # the Trainer's own pre-clip norm this step, from the wrapped clip_grad_norm_
        self._tapped = False  # the Trainer's norm was seen: the per-parameter hooks are gone
        self._thread = threading.get_ident()
        self._model = None
        self._snapshot: dict[str, Any] | None = None
        self._resumed: CheckpointSaved | None = None
        self._live: list[CheckpointSaved] = []
        self.stopped: str | None = None

    # -------------------------------------------------------------- start

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        import transformers

        from trainledger.training.experiment.manifest import scrub

        if self._sdc_every is not None:  # before anything is written
            if not self._replay_driver:
                raise UsageError("sdc_check runs a step's forward and backward pass twice, which only the Trainer can "
                                 "do: use trainledger.training.integrations.hf.ReplayCheckTrainer (or mix "
                                 "ReplayCheckMixin into your Trainer subclass)")
            if args.gradient_accumulation_steps != 1:
                raise UsageError(f"sdc_check compares one batch's gradients; gradient_accumulation_steps="
                                 f"{args.gradient_accumulation_steps} sums several (use 1 with sdc_check)")
            if args.fp16:
                raise UsageError("sdc_check compares gradients bit for bit; fp16's loss scaler unscales them in "
                                 "between (use bf16=True or full precision with sdc_check)")
        run = self.run_dir or Path(args.output_dir)
        self.run_dir = run
        meta = {"integration": "transformers.Trainer", "transformers": transformers.__version__,
                "training_args": scrub(args.to_dict())}
        prev = None
        if self.continue_from is not None:
            if state.global_step <= 0:
                raise UsageError(f"continue_from={str(self.continue_from)!r} needs trainer.train("
                                 f"resume_from_checkpoint='{self.continue_from}/checkpoint-N')")
            prev = _previous_run(self.continue_from, self.signer, state.global_step)
            meta["continues"] = prev[0]
        self.journal, self.rank = open_run_journal(run, self.signer, meta)
        from trainledger.training.integrations.hooks import Publisher

        self._publisher = Publisher(self.journal, **self._publish, lead=self.rank in (None, 0))
        learn_run_key(self.signer, self.journal)
        self._model = model
        self._monitor_options = monitor_options(model, previous=prev[1] if prev is not None else None,
                                                peak=self.peak, dtype=training_dtype(model, bf16=bool(args.bf16),
                                                                                     fp16=bool(args.fp16)),
                                                **self._compute)
        self._hooks = [model.register_forward_hook(self._forward, with_kwargs=True)]
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._expected = len(self._params)
        for p in self._params:
            self._hooks.append(p.register_post_accumulate_grad_hook(self._accumulated))
        self._thread = threading.get_ident()
        tap_clip(self)
        if self._straggler_options is not None and self.rank is not None and self._stragglers is None:
            from trainledger.training.distributed.ranks import StragglerDetector

            self._stragglers = StragglerDetector(self.journal, **self._straggler_options)
        fo = self._fingerprint_options
        if self._watch is None and fo["fingerprints"] is not False:
            from transformers.training_args import ParallelMode

            ddp = (args.world_size > 1 and args.parallel_mode == ParallelMode.DISTRIBUTED and not args.fsdp
                   and not args.deepspeed)
            if fo["fingerprints"] or fo["every"] is not None or ddp:
                from trainledger.training.distributed.state_watch import StateWatch

                exclude = list(fo["exclude"]) + (["buffer:*"] if ddp and any(True for _ in model.buffers()) else [])
                self._watch = StateWatch(self.journal, model, kwargs.get("optimizer"), every=fo["every"],
                                         exclude=exclude, on_divergence=fo["on_divergence"])
        history = signed_history(self.journal)
        self._live = [e for e in history if isinstance(e, CheckpointSaved) and e.files is not None]
        if state.global_step > 0:  # resume_from_checkpoint: the Trainer restored checkpoint-<global_step>
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            try:
                if prev is not None:  # the previous run's folder, checked against the previous run's journal
                    self._resumed = check_folder(self.journal, self.continue_from,
                                                 self.continue_from / f"checkpoint-{state.global_step}",
                                                 history=prev[1], reason="continued",
                                                 detail={"continues": prev[0]})
                else:
                    self._resumed = check_folder(self.journal, run, folder, history=history)
            except ResumeRejected:
                self._remove_hooks()
                self.journal.suspend()
                raise
            snap = folder / _MONITOR_FILE
            if snap.is_file():  # inside the folder whose digest just matched its signed record
                state_ = torch.load(snap, weights_only=True)
                self.monitor = TrainingHealthMonitor.resumed(state_, journal=self.journal, checkpoint=self._resumed,
                                                             later=history)

    def _remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
        untap_clip(self)

    def _forward(self, module, args, kwargs, output):
        if not module.training or self._replaying:
            return
        loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
        if isinstance(loss, torch.Tensor):
            self._losses.append(loss.detach())
        if self.fingerprint:
            fp = fingerprint_batch({**dict(enumerate(args)), **kwargs})
            self._fp = fp if self._fp is None or fp is None else self._fp + fp
        ids = kwargs.get("input_ids", args[0] if args else None)
        if isinstance(ids, torch.Tensor):
            self._tokens += ids.numel()  # from the shape: no sync
            if self._seq_len is None and ids.dim() == 2:
                self._seq_len = int(ids.shape[1])

    def _accumulated(self, p: torch.Tensor) -> None:
        # Every parameter's gradient is in once as many hooks fired as the model has parameters with gradients: the
        # norm of all of them then, before any clipping, in one foreach call (the last micro-batch's counts).
        if self._replaying:
            return
        fired = self._fired
        fired.append(p)
        if len(fired) == self._expected:
            self._ready = time.perf_counter()  # this rank's backward is done (DDP waits on the others after)
            if not self._tapped:
                self._grad_norm = norm_parts([q.grad for q in fired if q.grad is not None])
            self._fired = []

    # -------------------------------------------------------------- steps

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()
        self._losses, self._tokens, self._fired, self._grad_norm, self._clip_norm = [], 0, [], None, None
        self._fp = self._ready = None

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if self._clip_norm is not None:  # the Trainer clipped through torch: its pre-clip norm, computed once
            self._grad_norm = self._clip_norm
            self._fired = []
            if not self._tapped:  # the Trainer's clipping path is fixed for the run: the hooks are not needed
                self._tapped = True
                if self._stragglers is None:  # (on more than one rank they time the rank's own backward)
                    for h in self._hooks[1:]:
                        h.remove()
                    self._hooks = self._hooks[:1]
        elif self._tapped:  # it did not clip this step (max_grad_norm 0 on an older transformers): unclipped grads
            self._grad_norm = norm_parts([p.grad for p in self._params if p.grad is not None])
        elif self._fired:  # some parameters got no gradient this step: fewer hooks fire from now on
            self._expected = len({id(q) for q in self._fired})
            if self._grad_norm is None:  # this step's norm, after clipping (the next steps' before)
                self._grad_norm = norm_parts([q.grad for q in self._fired if q.grad is not None])
            self._fired = []
        opt = optimizer if optimizer is not None else kwargs.get("optimizer")
        if opt is not None:
            self._lr = float(opt.param_groups[0]["lr"])

    def on_step_end(self, args, state, control, **kwargs):
        if self.journal is None:
            return
        if self.monitor is None:
            fc = None
            if self._seq_len and _has_shape(self._model):
                # gradient checkpointing on: the recomputation is declared ("full"), and the ratio recorded as
                # given (recompute_ratio=, measured with measure_recompute_ratio); the statement excludes it
                fc = flop_config_from_hf(self._model, self._seq_len,
                                         recompute="full" if is_checkpointing(self._model) else "none")
                if self._recompute_ratio is not None:
                    fc = dataclasses.replace(fc, recompute_ratio=float(self._recompute_ratio))
            self.monitor = TrainingHealthMonitor(journal=self.journal, flop_config=fc, **self._monitor_options)
        dt = time.perf_counter() - self._t0
        ct = None
        if self._stragglers is not None:  # more than one rank: this rank's own time, and the straggler windows
            ct = self._ready - self._t0 if self._ready is not None else None
            self._stragglers.observe(state.global_step - 1, ct if ct is not None else dt)
        due = self.buffer.add(state.global_step - 1, step_loss(self._losses), self._grad_norm,
                              {"lr": self._lr, "tokens": self._tokens or None, "step_time_s": dt,
                               "batch_fingerprint": self._fp, "compute_time_s": ct})
        w, step = self._watch, state.global_step - 1
        if w is not None and (w.every is None or step % w.every == 0):  # fingerprint now, after the steps before
            self._drain(control)
            w.after_step(step, dt)
        elif due:
            self._drain(control)
        if w is not None and control.should_save:  # the Trainer saves next: the replicas compared before it does
            self._drain(control)
            w.check(step, at="checkpoint")

    def on_epoch_end(self, args, state, control, **kwargs):
        if self._watch is not None and control.should_save and self.journal is not None and state.global_step:
            self._drain(control)
            self._watch.check(state.global_step - 1, at="checkpoint")

    def stopped_by(self, exception: BaseException) -> None:
        """``train()`` raised (the Trainer has no hook for it; :class:`ReplayCheckMixin` calls this): the steps still
        queued and ``run_stopped`` (rule ``exception``) on record, durable, and the journal left open for a resume;
        the callback's hooks removed."""
        self._remove_hooks()
        j = self.journal
        if j is None or j.closed or isinstance(exception, ResumeRejected):
            return
        if self.monitor is not None:
            self.buffer.observe(self.monitor, j, frozenset())
        j.append(RunStopped(rule="exception", reason=f"{type(exception).__name__}: {exception}"[:500]), durable=True)
        j.suspend()
        self.journal = None

    def replay_check(self, trainer: Any, model: Any) -> Any:
        """The replay check :class:`ReplayCheckMixin` runs steps through (made at the first step: ``model`` is the
        model the Trainer trains, DDP-wrapped on more than one rank, whose communication hook then keeps this
        rank's own gradients of a checked step before the all-reduce)."""
        if self._replay is None:
            from trainledger.training.distributed.ranks import ComputeClock
            from trainledger.training.distributed.state_watch import ReplayCheck, _is_ddp

            clock = ComputeClock.attach(model) if _is_ddp(model) else None
            self._replay = ReplayCheck(self.journal, model, every=self._sdc_every, clock=clock,
                                       on_mismatch=self._fingerprint_options["on_divergence"])
        return self._replay

    def _drain(self, control) -> None:
        stop = self.buffer.observe(self.monitor, self.journal, self.stop_on if self.stopped is None else frozenset())
        if stop is not None:
            self.stopped = stop.rule
            control.should_training_stop = True

    # -------------------------------------------------------------- checkpoints

    def on_log(self, args, state, control, logs=None, **kwargs):
        """Every number the Trainer logs (``loss``, ``learning_rate``, ``grad_norm``, ``eval_*``, ...), as
        ``metrics_logged`` (source ``hf``) at the step it was logged after (``global_step - 1``, trainledger's step
        convention); what is not a number (a string the Trainer adds) is left out."""
        if self.journal is None or not logs:
            return
        numbers = {k: v for k, v in logs.items() if isinstance(k, str) and k and isinstance(v, (int, float))}
        if numbers:
            self.journal.append_deferred(MetricsLogged(step=max(0, state.global_step - 1),
                                                       metrics=metric_values(numbers), source="hf"))

    def on_save(self, args, state, control, **kwargs):
        if self.monitor is not None:
            self._drain(control)
        if not state.is_world_process_zero or self.journal is None:
            return  # the Trainer writes checkpoints on the main process
        t0 = time.perf_counter()
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if not folder.is_dir():
            return
        if self.monitor is not None:  # a new file, never written through a link planted at its name
            from trainledger.journal.paths import open_new

            with open_new(folder / _MONITOR_FILE) as f:
                torch.save(self.monitor.state(), f)
        names = [p.name for p in folder.iterdir()]
        contents = [part for part, files in _PARTS.items() if any(n.startswith(files) for n in names)]
        contents += ["accumulation", "manifest_id"]  # the Trainer's step is always a whole update; no manifest
        ev = record_checkpoint(self.journal, self.run_dir, folder, step=state.global_step - 1, contents=contents,
                           tokens=int(state.num_input_tokens_seen or 0), t0=t0)
        for old in self._live:  # folders the Trainer rotated away (save_total_limit)
            if not (self.run_dir / old.path).exists():
                self.journal.append(CheckpointDeleted(path=old.path, step=old.step,
                                                      reason="removed by the Trainer (save_total_limit)"),
                                    durable=True)
        self._live = [o for o in self._live if (self.run_dir / o.path).exists()] + [ev]
        self._publisher.after_seal()

    # -------------------------------------------------------------- end

    def on_train_end(self, args, state, control, **kwargs):
        if self.journal is None:
            return
        if self.monitor is not None:
            self._drain(control)
        if self._stragglers is not None:
            self._stragglers.finish()  # the last, partial window (every rank ends training together)
        self._remove_hooks()
        exported = self.export_dir is not None and state.is_world_process_zero
        if exported:
            self._export(kwargs.get("model"), kwargs.get("processing_class") or kwargs.get("tokenizer"))
        record_compute(self.journal)
        self._publisher.before_close()
        if self.stopped:
            self.journal.close(status="stopped", reason=self.stopped)
        else:
            self.journal.close()
        self._publisher.after_close([self.signer.public])
        if exported and self.release_key is not None:
            from trainledger.journal.statements.release.attest import release
            from trainledger.journal.statements.release.keys import load_release_key

            release(self.export_dir, self.journal.path, load_release_key(self.release_key), keys=[self.signer.public])

    def _export(self, model: Any, tokenizer: Any) -> None:
        """Save the trained model (and tokenizer) to ``export_dir`` and record it (model_exported)."""
        from trainledger.journal.statements.release.export import base_of, checkpoint_of, record_export

        if model is None:
            raise UsageError("export_dir=: the Trainer did not hand the callback its model")
        self.export_dir.mkdir(parents=True, exist_ok=True)
        getattr(model, "module", model).save_pretrained(self.export_dir)
        if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
            tokenizer.save_pretrained(self.export_dir)
        step = self.monitor.last_step if self.monitor is not None else None
        base, base_release, lineage = base_of(self.base_model) if self.base_model is not None else (None, None, None)
        record_export(self.journal, self.export_dir, step=step, checkpoint=checkpoint_of(self._live, step),
                      base=base, base_release=base_release, relative_to=self.run_dir, lineage=lineage)


class ReplayCheckMixin:
    """A Trainer that runs replay checks for its :class:`TrainledgerCallback`'s ``sdc_check=M`` (docs/sdc.md): on
    the first step and every M steps, :meth:`training_step` (the forward pass, the loss and the backward pass) runs
    a second time on the same inputs with the random state as it was and the gradients kept apart (under DDP's
    ``no_sync``: this rank's own gradients), the two are held to each other bit for bit, ``replay_checked`` is
    journaled, and a mismatch is sealed and raises ``ReplayMismatch`` before the optimizer step. Mix it in first::

        class MyTrainer(ReplayCheckMixin, Trainer): ...

    or use :class:`ReplayCheckTrainer`. Without a callback that has ``sdc_check``, it is the Trainer it mixes into."""

    def train(self, *args: Any, **kwargs: Any) -> Any:
        cb = _callback_of(self)
        if cb is not None:
            cb._replay_driver = True
        try:
            return super().train(*args, **kwargs)  # type: ignore[misc]
        except BaseException as e:
            if cb is not None:
                cb.stopped_by(e)
            raise

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        cb = _callback_of(self)
        if cb is None or cb._sdc_every is None or cb.journal is None:
            return super().training_step(model, inputs, *args, **kwargs)  # type: ignore[misc]
        check, step = cb.replay_check(self, model), self.state.global_step  # type: ignore[attr-defined]
        if not check.begin(step):
            return super().training_step(model, inputs, *args, **kwargs)  # type: ignore[misc]
        try:
            loss = super().training_step(model, inputs, *args, **kwargs)  # type: ignore[misc]
        except BaseException:
            check.disarm()
            raise
        if cb.monitor is not None:
            cb.buffer.observe(cb.monitor, cb.journal, frozenset())  # the steps before it on record first

        def again() -> Any:
            cb._replaying = True
            try:
                return super(ReplayCheckMixin, self).training_step(model, inputs, *args, **kwargs)  # type: ignore[misc]
            finally:
                cb._replaying = False

        check.finish(step, loss, again)
        return loss


def _callback_of(trainer: Any) -> TrainledgerCallback | None:
    handler = getattr(trainer, "callback_handler", None)
    return next((c for c in getattr(handler, "callbacks", ()) if isinstance(c, TrainledgerCallback)), None)


class ReplayCheckTrainer(ReplayCheckMixin, Trainer):
    """``transformers.Trainer`` with :class:`ReplayCheckMixin`: the Trainer for ``TrainledgerCallback(sdc_check=M)``.
    It takes what the installed ``Trainer`` takes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)


def _has_shape(model: Any) -> bool:
    cfg = getattr(model, "config", None)
    return all(hasattr(cfg, a) for a in ("num_hidden_layers", "num_attention_heads", "hidden_size")) and \
        callable(getattr(model, "get_input_embeddings", None))
