"""Format 1.10's blow-up and divergence rules (training/health/trend.py): a fitted classifier blown up above where it
started is flagged on its first step whatever the window's spread; a loss or grad norm that climbs 3x over hundreds
of steps is flagged before it gets there; healthy curves (warm-up, decays, an lr drop, a KL anneal, decades of batch
noise) raise none; a resume redoes the blocks after its checkpoint; the monitor's snapshot carries the rules' state;
and replay names a recorded conclusion the steps do not give, or one left out."""

from __future__ import annotations

import math
import random

import pytest

from journal_tools import dump, parse, read_lines, rechain, write_lines

from trainledger.audit import replay
from trainledger.journal import Journal, RunResumed, StepObserved
from trainledger.training.health.detectors import RANGE_DEFAULTS, HealthProjection
from trainledger.training.health.monitor import TrainingHealthMonitor
from trainledger.training.health.trend import TREND_DEFAULTS, TrendRules
from trainledger.training.kinds import RunConfigured

NEW = {"loss_blowup", "loss_divergence", "grad_norm_divergence"}


def _config(**kw) -> RunConfigured:
    return RunConfigured(loss_scale="log", **RANGE_DEFAULTS, **{**TREND_DEFAULTS, **kw})


def _fold(losses, grads=None, **kw) -> list:
    p = HealthProjection(_config(**kw))
    out = []
    for i, loss in enumerate(losses):
        out += p.apply(StepObserved(step=i, loss=loss, grad_norm=None if grads is None else grads[i]))
    return out


def _classifier(rng: random.Random, n: int = 3000) -> list[float]:
    """A ten-class classifier's batch losses, example by example: each of a batch's 32 examples has a logit gap g
    over the nine other classes, normal around a mean that rises from 0 (chance, ln 10) to 8 as it learns, with a
    spread of 2.5 (hard examples); its loss is log(1 + 9 e^-g), the batch's the mean. Fitted, the batch losses span
    decades (a few confidently wrong examples dominate a batch)."""
    out = []
    for i in range(n):
        mu = 8.0 * (1 - math.exp(-i / 400))
        gaps = (rng.gauss(mu, 2.5) for _ in range(32))
        out.append(sum(math.log1p(9 * math.exp(-g)) for g in gaps) / 32)
    return out


@pytest.mark.parametrize("seed", range(3))
def test_a_blown_up_classifier_is_flagged_on_its_first_step(seed):
    rng = random.Random(seed)
    losses = _classifier(rng)
    at = 2000
    for k, v in enumerate(rng.uniform(23, 82) for _ in range(5)):  # an lr x50 step: 23-82 nats for five steps
        losses[at + k] = v
    found = _fold(losses)
    assert at in {a.step for a in found}  # by the spike rules or the blow-up rule, never twice for it
    assert not [a for a in found if a.anomaly in NEW and a.step != at]
    # the blow-up rule on its own (where the spike rules do not flag it: a window too wide to tell)
    rules = TrendRules(blowup_factor=4.0, chance_loss=None, window=25, ratio=2.0)
    alone = [a for i, x in enumerate(losses) for a in rules.step(i, x, None) if a.anomaly == "loss_blowup"]
    assert [a.step for a in alone] == [at] and alone[0].rule == "blowup"
    assert alone[0].baseline_median == losses[0] and 2.0 < losses[0] < 4.0  # the first: untrained, about chance
    assert alone[0].threshold == 2 * losses[0]
    # with a chance level declared, the same, against ln 10
    rules = TrendRules(blowup_factor=4.0, chance_loss=math.log(10), window=25, ratio=2.0)
    declared = [a for i, x in enumerate(losses) for a in rules.step(i, x, None) if a.anomaly == "loss_blowup"]
    assert [(a.step, a.baseline_median, a.threshold) for a in declared] == [(at, math.log(10), 2 * math.log(10))]
    # a step the spike rules flagged is not flagged again, and its blow-up's later steps are the same episode
    rules = TrendRules(blowup_factor=4.0, chance_loss=None, window=25, ratio=2.0)
    flagged = [a for i, x in enumerate(losses) for a in rules.step(i, x, None, spiked=i == at)]
    assert not [a for a in flagged if a.anomaly == "loss_blowup"]


def test_a_loss_that_never_fell_far_is_not_armed():
    """An LM whose loss falls from 3.5 to 2.5 never fell to a quarter of its start: a loss of 4 is not a blow-up
    (the spike rules are what see it)."""
    losses = [2.5 + math.exp(-i / 100) + 0.01 * math.sin(i) for i in range(1000)]
    losses[800] = 4.0
    assert not [a for a in _fold(losses) if a.anomaly == "loss_blowup"]


@pytest.mark.parametrize("series", ["loss", "grad_norm"])
@pytest.mark.parametrize("seed", range(3))
def test_a_slow_threefold_rise_is_flagged_before_it_is_three_fold(series, seed):
    """An lr ramped 100x over 200 steps lifts the series about 3x, and the rolling window follows it up: the
    divergence rule holds it to its own earlier level and flags it on the way, from that series alone."""
    rng = random.Random(seed)
    n, start, ramp = 3000, 1500, 200
    level = [1.0 + 2.0 * min(max(i - start, 0), ramp) / ramp for i in range(n)]
    noisy = [v * math.exp(rng.gauss(0, 0.15)) for v in level]
    flat = [1.0 * math.exp(rng.gauss(0, 0.15)) for _ in range(n)]
    found = _fold(noisy, flat) if series == "loss" else _fold(flat, noisy)
    div = [a for a in found if a.anomaly == f"{series}_divergence"]
    three = start + ramp  # where the rise reaches 3x
    assert div and start < div[0].step <= three + 100, [a.step for a in div]
    assert div[0].value >= 2 * div[0].baseline_median and div[0].rule == "trend"
    assert not [a for a in found if a.anomaly in NEW and a.step < start]


def _healthy(kind: str, rng: random.Random, n: int = 20000) -> tuple[list[float], list[float]]:
    out_l, out_g = [], []
    for i in range(n):
        if kind == "lm":  # warm-up, then a cosine decay to 10% of the peak lr, the loss falling to a floor
            loss = 2.0 + 8.0 * (1 + i / 50) ** -0.6
            g = 0.3 + 2.0 * math.exp(-i / 300)
        elif kind == "lr_drop":  # a step schedule: each drop makes the loss fall and the grad norm jump down
            loss = 1.0 + 1.5 * math.exp(-i / 2000) - 0.1 * (i // 5000)
            g = 1.0 / (1 + i // 5000)
        elif kind == "kl_anneal":  # a VAE: the KL weight rises 0 -> 1 over 5,000 steps, lifting the loss 40%
            beta = min(1.0, i / 5000)
            loss = 80 + 60 * math.exp(-i / 800) + 30 * beta
            g = 5.0 + 3.0 * beta
        else:  # the classifier's decades of batch noise (_classifier), its grad norm as noisy
            return _classifier(rng, n), [0.5 * math.exp(rng.gauss(0, 0.8)) for _ in range(n)]
        out_l.append(loss * math.exp(rng.gauss(0, 0.1)))
        out_g.append(g * math.exp(rng.gauss(0, 0.3)))
    return out_l, out_g


@pytest.mark.parametrize("kind", ["lm", "lr_drop", "kl_anneal"])
def test_healthy_curves_raise_no_blowup_or_divergence(kind):
    losses, grads = _healthy(kind, random.Random(7))
    assert [(a.anomaly, a.step) for a in _fold(losses, grads) if a.anomaly in NEW] == []


def test_a_fitted_classifiers_wandering_raises_few():
    """The classifier's batch losses and grad norm span decades, so its 25-step medians wander: five seeds of
    20,000 healthy steps raise no blow-up and at most 0.25 divergences per 1,000 steps (measured: none)."""
    found = []
    for seed in range(5):
        losses, grads = _healthy("classifier", random.Random(seed))
        found += [a for a in _fold(losses, grads) if a.anomaly in NEW]
    assert not [a for a in found if a.anomaly == "loss_blowup"]
    assert len(found) <= 25, [(a.anomaly, a.step) for a in found]


def test_a_resume_redoes_the_blocks_after_its_checkpoint_and_the_snapshot_carries_them():
    """The rules' state is in the monitor's snapshot: a projection restored from it at step 1600 and fed the rest
    finds what one fed every step finds; a resume from step 1500 drops the blocks that ended after it."""
    rng = random.Random(3)
    n = 2400
    losses = [(1.0 + 2.0 * min(max(i - 1500, 0), 200) / 200) * math.exp(rng.gauss(0, 0.1)) for i in range(n)]
    whole = HealthProjection(_config())
    found = []
    for i, x in enumerate(losses):
        found += whole.apply(StepObserved(step=i, loss=x))
    part = HealthProjection(_config())
    for i, x in enumerate(losses[:1600]):
        part.apply(StepObserved(step=i, loss=x))
    restored = HealthProjection.from_state(part.state())
    assert restored.state() == part.state() and "trend" in part.state()
    later = []
    for i, x in enumerate(losses[1600:], start=1600):
        later += restored.apply(StepObserved(step=i, loss=x))
    assert [(a.anomaly, a.step) for a in later if a.anomaly in NEW] == \
        [(a.anomaly, a.step) for a in found if a.anomaly in NEW and a.step >= 1600]
    part._trend.resume(1500)
    assert all(s <= 1500 for s, _ in part._trend.loss.levels) and part._trend.loss.open == []


def test_the_monitor_records_the_rules_and_can_leave_them_out(tmp_path, signer):
    j = Journal.create(tmp_path / "j.jsonl", signer=signer, background=False)
    m = TrainingHealthMonitor(journal=j, chance_loss=math.log(10))
    assert (m.config.blowup_factor, m.config.trend_window, m.config.chance_loss) == (4.0, 25, math.log(10))
    j.close()
    off = TrainingHealthMonitor(trend_rules=False).config
    assert off.blowup_factor is None and off.trend_window is None
    assert TrainingHealthMonitor(spike_rule=None).config.trend_window is None  # the rules of 1.4-1.5, as they were
    with pytest.raises(ValueError, match="chance_loss"):
        TrainingHealthMonitor(trend_rules=False, chance_loss=2.3)
    with pytest.raises(ValueError, match="trend_window"):
        RunConfigured(trend_window=1)
    with pytest.raises(ValueError, match="blowup_factor"):
        RunConfigured(blowup_factor=1.0)


@pytest.mark.parametrize("doctor", ["dropped", "moved"])
def test_replay_names_a_doctored_divergence(tmp_path, signer, doctor):
    """A journal the monitor wrote (a loss that climbs 3x from step 1500), its loss_divergence line dropped or moved
    to another step, re-signed with the run's own key: a signed lie, named by replay."""
    rng = random.Random(0)
    path = tmp_path / "j.jsonl"
    j = Journal.create(path, signer=signer, background=False)
    m = TrainingHealthMonitor(journal=j)
    for i in range(1800):
        m.observe_step(i, (1.0 + 2.0 * min(max(i - 1500, 0), 200) / 200) * math.exp(rng.gauss(0, 0.1)))
    j.close()
    rec = replay(path, keys=[signer.public])
    assert rec.ok and rec.anomalies_by_kind.get("loss_divergence")
    at = rec.anomalies_by_kind["loss_divergence"][0]
    lines = read_lines(path)
    i = next(k for k, ln in enumerate(lines) if b'"loss_divergence"' in ln)
    if doctor == "dropped":
        del lines[i]
    else:
        obj = parse(lines[i])
        obj["step"] = at - 25
        lines[i] = dump(obj)
    bad = tmp_path / "bad.jsonl"
    write_lines(bad, rechain(lines, resign=signer))
    rec = replay(bad, keys=[signer.public])
    assert not rec.ok
    said = " ".join(d["detail"] for d in rec.differences)
    assert f"loss_divergence at step {at}" in said, rec.differences


def test_a_resume_in_a_journal_replays_the_rules(tmp_path, signer):
    """Live and replay agree across a resume: a divergence rising again after a resume from before it."""
    rng = random.Random(5)
    path = tmp_path / "j.jsonl"
    j = Journal.create(path, signer=signer, background=False)
    m = TrainingHealthMonitor(journal=j)

    def loss(i):
        return (1.0 + 2.0 * min(max(i - 600, 0), 200) / 200) * math.exp(rng.gauss(0, 0.1))

    for i in range(700):
        m.observe_step(i, loss(i))
    m.observe_resume(500, checkpoint="ck-500")
    for i in range(501, 1000):
        m.observe_step(i, loss(i))
    j.close()
    rec = replay(path, keys=[signer.public])
    assert rec.ok, rec.differences
    assert rec.anomalies_by_kind.get("loss_divergence"), rec.anomalies_by_kind


def test_the_recorder_records_a_declared_chance_level(tmp_path, signer):
    import torch

    from trainledger.training.recorder import Recorder

    model = torch.nn.Linear(4, 10)
    rec = Recorder(tmp_path / "run", model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), signer=signer,
                   chance_loss=math.log(10))
    try:
        c = rec.monitor.config
        assert (c.chance_loss, c.blowup_factor, c.trend_window) == (math.log(10), 4.0, 25)
    finally:
        rec.close()


def test_the_report_and_replay_say_which_signals_the_rules_had(tmp_path, signer, capsys):
    """A run that records no grad norm is watched from its loss alone, and says so: the monitor's report counts the
    steps each signal was there for, and replay prints it."""
    from trainledger.cli import main

    rng = random.Random(1)
    path = tmp_path / "j.jsonl"
    j = Journal.create(path, signer=signer, background=False)
    m = TrainingHealthMonitor(journal=j)
    for i in range(300):
        m.observe_step(i, 2.0 * math.exp(rng.gauss(0, 0.1)), grad_norm=1.0 if i < 100 else None)
    j.close()
    assert m.report()["signals"] == {"loss": 300, "grad_norm": 100}
    assert replay(path, keys=[signer.public]).health["signals"] == {"loss": 300, "grad_norm": 100}
    pub = tmp_path / "k.pub"
    pub.write_text(signer.public.line() + "\n")
    assert main(["replay", "--pubkey", str(pub), str(path)]) == 0
    assert "signals: the loss on 300 steps, the grad norm on 100" in capsys.readouterr().out
    alone = tmp_path / "alone.jsonl"
    j = Journal.create(alone, signer=signer, background=False)
    m = TrainingHealthMonitor(journal=j)
    for i in range(50):
        m.observe_step(i, 2.0)
    j.close()
    assert main(["replay", "--pubkey", str(pub), str(alone)]) == 0
    assert "signals: the loss alone (no grad norm recorded)" in capsys.readouterr().out


def _epochs(rng: random.Random, n: int = 900, per_epoch: int = 397) -> list[StepObserved]:
    """An LM under the Hugging Face Trainer with drop_last off: 16 sequences of 64 tokens a step, and each epoch's
    last step the 6 left over, whose grad norm (a smaller sample's) is 3x the others', as measured on
    tools/bench_detection.py's hfgpt2."""
    out = []
    for i in range(n):
        last = i % per_epoch == per_epoch - 1
        g = 0.7 * math.exp(rng.gauss(0, 0.1)) * (3.0 if last else 1.0)
        out.append(StepObserved(step=i, loss=2.6 * math.exp(rng.gauss(0, 0.03)), grad_norm=g,
                                tokens=(6 if last else 16) * 64))
    return out


def _anomalies(config: RunConfigured, events) -> tuple[list, HealthProjection]:
    p = HealthProjection(config)
    found = []
    for ev in events:
        found += p.apply(ev)
    return [(a.anomaly, a.step) for a in found], p


@pytest.mark.parametrize("seed", range(3))
def test_an_epochs_last_partial_batch_is_not_scored_by_the_spike_rules(seed):
    """Format 1.6's rules flag a partial batch's grad norm (as on the Trainer's runs: step 793 on every seed, 396 on one); with
    partial_batch (the default from 1.10) those steps are left unscored, counted in the report; the full-size steps
    around them are scored as before, and a NaN or a blow-up on a partial step is still an anomaly."""
    evs = _epochs(random.Random(seed))
    old, _ = _anomalies(RunConfigured(loss_scale="log", **RANGE_DEFAULTS), evs)
    assert {s for k, s in old if k == "grad_norm_spike"} & {396, 793}
    new, p = _anomalies(_config(), evs)
    assert new == [] and p.report()["partial_batches"] == 2
    hit = list(evs)  # a spike on a full step right after the partial one is still flagged
    hit[398] = StepObserved(step=398, loss=2.6, grad_norm=70.0, tokens=1024)
    assert ("grad_norm_spike", 398) in _anomalies(_config(), hit)[0]
    nan = list(evs)
    nan[396] = StepObserved(step=396, loss=math.nan, grad_norm=2.0, tokens=384)
    assert _anomalies(_config(), nan)[0] == [("nan_loss", 396)]
    blown = list(evs)
    blown[793] = StepObserved(step=793, loss=40.0, grad_norm=2.0, tokens=384)
    assert _anomalies(_config(chance_loss=12.0), blown)[0] == [("loss_blowup", 793)]  # armed: 2.6 <= 12 / 4


def test_a_smaller_batch_from_then_on_leaves_one_step_unscored():
    """The comparison is with the step before, so a run that halves its batch for good loses one step's scoring,
    not the rest of the run; examples are compared where recorded, else tokens; a resume forgets the step before."""
    p = HealthProjection(_config())
    for i in range(200):
        p.apply(StepObserved(step=i, loss=2.0, grad_norm=1.0, examples=32 if i < 100 else 8, tokens=4096))
    assert p.partial_steps == 1
    p.apply(RunResumed(from_step=150, reason="crash"))
    p.apply(StepObserved(step=151, loss=2.0, grad_norm=1.0, examples=1))
    assert p.partial_steps == 1
    p.apply(StepObserved(step=152, loss=2.0, grad_norm=1.0, examples=1))
    restored = HealthProjection.from_state(p.state())
    assert restored.state() == p.state() and p.state()["partial"] == [1, 1]
    assert "partial" not in HealthProjection(RunConfigured(loss_scale="log", **RANGE_DEFAULTS)).state()
    with pytest.raises(ValueError, match="partial_batch"):
        RunConfigured(partial_batch=1.5)


def test_the_monitor_records_partial_batch_and_replay_says_how_many(tmp_path, signer, capsys):
    from trainledger.cli import main

    path = tmp_path / "j.jsonl"
    j = Journal.create(path, signer=signer, background=False)
    m = TrainingHealthMonitor(journal=j)
    for ev in _epochs(random.Random(5)):
        m.observe_step(ev.step, ev.loss, grad_norm=ev.grad_norm, tokens=ev.tokens)
    j.close()
    assert m.config.partial_batch == 0.5 and m.report()["anomalies"] == 0
    assert replay(path, keys=[signer.public]).health["partial_batches"] == 2
    pub = tmp_path / "k.pub"
    pub.write_text(signer.public.line() + "\n")
    assert main(["replay", "--pubkey", str(pub), str(path)]) == 0
    assert "partial batches: 2 steps" in capsys.readouterr().out


def test_the_golden_of_1_10_leaves_its_partial_batch_unscored():
    """The signed golden's last segment ends on a partial batch (8 tokens after 32) whose grad norm is 40x the
    others': replay leaves it out of the spike rules, and says so."""
    from pathlib import Path

    from trainledger.journal import load_public_key

    golden = Path(__file__).resolve().parents[2] / "assets" / "golden" / "every_kind_v1_10.jsonl"
    r = replay(golden, keys=[load_public_key(golden.with_suffix(".pub"))])
    assert r.ok and r.health["partial_batches"] == 1 and all(43 not in s for s in r.anomalies_by_kind.values())
