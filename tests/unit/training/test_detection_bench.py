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
