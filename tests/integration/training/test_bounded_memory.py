"""Memory that stays flat as a run grows: replay of a journal 6x longer peaks at the same resident size (one pass,
no private copy, bounded detector histories), and the live monitor's detectors hold their window plus the resume
horizon however many steps it has seen."""

from __future__ import annotations

import sys
from pathlib import Path

from trainledger.training.health.detectors import RESUME_HORIZON

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tools"))

# the benchmark's own journal (the monitor's calls in a loop) and its replay in a fresh process (peak RSS, bytes written)
from bench_scale import run, write_journal  # noqa: E402

def test_replay_and_the_monitor_hold_their_memory_flat_as_the_run_grows(tmp_path):
    got = {}
    for n in (20_000, 120_000):
        p = tmp_path / f"j{n}.jsonl"
        pub, m = write_journal(p, n)
        for det in (m._proj._loss, m._proj._grad):  # the live monitor: window + horizon, never every value
            assert len(det.base._values) <= det.base.trim_at and len(det.base._steps) == len(det.base._values)
        if n > 2 * RESUME_HORIZON:
            assert len(m._proj._loss.base._values) < 2 * RESUME_HORIZON < n
        got[n] = run("replay", p, pub, n)
        assert got[n]["rows"] == n  # the steps replay folded
        assert got[n]["wchar"] < 1 << 20  # no private copy of the journal: what it writes is its one line of output
    grew = got[120_000]["rss_mb"] - got[20_000]["rss_mb"]
    # 100,000 more steps: before, about 12 MB more (every value kept, ~121 bytes a step) and a full copy written
    assert grew < 3, got
