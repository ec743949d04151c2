"""The optimised health reducer agrees with an obviously-correct reference (STYLE: keep both, test agreement)."""

from __future__ import annotations

import math
import statistics

from hypothesis import given, settings
from hypothesis import strategies as st

from trainledger.journal import RunResumed, StepObserved
from trainledger.training.health.detectors import (
    CONFIRM_FRACTION,
    IMMEDIATE_FACTOR,
    MAD_SCALE,
    RESTART_WINDOW,
    HealthProjection,
    RollingBaseline,
    RunConfigured,
    _kth_deviation,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3) | st.integers(-3, 3).map(float), min_size=1, max_size=60), st.data())
def test_kth_deviation_matches_sorting(values, data):
    s = sorted(values)
    m = statistics.median(s)
    devs = sorted(abs(x - m) for x in s)
    k = data.draw(st.integers(0, len(s) - 1))
    assert _kth_deviation(s, m, k) == devs[k]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=3, max_size=60), st.floats(0, 200))
def test_mad_at_least_is_a_sufficient_test(values, d):
    b = RollingBaseline(1000)
    for i, v in enumerate(values):
        b.add(i, v)
    m = statistics.median(values)
    mad = statistics.median(abs(x - m) for x in values)
    assert b.median() == m and math.isclose(b.mad(m), mad, abs_tol=1e-9)
    if b.mad_at_least(d):
        assert mad >= d


class Reference:
    """The scoring rule written plainly: lists, statistics.median, no shortcuts."""

    def __init__(self, window, min_periods, t):
        self.window, self.min_periods, self.t = window, min_periods, t
        self.hist: list[tuple[int, float]] = []
        self.pending = None

    def z(self, x):
        win = [v for _, v in self.hist[-self.window:]]
        if len(win) < self.min_periods:
            return None
        med = statistics.median(win)
        if not x > med:
            return None
        mad = statistics.median(abs(v - med) for v in win)
        return (x - med) / (MAD_SCALE * mad) if mad > 0 else math.inf

    def score(self, step, x, after_resume):
        if self.pending is not None:
            pstep, px = self.pending
            self.pending = None
            z = self.z(x)
            if z is not None and z > CONFIRM_FRACTION * self.t:
                return (pstep, "spike")
            self.hist.append((pstep, px))
        z = self.z(x)
        if z is not None and z > self.t:
            if after_resume:
                return (step, "restart_discontinuity")
            if z > IMMEDIATE_FACTOR * self.t:
                return (step, "spike")
            self.pending = (step, x)
            return None
        self.hist.append((step, x))
        return None

    def rewind(self, s):
        self.pending = None
        self.hist = [(k, v) for k, v in self.hist if k <= s]


values = st.floats(0.5, 5.0) | st.floats(10, 1e4) | st.sampled_from([math.nan, math.inf])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(values, st.booleans()), max_size=150))
def test_loss_detector_matches_the_reference(stream):
    window, min_periods, t = 12, 4, 5.0
    proj = HealthProjection(RunConfigured(loss_window=window, loss_min_periods=min_periods, loss_z_thresh=t))
    ref = Reference(window, min_periods, t)
    step = 0
    resume_left = 0
    for loss, resume in stream:
        if resume and step > 3:
            proj.apply(RunResumed(reason="t", from_step=step - 3))
            ref.rewind(step - 3)
            step -= 2
            resume_left = RESTART_WINDOW
        got = [(a.step, a.kind) for a in proj.apply(StepObserved(step=step, loss=loss))]
        if loss != loss or loss == math.inf:
            if ref.pending is not None:  # a non-finite value releases a candidate into the baseline
                ref.hist.append(ref.pending)
                ref.pending = None
            want = [(step, "nan_loss" if loss != loss else "inf_loss")]
            broke = False
        else:
            r = ref.score(step, loss, resume_left > 0)
            want = [] if r is None else [(r[0], "loss_spike" if r[1] == "spike" else r[1])]
            broke = bool(r) and r[1] == "restart_discontinuity"
        assert got == want
        if resume_left:
            resume_left = 0 if broke else resume_left - 1
        step += 1
