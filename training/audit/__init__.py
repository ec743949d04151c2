"""The training domain's projections: what replay recomputes from a run's steps, checkpoints and preflight.

``HealthAudit`` refolds the anomaly detectors, the suspected spikes and MFU from the step observations;
``CheckpointLog`` lists checkpoints and resumes; ``RewindAudit`` holds each rewind to its budget; ``StopLog`` checks
each stop against its rule; ``SelectionAudit`` re-picks the selected checkpoint by its rule; ``PreflightAudit``
holds the preflight's gates to their order and its authority gate to a signed approval. Every module here is
torch-free. The live loops call the same functions (:func:`rewind_allowed`, :func:`select_checkpoint`, the
detectors of :mod:`trainledger.training.health.detectors`), so live conclusions and replay cannot drift.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

import msgspec

from trainledger.journal.audit.projection import Projection, ProjectionRegistry, difference as _diff
from trainledger.journal.chain import format_at_least
from trainledger.journal.events import RunOpened, RunResumed, StepObserved
from trainledger.training.kinds import AnomalyDetected, ComputeThresholdCrossed, DeviceSampled, CheckpointSaved, \
    CheckpointSelected, ComputeTotaled, DataWindowSkipped, DeviceChanged, EvaluationRecorded, PreflightCompleted, \
    PreflightGate, ReplayChecked, ResumeRejectedEvent, RewindDecided, RunConfigured, RunStopped, SpikeSuspected, \
    AnomalyEnded, device_anomaly
from trainledger.journal.kinds import ModelExported
from trainledger.journal.statements.release.export import same_as_checkpoint
from trainledger.journal.statements.release.manifest import FileDigest, root_digest
from trainledger.training.audit.approval import ApprovalInvalid, SignedApproval, check_approval
from trainledger.training.health.detectors import HealthProjection, state_digest
from trainledger.training.health.mfu import ComputeTotals

__all__ = ["HealthAudit", "ExportAudit", "ReplayCheckAudit", "compare_crossings", "CheckpointLog", "RewindAudit", "StopLog", "SelectionAudit", "PreflightAudit",
           "compare_derived", "rewind_allowed", "select_checkpoint", "approval_problem", "register"]


# -- health: anomalies, suspected spikes, MFU -------------------------------------------------------------------

_RECORD_ONLY = ("seq", "ts", "h")


def _key(a: Any) -> tuple:
    """A derived event's own fields (not seq, ts, h), hashable, with NaN equal to NaN."""
    vals = (getattr(a, f) for f in type(a).__struct_fields__ if f not in _RECORD_ONLY)
    return tuple("NaN" if isinstance(v, float) and v != v else v for v in vals)


def _what(a: Any) -> str:
    if isinstance(a, AnomalyEnded):
        return f"the end of a {a.anomaly} episode"
    return a.kind if isinstance(a, AnomalyDetected) else f"a suspected {a.series} spike"


def compare_derived(recomputed: list[tuple[int, Any]], recorded: list[tuple[int, Any]],
                    kind: str) -> list[dict[str, Any]]:
    """Recomputed against recorded derived events, as multisets: linear in both."""
    want = Counter(_key(a) for _, a in recomputed)
    out = []
    for seq, rd in recorded:
        k = _key(rd)
        if want[k] > 0:
            want[k] -= 1
        else:
            out.append(_diff(seq, kind, f"recorded {_what(rd)} at step {rd.step}, which the observations do not "
                                        "support"))
    for seq, rc in reversed(recomputed):  # the unmatched ones: the latest of each were left unrecorded
        k = _key(rc)
        if want[k] > 0:
            want[k] -= 1
            z = f" (z {rc.z_score})" if getattr(rc, "z_score", None) is not None else ""
            out.append(_diff(seq, kind, f"the observations give {_what(rc)} at step {rc.step}{z}, "
                                        "which was not recorded"))
    return out


def compare_crossings(recomputed: list[tuple[int, Any]], recorded: list[tuple[int, Any]]) -> list[dict[str, Any]]:
    """The thresholds the running compute crossed (format 1.7) against the ``compute_threshold_crossed`` recorded:
    each recorded one must be the step the steps give, and each crossing the steps give must be on record."""
    want = {c.name: (seq, c) for seq, c in recomputed}
    out = []
    seen = set()
    for seq, rd in recorded:
        got = want.get(rd.name)
        if rd.name in seen:
            out.append(_diff(seq, "compute_threshold_crossed", f"recorded the {rd.name} threshold crossed again"))
        elif got is None:
            out.append(_diff(seq, "compute_threshold_crossed",
                             f"recorded the {rd.name} threshold ({rd.threshold:.3g} FLOPs) crossed at step {rd.step}, "
                             "but the steps before it do not reach it under the thresholds configured"))
        elif _key(got[1]) != _key(rd):
            c = got[1]
            out.append(_diff(seq, "compute_threshold_crossed",
                             f"recorded the {rd.name} threshold ({rd.threshold:.3g} FLOPs) crossed at step {rd.step} "
                             f"with {rd.flops:.6g} FLOPs, but the steps cross {c.threshold:.3g} at step {c.step} "
                             f"with {c.flops:.6g}"))
        seen.add(rd.name)
    for name, (seq, c) in want.items():
        if name not in seen:
            out.append(_diff(seq, "compute_threshold_crossed",
                             f"the steps cross the {name} threshold ({c.threshold:.3g} FLOPs) at step {c.step}, which "
                             "was not recorded"))
    return out


class HealthAudit(Projection):
    """The health fold. Each ``run_configured`` starts a segment with its own detectors and MFU accounting (a
    ladder writes one per rung); ``summary`` is the last segment's report, anomalies are counted across all."""

    name = "health"
    kinds = (RunConfigured, StepObserved, RunResumed, DeviceChanged, AnomalyDetected, SpikeSuspected,
             AnomalyEnded, ComputeTotaled, CheckpointSaved, RunOpened, DeviceSampled,
             ComputeThresholdCrossed)  # the events it folds (journal.audit.projection)

    def __init__(self, format_version: str | None = None) -> None:
        self.proj: HealthProjection | None = None
        self.recomputed: list[tuple[int, AnomalyDetected]] = []
        self.recorded: list[tuple[int, AnomalyDetected]] = []
        self.suspected: list[tuple[int, SpikeSuspected]] = []
        self.suspected_recorded: list[tuple[int, SpikeSuspected]] = []
        self.ended: list[tuple[int, AnomalyEnded]] = []  # format 1.6: the episodes' ends
        self.ended_recorded: list[tuple[int, AnomalyEnded]] = []
        self._diffs = []  # snapshots that are not the fold
        # spike_suspected came with format 1.1: a journal written before cannot be asked for it
        self.check_suspected = format_version is None or format_at_least(format_version, (1, 1))
        # device anomalies derived from device_changed came with format 1.2
        self.check_device = format_version is None or format_at_least(format_version, (1, 2))
        self.compute = ComputeTotals()  # compute_totaled (1.3): every step of every segment
        self.crossed_recorded: list[tuple[int, ComputeThresholdCrossed]] = []  # 1.7

    def apply_step(self, ev: Any) -> None:
        """The fold's hot path: :meth:`apply` for a ``step_observed``, without the dispatch."""
        self.compute.add(ev)
        proj = self.proj
        if proj is None:
            proj = self.proj = HealthProjection()
        found = proj._step(ev)
        if found:
            seq = ev.seq
            self.recomputed += [(seq, an) for an in found]
        if proj.suspected_new:
            self.suspected += [(ev.seq, x) for x in proj.take_suspected()]
        if proj.ended_new:
            self.ended += [(ev.seq, x) for x in proj.take_ended()]

    def apply_steps(self, events: list[Any], lo: int, hi: int) -> None:
        """:meth:`apply_step` on each of ``events[lo:hi]`` (the common steps in C: HealthProjection.fold_steps)."""
        proj = self.proj
        if proj is None:
            proj = self.proj = HealthProjection()
        proj.fold_steps(events, lo, hi, self.compute, self._after)

    def _after(self, ev: Any, found: list[AnomalyDetected]) -> None:
        if found:
            seq = ev.seq
            self.recomputed += [(seq, an) for an in found]
        proj = self.proj
        if proj.suspected_new:
            self.suspected += [(ev.seq, x) for x in proj.take_suspected()]
        if proj.ended_new:
            self.ended += [(ev.seq, x) for x in proj.take_ended()]

    def apply(self, ev: Any) -> None:
        if isinstance(ev, RunConfigured):
            self.proj = HealthProjection(ev)
            self.compute.configure(ev)
        elif isinstance(ev, (StepObserved, RunResumed)):
            if isinstance(ev, StepObserved):
                self.compute.add(ev)
            proj = self.proj
            if proj is None:
                proj = self.proj = HealthProjection()
            for an in proj.apply(ev):
                self.recomputed.append((ev.seq, an))
            if proj.suspected_new:
                self.suspected += [(ev.seq, x) for x in proj.take_suspected()]
            if proj.ended_new:
                self.ended += [(ev.seq, x) for x in proj.take_ended()]
        elif isinstance(ev, DeviceChanged) and self.check_device:  # a fault or throttling is an anomaly (1.2)
            an = device_anomaly(ev)
            if an is not None:
                self.recomputed.append((ev.seq, an))
        elif isinstance(ev, AnomalyDetected):
            self.recorded.append((ev.seq, ev))
        elif isinstance(ev, SpikeSuspected):
            self.suspected_recorded.append((ev.seq, ev))
        elif isinstance(ev, AnomalyEnded):
            self.ended_recorded.append((ev.seq, ev))
        elif isinstance(ev, DeviceSampled):
            self.compute.sample(ev)
        elif isinstance(ev, ComputeThresholdCrossed):
            self.crossed_recorded.append((ev.seq, ev))
        elif isinstance(ev, RunOpened):
            self.compute.open(ev)
        elif isinstance(ev, ComputeTotaled):
            want = self.compute.event()
            got = {f: getattr(ev, f) for f in ComputeTotaled.__struct_fields__ if f not in _RECORD_ONLY}
            for f, v in got.items():
                if getattr(want, f) != v:
                    self._diffs.append(_diff(ev.seq, "compute_totaled", f"recorded {f} {v}, but the steps before "
                                                                        f"it add up to {getattr(want, f)}"))
                    break
        elif isinstance(ev, CheckpointSaved) and ev.monitor_sha256 is not None:
            # The checkpoint's monitor snapshot must be the fold of the journal up to here.
            folded = state_digest((self.proj or HealthProjection()).state())
            if folded != ev.monitor_sha256:
                self._diffs.append(_diff(ev.seq, "checkpoint_saved",
                                                  f"the monitor snapshot in {ev.path} (sha256 {ev.monitor_sha256[:16]}) "
                                                  f"is not the fold of the journal up to it ({folded[:16]})"))

    def differences(self) -> list[dict[str, Any]]:
        out = compare_derived(self.recomputed, self.recorded, "anomaly_detected") + self._diffs
        if self.check_suspected:
            out += compare_derived(self.suspected, self.suspected_recorded, "spike_suspected")
        # anomaly_ended (1.6) only follows from a run_configured that names the range rule, which 1.6 brought
        out += compare_derived(self.ended, self.ended_recorded, "anomaly_ended")
        return out + compare_crossings(self.compute.crossed, self.crossed_recorded)

    def summary(self) -> dict[str, Any] | None:
        return self.proj.report() if self.proj is not None else None

    def anomalies_by_kind(self) -> dict[str, list[int]]:
        by_kind: dict[str, list[int]] = {}
        for _, an in self.recomputed:
            by_kind.setdefault(an.kind, []).append(an.step)
        return by_kind


# -- checkpoints, rewinds, stops --------------------------------------------------------------------------------


class CheckpointLog(Projection):
    name = "checkpoints"
    kinds = (CheckpointSaved, RunResumed, ResumeRejectedEvent)  # the events it folds (journal.audit.projection)

    def __init__(self) -> None:
        self.checkpoints: list[dict[str, Any]] = []
        self.resumes: list[dict[str, Any]] = []
        #: resumes that were refused (``resume_rejected``): the run did not continue from what it asked for
        self.rejected: list[dict[str, Any]] = []

    def apply(self, ev: Any) -> None:
        if isinstance(ev, CheckpointSaved):
            self.checkpoints.append({"seq": ev.seq, "step": ev.step, "path": ev.path, "sha256": ev.sha256,
                                     "background": ev.background})
        elif isinstance(ev, RunResumed):
            self.resumes.append({"seq": ev.seq, "from_step": ev.from_step, "checkpoint": ev.checkpoint,
                                 "reason": ev.reason})
        elif isinstance(ev, ResumeRejectedEvent):
            self.rejected.append({"seq": ev.seq, "path": ev.path, "reason": ev.reason, "missing": list(ev.missing),
                                  "detail": ev.detail})


def rewind_allowed(earlier_spike_steps: list[int], spike_step: int, max_rewinds: int, window_steps: int) -> bool:
    """The rewind budget: fewer than ``max_rewinds`` rewinds for spikes within the last ``window_steps`` steps.
    The live loop asks this of the rewinds it folded from its journal (so a crash does not reset the budget),
    and replay asks it again of every recorded ``rewind_decided``."""
    return sum(1 for s in earlier_spike_steps if s > spike_step - window_steps) < max_rewinds


class RewindAudit(Projection):
    """Rewinds, their data windows, and the budget: a rewind past ``max_rewinds`` per window is a difference."""

    name = "rewinds"
    kinds = (RewindDecided, DataWindowSkipped)  # the events it folds (journal.audit.projection)

    def __init__(self) -> None:
        self.rewinds: list[dict[str, Any]] = []
        self.spikes: list[int] = []
        self._diffs = []

    def apply(self, ev: Any) -> None:
        if isinstance(ev, RewindDecided):
            if ev.max_rewinds is not None and ev.window_steps is not None and not rewind_allowed(
                    self.spikes, ev.spike_step, ev.max_rewinds, ev.window_steps):
                self._diffs.append(_diff(ev.seq, "rewind_decided",
                                         f"rewind for the spike at step {ev.spike_step} is past the budget: "
                                         f"{ev.max_rewinds} per {ev.window_steps} steps already spent"))
            self.spikes.append(ev.spike_step)
            self.rewinds.append({"seq": ev.seq, "spike_step": ev.spike_step, "checkpoint": ev.checkpoint,
                                 "from_step": ev.from_step, "reason": ev.reason})
        elif isinstance(ev, DataWindowSkipped) and self.rewinds:
            self.rewinds[-1]["skipped_batches"] = [ev.start_batch, ev.end_batch]


#: For the stop rules that record the number that tripped them: what ``value`` against ``limit`` must show.
_STOP_TEST = {
    "budget-breach": (lambda v, lim: v >= lim, "at least"),
    "resume-divergence": (lambda v, lim: v > lim, "above"),
    "forbidden-regression": (lambda v, lim: v > lim, "above"),
    "target-futility": (lambda v, lim: not v <= lim, "above"),
    "effective-batch": (lambda v, lim: v != lim, "other than"),
}


class StopLog(Projection):
    """Every ``run_stopped``, and for the rules that record their numbers, whether those numbers trip the rule
    (a run stopped for futility whose value met its threshold is a difference; so is a finite non-finite-loss)."""

    name = "stops"
    kinds = (AnomalyDetected, RunResumed, RunStopped)  # the events it folds (journal.audit.projection)

    def __init__(self) -> None:
        self.stops: list[dict[str, Any]] = []
        self._diffs = []
        self._anomalies: set[tuple[str, int]] = set()  # (kind, step) of every anomaly recorded so far

    def apply(self, ev: Any) -> None:
        if isinstance(ev, AnomalyDetected):  # HealthAudit holds each of these to the steps themselves
            self._anomalies.add((ev.kind, ev.step))
        elif isinstance(ev, RunResumed):  # a stop the run came back from (a crash, then a resume)
            for s in self.stops:
                s.setdefault("resumed_seq", ev.seq)
        elif isinstance(ev, RunStopped):
            self.stops.append({"seq": ev.seq, "rule": ev.rule, "reason": ev.reason, "value": ev.value,
                               "limit": ev.limit})
            v, lim = ev.value, ev.limit
            if ev.rule == "non-finite-loss" and v is not None and math.isfinite(v):
                self._diffs.append(_diff(ev.seq, "run_stopped", f"stopped for a non-finite loss, but the loss "
                                                                f"recorded is {v}"))
            if ev.rule.startswith("stop_on:"):  # a framework callback stopped on an anomaly (training.integrations)
                kind = ev.rule[len("stop_on:"):]
                m = re.fullmatch(rf"{re.escape(kind)} at step (-?\d+)", ev.reason)
                if m is None or (kind, int(m.group(1))) not in self._anomalies:
                    self._diffs.append(_diff(ev.seq, "run_stopped", f"stopped by {ev.rule} ({ev.reason}), but no "
                                                                    f"{kind} anomaly at that step is on record"))
            test = _STOP_TEST.get(ev.rule)
            if test is not None and v is not None and lim is not None and not test[0](v, lim):
                self._diffs.append(_diff(ev.seq, "run_stopped", f"stopped by {ev.rule}, but its value {v} is not "
                                                                f"{test[1]} its limit {lim}"))


# -- checkpoint selection ---------------------------------------------------------------------------------------


def select_checkpoint(rule: str, evals: list[Any]) -> tuple[Any, int] | None:
    """The preregistered rule (``min:HOOK.METRIC`` or ``max:HOOK.METRIC``) over every evaluation: the chosen
    ``evaluation_recorded`` and the number of candidates, or ``None`` without one. Raises ``ValueError`` for a
    rule of another shape. The experiment loop selects with it and replay selects again."""
    sense, _, rest = rule.partition(":")
    hook, _, metric = rest.partition(".")
    if sense not in ("min", "max") or not hook or not metric:
        raise ValueError(f"selection rule {rule!r} is not min:HOOK.METRIC or max:HOOK.METRIC")
    cands = [e for e in evals if e.hook == hook and metric in e.metrics]
    if not cands:
        return None
    pick = (min if sense == "min" else max)(cands, key=lambda e: e.metrics[metric])
    return pick, len(cands)


class SelectionAudit(Projection):
    name = "selection"
    kinds = (EvaluationRecorded, CheckpointSelected)  # the events it folds (journal.audit.projection)

    def __init__(self) -> None:
        self.evals: list[EvaluationRecorded] = []
        self._diffs = []

    def apply(self, ev: Any) -> None:
        if isinstance(ev, EvaluationRecorded):
            self.evals.append(ev)
        elif isinstance(ev, CheckpointSelected):
            try:
                got = select_checkpoint(ev.rule, self.evals)
            except ValueError as e:
                self._diffs.append(_diff(ev.seq, "checkpoint_selected", str(e)))
                return
            if got is None:
                self._diffs.append(_diff(ev.seq, "checkpoint_selected",
                                         f"{ev.checkpoint} selected, but no evaluation fits {ev.rule!r}"))
                return
            pick, n = got
            metric = ev.rule.partition(".")[2]
            if (pick.checkpoint, pick.checkpoint_sha256, pick.step, pick.metrics[metric], n) != (
                    ev.checkpoint, ev.checkpoint_sha256, ev.step, ev.value, ev.candidates):
                self._diffs.append(_diff(ev.seq, "checkpoint_selected",
                                         f"recorded {ev.checkpoint} ({ev.value}) of {ev.candidates}, the rule "
                                         f"{ev.rule!r} picks {pick.checkpoint} ({pick.metrics[metric]}) of {n}"))


# -- preflight --------------------------------------------------------------------------------------------------


def approval_problem(ev: PreflightGate) -> str | None:
    """Why a passed authority gate does not follow from the approval it recorded (None when it does)."""
    raw = ev.measured.get("approval") if isinstance(ev.measured, dict) else None
    if raw is None:
        return "it records no signed approval"
    try:
        a = msgspec.convert(raw, SignedApproval)
        check_approval(a, manifest_id=ev.manifest_id, approvers=[a.authority], trusted=None)
    except (msgspec.ValidationError, ApprovalInvalid) as e:
        return f"its approval does not hold: {e}"
    if a.decision != "approve":
        return f"the recorded decision is {a.decision!r}"
    return None


class PreflightAudit(Projection):
    """The authority gate rests on a signed approval; no gate runs after the first that did not pass; the
    completion status says where the machine stopped."""

    name = "preflight"
    kinds = (PreflightGate, PreflightCompleted)  # the events it folds (journal.audit.projection)

    def __init__(self) -> None:
        self.stopped: PreflightGate | None = None
        self._diffs = []

    def apply(self, ev: Any) -> None:
        if isinstance(ev, PreflightGate):
            if self.stopped is not None and ev.status != "not_run":
                self._diffs.append(_diff(ev.seq, "preflight_gate",
                                         f"gate {ev.gate} is {ev.status}, but the preflight stopped at "
                                         f"{self.stopped.gate}: it cannot have run"))
            if ev.gate == "authority" and ev.status == "passed":
                problem = approval_problem(ev)
                if problem is not None:
                    self._diffs.append(_diff(ev.seq, "preflight_gate", f"the authority gate passed, but {problem}"))
            if self.stopped is None and ev.status not in ("passed",):
                self.stopped = ev
        elif isinstance(ev, PreflightCompleted):
            s = self.stopped
            want = "ready-to-train" if s is None else (
                f"experiment-specified-{'blocked' if s.status == 'blocked' else 'failed'}-before-training at {s.gate}")
            if ev.status != want:
                self._diffs.append(_diff(ev.seq, "preflight_completed",
                                         f"recorded {ev.status!r}, the gates give {want!r}"))
            self.stopped = None


class ExportAudit(Projection):
    """Every ``model_exported`` (format 1.6): its digest is the one its files give (model signing's), the
    checkpoint it names was recorded before it, of the same step; and how many of its files are that checkpoint's
    bytes (none: converted or merged weights, said plainly, not a difference)."""

    name = "exports"
    kinds = (CheckpointSaved, ModelExported)  # the events it folds (journal.audit.projection)

    def __init__(self) -> None:
        self.exports: list[dict[str, Any]] = []
        self._diffs = []
        self._checkpoints: dict[str, Any] = {}

    def apply(self, ev: Any) -> None:
        if isinstance(ev, CheckpointSaved):
            self._checkpoints[ev.path] = ev
            return
        files = [FileDigest(f["file"], f["bytes"], f["sha256"]) for f in ev.files]
        if root_digest(files) != ev.digest:
            self._diffs.append(_diff(ev.seq, "model_exported", f"the digest {ev.digest[:16]}... is not the one its "
                                                               "files give"))
        same = None
        if ev.checkpoint is not None:
            c = self._checkpoints.get(ev.checkpoint)
            if c is None:
                self._diffs.append(_diff(ev.seq, "model_exported", f"exported from checkpoint {ev.checkpoint}, "
                                                                   "which the journal does not record before it"))
            else:
                if ev.step is not None and c.step != ev.step:
                    self._diffs.append(_diff(ev.seq, "model_exported", f"of step {ev.step}, from checkpoint "
                                                                       f"{c.path} of step {c.step}"))
                same = same_as_checkpoint(ev.files, c)
        self.exports.append({"seq": ev.seq, "path": ev.path, "digest": ev.digest, "step": ev.step,
                             "checkpoint": ev.checkpoint, "files": len(files), "bytes": sum(f.size for f in files),
                             "same_as_checkpoint": same, "base": ev.base})

    def notes(self) -> list[str]:
        out = []
        for e in self.exports:
            if e["checkpoint"] is None:
                out.append(f"model export at seq {e['seq']} ({e['path']}): not a recorded checkpoint's weights")
            elif not e["same_as_checkpoint"]:
                out.append(f"model export at seq {e['seq']} ({e['path']}): none of its files is checkpoint "
                           f"{e['checkpoint']}'s bytes (converted or merged weights)")
        return out


class ReplayCheckAudit(Projection):
    """Every ``replay_checked`` (format 1.10, docs/sdc.md): its verdict is the one its own fields give (``ok`` when
    the two losses and the two gradient roots are equal; a tensor named exactly when the roots differ)."""

    name = "replay_checks"
    kinds = (ReplayChecked,)  # the events it folds (journal.audit.projection)

    def __init__(self) -> None:
        self.checks = 0
        self.mismatches: list[dict[str, Any]] = []
        self._diffs = []

    def apply(self, ev: Any) -> None:
        self.checks += 1
        same_roots = ev.root == ev.root_again
        agree = same_roots and ev.loss == ev.loss_again
        if ev.ok != agree or (ev.tensor is not None) == same_roots:
            self._diffs.append(_diff(ev.seq, "replay_checked",
                                     f"step {ev.step}: recorded ok={ev.ok}, tensor {ev.tensor}; its losses and "
                                     f"roots {'agree' if agree else 'differ'}"))
        if not agree:
            self.mismatches.append({"seq": ev.seq, "step": ev.step, "tensor": ev.tensor})

    def notes(self) -> list[str]:
        return [f"replay check of step {m['step']} differed from the first pass"
                + (f" in {m['tensor']}" if m["tensor"] else " in the loss") for m in self.mismatches]


def register(registry: ProjectionRegistry) -> None:
    """Add the training domain's projections to ``registry``, in replay's order."""
    registry.add("health", HealthAudit)
    registry.add("checkpoints", lambda _fv: CheckpointLog())
    registry.add("rewinds", lambda _fv: RewindAudit())
    registry.add("stops", lambda _fv: StopLog())
    registry.add("selection", lambda _fv: SelectionAudit())
    registry.add("preflight", lambda _fv: PreflightAudit())
    registry.add("exports", lambda _fv: ExportAudit())
    registry.add("replay_checks", lambda _fv: ReplayCheckAudit())
