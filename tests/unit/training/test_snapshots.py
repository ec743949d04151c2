"""Snapshots are folds: a checkpoint's monitor state is the fold of the journal up to the checkpoint's seq, and
snapshot + later events == the fold of the whole journal, across resumes, rewinds and run_configured segments."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from trainledger.journal import RunResumed, StepObserved
from trainledger.training.health.detectors import HealthProjection
from trainledger.training.kinds import RunConfigured
from trainledger.audit import replay
from trainledger.training.reference.loop import LoopConfig, run_training
from trainledger.training.health.monitor import TrainingHealthMonitor


def test_live_monitor_equals_replay_after_a_stop_and_resume(tmp_path, signer):
    """Before: stop_after=12 then a resume gave the live monitor 30 steps and replay 32 (the steps re-run after
    the checkpoint were counted by the journal, not by the restored snapshot)."""
    torch.set_num_threads(1)
    cfg = LoopConfig(steps=30, ckpt_every=5, keep_last=2)
    run_training(tmp_path / "run", signer=signer, config=cfg, stop_after=12)
    out = run_training(tmp_path / "run", signer=signer, config=cfg)
    j = tmp_path / "run" / "journal.jsonl"
    rec = replay(j, keys=[signer.public])
    assert rec.ok and out["report"] == rec.health == TrainingHealthMonitor.replay(j).report()
    assert out["report"]["steps"] == 32  # 30 steps, two of them (10, 11) observed again after the resume


def _stream(draw_losses, cuts):
    """Events: steps with the drawn losses, a resume or a new run_configured at the drawn places."""
    events, step = [], 0
    for i, loss in enumerate(draw_losses):
        if i in cuts:
            kind = cuts[i]
            if kind == "resume":
                ev = RunResumed(reason="checkpoint", from_step=max(0, step - 3))
                step = max(0, step - 3) + 1
            else:
                # a bounded history (format 1.5) of 2 values past the window: resumes reach past it, and the
                # oldest values are dropped along the way, the same in the snapshot and in the fold
                ev = RunConfigured(loss_window=8, loss_min_periods=4, grad_norm_window=8, grad_norm_min_periods=4,
                                   resume_horizon=2)
            events.append(ev)
        events.append(StepObserved(step=step, loss=loss, grad_norm=abs(loss) + 0.5 if math.isfinite(loss) else 1.0,
                                   step_time_s=0.1, tokens=16))
        step += 1
    return events


losses = st.lists(st.one_of(st.floats(0.5, 5.0), st.sampled_from([math.nan, math.inf, 40.0, 8.0])),
                  min_size=5, max_size=80)


@settings(max_examples=60, deadline=None)
@given(losses, st.dictionaries(st.integers(1, 79), st.sampled_from(["resume", "configure"]), max_size=4),
       st.integers(0, 100), st.sampled_from([None, 0, 2]))
def test_snapshot_plus_later_events_is_the_full_fold(draw, cuts, cut_at, horizon):
    events = _stream(draw, cuts)
    k = cut_at % (len(events) + 1)
    config = RunConfigured(loss_window=8, loss_min_periods=4, grad_norm_window=8, grad_norm_min_periods=4,
                           resume_horizon=horizon)
    rest, full = _resumed_and_whole(config, events, k)
    a, b = rest.report(), full.report()
    assert _nan_eq(a, b) and len(rest.suspected) == len(full.suspected)
    assert _nan_eq(rest.state(), full.state())  # what a later checkpoint's snapshot digests


def _resumed_and_whole(config, events, k):
    """(the fold of ``events[:k]``, snapshotted, restored and fed the rest; the fold of them all)."""
    full = HealthProjection(config)
    for ev in events:
        full.apply(ev)
    head = HealthProjection(config)
    for ev in events[:k]:
        head.apply(ev)
    rest = HealthProjection.from_state(head.state())
    for ev in events[k:]:
        rest.apply(ev)
    return rest, full


def _nan_eq(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_nan_eq(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_nan_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def test_a_bounded_history_stays_bounded_and_a_snapshot_of_it_is_still_the_fold():
    """Format 1.5's resume_horizon: each detector keeps its window plus the horizon (dropping a chunk at a time),
    a snapshot restored and continued keeps dropping where the uninterrupted fold does, and a resume reaching past
    the horizon rebuilds from what is kept, the same in both."""
    config = RunConfigured(loss_window=8, loss_min_periods=4, grad_norm_window=8, grad_norm_min_periods=4,
                           resume_horizon=4)
    events = [StepObserved(step=i, loss=2.0 + 0.01 * (i % 7), grad_norm=1.0 + 0.01 * (i % 5)) for i in range(300)]
    events.insert(250, RunResumed(reason="rewind", from_step=200))  # 50 steps back: past the horizon
    for k in (0, 37, 120, 249, 250, 251):
        rest, full = _resumed_and_whole(config, events, k)
        assert _nan_eq(rest.state(), full.state()), k
    assert 8 + 4 <= len(full._loss.base._values) < 8 + 4 + 16 + 1
    unbounded = HealthProjection(RunConfigured(loss_window=8, loss_min_periods=4, grad_norm_window=8,
                                               grad_norm_min_periods=4))
    for ev in events:
        unbounded.apply(ev)
    assert len(unbounded._loss.base._values) == 251  # before 1.5: every value (steps 0-200, then 50 more)
