"""Replay folds runs of step records through the C accelerator (``health_run``); the Python ``_step`` is the
reference. Random streams that hit every way out of the common case (a spike, a NaN or inf loss or grad norm, a
resume window, a batch fingerprint, examples without tokens, a zero or missing step time, an int where a float was
expected, a detector reaching its trim point, a segment change) must fold to the same state, the same anomalies
and the same compute totals, float for float, as one step at a time."""

from __future__ import annotations

import math
import random

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainledger.journal import Journal, Signer
from trainledger.journal.audit.replay import fold as replay_fold
from trainledger.journal.codec import encode_document
from trainledger.journal.events import StepObserved
from trainledger.training.kinds import RunConfigured
from trainledger.journal.kinds import RunResumed
from trainledger.training.audit import HealthAudit
from trainledger.training.health import detectors
from trainledger.training.health.trend import TREND_DEFAULTS

pytestmark = pytest.mark.skipif(detectors._health_run is None, reason="the C accelerator is not built")


def _journal(events, path):
    """The events written as a real signed journal (what replay reads back, record by record)."""
    s = Signer.generate()
    with Journal.create(path, signer=s, background=False) as j:
        for ev in events:
            j.append(ev)
    return path, s.public


def stream(seed: int, path, n: int = 3000, spike_rule: str | None = None):
    """``spike_rule="range"`` (format 1.6): the loss on the log scale, scored with the range rule's episodes;
    ``"trend"``: that and format 1.10's blow-up and divergence rules (a declared chance level or the start's), over
    a stream whose loss climbs 4x over 300 steps in the middle."""
    rng = random.Random(seed)
    scale = rng.choice(["log", "linear"])
    rule = {} if spike_rule is None else dict(detectors.RANGE_DEFAULTS, spike_rule="range")
    trend = {}
    if spike_rule == "trend":  # (a later segment's run_configured keeps them)
        trend = dict(TREND_DEFAULTS, chance_loss=rng.choice([None, 9.0]), trend_window=rng.choice([10, 25]))
        rule.update(trend)
    evs: list = [RunConfigured(n_params=1000, n_layer=2, n_head=2, head_dim=4, seq_len=16, peak_flops_per_sec=1e9,
                               loss_window=rng.choice([8, 16, 64]), loss_min_periods=rng.choice([4, 8]),
                               loss_scale="log" if rule else scale, grad_norm_window=16, grad_norm_min_periods=4,
                               resume_horizon=rng.choice([None, 16, 40]), **rule)]
    step = 0
    for _ in range(n):
        r = rng.random()
        if trend and 900 <= step < 1400:  # no resume or new segment while the divergence rises
            r = 1.0
        if r < 0.004:
            evs.append(RunResumed(from_step=max(0, step - rng.randint(1, 50)), reason="crash"))
            continue
        if r < 0.006:
            evs.append(RunConfigured(peak_flops_per_sec=None if rng.random() < 0.5 else 2e9, loss_window=16,
                                     loss_min_periods=4, n_params=None if rng.random() < 0.5 else 500, n_layer=1,
                                     n_head=1, head_dim=4, seq_len=8, resume_horizon=24, **trend))
            continue
        loss = 2.0 + math.exp(-step / 500) + rng.gauss(0, 0.02)
        if spike_rule == "trend" and 1000 <= step < 1600:
            loss *= 1 + 3 * min(step - 1000, 300) / 300  # a slow divergence, then back
        u = rng.random()
        if trend and 900 <= step < 1400:  # no spike on the way up (a flagged spike makes the rule start over)
            u = 1.0
        if u < 0.01:
            loss *= rng.choice([3.0, 10.0, 50.0])  # a spike
        elif u < 0.013:
            loss = rng.choice([math.nan, math.inf, -1.0, 0.0])
        elif u < 0.015:
            loss = 3  # an int
        g = rng.choice([0.8 + abs(rng.gauss(0, 0.05))] * 8 + [None, 0.0, math.nan, 40.0])
        if trend and 900 <= step < 1400 and (g is None or not 0.7 < g < 2):
            g = 0.8 + 0.04 * abs(math.sin(step))  # nor a NaN or spiking grad norm
        fields = dict(step=step, loss=loss, grad_norm=g)
        v = rng.random()
        if v < 0.9:
            fields.update(step_time_s=rng.choice([0.25, 0.2 + rng.random() * 0.1]), tokens=rng.choice([4096, 1000]))
        elif v < 0.93:
            fields.update(step_time_s=0.25, examples=32)
        elif v < 0.95:
            fields.update(step_time_s=rng.choice([0.0, -1.0, math.inf]), tokens=4096)
        elif v < 0.97:
            fields.update(batch_fingerprint=rng.random(), step_time_s=0.25, tokens=4096)
        elif v < 0.98:
            fields.update(step_time_s=1, tokens=4096)  # an int step time
        evs.append(StepObserved(**fields))
        step += 1
    return _journal(evs, path)


def fold(path, key) -> HealthAudit:
    """Replay's own fold (``journal.audit.replay.fold``: runs of step records handed to ``apply_steps``)."""
    _, (a,) = replay_fold(path, lambda version: [HealthAudit(version)], keys=[key])
    return a


@pytest.mark.parametrize("spike_rule", [None, "range", "trend"])
@pytest.mark.parametrize("seed", range(8))
def test_runs_in_c_fold_as_the_python_steps_do(seed, spike_rule, tmp_path, monkeypatch):
    path, key = stream(seed, tmp_path / "j.jsonl", spike_rule=spike_rule)
    c = fold(path, key)
    # the reference: every step through _step, every line of it in Python
    monkeypatch.setattr(detectors, "_health_run", None)
    monkeypatch.setattr(detectors, "_baseline_step", None)
    py = fold(path, key)
    same = lambda a, b: encode_document(a) == encode_document(b)  # noqa: E731 (canonical JSON: NaN equals NaN)
    assert same(c.proj.state(), py.proj.state())
    assert same(c.proj.report(), py.proj.report())
    assert same([(q, msgspec.to_builtins(x)) for q, x in c.recomputed + c.suspected + c.ended],
                [(q, msgspec.to_builtins(x)) for q, x in py.recomputed + py.suspected + py.ended])
    assert [getattr(c.compute, f) for f in c.compute.__slots__] == [getattr(py.compute, f) for f in py.compute.__slots__]
    assert c.recomputed, "the stream should find some anomalies"
    if spike_rule == "trend":  # the new rules fired, in the C runs' steps too
        kinds = {a.anomaly for _, a in c.recomputed}
        assert "loss_divergence" in kinds, kinds
        assert c.proj.partial_steps == py.proj.partial_steps > 0  # 1000 tokens after 4096: left to _step
        if c.proj.config.chance_loss is not None:  # its blow-ups are big spikes the spike rules flag first
            assert c.proj._trend.armed and py.proj._trend.armed


@pytest.mark.parametrize("spike_rule", [None, "range"])
def test_most_steps_of_a_plain_stream_take_the_c_run(tmp_path, monkeypatch, spike_rule):
    """The test above is only worth something if the C run does fold steps: count the ones that go the long way."""
    path, key = stream(0, tmp_path / "j.jsonl", spike_rule=spike_rule)
    long_way = []
    real = detectors.HealthProjection._step
    monkeypatch.setattr(detectors.HealthProjection, "_step", lambda self, ev: long_way.append(ev) or real(self, ev))
    a = fold(path, key)
    # the stream's 1% spikes, NaNs, fingerprints and resumes, and the episodes after them, go the long way
    assert 0 < len(long_way) < a.compute.steps * (0.3 if spike_rule is None else 0.35), (len(long_way), a.compute.steps)


@pytest.mark.parametrize("seed", range(4))
def test_a_quiet_range_rule_run_folds_in_c_values_above_the_window_included(seed, tmp_path, monkeypatch):
    """The range rule (format 1.6) scores a value above its window's maximum; when it ends as a plain step (no
    excursion, no z over the threshold, no joint rise) the C run scores it too, the median, MAD and z as the
    Python lines compute them. A quiet run (a falling loss with noise, a noisy grad norm: a new maximum every few
    dozen steps, and some excursions) folds to the same state either way, and nearly all of it in C."""
    rng = random.Random(seed)
    evs: list = [RunConfigured(n_params=1000, n_layer=2, n_head=2, head_dim=4, seq_len=16, peak_flops_per_sec=1e9,
                               loss_window=rng.choice([16, 64, 128]), loss_min_periods=8, loss_scale="log",
                               grad_norm_window=rng.choice([16, 128]), grad_norm_min_periods=8,
                               **detectors.RANGE_DEFAULTS)]
    for i in range(4000):
        loss = 2.0 + 3.0 * (1 + i / 50) ** -0.5 + rng.gauss(0, 0.02)
        g = 0.8 + abs(rng.gauss(0, 0.05)) * (6 if rng.random() < 0.002 else 1)
        evs.append(StepObserved(step=i, loss=loss, grad_norm=g, step_time_s=0.25, tokens=4096))
    path, key = _journal(evs, tmp_path / "j.jsonl")
    long_way = []
    real = detectors.HealthProjection._step
    monkeypatch.setattr(detectors.HealthProjection, "_step", lambda self, ev: long_way.append(ev) or real(self, ev))
    c = fold(path, key)
    assert len(long_way) < 0.03 * c.compute.steps, len(long_way)
    monkeypatch.setattr(detectors, "_health_run", None)
    monkeypatch.setattr(detectors, "_baseline_step", None)
    py = fold(path, key)
    same = lambda a, b: encode_document(a) == encode_document(b)  # noqa: E731
    assert same(c.proj.state(), py.proj.state()) and same(c.proj.report(), py.proj.report())
    assert same([(q, msgspec.to_builtins(x)) for q, x in c.recomputed + c.suspected + c.ended],
                [(q, msgspec.to_builtins(x)) for q, x in py.recomputed + py.suspected + py.ended])


def _project(config, evs, in_c: bool, poke=None):
    """The events folded by ``fold_steps`` (runs through the C fold) or one ``_step`` at a time (the Python
    reference), ``poke(projection)`` after the first 200 steps: the state reached, or "IndexError"."""
    from trainledger.training.health.detectors import HealthProjection

    p = HealthProjection(config)

    def feed(a, b):
        if in_c:
            p.fold_steps(evs, a, b)
        else:
            for ev in evs[a:b]:
                p._step(ev)

    feed(0, 200)
    if poke is not None:
        poke(p)
    try:
        feed(200, len(evs))
    except IndexError:
        return "IndexError"
    return encode_document(p.state())


@pytest.mark.parametrize("window", [16, 100, 1000])
def test_ties_and_a_window_still_filling_fold_in_c_as_in_python(window):
    """Equal values in the window (the C fold's sorted window is a copy in a C array for each run, searched
    without branches: equal values must go in after their equals and leave from the first of them, as Python's
    bisect puts them) and a window larger than the run's start (the copy grows as it fills)."""
    rng = random.Random(window)
    config = RunConfigured(loss_window=window, loss_min_periods=8, grad_norm_window=window // 2,
                           grad_norm_min_periods=8, loss_scale="linear")
    evs = [StepObserved(step=i, loss=rng.choice([2.0, 2.01, 2.02, 2.03]), grad_norm=rng.choice([0.5, 0.8, 0.8, 0.9]),
                        step_time_s=0.25, tokens=4096) for i in range(3000)]
    assert _project(config, evs, True) == _project(config, evs, False)


@pytest.mark.parametrize("item", [math.nan, 2])
def test_a_window_holding_a_nan_or_an_int_folds_in_c_as_in_python(item):
    """A window item that is not a plain number of a C array (an int the Python path kept, a NaN put there) keeps
    the C fold reading the list itself, as Python's bisect does, probe for probe (a NaN leaves the list unsorted:
    another order of probes could find other places)."""
    rng = random.Random(7)
    config = RunConfigured(loss_window=64, loss_min_periods=8, grad_norm_window=32, grad_norm_min_periods=8,
                           loss_scale="linear")
    evs = [StepObserved(step=i, loss=2.0 + rng.gauss(0, 0.01), grad_norm=0.8 + abs(rng.gauss(0, 0.02)),
                        step_time_s=0.25, tokens=4096) for i in range(1500)]

    def poke(p):  # the window's middle value, in its sorted list and in its history, made ``item``
        base = p._loss.base
        k = len(base._sorted) // 2
        j = len(base._values) - 1 - base._values[::-1].index(base._sorted[k])
        base._sorted[k] = base._values[j] = item

    assert _project(config, evs, True, poke) == _project(config, evs, False, poke) != "IndexError"


@pytest.mark.parametrize("leaving", [1.9, 2.0, 2.5])
def test_a_window_whose_history_disagrees_with_its_sorted_list_folds_as_python_does(leaving):
    """State no detector makes (a value in the history that its sorted list lacks: a hand-edited projection) is
    never moved in C on the assumption that the leaving value is where it should be: the Python detector deletes
    what its bisect finds (or raises), and the C fold ends the same way, never reading past the list."""
    rng = random.Random(3)
    config = RunConfigured(loss_window=32, loss_min_periods=8, grad_norm_window=32, grad_norm_min_periods=8,
                           loss_scale="linear")
    evs = [StepObserved(step=i, loss=2.0 + abs(rng.gauss(0, 0.01)), grad_norm=0.8, step_time_s=0.25, tokens=4096)
           for i in range(600)]

    def poke(p):
        p._loss.base._values[-5] = leaving

    assert _project(config, evs, True, poke) == _project(config, evs, False, poke)


# The health detector's common step (baseline_step) against the Python lines it stands for.
tie_prone = st.sampled_from([1.0, 1.5, 2.0, 2.0000000000000004, 3.0, 50.0]) | st.floats(-10, 100)


@settings(max_examples=300, deadline=None)
@given(st.lists(tie_prone, max_size=120), st.integers(3, 9), st.integers(0, 6), st.floats(1.0, 8.0))
def test_detector_scores_the_same_with_and_without_the_accelerator(xs, window, m, z):
    from trainledger.training.health import detectors as health
    from trainledger.training.kinds import DetectorParams

    p = DetectorParams(window, 3 + m % (window - 2), z, "loss")
    fast_det, slow_det = health._Detector(p, "loss_spike", False, "loss"), health._Detector(p, "loss_spike", False, "loss")
    saved = health._baseline_step
    for step, x in enumerate(xs):
        got = fast_det.score(step, x, False)
        health._baseline_step = None
        try:
            want = slow_det.score(step, x, False)
        finally:
            health._baseline_step = saved
        assert got == want
        assert fast_det.pending == slow_det.pending
        b, c = fast_det.base, slow_det.base
        assert (b._sorted, b._values, b._steps) == (c._sorted, c._values, c._steps)
        assert b._sorted == sorted(b._values[-window:])


def test_baseline_step_leaves_what_it_cannot_read_to_the_caller():
    folds = pytest.importorskip("trainledger.training.health._fastfolds")
    s, values, steps = [1.0, 2, 3.0], [1.0, 2, 3.0], [0, 1, 2]
    before = (list(s), list(values), list(steps))
    # an int in the window: the bisect meets it, nothing changes, the Python path decides
    assert folds.baseline_step(s, values, steps, 2.5, 3, 1, 0.1, 10) is False
    assert (s, values, steps) == before
    assert folds.baseline_step([], [], [], 1.0, 0, 0, 0.1, 10) is False  # an empty window with no warm-up
    assert folds.baseline_step([1.0], [1.0], [0], 1, 1, 5, 0.1, 10) is False  # x not a float
    assert folds.baseline_step([1.0], [1.0], [0], 2.0, 1, 5, 0.1, 0) is False  # no window
    s, values, steps = [1.0], [1.0], [0]
    assert folds.baseline_step(s, values, steps, 0.5, 1, 5, 0.1, 1) is True  # warming up: added, the oldest out
    assert (s, values, steps) == ([0.5], [1.0, 0.5], [0, 1])
    with pytest.raises(TypeError):
        folds.baseline_step((1.0,), [], [], 1.0, 0, 0, 0.1, 1)
