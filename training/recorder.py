"""Receipts for a hand-written PyTorch loop in five added lines: :class:`Recorder`.

    rec = Recorder("runs/mine", model=model, optimizer=opt, data=loader)   # key=: yours; else your default key
    for step in range(rec.start, steps):           # rec.start: 0, or the step after the restored checkpoint
        ...                                          # your step, as before
        rec.step(step, loss.item(), grad_norm=gn)
        if (step + 1) % 100 == 0: rec.checkpoint(step)
    rec.close()

It bundles the signed journal (``RUN_DIR/journal.jsonl``), the health monitor and the checkpointer. Opened on a
folder whose journal is open (a crash, a preemption), it continues the journal (torn tail repaired) and restores the
newest checkpoint the journal recorded, with the same verdicts as everywhere: ``run_resumed``, or ``resume_rejected``
and :class:`~trainledger.training.checkpoints.state.ResumeRejected` (a changed byte, a missing cursor, a model the weights do
not fit). The data cursor is ``data.state_dict()`` when ``data`` has one (trainledger's sampler, torchdata's
``StatefulDataLoader``), else the plain ``data_state`` you pass to :meth:`checkpoint` (epoch, batch index); a plain
``DataLoader`` with neither is saved without a cursor, and resuming from it is a ``resume-invalid-missing-state``
verdict naming the cursor, never a crash. A compiled (``torch.compile``) or DDP-wrapped model saves and restores the
weights of the module inside.

Under torchrun (``RANK`` and ``WORLD_SIZE`` > 1) each rank writes its own journal (``rank-NNNNN.jsonl``) and
checkpoint folder (``checkpoints/rank-NNNNN/``); with the process group up, :meth:`checkpoint` and :meth:`close`
anchor the ranks' journals to each other (collectives: call them on every rank) and a restart resumes every rank
from the newest step all ranks saved. A checkpoint the user's code wrote (:meth:`record_checkpoint`) is never
loaded by the Recorder: :func:`check_checkpoint` checks it before the user's own load, and a Recorder opened
after that continues from it. A crash inside ``with Recorder(...)`` is recorded (``run_stopped``, rule
``exception``).

Step convention: a checkpoint is labelled with the last step it completed (``checkpoint(step)`` after step
``step``), and the run continues at ``step + 1`` (:attr:`start`). nanoGPT's ``iter_num`` is the next step to run:
pass ``iter_num - 1``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from trainledger.training.health.flops import device_kind as _device_kind_of
from trainledger.training.health.mfu import carried_by, record_compute
from trainledger.journal import Journal, Signer
from trainledger.training.distributed.ranks import in_torchrun, journal_name, rank_info
from trainledger.journal.errors import JournalClosed, UsageError
from trainledger.journal.keys import default_key, publish_key

from trainledger.training.checkpoints.state import (
    CheckpointSaved,
    ResumeRejected,
    enforce_retention,
    live_checkpoints,
    restore_checkpoint,
    save_checkpoint,
    signed_history,
)
from trainledger.training.health.monitor import TrainingHealthMonitor
from trainledger.training.kinds import MAX_METRIC_NAME, PLAIN_NUMBERS, logged_row
from trainledger.training.integrations.hooks import StepBuffer, check_folder, learn_run_key, open_run_journal, \
    record_checkpoint, run_key_for_rank, signer_from

__all__ = ["Recorder", "check_checkpoint"]


def check_checkpoint(path: str | os.PathLike, *, run_dir: str | os.PathLike, key: str | os.PathLike | None = None,
                     signer: Signer | None = None) -> CheckpointSaved:
    """Check a checkpoint your own code wrote and recorded (:meth:`Recorder.record_checkpoint`) before your code
    loads it, with no model or optimizer yet (nanoGPT loads ``ckpt.pt`` before it builds the optimizer): its
    digest against the newest signed record of that path, and the verdict recorded in the run's journal
    (``run_resumed`` naming the step it was recorded at and what the file holds and does not; or
    ``resume_rejected`` and :class:`ResumeRejected`). Returns the record: its ``step`` is the last step the file
    completed. A :class:`Recorder` opened afterwards on the folder continues from it (``rec.start``)."""
    s = signer_from(key, signer)
    run = Path(run_dir)
    jpath = run / journal_name()  # from the environment: no collective, so one rank alone may call this
    if not jpath.exists():
        raise UsageError(f"{jpath}: no journal to check {path} against (was the run recorded in {run}?)")
    try:
        j = Journal.open_append(jpath, signer=s)
    except JournalClosed:
        raise UsageError(f"{jpath}: this run is finished (closed); continue it in a new folder with "
                         f"Recorder(NEW_DIR, continue_from={str(run)!r}, ...)") from None
    try:
        return check_folder(j, run, Path(path))
    finally:
        j.suspend()


def _grouped() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _rank_info(run: Path) -> Any:
    """torchrun's place for this process, else None."""
    return rank_info(run_dir=run) if in_torchrun() else None


def _agreed(kept: list[CheckpointSaved]) -> CheckpointSaved | None:
    """The newest of this rank's live checkpoints whose step every rank has (one collective, when the process
    group is up): ranks that died at different points resume from the same step. Without a process group, this
    rank's newest."""
    if not _grouped():
        return kept[-1] if kept else None
    import torch.distributed as dist

    mine = sorted({c.step for c in kept})
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    common = set(mine).intersection(*(set(x or []) for x in every))
    if not common:
        return None
    step = max(common)
    return [c for c in kept if c.step == step][-1]


def _taken(found: list[Any]) -> list[Any]:
    """Every anomaly in ``found`` now, taken out of it (a drain on the journal's thread may append more meanwhile:
    those stay for the next taker)."""
    n = len(found)
    out = found[:n]
    del found[:n]
    return out


_SAID_KEY: set[str] = set()


def _say_key(key: Path) -> None:
    """Once a process: which key signs the runs that name none (the user's default key)."""
    if str(key) not in _SAID_KEY:
        _SAID_KEY.add(str(key))
        sys.stderr.write(f"trainledger: signing with {key} (the key of your runs; pass key= for another)\n")


class Recorder:
    """A journal, a health monitor and a checkpointer for your own training loop (see the module docstring)."""

    def __init__(self, run_dir: str | os.PathLike, *, model: Any, optimizer: Any, key: str | os.PathLike | None = None,
                 signer: Signer | None = None, scheduler: Any = None, scaler: Any = None, data: Any = None,
                 flop_config: Any = None, peak_flops_per_sec: float | None = None, keep_last: int | None = None,
                 meta: dict[str, Any] | None = None, continue_from: str | os.PathLike | None = None,
                 release_key: str | os.PathLike | None = None, rank_keys: str | None = None,
                 fail_closed_after_s: float | None = None, compute_thresholds: dict[str, float] | None = None,
                 carried_flops: float | None = None, device_kind: str | None = None, batch: int | None = None,
                 chance_loss: float | None = None, stragglers: bool = True, straggler_every: int | None = None,
                 straggler_threshold: float = 0.8, fingerprints: bool | None = None,
                 fingerprint_every: int | None = None, fingerprint_exclude: Any = (), on_divergence: str = "raise",
                 sdc_check: int | None = None, fingerprint_grads: bool = False, tsa: str | None = None,
                 team_log: str | os.PathLike | None = None, team_log_key: str | os.PathLike | None = None,
                 device_settings: dict[str, Any] | None = None):
        if key is not None and signer is not None:
            raise UsageError("Recorder takes the run's signing key once: key= or signer=, not both")
        if on_divergence not in ("raise", "record", "rewind"):
            raise UsageError(f"on_divergence must be 'raise', 'record' or 'rewind', got {on_divergence!r}")
        from trainledger.training.integrations.hooks import Publisher

        Publisher.check(team_log, team_log_key)
        if keep_last is not None and keep_last < 1:
            raise UsageError(f"keep_last must be at least 1, got {keep_last}")
        if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
            raise UsageError(f"batch must be a whole number of steps, at least 1, got {batch!r}")
        #: batch > 1: step() queues its step and the monitor takes the queue every ``batch`` steps or 0.2 s
        #: (:meth:`hand_over`), with warm caches, instead of one step at a time after each training step has cooled
        #: them; every other method hands the queue over first, so the journal's order is the steps' own
        self._queue = StepBuffer(batch, max_wait_s=0.2) if batch is not None and batch > 1 else None
        #: no batch (the default): step() queues its step with the journal, whose next drain (the background
        #: thread within the flush interval, or any other call that touches the journal) folds it in order;
        #: batch=1: the monitor folds each step inside step(), which returns that step's own anomalies
        self._queued = batch is None
        self.run = Path(run_dir)
        self.run.mkdir(parents=True, exist_ok=True)
        #: under torchrun, this process's place (rank, world size, the run identity every rank shares); else None
        self.rank_info = _rank_info(self.run)
        by_default = key is None and signer is None
        if by_default:
            if self.rank_info is not None and self.rank_info.world_size > 1:
                # each node would make its own: the ranks of one run would not share a key
                raise UsageError("Recorder under torchrun needs the run's signing key: key='path/to/trainledger.key' "
                                 "(or a pkcs11: URI, or signer=)")
            key = default_key()
            _say_key(key)
        self.signer = run_key_for_rank(key, signer, info=self.rank_info, rank_keys=rank_keys,
                                       continue_from=continue_from)
        if by_default:  # the public key beside the journal, as the main job and the W&B calls leave it
            publish_key(self.run, self.signer.public)
        self.model, self.optimizer, self.scheduler, self.scaler, self.data = model, optimizer, scheduler, scaler, data
        self.keep_last = keep_last
        #: an ECDSA P-256 release key (trainledger keygen --release): close() releases the last recorded export
        self.release_key = release_key
        #: under torchrun: "key" (every rank signs with the run's key) or "ephemeral" (each rank a key in memory
        #: certified by it, once a round; training.distributed.ranks.open_rank_journal). None: ephemeral for a
        #: pkcs11: or KMS key, the key itself for a key file
        self.rank_keys = rank_keys
        #: with a key that signs in the background (a token, a KMS): once a seal has waited this long for its
        #: signature, step() and the other records raise instead of going on unsigned (the run fails closed)
        self._journal_options = {} if fail_closed_after_s is None else {"fail_closed_after_s": fail_closed_after_s}
        self._exported: Path | None = None
        #: what every monitor this Recorder makes records in its run_configured (format 1.7, docs/compute.md): the
        #: device kind (default: the model's device's name), the compute thresholds watched beside the defaults, and
        #: the model FLOPs of earlier runs counted toward them (default: a continued run's predecessor's total)
        self._monitor_options: dict[str, Any] = {"device_kind": device_kind or _device_kind_of(model),
                                                 "compute_thresholds": compute_thresholds}
        if carried_flops is not None:
            self._monitor_options["carried_flops"] = carried_flops
        if chance_loss is not None:  # the blow-up rule's start level (format 1.10): ln 10 for ten classes
            self._monitor_options["chance_loss"] = chance_loss
        # format 1.10: the accelerator's variant (SXM or PCIe, from its PCI device ID) and power limit, read from
        # NVML for a model on a CUDA device; device_settings= gives them (or {} records none)
        from trainledger.training.integrations.hooks import device_settings_of

        self._monitor_options["device_settings"] = device_settings_of(model) if device_settings is None \
            else device_settings
        #: the step to run next: 0 for a new run, the restored checkpoint's step + 1 after a resume
        self.start = 0
        #: the restored checkpoint's ``data_state`` (what you passed to checkpoint()), or None
        self.data_state: Any = None
        self.resumed_from: CheckpointSaved | None = None
        self._kept: list[CheckpointSaved] = []
        self._step = 0  # the last step given to step(): log()'s default
        info = self.rank_info
        #: where this process's own checkpoints go, relative to the run folder (one folder per rank under torchrun)
        self.checkpoint_dir = "checkpoints" if info is None else f"checkpoints/rank-{info.rank:05d}"
        path = self.run / journal_name()
        meta = {"recorder": True, **(meta or {})}
        if path.exists():  # continued (a finished one is refused, naming continue_from=)
            self.journal, _ = open_run_journal(self.run, self.signer, meta, info=info, rank_keys=rank_keys,
                                               **self._journal_options)
            self._learn_run_key()
            self._resume(flop_config, peak_flops_per_sec)
        elif continue_from is not None:
            self._continue(Path(continue_from), path, meta, flop_config, peak_flops_per_sec)
        else:
            self.journal, _ = open_run_journal(self.run, self.signer, meta, info=info, rank_keys=rank_keys,
                                               **self._journal_options)
            self._learn_run_key()
            self.monitor = TrainingHealthMonitor(journal=self.journal, flop_config=flop_config,
                                                 peak_flops_per_sec=peak_flops_per_sec, **self._monitor_options)
        #: the default step's path, looked up once: the journal's queue, the monitor's fold and what it found
        self._later, self._fold = self.journal.append_later, self.monitor.fold_queued
        self._found = self.monitor.found_queued
        #: under torchrun with a process group (world > 1): the straggler windows (training.distributed's detector,
        #: every rank, one small collective a window) over each rank's own compute time, timed by ``_clock`` (the
        #: DDP model's communication hook: the moment its last gradient bucket is ready, before it waits on the
        #: others); None in one process, or with ``stragglers=False``
        self._stragglers: Any = None
        self._clock: Any = None
        if (stragglers or sdc_check is not None) and self.rank_info is not None and _grouped():
            from trainledger.training.distributed.ranks import ComputeClock, StragglerDetector

            self._clock = ComputeClock.attach(model)
            if stragglers:
                self._stragglers = StragglerDetector(self.journal, every=straggler_every,
                                                     threshold=straggler_threshold)
        #: replay checks (docs/sdc.md): :meth:`backward` runs the forward and backward pass of the first step and of
        #: every ``sdc_check`` steps twice, held to each other before the optimizer step; None: off
        self._replay: Any = None
        #: what a divergence does: raise StateDivergence, record and go on, or rewind (:meth:`_rewind`)
        self._on_divergence = on_divergence
        #: an RFC 3161 time-stamping authority and the team's log (docs/publishing.md): the seal after each checkpoint
        #: gets a token, on a thread of its own (``timestamp_recorded``, or the error when none came: training never
        #: waits on it), and the final seal at close (beside the journal: a closed journal takes no line), rank 0
        #: alone under torchrun (its anchors name every rank's head); at close the journal's checkpoint is added to
        #: ``team_log``, signed with ``team_log_key``
        self._publisher = Publisher(self.journal, tsa=tsa, team_log=team_log, team_log_key=team_log_key,
                                    lead=self.rank_info is None or self.rank_info.rank == 0)
        if sdc_check is not None:
            from trainledger.training.distributed.state_watch import ReplayCheck

            self._replay = ReplayCheck(self.journal, model, every=sdc_check, clock=self._clock,
                                       on_mismatch="raise" if on_divergence == "rewind" else on_divergence)
        #: the replicas' states held to each other (docs/sdc.md): by default for a DistributedDataParallel model under
        #: torchrun with a process group, every ``fingerprint_every`` steps (None: chosen from the cost, about 1% of
        #: the training time) and at each checkpoint; otherwise (one process, or a sharded model whose ranks hold
        #: different state) only when fingerprints=True or fingerprint_every is given
        self._watch: Any = None
        if fingerprints is None:
            from trainledger.training.distributed.state_watch import _is_ddp

            fingerprints = fingerprint_every is not None or (self.rank_info is not None and _grouped()
                                                             and _is_ddp(model))
        if fingerprints:
            from trainledger.training.distributed.state_watch import StateWatch

            self._watch = StateWatch(self.journal, model, optimizer, every=fingerprint_every,
                                     exclude=fingerprint_exclude, grads=bool(fingerprint_grads),
                                     on_divergence="raise" if on_divergence == "rewind" else on_divergence)
        self._t = time.perf_counter()
        if self._clock is not None:
            self._clock.start = self._t

    def _learn_run_key(self) -> None:
        learn_run_key(self.signer, self.journal)

    def _continue(self, prev: Path, path: Path, meta: dict[str, Any] | None, flop_config: Any,
                  peak: float | None) -> None:
        """A new run that continues a finished one (more steps, a fine-tune): the previous journal is verified
        under this run's key, its newest live checkpoint checked against its signed record and loaded, and the new
        journal names the previous run, its signed head and the checkpoint's digest (``run_opened.meta.continues``,
        then ``run_resumed`` with reason ``continued``)."""
        from trainledger.journal import RunResumed, read_signed_events, verify
        from trainledger.journal.paths import confined

        from trainledger.training.checkpoints.state import apply_payload, file_sha256, load_payload

        pj = prev / path.name  # under torchrun: this rank's journal of the previous run
        rep = verify(pj, keys=[self.signer.public], allow_unsealed=True)
        history = list(read_signed_events(pj, [self.signer.public]))
        kept = live_checkpoints(prev, history)
        carried = carried_by(history)  # what the previous run spent and carried counts toward this run's thresholds
        if not kept:
            raise UsageError(f"{pj}: no checkpoint on record to continue from")
        ck = kept[-1]
        file = confined(prev, ck.path, what="checkpoint path")
        if file_sha256(file)[0] != ck.sha256:
            raise ResumeRejected("resume-invalid-digest", f"{file}: differs from its signed record in {pj}")
        payload = load_payload(file)
        missing = [k for k in ("model", "optimizer", "rng") if k not in payload]
        if missing:
            raise ResumeRejected("resume-invalid-missing-state", f"{file}: lacks {', '.join(missing)}", tuple(missing))
        try:
            self.data_state = apply_payload(payload, model=self.model, optimizer=self.optimizer,
                                            scheduler=self.scheduler, scaler=self.scaler,
                                            sampler=self.data if callable(getattr(self.data, "load_state_dict", None))
                                            else None)
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            raise ResumeRejected("resume-invalid-format",
                                 f"{file}: does not fit what it is restored into: {' '.join(str(e).split())[:300]}") \
                from None
        link = {"run_id": rep.run_id, "head": rep.head, "checkpoint": ck.path, "sha256": ck.sha256,
                "step": ck.step, "folder": prev.name}
        self.journal, _ = open_run_journal(self.run, self.signer, {**(meta or {}), "continues": link},
                                           info=self.rank_info, rank_keys=self.rank_keys, **self._journal_options)
        self.journal.append(RunResumed(reason="continued", from_step=ck.step, checkpoint=ck.path,
                                       detail={"continues": link}), durable=True)
        self.monitor = TrainingHealthMonitor(journal=self.journal, flop_config=flop_config, peak_flops_per_sec=peak,
                                             **{"carried_flops": carried, **self._monitor_options})
        self.monitor.observe_resume(ck.step, reason="continued", checkpoint=ck.path, append=False)
        self.start = ck.step + 1
        self.resumed_from = ck

    def _own(self, ck: CheckpointSaved) -> bool:
        """A checkpoint this Recorder wrote (in its folder, with the monitor's snapshot), not one the user's code
        wrote (:meth:`record_checkpoint` records no snapshot)."""
        return ck.path.startswith(self.checkpoint_dir + "/") and ck.monitor_sha256 is not None

    def _resume(self, flop_config: Any, peak: float | None) -> None:
        j = self.journal
        history = signed_history(j)
        self._kept = live_checkpoints(self.run, history)
        own = [c for c in self._kept if self._own(c)]
        # under torchrun every rank takes part in the agreement, whatever it then restores (it is a collective)
        ckpt = _agreed(own) if self.rank_info is not None else (own[-1] if own else None)
        newest = self._kept[-1] if self._kept else None
        if newest is not None and not self._own(newest):
            self._resume_theirs(newest, history)
            return
        if ckpt is None:  # nothing to restore: the steps start over in the same journal
            self.monitor = TrainingHealthMonitor(journal=j, flop_config=flop_config, peak_flops_per_sec=peak,
                                                 **self._monitor_options)
            return
        try:
            info = restore_checkpoint(self.run, j, ckpt.path, model=self.model, optimizer=self.optimizer,
                                      scheduler=self.scheduler, scaler=self.scaler,
                                      sampler=self.data if callable(getattr(self.data, "load_state_dict", None))
                                      else None)
        except ResumeRejected:
            j.suspend()
            raise
        self.start = info["counters"]["step"] + 1
        self.data_state = info.get("data_state")
        self.resumed_from = ckpt
        snap = (info.get("extra") or {}).get("monitor")
        if isinstance(snap, dict):
            self.monitor = TrainingHealthMonitor.resumed(snap, journal=j, checkpoint=ckpt, later=history)
        else:
            self.monitor = TrainingHealthMonitor(journal=j, flop_config=flop_config, peak_flops_per_sec=peak,
                                                 **self._monitor_options)
            self.monitor.observe_resume(ckpt.step, checkpoint=ckpt.path, append=False)

    def _resume_theirs(self, ck: CheckpointSaved, history: list[Any]) -> None:
        """The newest checkpoint is one the user's code wrote (:meth:`record_checkpoint`): the user's code loads
        it, not the Recorder. The monitor continues from the journal as it stands (the fold replay makes), and
        when :func:`check_checkpoint` has already checked that file (a ``run_resumed`` for it after its record),
        the run is resumed from it: :attr:`start` is the step after it. Otherwise call :meth:`check_checkpoint`
        before loading it."""
        self.monitor = TrainingHealthMonitor.continued(history, journal=self.journal)
        if any(type(ev).__struct_config__.tag == "run_resumed" and ev.checkpoint == ck.path and ev.seq > ck.seq
               for ev in history):
            self.start = ck.step + 1
            self.resumed_from = ck

    def step(self, step: int, loss: float, *, grad_norm: float | None = None, lr: float | None = None,
             tokens: int | None = None, batch_size: int | None = None, step_time_s: float | None = None,
             batch_fingerprint: Any = None) -> list[Any]:
        """Record one optimizer step (a Python float loss; ``loss.item()``); returns the anomalies found since the
        previous call (each names its step). By default the step is queued with the journal and folded by the
        monitor at the journal's next drain, in order (on its background thread within the flush interval, or at
        the Recorder's next other call), so a step's own anomalies come with a later call; ``Recorder(batch=1)``
        folds each step inside this call and returns its own anomalies. The step time
        defaults to the wall time since the previous call (or since the recorder was made). ``tokens`` (per step)
        gives tokens/s and, with ``flop_config`` and ``peak_flops_per_sec``, MFU. ``batch_fingerprint``
        (``batch_fingerprint(x, y)`` from ``trainledger.training``, a tensor or its float): a step run again after
        a resume on another batch than the first time is a ``data_divergence`` anomaly."""
        now = time.perf_counter()
        dt = now - self._t if step_time_s is None else step_time_s
        self._t = now
        self._step = step
        ct = None
        if self._stragglers is not None:  # under torchrun: this rank's own time, and the straggler windows
            ct = self._compute_time(step, now, dt)
        if self._watch is not None:
            found = self._record_step(step, loss, dt, ct, grad_norm, lr, tokens, batch_size, batch_fingerprint)
            w = self._watch
            if w.every is None or step % w.every == 0:  # due (or choosing its cadence): in the journal's order
                self._settle()
                self._watched(lambda: w.after_step(step, dt))
            return found
        return self._record_step(step, loss, dt, ct, grad_norm, lr, tokens, batch_size, batch_fingerprint)

    def _record_step(self, step: int, loss: float, dt: float, ct: float | None, grad_norm: float | None,
                     lr: float | None, tokens: int | None, batch_size: int | None,
                     batch_fingerprint: Any) -> list[Any]:
        if self._queued:
            if type(step) is int and type(loss) is float and type(dt) is float \
                    and (grad_norm is None or type(grad_norm) is float) and (lr is None or type(lr) is float) \
                    and (tokens is None or type(tokens) is int) and (batch_size is None or type(batch_size) is int) \
                    and batch_fingerprint is None:
                # the default: the step queued with the journal, folded by its next drain (in order, warm, off this
                # call); returned are the anomalies the folds found since the previous call
                self._later(self._fold, (step, loss, grad_norm, lr, dt, batch_size, tokens) if ct is None
                            else (step, loss, grad_norm, lr, dt, batch_size, tokens, ct))
                return _taken(self._found) if self._found else []
            before = self.hand_over()  # a step not queued: the queued ones are folded first
            found = self.monitor.observe_step(step, loss, grad_norm=grad_norm, step_time_s=dt, batch_size=batch_size,
                                              tokens=tokens, lr=lr, batch_fingerprint=batch_fingerprint,
                                              compute_time_s=ct)
            return before + found if before else found
        q = self._queue
        if q is None:  # batch=1
            return self.monitor.observe_step(step, loss, grad_norm=grad_norm, step_time_s=dt, batch_size=batch_size,
                                             tokens=tokens, lr=lr, batch_fingerprint=batch_fingerprint,
                                             compute_time_s=ct)
        if q.add(step, loss, grad_norm, {"step_time_s": dt, "batch_size": batch_size, "tokens": tokens, "lr": lr,
                                         "batch_fingerprint": batch_fingerprint, "compute_time_s": ct}):
            return self.hand_over()
        return []

    def backward(self, step: int, closure: Any) -> Any:
        """The forward and backward pass of ``step``, with replay checks (``Recorder(sdc_check=M)``, docs/sdc.md):
        ``closure()`` runs the forward pass and returns the loss; this runs its backward pass and returns the loss.
        On the first step and every M steps it runs both again, with the random state as it was and the gradients
        kept apart, holds the two to each other bit for bit, and records ``replay_checked``; a mismatch is sealed
        and raises ``ReplayMismatch`` before your optimizer step. Without ``sdc_check``, only the pass::

            loss = rec.backward(step, lambda: loss_fn(model(x), y))
            opt.step()
            rec.step(step, loss.item())
        """
        if self._replay is None:
            loss = closure()
            loss.backward()
            return loss
        if self._replay.due(step):
            self._settle()  # the check's line after the steps before it
        return self._replay.backward(step, closure)

    def _compute_time(self, step: int, now: float, dt: float) -> float | None:
        """This rank's own time in the step (its batch, forward and backward, up to its last gradient bucket being
        ready: before it waits on the other ranks), journaled as ``compute_time_s``; the straggler windows score it
        (the step time where the model gives no such moment: every rank then shows the slowest one's time)."""
        ct = self._clock.take(now) if self._clock is not None else None
        self._stragglers.observe(step, ct if ct is not None else dt)
        return ct

    def hand_over(self) -> list[Any]:
        """Hand the queued steps to the monitor now, in order; returns the anomalies found since the previous call
        (each names its step). Call it before reading ``rec.monitor`` yourself. With ``batch=1``: nothing queued,
        []."""
        self._settle()
        return _taken(self._found)

    def _settle(self) -> None:
        """Fold the queued steps (every other method does this first, so the journal's order is the steps' own);
        their anomalies wait for the next :meth:`step` or :meth:`hand_over` to return them."""
        if self._queued:
            self.journal.drain()
            return
        q = self._queue
        if q is not None and q.pending:
            self._found += q.hand_over(self.monitor)

    def log(self, metrics: Mapping[str, Any], *, step: int | None = None) -> None:
        """Record any scalars, as ``wandb.log`` or ``add_scalar`` would log them: accuracy, an eval loss, the learning
        rate, anything with a name. One ``metrics_logged`` event at ``step`` (default: the last step given to
        :meth:`step`, 0 before any) with the names and values as given: NaN and the infinities kept, a nested dict
        flattened with ``.`` as W&B does, a NumPy scalar or a one-element tensor taken by its value; a value that is
        not a number (a string, a list, an image) raises :class:`UsageError` naming it. Queued like a step: it never
        waits for the disk or a signature (the journal's flush interval bounds what a crash loses). With ``batch``,
        a ``metrics_logged`` may come before the lines of steps still queued: each names its step."""
        if type(metrics) is dict:  # a row of plain numbers with good names: queued as it is, made at the drain
            for k, v in metrics.items():
                if type(v) not in PLAIN_NUMBERS or type(k) is not str or not 0 < len(k) <= MAX_METRIC_NAME:
                    break
            else:
                at = self._step if step is None else step
                if type(at) is int and at >= 0:
                    self.journal.append_later(logged_row, (metrics.copy(), at, "log"))
                    return
        from trainledger.training.kinds import MetricsLogged, metric_values

        try:
            values = metric_values(metrics)
        except ValueError as e:
            raise UsageError(f"log: {e}") from None
        at = self._step if step is None else step
        if type(at) is not int or at < 0:
            raise UsageError(f"log: step must be a non-negative integer, got {at!r}")
        self.journal.append_deferred(MetricsLogged(step=at, metrics=values, source="log"))

    def evaluate(self, name: str, results: Mapping[str, Any], *, step: int | None = None,
                 checkpoint: CheckpointSaved | str | None = None, role: str = "target",
                 cases: list[Any] | None = None) -> Any:
        """Record an evaluation's results bound to the checkpoint it evaluated (``evaluation_recorded``, durable):
        its path and its SHA-256 as the journal recorded it, so that no one can later say the numbers were of other
        weights. ``checkpoint``: what :meth:`checkpoint` or :meth:`record_checkpoint` returned, or its path
        (default: the newest checkpoint this run recorded; none is a :class:`UsageError`: save one first). ``step``:
        default the checkpoint's. ``results``: name -> number, as :meth:`log` takes them. ``role``: ``target``,
        ``retention`` or ``control`` (what the evaluation is for, as the experiment manifest names them).
        ``cases``: per-case results (JSON-able), kept in ``evals/<digest>.json`` and recorded by digest."""
        from trainledger.training.experiment.loop import write_eval_cases
        from trainledger.training.kinds import EvaluationRecorded, metric_values

        self._settle()
        if not isinstance(name, str) or not name:
            raise UsageError(f"evaluate: name must be a non-empty string, got {name!r}"[:200])
        if role not in ("target", "retention", "control"):
            raise UsageError(f"evaluate: role must be target, retention or control, got {role!r}"[:200])
        try:
            values = metric_values(results, what="results")
        except ValueError as e:
            raise UsageError(f"evaluate: {e}") from None
        if checkpoint is None:
            if not self._kept:
                raise UsageError("evaluate: no checkpoint recorded yet to bind the results to: rec.checkpoint(step) "
                                 "first, or pass checkpoint=")
            ck = self._kept[-1]
        elif isinstance(checkpoint, str):
            found = [c for c in self._kept if c.path == checkpoint]
            if not found:
                raise UsageError(f"evaluate: {checkpoint!r} is not a live checkpoint this run recorded "
                                 f"({', '.join(c.path for c in self._kept[-3:]) or 'none yet'})")
            ck = found[-1]
        elif isinstance(checkpoint, CheckpointSaved) and any(c.path == checkpoint.path and c.sha256 ==
                                                             checkpoint.sha256 for c in self._kept):
            ck = checkpoint
        else:
            raise UsageError("evaluate: checkpoint must be one this run recorded (what rec.checkpoint returned, or "
                             "its path)")
        digest, where = write_eval_cases(self.run, name, ck.sha256, cases or [])
        ev = EvaluationRecorded(hook=name, role=role, step=ck.step if step is None else step, checkpoint=ck.path,
                                checkpoint_sha256=ck.sha256, metrics=values, cases=len(cases or []),
                                cases_sha256=digest, cases_path=where)
        self.journal.append(ev, durable=True)
        return ev

    def checkpoint(self, step: int, *, data_state: Any = None, tokens: int = 0) -> CheckpointSaved:
        """Save the full training state after step ``step`` (the last step completed) and record it, durably.

        A checkpoint path the journal already recorded, whose file is still there (a run that re-saves right
        after resuming), is written beside it (``step-000000099-1.pt``), never over bytes a record names."""
        self._settle()
        if self._watch is not None:  # replicas compared before their state is saved (a divergence raises here)
            self._watched(lambda: self._watch.check(step, at="checkpoint"))
        ev = save_checkpoint(self.run, self.journal, step=step, model=self.model, optimizer=self.optimizer,
                             scheduler=self.scheduler, scaler=self.scaler, sampler=self.data, tokens=tokens,
                             data_state=data_state, extra={"monitor": self.monitor.state()},
                             folder=self.checkpoint_dir)
        self._kept.append(ev)
        if self.keep_last is not None:
            enforce_retention(self.run, self.journal, self._kept, self.keep_last)
        if self.rank_info is not None:
            self.anchor(step)
        self._publisher.after_seal()
        self._t = time.perf_counter()  # the save is not part of the next step's time
        if self._clock is not None:
            self._clock.start = self._t  # nor of this rank's own compute time
        return ev

    def timestamp(self) -> None:
        """Have the time-stamping authority (``tsa=``) stamp what the journal holds now: the events so far sealed,
        durably, and a token asked for over that seal on a thread (``timestamp_recorded`` follows when it comes). Call
        it after an event whose time matters to someone else (a threshold crossing, a release); each checkpoint and
        the close are stamped anyway."""
        if self._publisher.tsa is None:
            raise UsageError("timestamp() needs Recorder(tsa=URL), an RFC 3161 time-stamping authority")
        self._settle()
        self.journal.seal(durable=True, signed=True)
        self._publisher.after_seal()

    def _watched(self, compare: Any) -> Any:
        """``compare()`` (a fingerprint comparison); with ``on_divergence="rewind"``, its StateDivergence turned
        into a rewind (:meth:`_rewind`)."""
        from trainledger.training.distributed.state_watch import StateDivergence

        try:
            return compare()
        except StateDivergence as e:
            if self._on_divergence != "rewind":
                raise
            self._rewind(e)

    def _rewind(self, error: Any) -> None:
        """Replicas diverged, with ``on_divergence="rewind"``: on every rank, ``rewind_decided`` naming the newest
        of this rank's checkpoints whose fingerprints every rank agreed on (at or before the verdict's step), the
        checkpoints after it deleted (``checkpoint_deleted``), durable; then :class:`StateRewound`, and the restart
        (torchrun's ``--max-restarts``, or your job run again) resumes every rank from that checkpoint. Past the
        budget (:class:`RewindPolicy`'s defaults: 3 rewinds within 1,000 steps, counted from the journal, so a
        restart does not reset it) or with no such checkpoint: ``run_stopped`` and the StateDivergence itself."""
        from trainledger.training.audit import rewind_allowed
        from trainledger.training.checkpoints.rewind import RewindPolicy
        from trainledger.training.distributed.state_watch import StateRewound
        from trainledger.training.kinds import CheckpointDeleted, RewindDecided, RunStopped
        from trainledger.journal.paths import confined

        v, policy = error.verdict, RewindPolicy()
        history = signed_history(self.journal)
        agreed = set(self._watch.agreed) | {e.step for e in history if type(e).__struct_config__.tag ==
                                            "state_fingerprinted" and e.digests is None}
        spent = [e.spike_step for e in history if isinstance(e, RewindDecided)]
        target = next((c for c in reversed(self._kept) if self._own(c) and c.step in agreed and c.step <= v["step"]),
                      None)
        what = f"state diverged at step {v['step']}: rank(s) {', '.join(map(str, v['ranks']))}" + (
            f" in {v['tensor']}" if v.get("tensor") else "")
        allowed = rewind_allowed(spent, v["step"], policy.max_rewinds, policy.window_steps)
        if target is None or not allowed:
            rule = (f"max_rewinds={policy.max_rewinds} per {policy.window_steps} steps" if not allowed else
                    "no checkpoint whose fingerprints every rank agreed on")
            self.journal.append(RunStopped(rule=rule, reason=what), durable=True)
            raise error
        self.journal.append(RewindDecided(spike_step=v["step"], anomaly="state_diverged", checkpoint=target.path,
                                          from_step=target.step, skip_batches=0, lr_scale=1.0, reason=what,
                                          max_rewinds=policy.max_rewinds, window_steps=policy.window_steps),
                            durable=True)
        for c in [c for c in self._kept if c.step > target.step and self._own(c)]:  # the branch left behind
            confined(self.run, c.path, what="checkpoint path").unlink(missing_ok=True)
            self.journal.append(CheckpointDeleted(path=c.path, step=c.step, reason=f"rewound to step {target.step}"),
                                durable=True)
        self._kept = [c for c in self._kept if c.step <= target.step or not self._own(c)]
        raise StateRewound(f"{error} - rewound: the restart resumes every rank from the checkpoint of step "
                           f"{target.step} ({target.path}; rewind_decided, sealed)", v, target.step) from None

    def anchor(self, step: int | None = None) -> dict[int, str] | None:
        """Under torchrun, with the process group initialized: anchor every rank's journal to the others (one small
        collective: call it on every rank at the same point; :meth:`checkpoint` and :meth:`close` do). Returns
        ``{rank: "SEQ:HASH"}``; None in a single process, or before ``init_process_group``."""
        self._settle()
        if self.rank_info is None or not _grouped():
            return None
        from trainledger.training.distributed.ranks import anchor_ranks

        return anchor_ranks(self.journal, step=step)

    def record_checkpoint(self, path: str | os.PathLike, *, step: int,
                          contents: tuple[str, ...] = ("model", "optimizer", "counters")) -> CheckpointSaved:
        """Record a checkpoint your own code wrote (nanoGPT's ``ckpt.pt``; a folder is recorded file by file),
        inside the run folder, after ``step`` (the last step it completed). A newer save over a path already
        recorded leaves the older record marked ``checkpoint_deleted`` (overwritten), so no record names bytes
        that are gone. The monitor's snapshot is not in such a file: a resume from it starts the health baseline
        over at the resume."""
        from trainledger.training.kinds import CheckpointDeleted

        self._settle()
        p = Path(path)
        if not p.resolve().is_relative_to(self.run.resolve()):
            raise UsageError(f"{p}: a checkpoint outside the run folder {self.run}: save it inside")
        rel = p.resolve().relative_to(self.run.resolve()).as_posix()
        for old in [c for c in self._kept if c.path == rel]:
            self.journal.append(CheckpointDeleted(path=old.path, step=old.step,
                                                  reason="overwritten by a newer save at the same path"), durable=True)
        self._kept = [c for c in self._kept if c.path != rel]
        ev = record_checkpoint(self.journal, self.run, p, step=step, contents=list(contents))
        self._kept.append(ev)
        return ev

    def record_export(self, path: str | os.PathLike, *, step: int | None = None, base: str | None = None,
                      base_release: str | None = None, base_model: str | os.PathLike | None = None) -> Any:
        """Record the weights the run ships (a ``save_pretrained`` folder, a folder of safetensors files) as
        ``model_exported``: every file's digest as OpenSSF model signing computes it, the step (default: the last
        step recorded) and the checkpoint of that step, if one was saved. ``base``: the digest of the released model
        this run fine-tuned (``verify-model`` of the base prints it), ``base_release`` its run id. Then
        ``trainledger release FOLDER RUN --key release.key`` signs it for release (docs/provenance.md), or
        ``release_key=`` does at :meth:`close`. ``base_model``: the released model's folder instead of ``base``
        (its digest, and the run its provenance names)."""
        from trainledger.journal.statements.release.export import base_of, checkpoint_of, record_export

        self._settle()
        step = self.monitor.last_step if step is None else step
        lineage = None
        if base_model is not None:
            base, base_release, lineage = base_of(base_model)
        ev = record_export(self.journal, path, step=step, checkpoint=checkpoint_of(self._kept, step),
                           base=base, base_release=base_release, relative_to=self.run, lineage=lineage)
        self._exported = Path(path)
        return ev

    def check_checkpoint(self, path: str | os.PathLike) -> CheckpointSaved:
        """Before loading a checkpoint your own code wrote: check it against its signed record and record the
        verdict (``run_resumed``; or ``resume_rejected`` and :class:`ResumeRejected`). Returns the record."""
        self._settle()
        rec = check_folder(self.journal, self.run, Path(path))
        self.monitor.observe_resume(rec.step, checkpoint=rec.path, append=False)
        return rec

    def report(self) -> dict[str, Any]:
        self._settle()
        return self.monitor.report()

    def close(self, status: str = "completed", reason: str | None = None) -> dict[str, Any]:
        """Close the journal (sealed, durable); returns the monitor's report."""
        self._settle()
        report = self.monitor.report()
        if self._stragglers is not None and status == "completed":
            self._stragglers.finish()  # the last, partial window (a collective: every rank closes together)
        record_compute(self.journal)
        if self.rank_info is not None and status == "completed":
            self.anchor(report["last_step"])  # every rank reaches the end together
        self._publisher.before_close()
        self.journal.close(status=status, reason=reason)
        self._publisher.after_close([self.signer.public])
        if self.release_key is not None and self._exported is not None and status == "completed":
            from trainledger.journal.statements.release.attest import release
            from trainledger.journal.statements.release.keys import load_release_key

            release(self._exported, self.journal.path, load_release_key(self.release_key), keys=[self.signer.public])
        return report

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.journal.closed:
            return
        if exc_type is None:
            self.close()
            return
        # A crash (an exception, Ctrl-C): on record, as the Lightning callback records it, durably; the journal
        # stays open for the resume.
        from trainledger.training.kinds import RunStopped

        try:
            self._settle()  # the steps queued before the crash (batch) happened before it
        except Exception:  # noqa: BLE001 - a journal that refuses them refuses the record below too, and says why
            pass
        try:
            self.journal.append(RunStopped(rule="exception", reason=f"{exc_type.__name__}: {exc}"[:500]),
                                durable=True)
        finally:
            self.journal.suspend()
