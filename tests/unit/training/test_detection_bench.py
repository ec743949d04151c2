"""tools/bench_detection.py's machinery on a short real run: branches share the healthy run's batches up to the fault,
episodes know their onset and visibility, and the rules are scored as replay folds a journal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))

import bench_detection as bench  # noqa: E402


@pytest.fixture(scope="module")
def run():
    saved = bench.STEPS["linreg"]
    bench.STEPS["linreg"] = 600
    try:
        return bench.train("linreg", 0)
    finally:
        bench.STEPS["linreg"] = saved


def test_a_branch_is_the_healthy_run_until_its_fault(run):
    (first, *_), healthy = run["branches"]["lr_x50"], run["loss"]
    s = first["at"]
    assert s == 240 and first["loss"][0] == healthy[s]     # lr x50 changes the update, not the step's own loss
    assert first["loss"][1] != healthy[s + 1]             # ... which shows from the next step: the onset
    corrupt = run["branches"]["corrupt_batch"][0]
    assert corrupt["loss"][0] > 100 * healthy[s]


def test_episodes_and_scores(run):
    eps = bench.episodes(run, "corrupt_batch")
    assert [e["onset"] for e in eps] == [240, 360, 480] and all(e["visible"] and not e["in_range"] for e in eps)
    assert [e["onset"] for e in bench.episodes(run, "lr_x50")] == [241, 361, 481]
    for name in ("log (1.4-1.5)", "candidate (prototype)"):
        rule = bench.RULES[name]
        assert all(bench.caught(e, rule) == ("caught", 0) for e in eps)
        assert bench.false_alarms(run, rule) == 0


def test_a_slow_divergence_branch_and_its_score(run):
    """lr_ramp: the lr ramped to 100x over 200 steps from the injection, a branch of 300 steps (cut at the run's end);
    visible once its 25-step median reaches 3x the healthy run's, and scored by 100 steps past that."""
    first = run["branches"]["lr_ramp"][0]
    assert first["at"] == 240 and len(first["loss"]) == 300 and first["loss"][0] == run["loss"][240]
    eps = bench.episodes(run, "lr_ramp")
    assert [e["onset"] for e in eps] == [240, 360, 480]
    assert all(e["three"] is None or e["onset"] < e["three"] < e["steps"] for e in eps)
    first = eps[0]  # the one whose branch runs its whole ramp before the run ends: it reaches 3x
    assert first["visible"] and first["three"] > first["onset"] + 100
    assert bench.caught(first, bench.RULES["range + blow-up + divergence (1.10, the default)"])[0] == "caught"
    # the scoring's window: a flag after 100 steps past 3x does not count
    assert bench.caught(first, lambda c: ([(first["three"] + 150, first["three"] + 150)], []))[0] == "missed"
