"""The ladder's projection: every gate verdict re-derived from its rung's own events, every decision from the
verdicts, every scaling-law fit refitted (torch-free, so a reviewer's machine replays a ladder)."""

from __future__ import annotations

import math
from typing import Any

from trainledger.journal.audit.projection import Projection, ProjectionRegistry, difference as _diff, values_agree
from trainledger.journal.errors import UsageError
from trainledger.journal.events import RunResumed, StepObserved
from trainledger.ladder.kinds import DecisionRecorded, GateVerdict, RungStarted, ScalingFitted
from trainledger.training.kinds import RunConfigured
from trainledger.ladder.outcome import LadderProjection, decide, gate
from trainledger.training.health.detectors import HealthProjection

__all__ = ["LadderAudit", "register"]


class LadderAudit(Projection):
    """Every verdict re-derived from the rung's own events, every decision from the verdicts.

    Between ``rung_started`` and its ``gate_verdict`` the rung's steps are folded again (its ``run_configured``
    starts a fresh health fold), and each value of ``measured`` those events determine is recomputed: the
    final loss, the anomaly count, the MFU mean and sample count, the FLOPs, the forgetting gap (from the
    forgetting curve the verdict's artifacts carry) and restart continuity. The gate then runs on the recorded
    measurements; a doctored measurement is named before the verdict that rests on it. The belief and the
    action come from :func:`~trainledger.ladder.outcome.decide`, which the live runner also uses.
    """

    name = "ladder"
    kinds = (RungStarted, RunConfigured, StepObserved, RunResumed, ScalingFitted, GateVerdict, DecisionRecorded)

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
        self.fit_warnings: dict[str, list[str]] = {}  # rung -> what makes the fit that sized it doubtful, recomputed

    def apply_step(self, ev: Any) -> None:
        """:meth:`apply` for a ``step_observed``: nothing outside a rung."""
        if self._rung is not None:
            self.apply(ev)

    def apply_steps(self, events: list[Any], lo: int, hi: int) -> None:
        """:meth:`apply_step` on each of ``events[lo:hi]`` (the rung's health fold in C where the steps are common)."""
        if self._rung is None:
            return
        if self._health is None:
            self._health = HealthProjection()
        h = self._health
        h.fold_steps(events, lo, hi)
        h.take_suspected()
        self._last_loss = events[hi - 1].loss
        fpt = h.mfu_accounting.fpt
        if fpt is not None:
            flops = self._flops
            for k in range(lo, hi):
                t = events[k].tokens
                if t is not None:
                    flops += fpt * t
            self._flops = flops

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
        from trainledger.ladder.scaling import fit_warnings  # pure Python: recomputed without numpy too

        warned = fit_warnings(ev.params, ev.points, ev.entropy_rate)
        if warned:
            self.fit_warnings[ev.rung] = warned
        # absent in journals written before it was recorded
        if "fit_warnings" in ev.choice and ev.choice["fit_warnings"] != warned:
            return bad(f"recorded fit warnings {repr(ev.choice['fit_warnings'])[:300]}, the law and its points give "
                       f"{warned!r}")
        if len(ev.evidence) != len(ev.points):
            return bad("the points and the verdicts they cite do not pair up")
        for h, p in zip(ev.evidence, ev.points):
            v = self._verdicts.get(h)
            m = v.measured if v is not None and isinstance(v.measured, dict) else None
            if m is None or not all(values_agree(a, m.get(k)) for a, k in zip(p, ("n_params", "tokens", "eval_loss"))):
                return bad(f"point {p} is not what the verdict {h[:12]} it cites measured")
        try:
            from trainledger.ladder.scaling import Candidate, ComputeBox, fit_scaling_law

            # the minimiser the journal names (format 1.5); before it, every fit was L-BFGS
            fit = fit_scaling_law(ev.points, seed=ev.seed, boot=ev.boot, fitter=ev.fitter or "lbfgs")
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
        if self.fit_warnings:
            out["fit_warnings"] = dict(self.fit_warnings)
        return out


def register(registry: ProjectionRegistry) -> None:
    """Add the ladder's projection to ``registry``."""
    registry.add("ladder", lambda _fv: LadderAudit())
