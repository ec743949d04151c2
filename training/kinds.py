"""The training domain's event kinds: the monitor's configuration and anomalies, checkpoints and spike rewind, the
experiment's preflight, evaluations, checkpoint selection and resource evidence, device telemetry, stragglers and
sharded checkpoints, a framework's logged metrics and the run's compute.

Torch-free, so that verify, replay and query fold them on an auditor's machine. They register into the codec like
any kind (a subclass of ``Event`` registers when defined), and the format core loads this module with the codec
(``trainledger.journal.kinds.KIND_MODULES``), so what ``verify`` checks never depends on what a caller imported.
"""

from __future__ import annotations

import math
from typing import Any

from trainledger.journal.events import Event
from trainledger.journal.kinds import check_files as _check_files, check_ranks as _check_ranks

__all__ = ["CHECKPOINT_CONTRACT", "LOSS_SCALES", "SPIKE_RULES", "RunConfigured", "AnomalyDetected", "SpikeSuspected",
           "AnomalyEnded", "MAX_WINDOW", "DetectorParams", "CheckpointSaved", "folder_digest",
           "ResumeRejectedEvent", "WeightsRestored", "CheckpointFailed", "CheckpointDeleted",
           "RewindDecided", "DataWindowSkipped", "RunStopped", "PreflightGate", "PreflightCompleted",
           "EvaluationRecorded", "CheckpointSelected", "ResourceRecorded", "ShardsSaved", "DeviceSampled",
           "DeviceChanged", "DEVICE_ANOMALIES", "device_anomaly", "TelemetryUnavailable", "StragglerScores",
           "StragglerDetected", "MetricsLogged", "metric_values", "MAX_METRIC_NAME", "ConfigLogged",
           "StateFingerprinted", "StateDiverged", "ReplayChecked",
           "config_values", "ComputeTotaled", "ComputeThresholdCrossed"]

#: What a checkpoint must hold for a resume to continue the run exactly (training/checkpoints/state.py enforces it;
#: the manifest validator checks a manifest's checkpoint contents against it). Torch-free on purpose.
CHECKPOINT_CONTRACT = ("model", "optimizer", "scheduler", "scaler", "rng", "sampler", "counters", "accumulation",
                       "manifest_id")


#: the scales a loss can be scored on (``run_configured.loss_scale``)
LOSS_SCALES = ("log", "linear")
#: 1.6: the spike rules a run_configured may name (``spike_rule``; absent: the robust z alone)
SPIKE_RULES = ("range",)
#: 1.10: which attention FLOPs model FLOPs count: "full" (PaLM's 12·L·H·Q·T) or "causal" (half of it)
ATTENTION_CONVENTIONS = ("full", "causal")


class RunConfigured(Event, tag="run_configured", frozen=True, kw_only=True):
    """What the monitor measures against: FLOP accounting, peak, devices and detector settings."""

    n_params: int | None = None
    n_layer: int | None = None
    n_head: int | None = None
    head_dim: int | None = None
    seq_len: int | None = None
    recompute: str = "none"
    peak_flops_per_sec: float | None = None
    devices: int = 1
    loss_window: int = 64
    loss_min_periods: int = 16
    loss_z_thresh: float = 8.0
    #: 1.4: the scale the loss is scored on: "log" (the monitor's default from 1.4: a loss is positive and its
    #: noise multiplicative) or "linear" (absent: every journal before 1.4, replayed as it was scored)
    loss_scale: str = "linear"
    grad_norm_window: int = 64
    grad_norm_min_periods: int = 16
    grad_norm_z_thresh: float = 8.0
    #: where the peak comes from: "datasheet", "measured" (this machine's matmul rate) or "given"
    peak_source: str | None = None
    #: for a measured peak, how much the repeated measurements varied: (best - median) / best
    peak_spread: float | None = None
    #: 1.5: how far back a resume or rewind rebuilds each detector's baseline exactly, in accepted values: the
    #: detectors keep that many past their window (the monitor's default: RESUME_HORIZON); absent: every value
    #: (every journal before 1.5, replayed as it was folded)
    resume_horizon: int | None = None
    #: 1.6: the spike rules on top of the robust z (training/health/detectors.py, docs/monitor.md): "range" flags at
    #: once a value above its window's maximum by max(excursion_ratio, (max / median) ** excursion_power), and a
    #: step whose loss and grad norm both rise above their windows' maxima and joint_z robust sigma and stay above
    #: joint_confirm_z the next step; both series are scored on the log scale in episodes, and a z above
    #: immediate_factor x the threshold is flagged on the spot. Absent: every journal before 1.6, scored as it was.
    spike_rule: str | None = None
    excursion_ratio: float = 8.0
    excursion_power: float = 1.5
    joint_z: float = 3.0
    joint_confirm_z: float = 3.0
    immediate_factor: float = 4.0
    #: 1.6, "range": the grad norm's own immediate factor (absent: immediate_factor). A bad batch often moves the
    #: gradient alone (the loss of a corrupted batch can stay in range); the monitor records 1.25
    grad_norm_immediate_factor: float | None = None
    #: 1.6, "range": a z above the immediate factor is flagged on the spot only when the value is also above the
    #: window's maximum by this multiple of the maximum's distance from the median (log units); else it waits for
    #: the next step like a smaller one (heavy-tailed noise makes lone values at z 10-15; the monitor records 1.5)
    immediate_margin: float = 0.0
    #: 1.7: what the devices are ("NVIDIA H100 80GB HBM3", "cpu"): the compute statement's kind of device
    device_kind: str | None = None
    #: 1.7: the cumulative training compute (model FLOPs) the monitor watches, name -> FLOPs (training.compute,
    #: docs/compute.md): it records ``compute_threshold_crossed`` at the step the journal's running total plus
    #: ``carried_flops`` first reaches each; replay recomputes that step
    compute_thresholds: dict[str, float] = {}
    #: 1.7: model FLOPs of this model's earlier runs (a base model's, a pre-training run's), declared, counted toward
    #: the thresholds
    carried_flops: float = 0.0
    #: 1.10: the blow-up rule (training/health/trend.py, docs/monitor.md): once a block of ``trend_window`` losses has
    #: a median at most the start level / blowup_factor, a loss above sqrt(blowup_factor) x it is a ``loss_blowup``; the start
    #: level is ``chance_loss`` where declared, else the segment's first finite positive loss. Absent:
    #: off (every journal before 1.10)
    blowup_factor: float | None = None
    chance_loss: float | None = None
    #: 1.10: the divergence rule: each series in blocks of ``trend_window`` values; a block whose median is at least
    #: ``trend_ratio`` x the second lowest of the 24 blocks before it (the two before it half as far) is a
    #: ``loss_divergence`` / ``grad_norm_divergence``. Absent: off (every journal before 1.10)
    trend_window: int | None = None
    trend_ratio: float = 2.0
    #: 1.10: a step whose batch (``examples``, else ``tokens``) is under ``partial_batch`` x the step before's (an
    #: epoch's last, partial batch) is not scored by the spike rules: its loss and grad norm are a smaller sample's,
    #: noisier by design. NaN and the infinities, the blow-up and the divergence rules still apply. Absent: every
    #: step is scored (every journal before 1.10)
    partial_batch: float | None = None
    #: 1.10, the settings that move a compute statement by more than its 30% margin (docs/compute.md): the
    #: executed-over-model FLOP ratio of activation recomputation, measured once on the real model with
    #: FlopCounterMode (training.health.flops.measure_recompute_ratio; 1.0: none); which attention FLOPs the model
    #: FLOPs count ("full": PaLM's 12·L·H·Q·T, every score of the square; "causal": half, the scores a causal mask
    #: keeps); the accelerator's variant ("H100 SXM5 80GB") with the PCI device ID it was read from and where the
    #: name and peak come from; the power limit the devices ran under, in watts. Absent: not recorded (every
    #: journal before 1.10, and a run whose devices could not be read)
    recompute_ratio: float | None = None
    attention_convention: str | None = None
    device_variant: str | None = None
    pci_device_id: str | None = None
    variant_source: str | None = None
    power_limit_w: float | None = None

    def __post_init__(self) -> None:
        # Runs on decode too (msgspec): a signed journal with impossible settings fails verification as a schema
        # error instead of crashing the projection that folds it.
        DetectorParams(self.loss_window, self.loss_min_periods, self.loss_z_thresh, "loss")
        DetectorParams(self.grad_norm_window, self.grad_norm_min_periods, self.grad_norm_z_thresh, "grad_norm")
        if self.loss_scale not in LOSS_SCALES:
            raise ValueError(f"loss_scale must be one of {', '.join(LOSS_SCALES)}, got {self.loss_scale!r}")
        if self.devices < 1:
            raise ValueError(f"devices must be at least 1, got {self.devices}")
        if self.spike_rule is not None and self.spike_rule not in SPIKE_RULES:
            raise ValueError(f"spike_rule must be one of {', '.join(SPIKE_RULES)} or absent, got {self.spike_rule!r}")
        if self.spike_rule == "range" and self.loss_scale != "log":
            raise ValueError("spike_rule 'range' scores the loss on the log scale: loss_scale must be 'log'")
        for name, lo, at_least in (("excursion_ratio", 1.0, False), ("excursion_power", 0.0, False),
                                   ("joint_z", 0.0, False), ("joint_confirm_z", 0.0, False),
                                   ("immediate_factor", 1.0, True), ("grad_norm_immediate_factor", 1.0, True),
                                   ("immediate_margin", 0.0, True)):
            v = getattr(self, name)
            if v is None and name == "grad_norm_immediate_factor":
                continue
            if not (isinstance(v, (int, float)) and math.isfinite(v) and (v >= lo if at_least else v > lo)):
                raise ValueError(f"{name} must be a finite number {'at least' if at_least else 'above'} {lo:g}, "
                                 f"got {v!r}")
        if self.resume_horizon is not None and not 0 <= self.resume_horizon <= 1 << 30:
            raise ValueError(f"resume_horizon must be between 0 and 2**30, got {self.resume_horizon}")
        p = self.peak_flops_per_sec
        if p is not None and not (p > 0 and math.isfinite(p)):
            raise ValueError(f"peak_flops_per_sec must be a positive finite number or absent, got {p}")
        shape = (self.n_params, self.n_layer, self.n_head, self.head_dim, self.seq_len)
        if self.n_params is not None and any(x is None or x < 0 for x in shape):
            raise ValueError("n_params, n_layer, n_head, head_dim and seq_len must all be given and >= 0")
        if len(self.compute_thresholds) > 64:
            raise ValueError(f"at most 64 compute thresholds, got {len(self.compute_thresholds)}")
        for name, v in self.compute_thresholds.items():
            if not (0 < len(name) <= 64 and isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"compute threshold {name[:64]!r}: a name of 1 to 64 characters and a positive "
                                 f"finite number of FLOPs, got {v!r}")
        if not (isinstance(self.carried_flops, (int, float)) and math.isfinite(self.carried_flops)
                and self.carried_flops >= 0):
            raise ValueError(f"carried_flops must be a finite number >= 0, got {self.carried_flops!r}")
        for name, lo in (("blowup_factor", 1.0), ("chance_loss", 0.0)):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > lo):
                raise ValueError(f"{name} must be a finite number above {lo:g} or absent, got {v!r}")
        pb = self.partial_batch
        if pb is not None and not (isinstance(pb, (int, float)) and 0 < pb < 1):
            raise ValueError(f"partial_batch must be a number between 0 and 1 (exclusive) or absent, got {pb!r}")
        w = self.trend_window
        if w is not None and not (isinstance(w, int) and 2 <= w <= MAX_WINDOW):
            raise ValueError(f"trend_window must be an integer from 2 to {MAX_WINDOW} or absent, got {w!r}")
        r = self.trend_ratio
        if not (isinstance(r, (int, float)) and math.isfinite(r) and r > 1):
            raise ValueError(f"trend_ratio must be a finite number above 1, got {r!r}")
        rr = self.recompute_ratio
        if rr is not None and not (isinstance(rr, (int, float)) and math.isfinite(rr) and 1 <= rr <= 4):
            raise ValueError(f"recompute_ratio must be a number from 1 to 4 (executed over model FLOPs) or absent, "
                             f"got {rr!r}")
        if self.attention_convention is not None and self.attention_convention not in ATTENTION_CONVENTIONS:
            raise ValueError(f"attention_convention must be one of {', '.join(ATTENTION_CONVENTIONS)} or absent, "
                             f"got {self.attention_convention!r}")
        pw = self.power_limit_w
        if pw is not None and not (isinstance(pw, (int, float)) and math.isfinite(pw) and 0 < pw < 1e6):
            raise ValueError(f"power_limit_w must be a positive number of watts under 1e6 or absent, got {pw!r}")


class AnomalyDetected(Event, tag="anomaly_detected", frozen=True, kw_only=True):
    """A derived event: the reducer's verdict on a step, recorded for audit and recomputed by replay.

    The JSON member is ``anomaly`` (``kind`` names the event kind on every
    line); in Python, ``.kind`` reads the anomaly's kind, as monitor users expect.
    """

    step: int
    anomaly: str
    value: float
    baseline_median: float | None = None
    mad: float | None = None
    z_score: float | None = None
    threshold: float | None = None
    #: The step whose observation confirmed the spike, when it came one step later.
    detected_at: int | None = None
    #: Format 1.2: the device of a device_fault / thermal_throttle (derived from device_changed)
    device: int | None = None
    #: Format 1.6, spike_rule "range": which rule flagged a spike: "z", "excursion" or "joint" (absent: "z")
    rule: str | None = None
    #: Format 1.6, spike_rule "range", a loss anomaly: the robust z of the log of the loss, which the rule scores
    #: (``baseline_median``, ``mad`` and ``z_score`` are then those of the loss itself, as the seed defines them)
    log_z: float | None = None

    @property
    def kind(self) -> str:
        """The anomaly's kind: loss_spike, grad_norm_spike, nan_loss, inf_loss, nan_grad_norm, ..."""
        return self.anomaly


class SpikeSuspected(Event, tag="spike_suspected", frozen=True, kw_only=True):
    """A derived event: a value above the threshold that the next step did not confirm (a lone outlier, or
    the start of a spike too short to call one). Recorded so that a reviewer sees it, and recomputed by replay,
    but not an anomaly: it counts in no anomaly total and drives no rewind."""

    step: int
    series: str  # "loss" | "grad_norm"
    value: float
    baseline_median: float
    mad: float
    z_score: float
    threshold: float
    #: the step whose calm (or non-finite) value released it
    released_at: int


class AnomalyEnded(Event, tag="anomaly_ended", frozen=True, kw_only=True):
    """A derived event (format 1.6, spike_rule "range"): the end of the episode an anomaly opened. A spike's
    elevated steps after its onset, and a resume's redone steps that keep seeing other batches, are its tail: one
    anomaly, then this record with its extent. Recomputed by replay."""

    #: the anomaly's step (its ``anomaly_detected.step``) and kind
    step: int
    anomaly: str
    series: str  # "loss" | "grad_norm" | "data"
    #: the episode's last step, and the steps in it (its onset included)
    last_step: int
    steps: int
    #: the largest value in it and its step (None for data divergence)
    peak: float | None = None
    peak_step: int | None = None
    #: "calm" (a value back near the baseline, or a redone batch equal to the first time's), "length" (the window's
    #: length of steps passed) or "resume"
    closed_by: str = "calm"
    #: the step whose observation closed it (None when a resume did)
    ended_at: int | None = None


#: The longest baseline window a detector keeps (a journal cannot ask for more memory than this).
MAX_WINDOW = 1 << 20


class DetectorParams:
    """Window, warm-up and threshold of one detector, validated."""

    __slots__ = ("window", "min_periods", "z_thresh")

    def __init__(self, window: int, min_periods: int, z_thresh: float, name: str):
        if not isinstance(window, int) or not 3 <= window <= MAX_WINDOW:
            raise ValueError(f"{name}_window must be an integer in [3, {MAX_WINDOW}], got {window!r}")
        if not isinstance(min_periods, int) or not 3 <= min_periods <= window:
            raise ValueError(f"{name}_min_periods must be an integer in [3, {name}_window={window}], got {min_periods!r}")
        if not isinstance(z_thresh, (int, float)) or not math.isfinite(z_thresh) or z_thresh <= 0:
            raise ValueError(f"{name}_z_thresh must be a positive number, got {z_thresh!r}")
        self.window, self.min_periods, self.z_thresh = window, min_periods, float(z_thresh)


class CheckpointSaved(Event, tag="checkpoint_saved", frozen=True, kw_only=True):
    """A checkpoint file that is on disk (fsynced) with this digest."""

    step: int
    path: str  # relative to the run directory
    bytes: int
    sha256: str
    contents: list[str]
    duration_s: float
    tokens: int = 0
    background: bool = False
    #: SHA-256 of the health monitor's snapshot stored in the checkpoint (format 1.1; blocking saves): replay
    #: holds it against the fold of the journal up to this event
    monitor_sha256: str | None = None
    #: Format 1.2: a checkpoint that is a folder other code wrote (a Trainer's checkpoint-N/): every file in it,
    #: {file (relative to the folder), bytes, sha256}; then ``sha256`` is the folder digest (folder_digest)
    files: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:  # on decode too: a resume checks every entry
        _check_files(self.files or (), "checkpoint")


def folder_digest(files: list[dict[str, Any]]) -> str:
    """The digest of a checkpoint folder: SHA-256 over its files' ``sha256sum`` lines (``HEX  NAME\n``), sorted
    by name, so ``sha256sum`` over the folder's files, sorted, reproduces its input."""
    import hashlib

    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f["file"]):
        h.update(f"{f['sha256']}  {f['file']}\n".encode())
    return h.hexdigest()


class ResumeRejectedEvent(Event, tag="resume_rejected", frozen=True, kw_only=True):
    """A restore that did not qualify as a resume, and why."""

    path: str
    reason: str  # resume-invalid-missing-state | resume-invalid-digest | resume-invalid-unknown-checkpoint
    missing: list[str] = []
    detail: str = ""


class WeightsRestored(Event, tag="weights_restored", frozen=True, kw_only=True):
    """The named override: weights only (e.g. to fine-tune). Not a resume."""

    path: str
    step: int
    override: str


class CheckpointFailed(Event, tag="checkpoint_failed", frozen=True, kw_only=True):
    """A background save that did not complete: nothing was recorded as saved."""

    step: int
    error: str


class CheckpointDeleted(Event, tag="checkpoint_deleted", frozen=True, kw_only=True):
    """A checkpoint file removed on purpose, so the journal says why a referenced file is gone."""

    path: str
    step: int
    reason: str


class RewindDecided(Event, tag="rewind_decided", frozen=True, kw_only=True):
    spike_step: int
    anomaly: str
    checkpoint: str
    from_step: int
    skip_batches: int
    lr_scale: float
    reason: str
    #: the budget in force (format 1.1): at most max_rewinds rewinds for spikes within window_steps steps
    max_rewinds: int | None = None
    window_steps: int | None = None


class DataWindowSkipped(Event, tag="data_window_skipped", frozen=True, kw_only=True):
    start_batch: int
    end_batch: int


class RunStopped(Event, tag="run_stopped", frozen=True, kw_only=True):
    rule: str
    reason: str
    #: The number that tripped the rule and the limit it crossed, when there is one.
    value: float | None = None
    limit: float | None = None


class PreflightGate(Event, tag="preflight_gate", frozen=True, kw_only=True):
    """One gate of the experiment preflight (training/experiment/preflight.py), in order."""

    gate: str
    status: str  # passed | failed | blocked | not_run
    reason: str
    measured: dict[str, Any] = {}
    manifest_id: str = ""


class PreflightCompleted(Event, tag="preflight_completed", frozen=True, kw_only=True):
    manifest_id: str
    status: str  # ready-to-train | experiment-specified-{blocked,failed}-before-training at <gate>
    stopped_at: str | None = None


class EvaluationRecorded(Event, tag="evaluation_recorded", frozen=True, kw_only=True):
    """An evaluation hook's result, bound to the checkpoint it evaluated; per-case results by digest."""

    hook: str
    role: str  # target | retention | control
    step: int
    checkpoint: str
    checkpoint_sha256: str
    metrics: dict[str, float]
    cases: int
    cases_sha256: str
    cases_path: str


class CheckpointSelected(Event, tag="checkpoint_selected", frozen=True, kw_only=True):
    rule: str
    checkpoint: str
    checkpoint_sha256: str
    step: int
    value: float
    candidates: int


class ResourceRecorded(Event, tag="resource_recorded", frozen=True, kw_only=True):
    """Resource evidence at checkpoint cadence: counts, time by component, memory, failures, environment."""

    updates: int
    examples: int
    tokens: int
    supervised_tokens: int
    wall_s: float
    durations_s: dict[str, float]
    peak_rss_bytes: int
    failures: int = 0
    retries: int = 0
    checkpoint_bytes: int = 0
    checkpoint_s: float = 0.0
    environment: dict[str, str] = {}


class ShardsSaved(Event, tag="shards_saved", frozen=True, kw_only=True):
    """One rank's part of a sharded checkpoint (``torch.distributed.checkpoint``): the shard files it wrote,
    each durable, with its digest; rank 0 also records the ``.metadata`` digest. A sharded checkpoint is
    complete only when every rank of ``world_size`` recorded its shards."""

    step: int
    path: str  # the checkpoint folder, relative to the run folder
    rank: int
    world_size: int
    files: list[dict[str, Any]]  # {"file", "bytes", "sha256"}
    metadata_sha256: str | None = None
    save_id: str | None = None  # rank 0: DCP's save_id, as in the checkpoint's .metadata

    def __post_init__(self) -> None:  # on decode too: a restore reads every entry
        _check_files(self.files, "shard")


class DeviceSampled(Event, tag="device_sampled", frozen=True, kw_only=True):
    """One device's reading through NVML (training/health/telemetry.py); a value the device does not report is null."""

    device: int
    temp_c: float | None = None
    temp_hbm_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    clock_event_reasons: int | None = None
    ecc: dict[str, int] = {}
    #: 1.7: NVML's total energy counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver
    #: loaded; Volta or newer): the compute statement's measured energy is the rise between samples
    energy_mj: int | None = None


class DeviceChanged(Event, tag="device_changed", frozen=True, kw_only=True):
    """Something that matters changed on a device: an ECC count rose, throttling started or stopped."""

    device: int
    change: str  # ecc_corrected | ecc_uncorrected | throttle_started | throttle_stopped | xid
    detail: dict[str, Any] = {}
    #: the last step the training loop had observed when the change was seen (None: no step yet, or no monitor)
    step: int | None = None


#: device_changed -> the anomaly the health projection derives from it (journal/audit/projection.py, HealthAudit)
DEVICE_ANOMALIES = {"ecc_uncorrected": "device_fault", "xid": "device_fault", "throttle_started": "thermal_throttle"}


def device_anomaly(ev: DeviceChanged) -> AnomalyDetected | None:
    """The anomaly a device change is (``device_fault``: uncorrected ECC errors rising, an XID critical error;
    ``thermal_throttle``: the device started slowing itself down), or None. ``value``: the new uncorrected count,
    the XID, or the temperature; ``step``: the change's (-1 before any step)."""
    kind = DEVICE_ANOMALIES.get(ev.change)
    if kind is None:
        return None
    d = ev.detail
    raw = d.get("after") if ev.change == "ecc_uncorrected" else d.get("xid") if ev.change == "xid" else d.get("temp_c")
    value = float(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else float("nan")
    return AnomalyDetected(step=ev.step if ev.step is not None else -1, anomaly=kind, value=value, device=ev.device)


class TelemetryUnavailable(Event, tag="telemetry_unavailable", frozen=True, kw_only=True):
    """Device telemetry could not start (no NVML, no driver, no device): said once, never invented."""

    reason: str


class StragglerScores(Event, tag="straggler_scores", frozen=True, kw_only=True):
    """Rank 0's record of one straggler window: every rank's median step time over steps window_start to
    window_end and its relative score (the fastest median over its own; training/distributed/stragglers.py)."""

    window_start: int
    window_end: int
    medians: dict[str, float]  # rank (decimal) -> median step time, seconds
    scores: dict[str, float]
    threshold: float
    individual: dict[str, float] | None = None  # rank -> its best window median so far over this one's

    def __post_init__(self) -> None:  # on decode too: replay RUN_DIR reads these fields
        _check_ranks(self.medians, "medians")
        _check_ranks(self.scores, "scores")
        if self.individual is not None:
            _check_ranks(self.individual, "individual")


class StragglerDetected(Event, tag="straggler_detected", frozen=True, kw_only=True):
    """A rank whose relative score fell below the threshold in a window (derived; replay recomputes it)."""

    rank: int
    score: float
    window_start: int
    window_end: int
    node: str | None = None


class MetricsLogged(Event, tag="metrics_logged", frozen=True, kw_only=True):
    """Metrics a logging call reported (``Recorder.log``, Lightning's ``self.log``, Hugging Face's logs), as it
    reported them: a record of what was logged, not a conclusion trainledger derives (format 1.2). ``source`` names
    the call (``log``, ``lightning``, ``hf``, ...)."""

    step: int
    metrics: dict[str, float]
    source: str = ""


class ConfigLogged(Event, tag="config_logged", frozen=True, kw_only=True):
    """Format 1.9: a run's configuration as a logging call set it (``wandb.config``, ``add_hparams``): the keys set
    and their values, as JSON. Later records override earlier ones key by key; the run's configuration is their
    fold. ``source`` names the call; ``step`` the last step logged when it was set (None: before any)."""

    config: dict[str, Any]
    source: str = ""
    step: int | None = None


_HEX = frozenset("0123456789abcdef")


def _hex(v: Any, n: int, what: str) -> None:
    if not (isinstance(v, str) and len(v) == n and _HEX.issuperset(v)):
        raise ValueError(f"{what} must be {n} lowercase hex digits, got {str(v)[:80]!r}")


class StateFingerprinted(Event, tag="state_fingerprinted", frozen=True, kw_only=True):
    """Format 1.10: this rank's training state after ``step``'s optimizer step, as
    ``training.health.state_fingerprint`` computes it (docs/sdc.md): ``root`` (64 hex digits) over every tensor's
    pair, ``tensors`` how many; ``digests`` each tensor's pair (name -> 32 hex digits) where recorded (when the
    ranks' roots disagreed, or always when asked), so a divergence can be named to its tensor; ``excluded`` what was
    left out on purpose because replicas hold it differently (names); ``grads`` whether the gradients are in it;
    ``at`` why now (``every``, ``checkpoint``, ``start``); ``replicas`` the ranks whose state must equal this
    rank's (its own among them) where the state is sharded (FSDP, HSDP: the ranks that hold the same shards; a
    rank alone where no other does), None for every rank of the run (DDP)."""

    step: int
    root: str
    tensors: int
    digests: dict[str, str] | None = None
    excluded: list[str] = []
    grads: bool = False
    at: str = "every"
    replicas: list[int] | None = None

    def __post_init__(self) -> None:  # on decode too: the SDC fold reads these fields
        _hex(self.root, 64, "root")
        if self.tensors < 0:
            raise ValueError(f"tensors must be >= 0, got {self.tensors}")
        if self.digests is not None:
            if len(self.digests) != self.tensors:
                raise ValueError(f"digests: {len(self.digests)} for {self.tensors} tensors")
            for name, d in self.digests.items():
                _hex(d, 32, f"digest of {name[:80]!r}")


class StateDiverged(Event, tag="state_diverged", frozen=True, kw_only=True):
    """Format 1.10: data-parallel replicas whose state fingerprints disagreed at ``step`` (derived: rank 0 records
    it, replay recomputes it from every rank's ``state_fingerprinted``; training/distributed/sdc.py). ``ranks``: the
    ranks named, those outside the majority's root (every rank of the step where no root has a strict majority:
    both, of two); ``rank`` the first of them; ``tensor`` the first tensor whose pair differs from the majority's (or
    the other rank's), None where no digests were recorded; ``replicas`` how many ranks fingerprinted the step;
    ``majority`` the majority's root (None without one). A rank is named once an episode (its first step outside
    the majority, until every replica agrees again)."""

    step: int
    rank: int
    ranks: list[int]
    replicas: int
    tensor: str | None = None
    majority: str | None = None

    def __post_init__(self) -> None:
        if not self.ranks or self.rank != self.ranks[0] or any(r < 0 for r in self.ranks):
            raise ValueError(f"ranks must be non-negative, rank the first of them: {self.rank}, {self.ranks[:16]}")
        if self.majority is not None:
            _hex(self.majority, 64, "majority")


class ReplayChecked(Event, tag="replay_checked", frozen=True, kw_only=True):
    """Format 1.10: this rank's forward and backward pass of ``step`` computed again, on the same batch, weights and
    random state, before the optimizer step, and held to the first (docs/sdc.md): ``loss`` and ``loss_again``
    (the two losses' bits as 16 hex digits of their float64), ``root`` and ``root_again`` (over every parameter's
    local gradient, before the all-reduce, as the state fingerprint reduces a tensor), ``tensors`` how many
    gradients; ``ok`` whether both agree bit for bit; ``tensor`` the first gradient that differs (None where they
    agree or only the loss differs). Replay holds ``ok`` to the fields."""

    step: int
    ok: bool
    loss: str
    loss_again: str
    root: str
    root_again: str
    tensors: int
    tensor: str | None = None

    def __post_init__(self) -> None:
        _hex(self.loss, 16, "loss")
        _hex(self.loss_again, 16, "loss_again")
        _hex(self.root, 64, "root")
        _hex(self.root_again, 64, "root_again")


def config_values(values: Any, *, what: str = "config") -> dict[str, Any]:
    """A configuration as ``config_logged`` records it: a mapping (an ``argparse.Namespace`` or any object with
    ``__dict__`` by its attributes) of string keys to JSON values; numbers, strings, booleans and None as they are,
    tuples and sets as lists, nested mappings as objects, anything else by its ``str()`` (a dtype, a path, a
    class). Raises :class:`ValueError` for a key that is not a non-empty string."""
    if not hasattr(values, "items"):
        if hasattr(values, "__dict__") and not isinstance(values, type):
            values = vars(values)
        else:
            raise ValueError(f"{what} must be a mapping (or an argparse Namespace), got {type(values).__name__}")

    def plain(v: Any, depth: int) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if depth > 16:
            return str(v)
        if hasattr(v, "items"):
            return {str(k): plain(x, depth + 1) for k, x in v.items()}
        if isinstance(v, (list, tuple, set, frozenset)):
            return [plain(x, depth + 1) for x in (sorted(v, key=str) if isinstance(v, (set, frozenset)) else v)]
        item = getattr(v, "item", None)
        if callable(item) and getattr(v, "ndim", None) == 0:
            return plain(item(), depth)
        return str(v)

    out: dict[str, Any] = {}
    for k, v in values.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"{what}: a key must be a non-empty string, got {k!r}"[:200])
        out[k] = plain(v, 0)
    return out


#: The longest metric name a ``metrics_logged`` records (a name is a label, not a payload)
MAX_METRIC_NAME = 1024


#: the value types a queued row may hold by reference (immutable, numbers): a row of only these, with valid names,
#: is queued as it is and made into its event by the journal's drain (:func:`logged_row`)
PLAIN_NUMBERS = frozenset((float, int, bool))


def logged_row(item: tuple[dict[str, Any], int, str]) -> MetricsLogged:
    """``(row, step, source)`` of plain numbers (names checked by the caller) as its ``metrics_logged``: what a
    logging call queues with ``Journal.append_later``, made at the drain."""
    row, step, source = item
    return MetricsLogged(step=step, metrics={k: float(v) for k, v in row.items()}, source=source)


def metric_values(values: Any, *, what: str = "metrics") -> dict[str, float]:
    """The scalars of a logging call as ``metrics_logged`` records them: every value a real number as a float
    (ints, bools as 0/1, NaN and the infinities kept; a NumPy scalar or a one-element tensor by its ``item()``), a
    nested mapping flattened with ``.`` as W&B does (``{"eval": {"acc": 0.9}}`` is ``eval.acc``). Raises
    :class:`ValueError` naming the first name or value that is not one: an empty or over-long name, a string, a
    list, an image."""
    if type(values) is dict:  # the common row, flat names to floats: taken as it is (a logging call in a loop)
        for k, v in values.items():
            if type(v) is not float or type(k) is not str or not 0 < len(k) <= MAX_METRIC_NAME:
                break
        else:
            return dict(values)
    out: dict[str, float] = {}

    def walk(prefix: str, d: Any) -> None:
        if not hasattr(d, "items"):
            raise ValueError(f"{what} must be a mapping of names to numbers, got {type(d).__name__}")
        for k, v in d.items():
            if not isinstance(k, str) or not k:
                raise ValueError(f"{what}: a metric name must be a non-empty string, got {k!r}"[:200])
            name = f"{prefix}.{k}" if prefix else k
            if len(name) > MAX_METRIC_NAME:
                raise ValueError(f"{what}: the name {name[:40]!r}... is longer than {MAX_METRIC_NAME} characters")
            if isinstance(v, float):
                out[name] = v
            elif isinstance(v, int):  # bool included: True is 1.0
                out[name] = float(v)
            elif hasattr(v, "items"):
                walk(name, v)
            else:
                item = getattr(v, "item", None)
                size = getattr(v, "size", None)
                numel = v.numel() if callable(getattr(v, "numel", None)) else size if isinstance(size, int) else None
                if callable(item) and numel == 1:
                    got = item()
                    if isinstance(got, (int, float)):
                        out[name] = float(got)
                        continue
                raise ValueError(f"{what}: {name!r} is a {type(v).__name__}, not a number (only scalars are "
                                 "recorded)"[:300])

    walk("", values)
    return out


class ComputeTotaled(Event, tag="compute_totaled", frozen=True, kw_only=True):
    """The training compute of every step the journal observed before it, as one signed figure (format 1.3):
    a derived event (:class:`trainledger.training.health.mfu.ComputeTotals`), recorded when a run ends and recomputed by replay.
    Every ``step_observed`` counts (steps done again after a rewind or a resume too: compute spent); a step's
    tokens are ``tokens``, else ``examples`` x its segment's ``seq_len``; ``flops`` is the model FLOPs of those
    tokens (PaLM: 6N + 12LHQT per token, under each step's ``run_configured``), a float (a frontier run's
    exceeds 64-bit integers)."""

    steps: int
    tokens: int
    flops: float
    last_step: int | None = None
    steps_without_tokens: int = 0  # steps with neither tokens nor examples and a seq_len
    tokens_without_shape: int = 0  # tokens of segments whose run_configured gave no FLOP shape (not in flops)
    #: 1.7 (the compute statement, training.compute): seconds in steps (the sum of every positive finite
    #: ``step_time_s``, each truncated to whole nanoseconds), and the steps without one
    busy_s: float | None = None
    steps_without_time: int = 0
    #: 1.7: the steps by the hardware they ran on, one entry per distinct (devices, peak, peak_source, device_kind)
    #: of the run_configured in force, in order of first use: those fields, ``steps`` and ``busy_s``
    hardware: list[dict[str, Any]] = []
    #: 1.7: the journal's first line's and its last step's timestamps (ns since the epoch)
    started_ns: int | None = None
    ended_ns: int | None = None
    #: 1.7: energy from NVML's counter (``device_sampled.energy_mj`` rising between consecutive samples of a device),
    #: the device-seconds those samples span, and the counter's resets (a fall: not counted); where a pair of
    #: samples has no counter, the trapezoid of their ``power_w`` (``power_j``, ``power_s``), labelled an estimate
    energy_j: float | None = None
    energy_s: float = 0.0
    energy_resets: int = 0
    power_j: float | None = None
    power_s: float = 0.0
    #: 1.8: what a compute statement needs to show its crossings whole: the thresholds the ``run_configured`` in
    #: force watches (name: model FLOPs), the FLOPs of earlier runs it declares (``carried_flops``), and the name of
    #: every threshold the journal's steps crossed before this total, in order (one ``compute_threshold_crossed``
    #: each). A proof can hold any line, but no proof shows that no ``run_configured`` or crossing came between two
    #: lines: the total, which replay recomputes, says it.
    thresholds: dict[str, float] | None = None
    carried_flops: float | None = None
    crossed: list[str] | None = None


class ComputeThresholdCrossed(Event, tag="compute_threshold_crossed", frozen=True, kw_only=True):
    """Format 1.7: the journal's running training compute (model FLOPs of every step so far, plus the
    ``carried_flops`` declared) reached a threshold the ``run_configured`` in force watches (``compute_thresholds``)
    at ``step``: the receipt that starts a notification clock (EU AI Act Article 52: two weeks). A derived event:
    replay recomputes the step. ``flops`` is the running total after that step, carried included."""

    name: str
    threshold: float
    step: int
    flops: float
    carried_flops: float = 0.0


#: the kinds this module defines, as the codec's registry lists them (journal.kinds.BUILTIN_KINDS)
KINDS: tuple[type[Event], ...] = (
    RunConfigured, AnomalyDetected, SpikeSuspected, AnomalyEnded, CheckpointSaved, ResumeRejectedEvent,
    WeightsRestored, CheckpointFailed, CheckpointDeleted, RewindDecided, DataWindowSkipped, RunStopped,
    PreflightGate, PreflightCompleted, EvaluationRecorded, CheckpointSelected, ResourceRecorded, ShardsSaved,
    DeviceSampled, DeviceChanged, TelemetryUnavailable, StragglerScores, StragglerDetected, MetricsLogged,
    ComputeTotaled, ComputeThresholdCrossed, ConfigLogged, StateFingerprinted, StateDiverged, ReplayChecked,
)
