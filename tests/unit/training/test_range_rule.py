"""Format 1.6's "range" spike rule (run_configured.spike_rule): the excursion over the window's maximum, the joint
rise of loss and grad norm, a large z flagged at once; recorded, replayed, snapshotted, and older journals untouched."""

from __future__ import annotations

import math
import random

import pytest

from trainledger.audit import replay
from trainledger.journal import FORMAT_VERSION, Journal, StepObserved
from trainledger.training.kinds import RunConfigured
from trainledger.training.health.detectors import RANGE_DEFAULTS, RANGE_IMMEDIATE_FACTOR, HealthProjection
from trainledger.training.health.monitor import TrainingHealthMonitor

RANGE = dict(loss_scale="log", **RANGE_DEFAULTS)


def _fold(steps, **config):
    proj = HealthProjection(RunConfigured(**config))
    found = []
    for i, (loss, grad) in enumerate(steps):
        found += proj.apply(StepObserved(step=i, loss=loss, grad_norm=grad))
    return proj, found


def _lm(n=400, seed=0):
    """An LM-like curve: the loss near 2 with 2% multiplicative noise, the grad norm near 1 with 10%."""
    rng = random.Random(seed)
    return [(2.0 * math.exp(rng.gauss(0, 0.02)), math.exp(rng.gauss(0, 0.1))) for _ in range(n)]


def _classifier(n=400, seed=0):
    """A converged classifier's batch losses spanning decades (log-normal, sigma 1.5 around 1e-4)."""
    rng = random.Random(seed)
    return [(1e-4 * math.exp(rng.gauss(0, 1.5)), 1e-3 * math.exp(rng.gauss(0, 1.0))) for _ in range(n)]


def test_a_one_step_bad_batch_is_an_anomaly_at_once_not_a_suspicion():
    """A random-token batch: 1.6x the loss on an LM whose loss moves 2% (z about 16: between 12 and 32)."""
    steps = _lm()
    steps[300] = (steps[300][0] * 1.6, steps[300][1])
    _, old = _fold(steps, loss_scale="log")
    proj, new = _fold(steps, **RANGE)
    assert [a.step for a in old if a.kind == "loss_spike"] == []          # formats 1.4-1.5: only suspected
    assert [(a.kind, a.step, a.detected_at, a.rule) for a in new] == [("loss_spike", 300, None, "z")]
    assert not proj.suspected


def test_an_excursion_far_above_a_heavy_tailed_window_is_flagged_where_the_z_cannot_see_it():
    """A corrupted batch on a classifier whose losses span decades: 500x the window's maximum (z about 3)."""
    steps = _classifier()
    top = max(s[0] for s in steps[236:300])
    steps[300] = (top * 500, steps[300][1])
    _, old = _fold(steps, loss_scale="log")
    _, new = _fold(steps, **RANGE)
    assert old == []
    assert [(a.kind, a.step, a.rule) for a in new] == [("loss_spike", 300, "excursion")]
    assert new[0].log_z < 8       # the robust z alone would not have flagged it


def test_a_joint_rise_that_persists_is_flagged_on_the_next_step():
    """An lr x50 update: the loss and the grad norm both just above their windows' maxima for three steps."""
    steps = _lm()
    tl, tg = max(s[0] for s in steps[236:300]), max(s[1] for s in steps[236:300])
    for k in range(300, 303):
        steps[k] = (tl * 1.06, tg * 1.35)
    _, old = _fold(steps, loss_scale="log")
    _, new = _fold(steps, **RANGE)
    assert [a for a in new if a.rule == "joint"] == new and [(a.step, a.detected_at) for a in new] == [(300, 301)]
    assert not [a for a in old if a.step in (300, 301)]
    one_step = _lm()
    one_step[300] = (tl * 1.06, tg * 1.35)   # one step only: an ordinary hard batch
    assert _fold(one_step, **RANGE)[1] == []


def test_healthy_curves_raise_nothing():
    for seed in range(3):
        assert _fold(_lm(2000, seed), **RANGE)[1] == []
        assert _fold(_classifier(2000, seed), **RANGE)[1] == []


def test_the_monitor_records_the_rule_and_replay_recomputes_it(tmp_path, signer, pubkey):

    steps = _lm(500)
    steps[300] = (steps[300][0] * 1.6, steps[300][1])
    steps[420] = (max(s[0] for s in steps) * 50, steps[420][1] * 50)
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer) as j:
        m = TrainingHealthMonitor(journal=j, spike_rule="range")
        live = [a for i, (loss, g) in enumerate(steps) for a in m.observe_step(i, loss, grad_norm=g)]
    assert [(a.kind, a.step, a.rule) for a in live] == [("loss_spike", 300, "z"), ("loss_spike", 420, "excursion"),
                                                        ("grad_norm_spike", 420, "excursion")]
    assert m.config.spike_rule == "range" and m.config.immediate_factor == RANGE_IMMEDIATE_FACTOR
    rec = replay(p, keys=[pubkey])
    assert rec.ok and rec.verify.format_version == FORMAT_VERSION  # written by this version, 1.6 or later
    assert rec.anomalies_by_kind == {"grad_norm_spike": [420], "loss_spike": [300, 420]}


def test_a_snapshot_taken_while_a_joint_rise_waits_continues_exactly():
    steps = _lm()
    tl, tg = max(s[0] for s in steps[236:300]), max(s[1] for s in steps[236:300])
    for k in range(300, 303):
        steps[k] = (tl * 1.06, tg * 1.35)
    whole, found = _fold(steps, **RANGE)
    half = HealthProjection(RunConfigured(**RANGE))
    for i, (loss, g) in enumerate(steps[:301]):
        half.apply(StepObserved(step=i, loss=loss, grad_norm=g))
    assert half._joint is not None                          # the rise of step 300 waits on step 301
    again = HealthProjection.from_state(half.state())
    rest = [a for i, (loss, g) in enumerate(steps[301:], 301)
            for a in again.apply(StepObserved(step=i, loss=loss, grad_norm=g))]
    assert rest == found and again.state() == whole.state()


@pytest.mark.parametrize("field, value", [("spike_rule", "fancy"), ("excursion_ratio", 1.0), ("joint_z", -1.0),
                                          ("immediate_factor", 0.5), ("excursion_power", math.inf),
                                          ("grad_norm_immediate_factor", 0.5), ("immediate_margin", -1.0)])
def test_impossible_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        RunConfigured(**{**RANGE, field: value})
    with pytest.raises(ValueError, match="loss_scale must be 'log'"):
        RunConfigured(spike_rule="range")


def test_a_spike_is_one_episode_and_its_end_is_on_record(tmp_path, signer, pubkey, capsys):
    """Three elevated steps: one anomaly, then anomaly_ended with the last step, the length and the peak; replay
    recomputes it, and says where the episode ran."""
    from trainledger.cli import main
    from trainledger.journal import read_events

    steps = _lm(400)
    for k, f in ((300, 30.0), (301, 60.0), (302, 20.0)):
        steps[k] = (steps[k][0] * f, steps[k][1])
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer) as j:
        m = TrainingHealthMonitor(journal=j)
        live = [a for i, (loss, g) in enumerate(steps) for a in m.observe_step(i, loss, grad_norm=g)]
    assert [(a.kind, a.step) for a in live] == [("loss_spike", 300)]
    [end] = [e for e in read_events(p) if type(e).__struct_config__.tag == "anomaly_ended"]
    assert (end.step, end.anomaly, end.series, end.last_step, end.steps, end.peak_step, end.closed_by, end.ended_at) \
        == (300, "loss_spike", "loss", 302, 3, 301, "calm", 303)
    assert end.peak == steps[301][0]
    rec = replay(p, keys=[pubkey])
    assert rec.ok and rec.episodes == [{k: getattr(end, k) for k in type(end).__struct_fields__
                                        if k not in ("seq", "ts", "h")}]
    assert rec.anomaly_steps("loss_spike") == "300-302"
    pub = tmp_path / "k.pub"
    pub.write_text(signer.public.line() + "\n")
    assert main(["replay", "--pubkey", str(pub), str(p)]) == 0
    assert "anomaly loss_spike: 1 at step 300-302" in capsys.readouterr().out
    assert main(["query", "--pubkey", str(pub), "--format", "csv", str(p),
                 "SELECT step, anomaly, last_step, steps, peak_step, closed_by FROM episodes"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "300,loss_spike,302,3,301,calm"


def test_a_resume_ends_the_open_episode_and_a_doctored_end_is_named(tmp_path, signer, pubkey):
    from journal_tools import dump, parse, read_lines, rechain, write_lines

    steps = _lm(400)
    for k in range(300, 320):
        steps[k] = (steps[k][0] * 30, steps[k][1])
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer) as j:
        m = TrainingHealthMonitor(journal=j)
        for i, (loss, g) in enumerate(steps[:310]):
            m.observe_step(i, loss, grad_norm=g)
        m.observe_resume(250)
        for i, (loss, g) in enumerate(steps[251:280], 251):
            m.observe_step(i, loss, grad_norm=g)
    rec = replay(p, keys=[pubkey])
    assert rec.ok and [(e["step"], e["last_step"], e["closed_by"], e["ended_at"]) for e in rec.episodes] == \
        [(300, 309, "resume", None)]
    lines = read_lines(p)
    [i] = [k for k, ln in enumerate(lines) if b'"anomaly_ended"' in ln]
    obj = parse(lines[i])
    obj["last_step"] = 301  # a shorter episode than the observations show
    doctored = tmp_path / "d.jsonl"
    write_lines(doctored, rechain(lines[:i] + [dump(obj)] + lines[i + 1:], resign=signer))
    bad = replay(doctored, keys=[pubkey])
    assert not bad.ok and {d["kind"] for d in bad.differences} == {"anomaly_ended"}


def test_a_snapshot_taken_inside_an_episode_continues_exactly():
    steps = _lm()
    for k in range(300, 305):
        steps[k] = (steps[k][0] * 30, steps[k][1] * 20)
    whole, found = _fold(steps, **RANGE)
    half = HealthProjection(RunConfigured(**RANGE))
    for i, (loss, g) in enumerate(steps[:302]):
        half.apply(StepObserved(step=i, loss=loss, grad_norm=g))
    assert half._loss.ep is not None and half._grad.ep is not None
    again = HealthProjection.from_state(half.state())
    rest = [a for i, (loss, g) in enumerate(steps[302:], 302)
            for a in again.apply(StepObserved(step=i, loss=loss, grad_norm=g))]
    assert rest == found[2:] and again.state() == whole.state()
    assert [(e.step, e.series, e.last_step) for e in again.take_ended()] == [(300, "loss", 304), (300, "grad_norm", 304)]
