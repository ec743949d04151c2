"""The report's curves for a ladder longer than the plot's point budget: each rung bucketed within itself, in its
own colour, named in the legend; MFU in percent; the Health table over every step; no ladder section for a run
without one."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("matplotlib")

from trainledger.journal import Journal, StepObserved  # noqa: E402
from trainledger.training.kinds import RunConfigured
from trainledger.ladder.kinds import RungStarted  # noqa: E402
from trainledger.report import MAX_POINTS, _figure, _matplotlib, _Series, write_report  # noqa: E402


def _ladder_series(rungs: int = 3, steps: int = 1500) -> _Series:
    s = _Series()
    for r in range(rungs):
        s.apply(RungStarted(rung=f"rung_{r}", real_target="-", spec={}))
        s.apply(RunConfigured(n_params=1000, n_layer=1, n_head=1, head_dim=8, seq_len=8, peak_flops_per_sec=1e9))
        for i in range(steps):
            s.apply(StepObserved(step=i, loss=3.0 - r * 0.1 - i * 1e-4, grad_norm=1.0, step_time_s=0.01, tokens=64))
    return s


def test_a_long_ladder_is_bucketed_within_each_rung_and_coloured_by_rung(monkeypatch):
    import matplotlib.axes

    drawn = []
    real_plot = matplotlib.axes.Axes.plot

    def plot(self, xs, ys, *a, **kw):
        drawn.append((self.get_ylabel() or len(drawn), list(xs), kw.get("color"), kw.get("label")))
        return real_plot(self, xs, ys, *a, **kw)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    s = _ladder_series()
    assert len(s.step) > MAX_POINTS and s.segments == 3
    _figure(_matplotlib(), s)
    lines = [d for d in drawn if d[2] is not None and d[2].startswith("C")]
    assert {d[2] for d in lines} == {"C0", "C1", "C2"}  # one colour per rung
    assert {d[3] for d in lines} >= {"rung_0", "rung_1", "rung_2"}  # named in the legend
    for _, xs, _, _ in lines:
        assert all(b > a for a, b in zip(xs, xs[1:]))  # no bucket joins one rung's end to the next one's start
        assert max(xs) <= 1499
    assert sum(len(xs) for _, xs, _, _ in lines) <= 4 * (MAX_POINTS + 3)  # within the budget, four panels


def test_the_health_table_counts_every_step_and_mfu_is_a_percent(tmp_path, signer):
    path = tmp_path / "j.jsonl"
    with Journal.create(path, signer=signer) as j:
        for r in range(2):
            j.append(RunConfigured(n_params=1000, n_layer=1, n_head=1, head_dim=8, seq_len=8, peak_flops_per_sec=1e9))
            for i in range(50):
                j.append(StepObserved(step=i, loss=2.0 + math.sin(i), step_time_s=0.01, tokens=64))
    write_report(path, tmp_path / "r.html", keys=[signer.public])
    page = (tmp_path / "r.html").read_text()
    assert "<td>100</td>" in page and "steps (all)" in page and "2 segments" in page
    assert "Pilot ladder" not in page
