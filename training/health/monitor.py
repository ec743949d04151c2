"""TrainingHealthMonitor: the emitter users embed in a training loop.

It records each step (and each resume) as a journal event and folds it
through :class:`trainledger.training.health.detectors.HealthProjection`, the same reducer replay
uses, so the live state and a replay of the journal cannot drift apart.

Host-device syncs: ``observe_step`` takes Python floats. Calling
``loss.item()`` every step forces the host to wait for the GPU; to avoid a
sync per step, keep the per-step losses as tensors and hand them over in
bulk (``torch.stack(losses).tolist()``, one sync) every N steps, calling
``observe_step`` for each. Detection then lags by at most N steps.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

from trainledger.journal import Journal, RunResumed, StepObserved
from trainledger.journal.reader import fold_events
from trainledger.journal.writer import DURABLE
from trainledger.training.health.detectors import (RANGE_DEFAULTS, RESUME_HORIZON, AnomalyDetected, DetectorParams,
                                                   HealthProjection, RunConfigured)
from trainledger.training.health.trend import TREND_DEFAULTS

from trainledger.journal.statements.compute.figures import DEFAULT_COMPUTE_THRESHOLDS
from trainledger.training.health.flops import FlopConfig
from trainledger.training.health.mfu import DEVICE_SETTINGS

__all__ = ["TrainingHealthMonitor", "AnomalyDetected", "DEFAULT_COMPUTE_THRESHOLDS"]



def _opt_float(name: str, v: Any) -> float | None:
    if v is None:
        return None
    try:
        return float(v)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number (a Python float; call .item() on tensors), got {type(v).__name__}") from None


class TrainingHealthMonitor:
    """Anomaly detection, MFU and restart continuity for a training loop.

    ``journal=`` appends every event (the run's configuration, each step, each
    anomaly, each resume); without one the monitor runs in memory.
    Example (the five-step loop of the seed document)::

        monitor = TrainingHealthMonitor(flop_config=cfg, peak_flops_per_sec=1e12)
        monitor.observe_step(step, float(loss.item()), grad_norm=float(gn.item()), step_time_s=dt, batch_size=4)
        monitor.report()

    ``spike_rule="range"`` (journal format 1.6, the default with the log scale) adds the rules measured in
    tools/bench_detection.py to the robust z: a value far above its window's maximum, and a loss and grad norm
    rising together, are anomalies at once, and both series are scored in episodes (docs/monitor.md). A loss
    anomaly reports the loss's own median, MAD and robust z (``z_score``, the seed's receipt) and the z of its log
    that the rule scored (``log_z``). ``spike_rule=None`` keeps the rules of formats 1.4-1.5 (and
    ``loss_scale="linear"`` the seed's, 1.0-1.3).

    ``trend_rules=True`` (journal format 1.10, the default with the default spike rule) adds two rules for what a
    rolling window cannot see (training/health/trend.py, docs/monitor.md): ``loss_blowup``, a loss above twice where
    the run started (or twice ``chance_loss``, a declared chance level such as ln 10 for ten classes) after it had
    fallen to a quarter of it, and ``loss_divergence`` / ``grad_norm_divergence``, a series whose 25-step median
    doubled against its own earlier level. ``trend_rules=False`` leaves them out (a loss meant to rise: an
    adversarial or RL objective).

    Raises ``ValueError`` at construction for an invalid setting.
    """

    def __init__(
        self,
        *,
        journal: Journal | None = None,
        flop_config: FlopConfig | None = None,
        peak_flops_per_sec: float | None = None,
        devices: int = 1,
        peak_source: str | None = None,
        peak_spread: float | None = None,
        loss_window: int = 64,
        loss_min_periods: int = 16,
        loss_z_thresh: float = 8.0,
        loss_scale: str = "log",
        grad_norm_window: int = 64,
        grad_norm_min_periods: int = 16,
        grad_norm_z_thresh: float = 8.0,
        resume_horizon: int | None = RESUME_HORIZON,
        spike_rule: str | None = "default",
        device_kind: str | None = None,
        compute_thresholds: dict[str, float] | None = None,
        carried_flops: float = 0.0,
        trend_rules: bool = True,
        chance_loss: float | None = None,
        device_settings: dict[str, Any] | None = None,
    ):
        DetectorParams(loss_window, loss_min_periods, loss_z_thresh, "loss")
        DetectorParams(grad_norm_window, grad_norm_min_periods, grad_norm_z_thresh, "grad_norm")
        if peak_flops_per_sec is not None and not (isinstance(peak_flops_per_sec, (int, float))
                                                   and math.isfinite(peak_flops_per_sec) and peak_flops_per_sec > 0):
            raise ValueError(f"peak_flops_per_sec must be a positive number or None, got {peak_flops_per_sec!r}")
        if not isinstance(devices, int) or devices < 1:
            raise ValueError(f"devices must be a positive integer, got {devices!r}")
        if flop_config is not None and not isinstance(flop_config, FlopConfig):
            raise ValueError("flop_config must be a training.flops.FlopConfig (see flop_config_from_causal_lm)")
        if spike_rule == "default":  # the range rule scores the log of the loss: with the linear scale, the seed's rule
            spike_rule = "range" if loss_scale == "log" else None
        if chance_loss is not None and not (trend_rules and spike_rule is not None):
            raise ValueError("chance_loss= is the blow-up rule's start level: it needs trend_rules=True and the "
                             "default spike rule")
        # format 1.10's blow-up and divergence rules, with the default rules only: spike_rule=None and the linear
        # scale keep the rules of the formats they name
        trend = dict(TREND_DEFAULTS, chance_loss=_opt_float("chance_loss", chance_loss)) \
            if trend_rules and spike_rule is not None else {}
        fc = flop_config
        self.config = RunConfigured(
            n_params=fc.n_params if fc else None, n_layer=fc.n_layer if fc else None,
            n_head=fc.n_head if fc else None, head_dim=fc.head_dim if fc else None,
            seq_len=fc.seq_len if fc else None, recompute=fc.recompute if fc else "none",
            peak_flops_per_sec=float(peak_flops_per_sec) if peak_flops_per_sec is not None else None,
            devices=devices,
            loss_window=loss_window, loss_min_periods=loss_min_periods, loss_z_thresh=float(loss_z_thresh),
            loss_scale=loss_scale,
            grad_norm_window=grad_norm_window, grad_norm_min_periods=grad_norm_min_periods,
            grad_norm_z_thresh=float(grad_norm_z_thresh),
            peak_source=peak_source, peak_spread=None if peak_spread is None else float(peak_spread),
            resume_horizon=resume_horizon,
            # format 1.6's "range" rule, with the immediate factor tools/bench_detection.py chose for it
            **(dict(RANGE_DEFAULTS, spike_rule=spike_rule) if spike_rule is not None else {}),
            device_kind=device_kind, compute_thresholds={**DEFAULT_COMPUTE_THRESHOLDS, **(compute_thresholds or {})},
            carried_flops=float(carried_flops), **trend,
            # format 1.10: the settings that move a compute statement (docs/compute.md)
            attention_convention=fc.attention if fc else None,
            recompute_ratio=float(fc.recompute_ratio) if fc and fc.recompute_ratio is not None else None,
            **_device_settings(device_settings),
        )
        self.journal = journal
        self._proj = HealthProjection(self.config)
        self._compute = None
        #: the anomalies :meth:`fold_queued` found, until whoever queued the steps takes them
        self.found_queued: list[AnomalyDetected] = []
        if journal is not None:
            journal.append(self.config)
            self._watch_compute()

    def observe_step(self, step: int, loss: float, grad_norm: float | None = None, step_time_s: float | None = None,
                     batch_size: int | None = None, tokens: int | None = None,
                     lr: float | None = None, data_time_s: float | None = None,
                     compute_time_s: float | None = None,
                     batch_fingerprint: float | None = None) -> list[AnomalyDetected]:
        """Record one optimizer step; return its anomalies (each with ``kind``, ``step``, ``value``, ``z_score``).

        In a distributed run, ``compute_time_s`` is this rank's own time in the step (before it waits on the other
        ranks' gradients): what straggler detection compares. ``batch_fingerprint``
        (:func:`trainledger.training.health.fingerprint.batch_fingerprint`, as a float): a step run again after a
        resume whose batch differs from the first time's is a ``data_divergence`` anomaly."""
        try:  # the conversions inline (a function call per field costs more than the field inside a loop)
            ev = StepObserved(step=int(step), loss=float(loss),
                              grad_norm=None if grad_norm is None else float(grad_norm),
                              lr=None if lr is None else float(lr),
                              step_time_s=None if step_time_s is None else float(step_time_s),
                              examples=None if batch_size is None else int(batch_size),
                              tokens=None if tokens is None else int(tokens),
                              data_time_s=None if data_time_s is None else float(data_time_s),
                              compute_time_s=None if compute_time_s is None else float(compute_time_s),
                              batch_fingerprint=None if batch_fingerprint is None else float(batch_fingerprint))
        except (TypeError, ValueError):
            for name, v in (("grad_norm", grad_norm), ("lr", lr), ("step_time_s", step_time_s),
                            ("data_time_s", data_time_s), ("compute_time_s", compute_time_s),
                            ("batch_fingerprint", batch_fingerprint)):
                _opt_float(name, v)  # names the argument that is not a number
            raise
        j = self.journal
        if j is not None:
            # Deferred: the event's types are fixed above, so the writer encodes and chains it later, in a
            # batch (inside a real loop that is most of the cost of a call made with cold caches).
            j.append_deferred(ev)
        found, crossed, after = self._fold(ev)
        if j is not None:
            for x in crossed:  # a compute threshold reached: its receipt at once, on disk
                j.append(x, durable=True)
            for x in after:
                j.append_deferred(x)
        return found

    def _fold(self, ev: StepObserved) -> tuple[list[AnomalyDetected], Any, list[Any]]:
        """Fold a step in: its anomalies; the compute thresholds' receipts it reached (a journal's monitor only;
        none: ``()``); and the lines that follow them, in order: its anomalies, the candidates the next step did not
        confirm, the episodes it ended."""
        proj = self._proj
        found = proj.apply(ev)
        crossed: Any = ()
        c = self._compute
        if c is not None:
            c.watch(ev)
            if len(c.crossed) > self._crossed:
                crossed = [x for _, x in c.crossed[self._crossed:]]
                self._crossed = len(c.crossed)
        after = found
        if proj.suspected_new or proj.ended_new:
            after = found + proj.take_suspected() + proj.take_ended()
        return found, crossed, after

    def fold_queued(self, item: tuple[Any, ...]) -> list[Any]:
        """A step queued with ``Journal.append_later`` (the Recorder's default): ``(step, loss, grad_norm, lr,
        step_time_s, batch_size, tokens)`` and, under torchrun, ``compute_time_s`` (the rank's own time), each
        already of its type, folded by the journal's drain (in order, with
        warm caches, off the training thread's call). Returns the lines it adds, as :meth:`observe_step` appends
        them: the step, a compute threshold's receipt (then sealed durably: ``DURABLE``), its anomalies, the
        candidates not confirmed and the episodes ended. Its anomalies are also kept in :attr:`found_queued`, for
        whoever queued the step to take. Never raises (a drain has no caller to raise to)."""
        step, loss, grad_norm, lr, dt, batch_size, tokens = item[:7]
        ev = StepObserved(step=step, loss=loss, grad_norm=grad_norm, lr=lr, step_time_s=dt, examples=batch_size,
                          tokens=tokens, compute_time_s=item[7] if len(item) > 7 else None)
        found, crossed, after = self._fold(ev)
        if found:
            self.found_queued += found
        return [ev, *crossed, DURABLE, *after] if crossed else [ev, *after]

    def observe_resume(self, from_step: int | None, *, reason: str = "checkpoint",
                       checkpoint: str | None = None, append: bool = True) -> None:
        """Record a resume from the checkpoint of step ``from_step``: the next steps are scored against
        the baseline as it stood then, and a jump there is a ``restart_discontinuity``.

        ``append=False`` when ``run_resumed`` is already in the journal (``restore_checkpoint`` writes it); a
        ``run_resumed`` of the same step that was the journal's last event is not written twice either.
        """
        ev = RunResumed(reason=reason, from_step=from_step, checkpoint=checkpoint)
        if self.journal is not None and append:
            last = self.journal.last_appended()
            if not (isinstance(last, RunResumed) and last.from_step == from_step):
                self.journal.append(ev)  # else: a restore (restore_sharded, restore_checkpoint) just recorded it
        self._proj.apply(ev)
        if self._proj.ended_new:  # the resume ended the open episodes: derived here, whoever wrote run_resumed
            ended = self._proj.take_ended()
            if self.journal is not None:
                for end in ended:
                    self.journal.append(end)

    def report(self) -> dict[str, Any]:
        """JSON-serializable: steps, MFU mean/min/max/count, tokens/s, anomalies by kind, restarts."""
        return self._proj.report()

    @property
    def last_step(self) -> int | None:
        """The last step observed (None before the first)."""
        return self._proj.last_step

    @property
    def anomalies(self) -> list[AnomalyDetected]:
        return list(self._proj.anomalies)

    @property
    def suspected(self) -> list:
        """Spike candidates the next step did not confirm (``spike_suspected``): on record, not anomalies."""
        return list(self._proj.suspected)

    def state(self) -> dict[str, Any]:
        """The monitor's state (JSON-serializable), to store in a checkpoint."""
        return self._proj.state()

    @classmethod
    def resumed(cls, snapshot: dict[str, Any], *, journal: Journal | None, checkpoint: Any,
                later: Iterable[Any] = (), after_seq: int | None = None) -> TrainingHealthMonitor:
        """The monitor after a restore from ``checkpoint`` (its ``checkpoint_saved``): the checkpoint's
        snapshot, then every event recorded after it (``later``: the signed events past the checkpoint's seq,
        the steps an interrupted process had already observed), then the resume. The snapshot is the fold of the
        journal up to the checkpoint's seq, so snapshot + later events is the fold of the whole journal: the
        live monitor and ``replay`` agree. Call it after ``restore_checkpoint`` (which records ``run_resumed``).
        ``after_seq``: the seq the snapshot was taken at, when that is not the checkpoint record's (a sharded or
        background save records its checkpoint after later steps were already journaled).
        """
        self = cls.from_state(snapshot, journal=journal)
        proj = self._proj
        upto = after_seq
        for ev in later:
            if upto is None:
                upto = checkpoint.seq
            if ev.seq > upto:
                proj.apply(ev)
        proj.suspected_new.clear()  # already on record
        proj.ended_new.clear()
        self.observe_resume(checkpoint.step, checkpoint=checkpoint.path, append=False)
        return self

    @classmethod
    def continued(cls, history: Iterable[Any], *, journal: Journal | None) -> TrainingHealthMonitor:
        """The monitor of a journal that goes on without a snapshot to restore (a resume from a checkpoint the
        user's code wrote): the fold of its events so far, exactly the state replay reaches there; it appends to
        ``journal`` from now on, with no new ``run_configured`` (the segment goes on)."""
        proj = HealthProjection()
        proj.apply_all(list(history))
        proj.suspected_new.clear()  # already on record
        proj.ended_new.clear()
        return cls._around(proj, journal)

    @classmethod
    def from_state(cls, state: dict[str, Any], *, journal: Journal | None = None) -> TrainingHealthMonitor:
        """Rebuild a monitor from :meth:`state`; it appends to ``journal`` from now on."""
        return cls._around(HealthProjection.from_state(state), journal)

    @classmethod
    def _around(cls, proj: HealthProjection, journal: Journal | None) -> TrainingHealthMonitor:
        """A monitor over a projection already folded (nothing appended: its run_configured is on record)."""
        self = object.__new__(cls)
        self._proj = proj
        self.config = proj.config
        self.journal = journal
        self._compute = None
        self.found_queued = []
        if journal is not None:
            self._watch_compute()
        return self

    def _watch_compute(self) -> None:
        """The journal's running compute (every step on record, every segment, re-done steps too: what replay
        totals), from which this monitor records each compute threshold the ``run_configured`` in force watches
        when a step reaches it (format 1.7). Read from the journal as written, so that a resumed process, whose
        own steps are only the latest, still counts them all."""
        from trainledger.journal.reader import read_event_batches
        from trainledger.training.health.mfu import ComputeTotals

        j = self.journal
        j.flush()
        c = ComputeTotals()
        for batch in read_event_batches(j.path):
            c.fold(batch)
        self._compute, self._crossed = c, len(c.crossed)

    @staticmethod
    def replay(path: str | os.PathLike) -> HealthProjection:
        """Fold a journal's events through the reducer: the state a live monitor had at the end.

        Checks the chain and canonical form (in a second process, while this one folds) and
        raises on an integrity error; verify signatures first when authenticity matters.
        """
        proj = HealthProjection()
        # run_configured (the first event the monitor writes) re-initializes it
        fold_events(path, proj.apply_all)
        return proj


def _device_settings(given: dict[str, Any] | None) -> dict[str, Any]:
    """The accelerator's variant and power limit for ``run_configured`` (training.health.telemetry.device_settings
    reads them from NVML): only those keys, each checked."""
    if not given:
        return {}
    unknown = set(given) - set(DEVICE_SETTINGS)
    if unknown:
        raise ValueError(f"device_settings: unknown key(s) {sorted(unknown)}; known: {', '.join(DEVICE_SETTINGS)}")
    out = {k: given[k] for k in DEVICE_SETTINGS if given.get(k) is not None}
    if "power_limit_w" in out:
        out["power_limit_w"] = float(out["power_limit_w"])
    return out
