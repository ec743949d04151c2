"""Projections: deterministic folds over a journal's events, one protocol, folded by replay.

A projection has ``apply(event)`` (fold one event: no I/O, no clock, no randomness), ``differences()`` (every way
the conclusions a writer recorded differ from what the events they rest on imply, each with its seq) and
``summary()`` (what it rebuilt, for the reconstruction). :func:`journal.replay.replay` folds the list that
:func:`default_projections` returns, in journal order, over the signed prefix of a verified journal.

The live code paths reach their conclusions through the same functions the projections recompute them with:
the anomaly detector (:class:`~journal.health.HealthProjection`), the gate (:func:`~journal.ladder_outcome.gate`),
the ladder's belief and action (:func:`~journal.ladder_outcome.decide`), the rewind budget
(:func:`rewind_allowed`) and checkpoint selection (:func:`select_checkpoint`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

import msgspec

from .approval import ApprovalInvalid, SignedApproval, check_approval
from .chain import format_at_least
from .events import RunResumed, StepObserved
from .health import HealthProjection, state_digest
from .errors import UsageError
from .mfu import ComputeTotals
from .kinds import (
    AnomalyDetected,
    ComputeTotaled,
    DeviceChanged,
    ScalingFitted,
    device_anomaly,
    CheckpointSaved,
    CheckpointSelected,
    DataWindowSkipped,
    DecisionRecorded,
    EvaluationRecorded,
    GateVerdict,
    PreflightCompleted,
    PreflightGate,
    RewindDecided,
    RunConfigured,
    RungStarted,
    RunStopped,
    SpikeSuspected,
)
from .ladder_outcome import LadderProjection, decide, gate

__all__ = ["Projection", "HealthAudit", "CheckpointLog", "RewindAudit", "StopLog", "SelectionAudit",
           "PreflightAudit", "LadderAudit", "default_projections", "rewind_allowed", "select_checkpoint", "values_agree"]


class Projection:
    """The protocol. Subclasses fold the kinds they care about and ignore the rest; what they find wrong goes in
    ``_diffs`` as they fold (``differences`` returns it unless a subclass compares at the end)."""

    name = "projection"
    _diffs: Any = ()  # a subclass that finds anything sets its own list

    def apply(self, ev: Any) -> None:
        raise NotImplementedError

    def differences(self) -> list[dict[str, Any]]:
        return list(self._diffs)

    def summary(self) -> Any:
        return None


def _diff(seq: int | None, kind: str, detail: str) -> dict[str, Any]:
    return {"seq": seq, "kind": kind, "detail": detail}


# -- health: anomalies, suspected spikes, MFU -------------------------------------------------------------------

_RECORD_ONLY = ("seq", "ts", "h")


def _key(a: Any) -> tuple:
    """A derived event's own fields (not seq, ts, h), hashable, with NaN equal to NaN."""
    vals = (getattr(a, f) for f in type(a).__struct_fields__ if f not in _RECORD_ONLY)
    return tuple("NaN" if isinstance(v, float) and v != v else v for v in vals)


def _what(a: Any) -> str:
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
            out.append(_diff(seq, kind, f"the observations give {_what(rc)} at step {rc.step} (z {rc.z_score}), "
                                        "which was not recorded"))
    return out


class HealthAudit(Projection):
    """The health fold. Each ``run_configured`` starts a segment with its own detectors and MFU accounting (a
    ladder writes one per rung); ``summary`` is the last segment's report, anomalies are counted across all."""

    name = "health"

    def __init__(self, format_version: str | None = None) -> None:
        self.proj: HealthProjection | None = None
        self.recomputed: list[tuple[int, AnomalyDetected]] = []
        self.recorded: list[tuple[int, AnomalyDetected]] = []
        self.suspected: list[tuple[int, SpikeSuspected]] = []
        self.suspected_recorded: list[tuple[int, SpikeSuspected]] = []
        self._diffs = []  # snapshots that are not the fold
        # spike_suspected came with format 1.1: a journal written before cannot be asked for it
        self.check_suspected = format_version is None or format_at_least(format_version, (1, 1))
        # device anomalies derived from device_changed came with format 1.2
        self.check_device = format_version is None or format_at_least(format_version, (1, 2))
        self.compute = ComputeTotals()  # compute_totaled (1.3): every step of every segment

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
        elif isinstance(ev, DeviceChanged) and self.check_device:  # a fault or throttling is an anomaly (1.2)
            an = device_anomaly(ev)
            if an is not None:
                self.recomputed.append((ev.seq, an))
        elif isinstance(ev, AnomalyDetected):
            self.recorded.append((ev.seq, ev))
        elif isinstance(ev, SpikeSuspected):
            self.suspected_recorded.append((ev.seq, ev))
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
        return out

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

    def __init__(self) -> None:
        self.checkpoints: list[dict[str, Any]] = []
        self.resumes: list[dict[str, Any]] = []

    def apply(self, ev: Any) -> None:
        if isinstance(ev, CheckpointSaved):
            self.checkpoints.append({"seq": ev.seq, "step": ev.step, "path": ev.path, "sha256": ev.sha256,
                                     "background": ev.background})
        elif isinstance(ev, RunResumed):
            self.resumes.append({"seq": ev.seq, "from_step": ev.from_step, "checkpoint": ev.checkpoint,
                                 "reason": ev.reason})


def rewind_allowed(earlier_spike_steps: list[int], spike_step: int, max_rewinds: int, window_steps: int) -> bool:
    """The rewind budget: fewer than ``max_rewinds`` rewinds for spikes within the last ``window_steps`` steps.
    The live loop asks this of the rewinds it folded from its journal (so a crash does not reset the budget),
    and replay asks it again of every recorded ``rewind_decided``."""
    return sum(1 for s in earlier_spike_steps if s > spike_step - window_steps) < max_rewinds


class RewindAudit(Projection):
    """Rewinds, their data windows, and the budget: a rewind past ``max_rewinds`` per window is a difference."""

    name = "rewinds"

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

    def __init__(self) -> None:
        self.stops: list[dict[str, Any]] = []
        self._diffs = []
        self._anomalies: set[tuple[str, int]] = set()  # (kind, step) of every anomaly recorded so far

    def apply(self, ev: Any) -> None:
        if isinstance(ev, AnomalyDetected):  # HealthAudit holds each of these to the steps themselves
            self._anomalies.add((ev.kind, ev.step))
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


# -- the pilot ladder -------------------------------------------------------------------------------------------


def values_agree(a: Any, b: Any) -> bool:
    """A recorded number against its recomputation: equal within 1e-9 relative (NaN equals NaN), or equal."""
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return a == b
    if math.isinf(a) or math.isinf(b) or a != a or b != b:
        return a == b or (a != a and b != b)
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


class LadderAudit(Projection):
    """Every verdict re-derived from the rung's own events, every decision from the verdicts.

    Between ``rung_started`` and its ``gate_verdict`` the rung's steps are folded again (its ``run_configured``
    starts a fresh health fold), and each value of ``measured`` those events determine is recomputed: the
    final loss, the anomaly count, the MFU mean and sample count, the FLOPs, the forgetting gap (from the
    forgetting curve the verdict's artifacts carry) and restart continuity. The gate then runs on the recorded
    measurements; a doctored measurement is named before the verdict that rests on it. The belief and the
    action come from :func:`~journal.ladder_outcome.decide`, which the live runner also uses.
    """

    name = "ladder"

    def __init__(self) -> None:
        self.proj = LadderProjection()
        self.seen = False
        self.belief = (1.0, 1.0)
        self.verdict: GateVerdict | None = None
        self._rung: RungStarted | None = None
        self._health: HealthProjection | None = None
        self._last_loss: float | None = None
        self._flops = 0.0
        self._diffs = []
        self._verdicts: dict[str, GateVerdict] = {}  # by chain hash: what F5's evidence cites
        self._f5: dict[str, ScalingFitted] = {}  # rung -> the fit that sized it, until its verdict
        self._f5_unchecked: str | None = None

    def apply(self, ev: Any) -> None:
        if isinstance(ev, RungStarted):
            self._rung, self._health, self._last_loss, self._flops = ev, None, None, 0.0
        elif self._rung is not None and isinstance(ev, RunConfigured):
            self._health = HealthProjection(ev)
        elif self._rung is not None and isinstance(ev, (StepObserved, RunResumed)):
            if self._health is None:
                self._health = HealthProjection()
            self._health.apply(ev)
            self._health.take_suspected()
            if isinstance(ev, StepObserved):
                self._last_loss = ev.loss
                fpt = self._health.mfu_accounting.fpt
                if fpt is not None and ev.tokens is not None:
                    self._flops += fpt * ev.tokens
        elif isinstance(ev, ScalingFitted):
            self.seen = True
            self._check_fit(ev)
        elif isinstance(ev, GateVerdict):
            self.seen = True
            self._verdicts[ev.h] = ev
            self.proj.apply(ev)
            self._check_measured(ev)
            f5 = self._f5.pop(ev.rung, None)
            if f5 is not None and isinstance(ev.bars, dict) and not (
                    values_agree(ev.bars.get("predicted_loss"), f5.choice.get("predicted_loss"))
                    and isinstance(ev.bars.get("loss_interval"), list)
                    and all(values_agree(a, b) for a, b in zip(ev.bars["loss_interval"], f5.choice.get("interval", ())))):
                self._diffs.append(_diff(ev.seq, "gate_verdict", f"rung {ev.rung}: its interval bar "
                                                                 f"{ev.bars.get('loss_interval')} is not the one F5 "
                                                                 f"recorded {f5.choice.get('interval')}"))
            try:
                passed, reason = gate(dict(ev.bars), dict(ev.measured))
            except ValueError as e:
                self._diffs.append(_diff(ev.seq, "gate_verdict", f"rung {ev.rung}: the verdict cannot be "
                                                                 f"recomputed: {e}"))
            else:
                if passed != ev.passed or reason != ev.reason:
                    self._diffs.append(_diff(ev.seq, "gate_verdict",
                                             f"rung {ev.rung}: recorded passed={ev.passed} ({ev.reason!r}), the "
                                             f"receipts give passed={passed} ({reason!r})"))
            self.verdict = ev
            self._rung = None
        elif isinstance(ev, DecisionRecorded):
            self.seen = True
            self.proj.apply(ev)
            v = self.verdict
            if v is None or v.rung != ev.rung:
                self._diffs.append(_diff(ev.seq, "decision_recorded", f"decision for rung {ev.rung} without its "
                                                                      "verdict"))
                return
            a, b = self.belief
            before = {"a": a, "b": b, "mean": a / (a + b)}
            action, (a2, b2) = decide(a, b, v.passed)
            after = {"a": a2, "b": b2, "mean": a2 / (a2 + b2)}
            self.belief = (a2, b2)
            if (ev.action_chosen != action or dict(ev.belief_before) != before or dict(ev.belief_after) != after
                    or v.h not in ev.evidence):
                self._diffs.append(_diff(ev.seq, "decision_recorded",
                                         f"rung {ev.rung}: recorded {ev.action_chosen} {dict(ev.belief_before)} -> "
                                         f"{dict(ev.belief_after)}, the verdict gives {action} {before} -> {after}"))

    def _check_fit(self, ev: ScalingFitted) -> None:
        """F5 again: the points are what the cited verdicts measured; the law refitted from them, the box's choice
        made again, the interval drawn again (seeded) must be what was recorded."""
        self._f5[ev.rung] = ev
        bad = lambda msg: self._diffs.append(_diff(ev.seq, "scaling_fitted", f"rung {ev.rung}: {msg}"))  # noqa: E731
        # A journal may say anything: bounds on the work a refit may cost (a ladder has tens of points)
        if len(ev.points) > 1000 or not 0 <= ev.boot <= 2000 or len(ev.candidates) > 1000:
            return bad(f"too large to recompute ({len(ev.points)} points, {ev.boot} bootstrap draws, "
                       f"{len(ev.candidates)} candidates; at most 1000, 2000, 1000)")
        if len(ev.evidence) != len(ev.points):
            return bad("the points and the verdicts they cite do not pair up")
        for h, p in zip(ev.evidence, ev.points):
            v = self._verdicts.get(h)
            m = v.measured if v is not None and isinstance(v.measured, dict) else None
            if m is None or not all(values_agree(a, m.get(k)) for a, k in zip(p, ("n_params", "tokens", "eval_loss"))):
                return bad(f"point {p} is not what the verdict {h[:12]} it cites measured")
        try:
            from .scaling import Candidate, ComputeBox, fit_scaling_law

            fit = fit_scaling_law(ev.points, seed=ev.seed, boot=ev.boot)
        except UsageError as e:  # numpy/scipy missing: said in the summary, never passed off as checked
            self._f5_unchecked = str(e)
            return None
        except ValueError as e:
            return bad(f"the law cannot be refitted: {e}")
        close = lambda a, b: isinstance(a, (int, float)) and abs(a - b) <= 1e-6 * max(1.0, abs(b))  # noqa: E731
        for k, v in fit.params.items():
            if not close(ev.params.get(k), v):
                return bad(f"recorded {k}={ev.params.get(k)!r}, the points give {v!r}")
        if not close(ev.loo_error, fit.loo_error()):
            return bad(f"recorded leave-one-out error {ev.loo_error!r}, the points give {fit.loo_error()!r}")
        try:
            box = ComputeBox(**ev.box)
            cands = [Candidate(**c) for c in ev.candidates]
            per_step = int(ev.choice["per_step"])
            choice = box.choose(fit, cands, min_tokens=per_step)
            steps = max(1, choice.tokens // per_step)
            n = choice.candidate.n_params
            want = {"candidate": choice.candidate.name, "binding": choice.binding, "steps": steps,
                    "predicted_loss": fit.predict(n, steps * per_step),
                    "interval": list(fit.interval(n, steps * per_step, level=ev.level))}
        except (TypeError, ValueError, KeyError, ArithmeticError) as e:  # a journal may say anything
            return bad(f"the box's choice cannot be made again: {e}")
        cand = ev.choice.get("candidate")
        got = {"candidate": cand.get("name") if isinstance(cand, dict) else cand, "binding": ev.choice.get("binding"),
               "steps": ev.choice.get("steps"), "predicted_loss": ev.choice.get("predicted_loss"),
               "interval": ev.choice.get("interval")}
        for k, w in want.items():
            g = got[k]
            same = (all(close(a, b) for a, b in zip(g, w)) and len(g) == len(w)) if isinstance(w, list) and \
                isinstance(g, list) else close(g, w) if isinstance(w, float) else g == w
            if not same:
                return bad(f"recorded {k} {g!r}, the box and the law give {w!r}")
        return None

    def _check_measured(self, ev: GateVerdict) -> None:
        """The measurements the rung's own events determine, recomputed (only for a verdict that follows its
        ``rung_started``: a verdict on its own has nothing to be recomputed from)."""
        if self._rung is None or self._rung.rung != ev.rung or not isinstance(ev.measured, dict):
            return
        h = self._health.report() if self._health is not None else None
        got: dict[str, Any] = {}
        if self._last_loss is not None:
            got["final_loss"] = self._last_loss if math.isfinite(self._last_loss) else math.inf
        if h is not None:
            got["anomalies"] = h["anomalies"]
            got["mfu_mean"] = h["mfu"]["mean"]
            got["mfu_samples"] = h["mfu"]["count"]
            if "continuity_ok" in ev.measured:
                got["continuity_ok"] = h["restarts"]["continuity_ok"] and h["restarts"]["count"] == 1
        if self._flops:
            got["flops"] = self._flops
        curve = ev.artifacts.get("forgetting_curve") if isinstance(ev.artifacts, dict) else None
        if isinstance(curve, list) and curve and all(isinstance(x, (int, float)) for x in curve):
            got["forgetting_gap"] = curve[-1] - min(curve)
        for key, value in got.items():
            tol_ok = values_agree(ev.measured.get(key), value) or (
                key == "forgetting_gap" and isinstance(ev.measured.get(key), (int, float))
                and abs(ev.measured[key] - value) <= 2e-6)  # the curve is stored rounded to 6 decimals
            if key in ev.measured and not tol_ok:
                self._diffs.append(_diff(ev.seq, "gate_verdict",
                                         f"rung {ev.rung}: recorded measured {key}={ev.measured[key]!r}, the rung's "
                                         f"events give {value!r}"))

    def summary(self) -> dict[str, Any] | None:
        if not self.seen:
            return None
        res = self.proj.result()
        out = {"passed_rungs": res.passed_rungs(), "halted_at": res.halted_at, "decisions": res.decisions,
               "outcomes": [{"rung": o.name, "passed": o.passed, "reason": o.reason} for o in res.outcomes]}
        if self._f5_unchecked is not None:
            out["f5_not_recomputed"] = self._f5_unchecked
        return out


def default_projections(format_version: str | None = None) -> list[Projection]:
    """Every projection replay folds, in a fixed order."""
    return [HealthAudit(format_version), CheckpointLog(), RewindAudit(), StopLog(), SelectionAudit(),
            PreflightAudit(), LadderAudit()]
