"""Event kinds of the training side, defined torch-free so that verify, replay and query can
fold them on an auditor's machine. ``training`` and ``ladder`` import them from here.

Checkpoints (issue 4), spike rewind (issue 4), the pilot ladder (issue 5), and the experiment's preflight,
evaluations, checkpoint selection and resource evidence (issue 7).
"""

from __future__ import annotations

from typing import Any

from .events import Event

__all__ = ["CheckpointSaved", "ResumeRejectedEvent", "WeightsRestored", "CheckpointFailed", "CheckpointDeleted",
           "RewindDecided", "DataWindowSkipped", "RunStopped", "RungStarted", "GateVerdict", "DecisionRecorded",
           "PreflightGate", "PreflightCompleted", "EvaluationRecorded", "CheckpointSelected", "ResourceRecorded",
           "CHECKPOINT_CONTRACT"]

#: What a checkpoint must hold for a resume to continue the run exactly (training/checkpoint.py enforces it;
#: the manifest validator checks a manifest's checkpoint contents against it). Torch-free on purpose.
CHECKPOINT_CONTRACT = ("model", "optimizer", "scheduler", "scaler", "rng", "sampler", "counters", "accumulation",
                       "manifest_id")


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
    """One gate of the experiment preflight (training/preflight.py), in order."""

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


class RungStarted(Event, tag="rung_started", frozen=True, kw_only=True):
    rung: str
    real_target: str
    spec: dict[str, Any]


class GateVerdict(Event, tag="gate_verdict", frozen=True, kw_only=True):
    rung: str
    passed: bool
    reason: str
    measured: dict[str, Any]
    bars: dict[str, Any]
    artifacts: dict[str, Any]


class DecisionRecorded(Event, tag="decision_recorded", frozen=True, kw_only=True):
    rung: str
    belief_before: dict[str, float]
    evidence: list[str]  # chain hashes of the events the decision rests on
    belief_after: dict[str, float]
    action_chosen: str  # "advance" | "halt_ladder"
