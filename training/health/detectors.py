"""The training-health projection: anomaly detection, MFU and restart continuity as a fold.

Torch-free, so that ``replay`` rebuilds on an auditor's machine exactly what
the live :class:`trainledger.training.health.monitor.TrainingHealthMonitor` saw and decided: the
monitor feeds every event it appends through this same reducer.

Scoring: each step's loss (and the log of its grad norm: norms are
multiplicative) is scored against a causal rolling window of earlier accepted
values, ``z = (x - median) / (1.4826 * MAD)``; ``z`` above the threshold is a
candidate spike, flagged at once when far above it and otherwise when the
next step confirms it (see ``_Detector``). NaN and infinite values are flagged on the step they happen, warm-up
included. Flagged and non-finite values never enter the baseline. After a
``run_resumed`` (from the checkpoint of step ``s``) the baseline is the one
that stood at step ``s``, and a spike in the first ``RESTART_WINDOW`` steps
after it is a ``restart_discontinuity``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import Any

from trainledger.journal import accel as _accel
from trainledger.journal.codec import UnknownEvent, record_type
from trainledger.journal.events import RunResumed, StepObserved
from trainledger.training.health.mfu import MfuAccounting
from trainledger.training.health.trend import TrendRules
from trainledger.training.kinds import (MAX_WINDOW, AnomalyDetected, AnomalyEnded, DataWindowSkipped,  # noqa: F401
                                        DetectorParams, RewindDecided, RunConfigured, SpikeSuspected)

__all__ = [
    "RANGE_IMMEDIATE_FACTOR",
    "RANGE_GRAD_IMMEDIATE_FACTOR",
    "RANGE_IMMEDIATE_MARGIN",
    "RANGE_DEFAULTS",
    "RESUME_HORIZON",
    "state_digest",
    "RunConfigured",
    "AnomalyDetected",
    "DetectorParams",
    "RollingBaseline",
    "HealthProjection",
    "MAD_SCALE",
]

_NONE: list = []  # shared empty result: callers only read it
_up = math.nextafter
_INF = math.inf

#: 1 / Phi^-1(3/4): makes the MAD a consistent estimator of the standard deviation for Gaussian noise.
MAD_SCALE = 1.4826


def _kth_deviation(s: list[float], m: float, k: int) -> float:
    """The k-th smallest (0-based) of |s_i - m| for sorted ``s`` whose median is ``m``, in O(log n).

    The deviations are two sorted runs, the lower half read outward from the
    middle and the upper half; this is the k-th element of their union.
    """
    n = len(s)
    split = n // 2  # s[:split] <= m <= s[split:]
    a, b = split, n - split

    def dev_a(t: int) -> float:  # t-th smallest deviation of the lower half
        return m - s[split - 1 - t]

    def dev_b(t: int) -> float:
        return s[split + t] - m

    lo, hi = max(0, k + 1 - b), min(k + 1, a)
    while lo < hi:
        i = (lo + hi) // 2  # take i from the lower half, k + 1 - i from the upper
        if dev_a(i) < dev_b(k - i):
            lo = i + 1
        else:
            hi = i
    i, j = lo, k + 1 - lo
    return max(dev_a(i - 1) if i > 0 else -math.inf, dev_b(j - 1) if j > 0 else -math.inf)


def _sorted_median(s: list[float]) -> float:
    """The median of the sorted list ``s``."""
    n = len(s)
    h = n // 2
    return s[h] if n % 2 else 0.5 * (s[h - 1] + s[h])


def _sorted_mad(s: list[float], median: float) -> float:
    """The median absolute deviation from ``median`` (the median of sorted ``s``), in O(log n)."""
    n = len(s)
    if n % 2:
        return _kth_deviation(s, median, n // 2)
    return 0.5 * (_kth_deviation(s, median, n // 2 - 1) + _kth_deviation(s, median, n // 2))


#: The monitor's resume horizon (format 1.5, ``run_configured.resume_horizon``): each detector keeps this many
#: accepted values past its window, so a resume or rewind up to that far back rebuilds the window exactly, and its
#: memory (and a checkpoint's monitor snapshot) stays bounded however long the run: about 1.1 MB a detector.
RESUME_HORIZON = 16384


class RollingBaseline:
    """Causal rolling median and MAD over the last ``window`` accepted values.

    A sorted copy of the window gives the median in O(1) and the MAD in
    O(log n); appending is O(window) memory moves. Accepted values are kept with
    their steps (the window is the tail of that history), so a resume can put the
    window back as it stood at an earlier step: every value when ``horizon`` is
    None (journals before format 1.5), else the last ``window + horizon`` at least
    (dropped a chunk at a time, the same way live and in replay, so a snapshot
    stays the fold). A resume further back than that rebuilds the window from the
    values still kept (fewer, or none: the detector warms up again).
    """

    __slots__ = ("window", "_sorted", "_steps", "_values", "keep", "trim_at")

    def __init__(self, window: int, horizon: int | None = None):
        self.window = window
        self._sorted: list[float] = []
        self._steps: list[int] = []
        self._values: list[float] = []
        self.keep = None if horizon is None else window + horizon
        #: the history length at which the oldest values are dropped (never, unbounded)
        # a quarter more before the oldest are dropped at once (amortizes the deletion)
        self.trim_at = 1 << 62 if horizon is None else self.keep + max(16, self.keep // 4)

    def trim(self) -> None:
        """Drop the oldest values past ``window + horizon`` (called when the history reaches ``trim_at``)."""
        cut = len(self._values) - self.keep
        if cut > 0:
            del self._values[:cut]
            del self._steps[:cut]

    def __len__(self) -> int:
        return len(self._sorted)

    def median(self) -> float:
        return _sorted_median(self._sorted)

    def mad(self, median: float) -> float:
        return _sorted_mad(self._sorted, median)

    def mad_at_least(self, d: float) -> bool:
        """True when the MAD is certainly >= ``d`` (a sufficient test by counting, O(log n)).

        At most n//2 - 1 deviations below ``d`` puts both middle order statistics
        of the deviations (and so the MAD) at or above it.
        """
        s = self._sorted
        m = self.median()
        # Widen the interval by one ulp each way: rounding can then only overcount the
        # values inside, which makes the answer False (take the exact path), never wrong.
        inside = bisect.bisect_left(s, _up(m + d, _INF)) - bisect.bisect_right(s, _up(m - d, -_INF))
        return inside <= len(s) // 2 - 1

    def add(self, step: int, x: float) -> None:
        values = self._values
        self._steps.append(step)
        values.append(x)
        s = self._sorted
        bisect.insort(s, x)
        if len(values) > self.window:
            del s[bisect.bisect_left(s, values[-self.window - 1])]
        if len(values) >= self.trim_at:
            self.trim()

    def _rebuild(self) -> None:
        self._sorted = sorted(self._values[-self.window:])

    def rewind_to(self, step: int) -> None:
        """Forget values observed after ``step``: the window as it stood when step ``step`` was done."""
        steps = self._steps
        cut = len(steps)
        while cut and steps[cut - 1] > step:
            cut -= 1
        del self._steps[cut:]
        del self._values[cut:]
        self._rebuild()

    def state(self) -> dict[str, Any]:
        return {"window": self.window, "steps": list(self._steps), "values": list(self._values)}

    @classmethod
    def from_state(cls, d: dict[str, Any], horizon: int | None = None) -> RollingBaseline:
        b = cls(int(d["window"]), horizon)
        b._steps = [int(x) for x in d["steps"]]
        b._values = [float(x) for x in d["values"]]
        b._rebuild()
        return b


#: Steps after a resume in which a jump is a restart_discontinuity (flagged at once, no
#: confirmation): a lost optimizer or scheduler state shows in the loss after the first update.
RESTART_WINDOW = 3

#: A spike whose z exceeds this multiple of the threshold is flagged on the spot;
#: a smaller one is flagged when the next step is still elevated (see _Detector).
IMMEDIATE_FACTOR = 4.0
#: Format 1.6's "range" rule flags a z above this multiple of the threshold on the spot (the monitor records it in
#: run_configured.immediate_factor): a one-step bad batch is an anomaly, not a suspicion (tools/bench_detection.py)
RANGE_IMMEDIATE_FACTOR = 1.5
#: The same for the grad norm (run_configured.grad_norm_immediate_factor): a corrupted batch under DDP moved rank 0's
#: grad norm alone, to a z of 10-12, and the next step did not confirm it (tools/bench_detection.py, ddplm0)
RANGE_GRAD_IMMEDIATE_FACTOR = 1.25
#: ... and only when the value is also above the window's maximum by 1.5x the maximum's distance from the median
#: (run_configured.immediate_margin): Student-t(3) noise makes lone values at z 10-15, whose windows reach far
#: (tools/bench_anomaly.py: 0.56 false alarms per 1,000 steps on such grad norms, 0.94 without the margin)
RANGE_IMMEDIATE_MARGIN = 1.5
#: The excursion's floor the monitor records (run_configured.excursion_ratio): 32x the window's maximum. With the z
#: flagged on the spot above, a lower floor adds nothing on the benchmark's faults and flags more of a long MLP
#: regression's own one-step spikes (tools/bench_false_alarms.py: 1.85 per 1,000 steps at 8x, 0.97 at 32x)
RANGE_EXCURSION_RATIO = 32.0
#: What the monitor records by default (format 1.6): the "range" rule with the settings above
RANGE_DEFAULTS = {"spike_rule": "range", "immediate_factor": RANGE_IMMEDIATE_FACTOR,
                  "grad_norm_immediate_factor": RANGE_GRAD_IMMEDIATE_FACTOR, "immediate_margin": RANGE_IMMEDIATE_MARGIN,
                  "excursion_ratio": RANGE_EXCURSION_RATIO}
#: The next step confirms a candidate spike when its own z exceeds this fraction of the threshold.
CONFIRM_FRACTION = 0.25
#: The same for the loss on the log scale (format 1.4), whose rule also treats a spike as one episode: after a
#: flag, the steps still above this level are its tail (kept out of the baseline, not flagged again) until one
#: falls back to it or ``window`` steps have passed. Measured in tools/bench_false_alarms.py.
EPISODE_CONFIRM_FRACTION = 0.4


class _Detector:
    """One scored series (loss, or log grad norm).

    A value with ``z > z_thresh`` is a *candidate*. Real spikes last (they
    decay over a few steps); heavy-tailed noise makes lone outliers. So a
    candidate is flagged on the spot when ``z > IMMEDIATE_FACTOR * z_thresh``
    or on the first step after a resume, and otherwise on the next step, if
    that step is still above ``CONFIRM_FRACTION * z_thresh`` (latency one
    step, recorded as ``detected_at``). An unconfirmed candidate joins the
    baseline late, as the noise it was.
    """

    __slots__ = ("p", "base", "kind", "log", "pending", "inv_scale", "inv_scale_confirm", "min_periods", "window",
                 "series", "suspected", "confirm", "episodes", "episode", "excursion", "immediate", "joint", "last_z",
                 "force", "raw", "joint_z", "raw_stats", "ep", "sink", "margin")

    def __init__(self, p: DetectorParams, kind: str, log: bool, series: str, episodes: bool = False,
                 horizon: int | None = None, excursion: tuple[float, float] | None = None,
                 immediate: float = IMMEDIATE_FACTOR, margin: float = 0.0):
        self.p = p
        #: format 1.6's "range" rule: (log of the ratio, power) of the excursion over the window's maximum; None: off
        self.excursion = excursion
        self.immediate = immediate
        self.margin = margin  # "range": the immediate z also needs x - max > margin * (max - median)
        self.joint = False  # "range": this step's value rose above the window's maximum and the joint level
        self.last_z: float | None = None  # "range": this step's z (0 with a MAD of 0), None in warm-up
        self.force = False  # "range": score the next value in full (a joint rise waits on it)
        #: "range", the loss: anomalies report the loss's own median, MAD and z (the rule scores its log: log_z)
        self.raw = excursion is not None and log and kind == "loss_spike"
        self.joint_z = math.inf  # "range": the joint level (the projection sets it)
        self.raw_stats: tuple[float, float] | None = None  # the raw median and MAD before a joint candidate's step
        #: "range": the open episode of an anomaly this detector flagged, [step, kind, last_step, peak, peak_step,
        #: steps]; its anomaly_ended goes to ``sink`` (the projection's list) when it closes
        self.ep: list | None = None
        self.sink: list = []
        # The 1.4 loss rule (``episodes``): a higher confirmation level, and one anomaly per spike episode.
        self.confirm = EPISODE_CONFIRM_FRACTION if episodes else CONFIRM_FRACTION
        self.episodes = episodes
        self.episode = 0  # steps an open spike episode may still last (0: none open)
        self.min_periods = p.min_periods
        self.window = p.window
        # z <= z_thresh  <=>  MAD >= (x - median) * inv_scale (and likewise for the confirmation level)
        self.inv_scale = 1.0 / (MAD_SCALE * p.z_thresh)
        self.inv_scale_confirm = 1.0 / (MAD_SCALE * p.z_thresh * self.confirm)
        self.base = RollingBaseline(p.window, horizon)
        self.kind = kind
        self.log = log
        self.pending: list | None = None  # [step, raw, x, median, mad, z] of a candidate spike
        self.series = series
        self.suspected: SpikeSuspected | None = None  # a candidate the last call released unconfirmed

    def _z(self, x: float, inv_scale: float) -> tuple[float, float, float] | None:
        """(z, median, mad) of x against the baseline, or None in warm-up, at/below the median,
        or when z is certainly at or below the level that ``inv_scale`` stands for."""
        base = self.base
        if len(base) < self.p.min_periods:
            return None
        med = base.median()
        if not x > med:
            return None
        if base.mad_at_least((x - med) * inv_scale):
            return None  # z is at or below the level asked about: no need for the exact MAD
        mad = base.mad(med)
        scale = MAD_SCALE * mad
        return ((x - med) / scale if scale > 0 else math.inf), med, mad

    def open(self, a: AnomalyDetected, last: int, raw: float) -> AnomalyDetected:
        """Open the episode of anomaly ``a`` (its tail so far reaching step ``last``, whose value was ``raw``)."""
        self.episode = self.window
        if a.value >= raw or a.value != a.value:
            self.ep = [a.step, a.anomaly, last, a.value, a.step, 1 + (last > a.step)]
        else:
            self.ep = [a.step, a.anomaly, last, raw, last, 1 + (last > a.step)]
        return a

    def close(self, how: str, at: int | None) -> None:
        """Close the open episode: its anomaly_ended goes to the sink."""
        ep, self.ep = self.ep, None
        self.sink.append(AnomalyEnded(step=ep[0], anomaly=ep[1], series=self.series, last_step=ep[2], steps=ep[5],
                                      peak=ep[3], peak_step=ep[4], closed_by=how, ended_at=at))

    def release(self, step: int) -> None:
        """Give up on a candidate (a non-finite value came instead of a confirmation): it joins the baseline,
        and is recorded as suspected."""
        if self.pending is not None:
            self._unconfirmed(step)

    def _unconfirmed(self, step: int) -> None:
        pend, self.pending = self.pending, None
        self.base.add(pend[0], pend[2])
        self.suspected = SpikeSuspected(step=pend[0], series=self.series, value=pend[1], baseline_median=pend[3],
                                        mad=pend[4], z_score=pend[5], threshold=self.p.z_thresh, released_at=step)

    def score(self, step: int, raw: float, after_resume: bool) -> AnomalyDetected | None:
        """Score one finite value; add it to the baseline unless it is (part of) a spike."""
        x = _log(raw) if self.log else raw
        if self.episode:  # inside a flagged spike: its elevated steps are its tail, kept out and not flagged again
            cur = self._z(x, self.inv_scale_confirm)
            if (cur is not None and cur[0] > self.confirm * self.p.z_thresh) or (
                    self.excursion is not None and self.base._sorted and x > self.base._sorted[-1]):
                self.episode -= 1
                self.joint, self.last_z = False, None
                ep = self.ep
                if ep is not None:
                    ep[2] = step
                    ep[5] += 1
                    if raw > ep[3]:
                        ep[3], ep[4] = raw, step
                    if not self.episode:
                        self.close("length", step)
                return None
            self.episode = 0  # back near the baseline: the episode is over, and this value is scored as any
            if self.ep is not None:
                self.close("calm", step)
        if self.excursion is not None:
            s = self.base._sorted
            if self.pending is not None or self.force or (s and x > s[-1]) or len(s) < self.min_periods:
                return self._score_range(step, raw, x, after_resume)
            self.last_z = None  # not computed: at or below the window's maximum, so no joint rise
        if self.pending is None:
            base = self.base
            if _baseline_step is not None:  # the lines below, in C (training/health/_fastfolds.c)
                if _baseline_step(base._sorted, base._values, base._steps, x, step, self.min_periods, self.inv_scale,
                                  self.window):
                    if len(base._values) >= base.trim_at:
                        base.trim()
                    return None
                return self._score(step, raw, x, after_resume)
            # The common case, inlined: warm, and not even near a threshold (see _z and mad_at_least).
            s = base._sorted
            n = len(s)
            if n >= self.min_periods:
                h = n >> 1
                med = s[h] if n & 1 else 0.5 * (s[h - 1] + s[h])
                if x > med:
                    d = (x - med) * self.inv_scale
                    if _bisect_left(s, _up(med + d, _INF)) - _bisect_right(s, _up(med - d, -_INF)) >= h:
                        return self._score(step, raw, x, after_resume)
            # base.add(step, x), inlined
            values = base._values
            base._steps.append(step)
            values.append(x)
            _insort(s, x)
            w = self.window
            if len(values) > w:
                del s[_bisect_left(s, values[-w - 1])]
            if len(values) >= base.trim_at:
                base.trim()
            return None
        return self._score(step, raw, x, after_resume)

    def _score(self, step: int, raw: float, x: float, after_resume: bool) -> AnomalyDetected | None:
        if self.excursion is not None:
            return self._score_range(step, raw, x, after_resume)
        t = self.p.z_thresh
        pend = self.pending
        if pend is not None:
            cur = self._z(x, self.inv_scale_confirm)
            if cur is not None and cur[0] > self.confirm * t:
                # Still elevated: the candidate was a spike. This value is its tail: keep it out too.
                self.pending = None
                if self.episodes:
                    self.episode = self.window
                return AnomalyDetected(step=pend[0], anomaly=self.kind, value=pend[1], baseline_median=pend[3],
                                       mad=pend[4], z_score=pend[5], threshold=t, detected_at=step)
            self._unconfirmed(step)
        cur = self._z(x, self.inv_scale)
        if cur is not None and cur[0] > t:
            z, med, mad = cur
            if after_resume or z > IMMEDIATE_FACTOR * t:
                kind = "restart_discontinuity" if after_resume else self.kind
                if self.episodes:
                    self.episode = self.window
                return AnomalyDetected(step=step, anomaly=kind, value=raw, baseline_median=med, mad=mad,
                                       z_score=z, threshold=t)
            self.pending = [step, raw, x, med, mad, z]
            return None
        self.base.add(step, x)
        return None


    def range_params(self) -> tuple[float, float, float]:
        """What the accelerator's fold (``health_run``) needs to score a value above the window's maximum as
        :meth:`_score_range` does when that value ends as a plain step (no excursion, no z over the threshold; a
        loss that is a joint candidate ends as one unless the grad norm rose above its window's maximum on the same
        step, which health_run leaves to :meth:`_step`); every other ending is left to :meth:`_score_range`."""
        log_ratio, power = self.excursion
        return (float(log_ratio), float(power), float(self.p.z_thresh))

    def _score_range(self, step: int, raw: float, x: float, after_resume: bool) -> AnomalyDetected | None:
        """Format 1.6's "range" rule for one value (see RunConfigured.spike_rule): a pending candidate confirmed or
        released; then an excursion over the window's maximum, flagged at once; then the robust z (at once above
        ``immediate`` x the threshold, else confirmed by the next value); a value above the window's maximum and
        the joint level is marked for the projection's joint rule. A window whose MAD is 0 scores no z."""
        p, t, base = self.p, self.p.z_thresh, self.base
        self.force, self.joint = False, False
        pend = self.pending
        if pend is not None:
            z = self._plain_z(x)
            if z is not None and z > self.confirm * t:
                self.pending = None
                self.last_z = z
                if self.raw:
                    return self.open(self._raw_anomaly(pend[0], self.kind, pend[1], pend[6], pend[5], t, "z",
                                                       detected_at=step), step, raw)
                return self.open(AnomalyDetected(step=pend[0], anomaly=self.kind, value=pend[1],
                                                 baseline_median=pend[3], mad=pend[4], z_score=pend[5], threshold=t,
                                                 detected_at=step, rule="z"), step, raw)
            self._unconfirmed(step)
        s = base._sorted
        if len(s) < p.min_periods:
            self.last_z = None
            base.add(step, x)
            return None
        med, top = base.median(), s[-1]
        mad = base.mad(med)
        z = (x - med) / (MAD_SCALE * mad) if mad > 0 else 0.0
        self.last_z = z
        log_ratio, power = self.excursion
        kind = "restart_discontinuity" if after_resume else self.kind
        if x > top + max(log_ratio, power * (top - med)):
            zx = (x - med) / (MAD_SCALE * mad) if mad > 0 else math.inf
            if self.raw:
                return self.open(self._raw_anomaly(step, kind, raw, self._raw_median_mad(), zx, t, "excursion"),
                                 step, raw)
            return self.open(AnomalyDetected(step=step, anomaly=kind, value=raw, baseline_median=med, mad=mad,
                                             z_score=zx, threshold=t, rule="excursion"), step, raw)
        if z > t:
            if after_resume or (z > self.immediate * t and x - top > self.margin * (top - med)):
                if self.raw:
                    return self.open(self._raw_anomaly(step, kind, raw, self._raw_median_mad(), z, t, "z"), step, raw)
                return self.open(AnomalyDetected(step=step, anomaly=kind, value=raw, baseline_median=med, mad=mad,
                                                 z_score=z, threshold=t, rule="z"), step, raw)
            self.pending = [step, raw, x, med, mad, z] + ([list(self._raw_median_mad())] if self.raw else [])
            return None
        self.joint = x > top
        if self.joint and self.raw and z > self.joint_z:  # a joint candidate: its window before it joins
            self.raw_stats = self._raw_median_mad()
        base.add(step, x)
        return None

    def _raw_median_mad(self) -> tuple[float, float]:
        """The median and MAD of the loss itself over the window (whose values are its logs): what a loss
        anomaly of the "range" rule reports, as the seed's rule did."""
        vals = [math.exp(v) for v in self.base._sorted]  # exp is increasing: still sorted
        med = _sorted_median(vals)
        return med, _sorted_mad(vals, med)

    @staticmethod
    def _raw_anomaly(step: int, kind: str, raw: float, stats: Any, log_z: float, t: float, rule: str,
                     detected_at: int | None = None) -> AnomalyDetected:
        med, mad = stats
        return AnomalyDetected(step=step, anomaly=kind, value=raw, baseline_median=med, mad=mad,
                               z_score=(raw - med) / (MAD_SCALE * mad) if mad > 0 else math.inf, threshold=t,
                               detected_at=detected_at, rule=rule, log_z=log_z)

    def _plain_z(self, x: float) -> float | None:
        """The robust z of ``x`` against the window (0 with a MAD of 0), None in warm-up."""
        base = self.base
        if len(base) < self.p.min_periods:
            return None
        med = base.median()
        mad = base.mad(med)
        return (x - med) / (MAD_SCALE * mad) if mad > 0 else 0.0


_bisect_left = bisect.bisect_left
_bisect_right = bisect.bisect_right
_insort = bisect.insort
_log = math.log
#: the health folds' accelerator (training/health/_fastfolds.c), or None: its common step, or the lines below
_fast = _accel.load("trainledger.training.health._fastfolds")
_baseline_step = getattr(_fast, "baseline_step", None)
_health_run = getattr(_fast, "health_run", None)


#: Batch fingerprints kept (the most recent steps'): a resume goes back to a checkpoint, a few thousand steps at most
FINGERPRINT_WINDOW = 1 << 16


def _same_batch(a: float, b: float) -> bool:
    """Two fingerprints of the same batch: equal, or within 1e-9 relative (a reduction summed in another order)."""
    return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def state_digest(state: dict[str, Any]) -> str:
    """SHA-256 of a monitor state's canonical JSON: what ``checkpoint_saved.monitor_sha256`` records."""
    import hashlib

    from trainledger.journal.codec import encode_document

    return hashlib.sha256(encode_document(state)).hexdigest()


class HealthProjection:
    """The reducer. ``apply(event)`` folds one event in; for a ``step_observed`` it returns that step's anomalies.

    No I/O, no clock, no randomness, no tensors: the same fold runs live and in replay.
    """

    def __init__(self, config: RunConfigured | None = None):
        self.config = config or RunConfigured()
        c = self.config
        # format 1.4's rule (loss_scale "log"): the log of the loss, and one anomaly per spike episode
        self._loss_log = c.loss_scale == "log"
        #: format 1.6's "range" rule (RunConfigured.spike_rule): the excursion and the joint rise, both series in
        #: episodes; its detectors take the Python path for values above their window's maximum
        self._range = c.spike_rule == "range"
        rng = dict(excursion=(math.log(c.excursion_ratio), c.excursion_power), immediate=c.immediate_factor,
                   margin=c.immediate_margin) if self._range else {}
        grng = dict(rng, immediate=c.grad_norm_immediate_factor or c.immediate_factor) if self._range else {}
        self._loss = _Detector(DetectorParams(c.loss_window, c.loss_min_periods, c.loss_z_thresh, "loss"),
                               "loss_spike", log=self._loss_log, series="loss", episodes=self._loss_log,
                               horizon=c.resume_horizon, **rng)
        self._grad = _Detector(DetectorParams(c.grad_norm_window, c.grad_norm_min_periods, c.grad_norm_z_thresh,
                                              "grad_norm"), "grad_norm_spike", log=True, series="grad_norm",
                               episodes=self._range, horizon=c.resume_horizon, **grng)
        self._loss.joint_z = c.joint_z if self._range else math.inf
        self._joint: list | None = None  # "range": [step, loss, grad norm, loss z, grad z] of a joint rise
        #: "range": the anomaly_ended records of the episodes closed since the last take_ended (the live monitor
        #: appends them; replay compares them with what was recorded)
        self.ended_new: list[AnomalyEnded] = []
        self._loss.sink = self._grad.sink = self.ended_new
        self._dd: list | None = None  # "range": the open data-divergence episode, [step, last_step, steps]
        self.steps = 0
        self.last_step: int | None = None
        self.anomalies: list[AnomalyDetected] = []
        self.by_kind: dict[str, int] = {}
        self.suspected: list[SpikeSuspected] = []
        self.suspected_new: list[SpikeSuspected] = []
        self.mfu_over = 0  # steps whose MFU came out above 100%: the peak they are measured against is too low
        self.mfu_sum = 0.0
        self.mfu_min = math.inf
        self.mfu_max = -math.inf
        self.mfu_count = 0
        self.tokens = 0
        self.token_time_s = 0.0
        self.restarts: list[dict[str, Any]] = []
        self._pending_resume: dict[str, Any] | None = None
        self.unknown_events = 0
        # Live events and the records read back from a journal take the same paths.
        self._handlers = {}
        #: format 1.4: each recent step's batch fingerprint, oldest first (at most FINGERPRINT_WINDOW), to hold a
        #: step run again after a resume against (data_divergence)
        self._fingerprints: dict[int, float] = {}
        for cls, fn in ((StepObserved, self._step), (RunResumed, self._resume), (RunConfigured, self._configure),
                        (RewindDecided, self._new_data), (DataWindowSkipped, self._new_data)):
            self._handlers[cls] = fn
            self._handlers[record_type(cls)] = fn
        self.mfu_accounting = MfuAccounting(c)  # the one MFU implementation (training/health/mfu.py)
        #: format 1.10: the blow-up and divergence rules (training/health/trend.py); None where the run configured
        #: neither (every journal before 1.10)
        self._trend = TrendRules(blowup_factor=c.blowup_factor, chance_loss=c.chance_loss,
                                 window=c.trend_window, ratio=c.trend_ratio) \
            if c.blowup_factor is not None or c.trend_window is not None else None
        #: format 1.10: a step whose batch is under this fraction of the step before's is not scored by the spike
        #: rules (None: every step is); ``_batch``: the step before's size; ``partial_steps``: how many were not
        self._partial = c.partial_batch
        self._batch: int | None = None
        self.partial_steps = 0

    # ------------------------------------------------------------ the fold

    def apply(self, event: Any) -> list[AnomalyDetected]:
        """Fold one event in; return the anomalies it revealed (a new list, the caller's to keep)."""
        handler = self._handlers.get(type(event))
        if handler is not None:
            found = handler(event)
            return found if found else []
        if type(event) is UnknownEvent:
            self.unknown_events += 1
        return []

    def apply_all(self, events: list[Any]) -> None:
        """Fold a batch of events (replay's loop: one call per batch, not per event)."""
        handlers = self._handlers
        for ev in events:
            handler = handlers.get(type(ev))
            if handler is not None:
                handler(ev)
                if handler.__func__ is HealthProjection._configure:
                    handlers = self._handlers  # re-initialized: new bound methods
            elif type(ev) is UnknownEvent:
                self.unknown_events += 1

    def _configure(self, event: RunConfigured) -> list[AnomalyDetected]:
        """A ``run_configured`` starts a new segment (docs/FORMAT.md): detectors, baselines, MFU and counts
        restart from it (a ladder writes one per rung); what came before belongs to the previous segment."""
        self.__init__(event)
        return _NONE

    def _step(self, ev: StepObserved) -> list[AnomalyDetected]:
        step = ev.step
        self.steps += 1
        self.last_step = step
        after_resume = self._pending_resume is not None
        out = _NONE
        loss = ev.loss
        partial = False
        if self._partial is not None:  # format 1.10: an epoch's last, partial batch is not scored by the spike rules
            n = ev.examples if ev.examples is not None else ev.tokens
            b = self._batch
            if n is not None and b is not None and n < b * self._partial:
                partial = True
                self.partial_steps += 1
            self._batch = n
        if self._range:  # the joint rule reads what each detector saw of this step
            in_episode = bool(self._loss.episode or self._grad.episode)
            self._loss.joint = self._grad.joint = False
            self._loss.last_z = self._grad.last_z = None
        if loss - loss == 0:  # finite (NaN and +/-inf give NaN)
            if (loss > 0 or not self._loss_log) and not partial:  # on the log scale a loss <= 0 is not scored
                a = self._loss.score(step, loss, after_resume)
                if a is not None:
                    out = [a]
        else:
            self._loss.release(step)
            out = [AnomalyDetected(step=step, anomaly="nan_loss" if loss != loss else "inf_loss", value=loss)]
        g = ev.grad_norm
        if g is not None:
            if g - g == 0:
                if g > 0 and not partial:
                    a = self._grad.score(step, g, after_resume)
                    if a is not None:
                        out = out + [a]
            else:
                self._grad.release(step)
                out = out + [AnomalyDetected(step=step, anomaly="nan_grad_norm" if g != g else "inf_grad_norm",
                                             value=g)]
        if self._range and (self._joint is not None or (self._loss.joint and self._grad.joint)):
            out = self._joint_rule(step, loss, g, out, in_episode)  # (force is only ever set with a joint pending)
        if self._trend is not None:
            t = self._trend.step(step, loss, g, bool(out))  # (a spike flagged here starts the divergences over)
            if t:
                out = out + t
        fp = ev.batch_fingerprint
        if fp is not None:
            fps = self._fingerprints
            before = fps.pop(step, None)
            if before is not None and not _same_batch(before, fp):
                dd = self._dd
                if dd is None:  # (format 1.6, "range": the redone steps that go on diverging are its tail)
                    out = out + [AnomalyDetected(step=step, anomaly="data_divergence", value=fp,
                                                 baseline_median=before)]
                    if self._range:
                        self._dd = [step, step, 1]
                else:
                    dd[1] = step
                    dd[2] += 1
            elif self._dd is not None:  # the same batch as the first time, or a step not done before
                self._close_data("calm", step)
            fps[step] = fp
            if len(fps) > FINGERPRINT_WINDOW:
                del fps[next(iter(fps))]
        if after_resume:
            r = self._pending_resume
            r.setdefault("at_step", step)
            r["left"] -= 1
            broke = any(a.anomaly == "restart_discontinuity" for a in out)
            if broke or not r["left"]:
                del r["left"]
                r["continuity_ok"] = not broke
                self.restarts.append(r)
                self._pending_resume = None
        st = ev.step_time_s
        if st is not None and st > 0 and st - st == 0:
            if ev.tokens is not None:
                self.tokens += ev.tokens
                self.token_time_s += st
            m = self.mfu_accounting.step(ev.tokens, ev.examples, st)
            if m is not None:
                self.mfu_sum += m
                self.mfu_count += 1
                if m < self.mfu_min:
                    self.mfu_min = m
                if m > self.mfu_max:
                    self.mfu_max = m
                if m > 1.0:
                    self.mfu_over += 1
        if self._loss.suspected is not None or self._grad.suspected is not None:  # rare: no loop per step
            for det in (self._loss, self._grad):
                if det.suspected is not None:
                    self.suspected.append(det.suspected)
                    self.suspected_new.append(det.suspected)
                    det.suspected = None
        if out:
            for a in out:
                self.anomalies.append(a)
                self.by_kind[a.anomaly] = self.by_kind.get(a.anomaly, 0) + 1
        return out

    def _joint_rule(self, step: int, loss: float, g: float | None, out: list, in_episode: bool) -> list:
        """Format 1.6's joint rise: the loss and the grad norm both above their windows' maxima and ``joint_z``
        robust sigma on one step (no spike flagged, no episode open), and both still above ``joint_confirm_z`` on
        the next: flagged then as a ``loss_spike`` of the first step (``rule`` "joint"), an episode on both."""
        c, lo, gr = self.config, self._loss, self._grad
        pend, self._joint = self._joint, None
        lo.force = gr.force = False
        if out:
            return out
        lz, gz = lo.last_z, gr.last_z
        if pend is not None and lz is not None and gz is not None and lz > c.joint_confirm_z and gz > c.joint_confirm_z:
            gr.episode = gr.window
            return [lo.open(lo._raw_anomaly(pend[0], "loss_spike", pend[1], pend[5], pend[3], c.joint_z, "joint",
                                            detected_at=step), step, loss)]
        if not in_episode and lo.joint and gr.joint and lz > c.joint_z and gz > c.joint_z:
            self._joint = [step, loss, g, lz, gz, list(lo.raw_stats)]
            lo.force = gr.force = True
        return out

    def fold_steps(self, events: list[Any], lo: int, hi: int, compute: Any = None,
                   after: Callable[[Any, list[AnomalyDetected]], None] | None = None) -> None:
        """Fold ``events[lo:hi]``, every one a ``step_observed`` record, as :meth:`_step` on each in order (replay's
        loop). The common steps go through the C accelerator (``health_run``: the same arithmetic in the same
        order); whenever a step is not common, or the state is not (a resume window or a spike episode open, a
        candidate pending), that step goes through :meth:`_step`. ``compute``: a :class:`ComputeTotals` each step
        is also added to (before it is folded, as :class:`training.audit.HealthAudit` does one by one);
        ``after(event, anomalies)``: called after each step folded by :meth:`_step`, the only ones that can find
        anomalies or release a suspected spike."""
        i = lo
        run = _health_run
        # format 1.10: the partial batches in events[lo:hi] (the C run knows nothing of them: each is folded by
        # _step), found with the same comparison _step makes, in the same order
        partial = self._partial_at(events, lo, hi) if self._partial is not None and run is not None else []
        pi = 0
        while i < hi:
            loss, grad = self._loss, self._grad
            while pi < len(partial) and partial[pi] < i:
                pi += 1
            end = partial[pi] if pi < len(partial) else hi
            if run is not None and end > i and self._pending_resume is None and loss.pending is None \
                    and grad.pending is None and not loss.episode and not grad.episode and self._joint is None:
                lb, gb, acc = loss.base, grad.base, self.mfu_accounting
                out = run(events, i, end, type(events[i]),
                          (lb._sorted, lb._values, lb._steps, loss.min_periods, loss.inv_scale, loss.window, lb.trim_at,
                           loss.log, self._range and loss.range_params()),
                          (gb._sorted, gb._values, gb._steps, grad.min_periods, grad.inv_scale, grad.window, gb.trim_at,
                           grad.log, self._range and grad.range_params()),
                          self._loss_log, acc.fpt, acc.peak, self.token_time_s, self.mfu_sum, self.mfu_min, self.mfu_max)
                stop = out[0]
                if stop > i:
                    k = stop - i
                    self.steps += k
                    self.last_step = out[1]
                    self.tokens += out[2]
                    self.token_time_s, self.mfu_sum = out[3], out[4]
                    self.mfu_count += out[5]
                    self.mfu_min, self.mfu_max = out[6], out[7]
                    self.mfu_over += out[8]
                    if compute is not None:
                        compute.add_run(k, out[1], out[9], out[10], out[11], out[12], events, i)
                    if self._trend is not None:  # (format 1.10: not in the C run; every step, in order)
                        self._trend_run(events, i, stop, after)
                    if self._partial is not None:
                        last = events[stop - 1]
                        self._batch = last.examples if last.examples is not None else last.tokens
                    i = stop
                    if i >= hi:
                        break
            ev = events[i]
            if compute is not None:
                compute.add(ev)
            found = self._step(ev)
            if after is not None:
                after(ev, found)
            i += 1

    def _partial_at(self, events: list[Any], lo: int, hi: int) -> list[int]:
        """The indexes in ``events[lo:hi]`` of the steps :meth:`_step` will find partial, in order."""
        out, b, r = [], self._batch, self._partial
        for k in range(lo, hi):
            ev = events[k]
            n = ev.examples if ev.examples is not None else ev.tokens
            if n is not None and b is not None and n < b * r:
                out.append(k)
            b = n
        return out

    def _trend_run(self, events: list[Any], lo: int, hi: int,
                   after: Callable[[Any, list[AnomalyDetected]], None] | None) -> None:
        """The blow-up and divergence rules (format 1.10) over ``events[lo:hi]``, steps the C run folded: what
        :meth:`_step` does for them on each step, the anomalies counted the same way."""
        rules = self._trend.step
        for ev in events[lo:hi]:
            found = rules(ev.step, ev.loss, ev.grad_norm)
            if found:
                for a in found:
                    self.anomalies.append(a)
                    self.by_kind[a.anomaly] = self.by_kind.get(a.anomaly, 0) + 1
                if after is not None:
                    after(ev, found)

    def take_suspected(self) -> list[SpikeSuspected]:
        """The ``spike_suspected`` events the last folds produced (the live monitor appends them; replay
        compares them with what was recorded); emptied by the call."""
        new, self.suspected_new = self.suspected_new, []
        return new

    def _close_data(self, how: str, at: int | None) -> None:
        dd, self._dd = self._dd, None
        self.ended_new.append(AnomalyEnded(step=dd[0], anomaly="data_divergence", series="data", last_step=dd[1],
                                           steps=dd[2], closed_by=how, ended_at=at))

    def take_ended(self) -> list[AnomalyEnded]:
        """The ``anomaly_ended`` events the last folds produced; emptied by the call."""
        new = list(self.ended_new)
        self.ended_new.clear()  # the detectors hold this list
        return new

    def _resume(self, ev: RunResumed) -> list[AnomalyDetected]:
        for det in (self._loss, self._grad):  # a resume ends every open episode: the steps after it are redone
            if det.ep is not None:
                det.close("resume", None)
        if self._dd is not None:
            self._close_data("resume", None)
        prev = self._pending_resume
        if prev is not None:  # resumed again before the window closed: no break was seen
            del prev["left"]
            prev["continuity_ok"] = True
            self.restarts.append(prev)
        s = ev.from_step
        if s is not None and self._fingerprints:  # the steps after it are redone: theirs are what they are held to
            self._fingerprints = {k: v for k, v in self._fingerprints.items() if k > s}
        self._loss.pending = self._grad.pending = None  # the steps after the checkpoint are being redone
        self._loss.episode = 0
        self._grad.episode = 0
        self._joint = None
        self._loss.force = self._grad.force = False
        if s is not None:
            self._loss.base.rewind_to(s)
            self._grad.base.rewind_to(s)
        if self._trend is not None:
            self._trend.resume(s)
        self._batch = None  # (the step before the first redone one is not on this side of the resume)
        self._pending_resume = {"from_step": s, "reason": ev.reason, "checkpoint": ev.checkpoint,
                                "left": RESTART_WINDOW}
        return _NONE

    def _new_data(self, ev: Any) -> list[AnomalyDetected]:
        """A rewind skips a window of data on purpose: the steps it redoes are meant to see other batches."""
        self._fingerprints = {}
        return _NONE

    # ------------------------------------------------------------ reading it out

    def report(self) -> dict[str, Any]:
        """JSON-serializable summary (the monitor's ``report()``)."""
        n = self.mfu_count
        return {
            "steps": self.steps,
            "last_step": self.last_step,
            "mfu": {
                "mean": self.mfu_sum / n if n else None,
                "min": self.mfu_min if n else None,
                "max": self.mfu_max if n else None,
                "count": n,
                # MFU cannot exceed 100%: steps above it are not receipts but a sign of a wrong peak
                "above_100pct": self.mfu_over,
                "implausible": self.mfu_over > 0,
                "peak_source": self.config.peak_source,
                "peak_spread": self.config.peak_spread,
            },
            "hfu": self._hfu(),
            "tokens_per_s": self.tokens / self.token_time_s if self.token_time_s > 0 else None,
            "anomalies_by_kind": dict(sorted(self.by_kind.items())),
            "anomalies": len(self.anomalies),
            # format 1.10: the steps each signal was there for, so a verdict says what it rested on (a run that
            # records no grad norm is watched from its loss alone)
            **({"signals": dict(self._trend.seen)} if self._trend is not None else {}),
            # format 1.10: the steps the spike rules left unscored, their batch under partial_batch x the one before
            **({"partial_batches": self.partial_steps} if self._partial is not None else {}),
            "spikes_suspected": len(self.suspected),
            "restarts": {
                # a resume whose continuity window is still open counts, and is not yet judged
                "count": len(self.restarts) + (self._pending_resume is not None),
                "continuity_ok": all(r["continuity_ok"] for r in self.restarts),
                "events": [dict(r) for r in self.restarts],
            },
        }

    def _hfu(self) -> dict[str, Any] | None:
        """Hardware FLOPs utilization, reported only when activation recompute is declared.

        Recompute repeats forward work: selective adds the attention forward
        (4·L·H·Q·T per token), full adds the whole forward (2N + 4·L·H·Q·T);
        the same accounting as ``training.flops.FlopConfig.hardware_flops_per_token``.
        """
        c = self.config
        n = self.mfu_count
        fpt = self.mfu_accounting.fpt
        if c.recompute == "none" or fpt is None or not n:
            return None
        attn_fwd = 4 * c.n_layer * c.n_head * c.head_dim * c.seq_len
        extra = attn_fwd if c.recompute == "selective" else 2 * c.n_params + attn_fwd
        r = (fpt + extra) / fpt
        return {"mean": self.mfu_sum / n * r, "min": self.mfu_min * r, "max": self.mfu_max * r, "count": n,
                "recompute": c.recompute}

    def state(self) -> dict[str, Any]:
        """Everything needed to continue the fold elsewhere (a checkpoint stores this)."""
        from trainledger.journal.codec import encode_event  # the config as canonical JSON-ready data

        import msgspec

        cfg = self.config
        if type(cfg) is not RunConfigured:  # a record read back from a journal: the event's own fields only
            cfg = RunConfigured(**{f: getattr(cfg, f) for f in RunConfigured.__struct_fields__})
        return {
            "config": msgspec.json.decode(encode_event(cfg)),
            "loss": self._loss.base.state(),
            "grad_norm": self._grad.base.state(),
            "pending": [self._loss.pending, self._grad.pending],
            "steps": self.steps,
            "last_step": self.last_step,
            "anomalies": [msgspec.to_builtins(a) for a in self.anomalies],
            "mfu": [self.mfu_sum, self.mfu_min, self.mfu_max, self.mfu_count, self.mfu_over],
            "suspected": [msgspec.to_builtins(a) for a in self.suspected],
            "tokens": [self.tokens, self.token_time_s],
            "restarts": [dict(r) for r in self.restarts],
            "pending_resume": self._pending_resume,
            "unknown_events": self.unknown_events,
            **({"loss_episode": self._loss.episode} if self._loss_log else {}),  # 1.4 only: older digests hold
            **({"range": {"grad_episode": self._grad.episode, "joint": self._joint, "loss_ep": self._loss.ep,
                          "grad_ep": self._grad.ep, "data_ep": self._dd}} if self._range else {}),  # 1.6
            **({"trend": self._trend.state()} if self._trend is not None else {}),  # 1.10
            **({"partial": [self._batch, self.partial_steps]} if self._partial is not None else {}),  # 1.10
        }

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> HealthProjection:
        import msgspec

        cfg = msgspec.convert(d["config"], RunConfigured, strict=False)
        p = cls(cfg)
        p._loss.base = RollingBaseline.from_state(d["loss"], cfg.resume_horizon)
        p._grad.base = RollingBaseline.from_state(d["grad_norm"], cfg.resume_horizon)
        p._loss.pending, p._grad.pending = (list(x) if x is not None else None for x in d["pending"])
        p.steps, p.last_step = d["steps"], d["last_step"]
        p.anomalies = [msgspec.convert(a, AnomalyDetected, strict=False) for a in d["anomalies"]]
        for a in p.anomalies:
            p.by_kind[a.kind] = p.by_kind.get(a.kind, 0) + 1
        p.mfu_sum, p.mfu_min, p.mfu_max, p.mfu_count, *over = d["mfu"]
        p.mfu_over = over[0] if over else 0  # states written before this counter existed
        p.suspected = [msgspec.convert(a, SpikeSuspected, strict=False) for a in d.get("suspected", [])]
        p.tokens, p.token_time_s = d["tokens"]
        p.restarts = [dict(r) for r in d["restarts"]]
        p._pending_resume = d["pending_resume"]
        p.unknown_events = d["unknown_events"]
        p._loss.episode = int(d.get("loss_episode", 0))
        rng = d.get("range")
        if p._range and isinstance(rng, dict):
            p._grad.episode = int(rng.get("grad_episode", 0))
            p._joint = list(rng["joint"]) if rng.get("joint") is not None else None
            p._loss.force = p._grad.force = p._joint is not None
            for det, key in ((p._loss, "loss_ep"), (p._grad, "grad_ep")):
                det.ep = list(rng[key]) if rng.get(key) is not None else None
            p._dd = list(rng["data_ep"]) if rng.get("data_ep") is not None else None
        if p._trend is not None and isinstance(d.get("trend"), dict):
            p._trend.load(d["trend"])
        part = d.get("partial")
        if p._partial is not None and isinstance(part, list) and len(part) == 2:
            p._batch = None if part[0] is None else int(part[0])
            p.partial_steps = int(part[1])
        return p
