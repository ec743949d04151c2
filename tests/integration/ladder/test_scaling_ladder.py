"""The default ladder, `trainledger ladder` (the README's main job): nine pilots (an IsoFLOP grid) measured on held-out data, the
headline sized by F5 inside a compute box, its gate checking the prediction; verify and replay clean; a doctored
fit parameter or box decision, re-signed with the run's own key, named by replay. One run, shared."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("scipy")

from journal_tools import dump, parse, read_lines, rechain, write_lines  # noqa: E402

from trainledger.cli import main  # noqa: E402
from trainledger.journal import load_signer, read_events  # noqa: E402


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    base = tmp_path_factory.mktemp("scaling")
    out = base / "run"
    import contextlib
    import io

    from trainledger.journal import keygen

    priv, _ = keygen(base / "keys")  # outside the run folder, where a run's key belongs
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        code = main(["ladder", "--peak-flops", "2e10", "--key", str(priv), str(out)])
    assert code == 0, buf.getvalue()[-2000:]
    return out, buf.getvalue() + err.getvalue(), priv


def test_the_default_ladder_climbs_and_checks_its_prediction(ladder):
    out, printed, _ = ladder
    assert not list(out.rglob("*.key")) and (out / "trainledger.pub").exists()  # the private key stays outside
    empty = [p for p in out.rglob("*") if p.is_dir() and not any(p.iterdir())]
    assert empty == []  # a rung's folder exists only where it wrote something (its F2 checkpoint)
    assert "rung 1/10 pilot_1" in printed and "rung 10/10 rung_iv_headline" in printed  # progress, a rung at a time
    assert "binding constraint: flops" in printed  # the box binds on FLOPs, so the headline reproduces
    assert "ladder 'scaling'" in printed and "no rung halted" in printed and "halted_at=" not in printed
    assert "inside F5's interval" in printed and "true entropy rate 2.485" in printed
    evs = list(read_events(out / "ladder.jsonl"))
    (fit,) = [e for e in evs if type(e).__struct_config__.tag == "scaling_fitted"]
    verdicts = {e.h: e for e in evs if type(e).__struct_config__.tag == "gate_verdict"}
    assert len(fit.points) == 9 and all(h in verdicts for h in fit.evidence)
    # the grid identifies the law: E near the corpus's entropy rate, both exponents well above 0, nothing flagged
    assert fit.entropy_rate / 2 <= fit.params["E"] <= fit.entropy_rate and fit.params["beta"] >= 0.05
    assert fit.choice["fit_warnings"] == [] and "FIT WARNING" not in printed
    assert fit.choice["binding"] in ("flops", "wall_clock", "memory") and fit.entropy_rate == pytest.approx(2.4851, abs=1e-3)
    headline = [v for v in verdicts.values() if v.rung == "rung_iv_headline"][0]
    lo, hi = headline.bars["loss_interval"]
    assert headline.passed and lo <= headline.measured["eval_loss"] <= hi
    # each held-out loss with the standard error of its mean over the eval batches (the dashboard's error bars)
    assert all(0 < v.measured["eval_loss_se"] < 0.1 for v in verdicts.values() if "eval_loss" in v.measured)
    assert "F5" not in headline.artifacts["skipped_pieces"]
    flops = [v.measured["flops"] for v in verdicts.values()]
    assert headline.measured["flops"] <= 4 * max(flops[:-1]) * 1.01  # inside the box


def _doctor(out, tmp_path, change, markers=(b'"kind":"scaling_fitted"',), *, ladder_key):
    """The ladder's journal with the first line holding every one of ``markers`` changed, re-signed with the run's own key: a
    signed lie, not a broken chain."""

    p = tmp_path / "ladder.jsonl"
    lines = read_lines(out / "ladder.jsonl")
    i = next(k for k, ln in enumerate(lines) if all(m in ln for m in markers))
    obj = parse(lines[i])
    change(obj)
    lines[i] = dump(obj)
    signer = load_signer(ladder_key)

    write_lines(p, rechain(lines, resign=signer))
    return p


@pytest.mark.parametrize("what, change, says", [
    ("a fit parameter", lambda o: o["params"].update(alpha=o["params"]["alpha"] * 1.1), "recorded alpha"),
    ("the box decision", lambda o: o["choice"].update(binding="memory"), "recorded binding"),
    ("a hostile candidate", lambda o: o["candidates"][0].update(n_params=0), "cannot be made again"),
    ("a hostile level", lambda o: o.update(level=5.0), "cannot be made again"),
    ("an unknown fitter", lambda o: o.update(fitter="newton"), "cannot be refitted: fitter 'newton'"),
    ("a fit warning made up", lambda o: o["choice"].update(fit_warnings=["made up"]),
     "recorded fit warnings ['made up']"),
])
def test_a_doctored_fit_or_box_decision_is_named_by_replay(ladder, tmp_path, capsys, what, change, says):
    out, _, key = ladder
    p = _doctor(out, tmp_path, change, ladder_key=key)
    assert main(["replay", "--pubkey", str(out / "trainledger.pub"), "--json", str(p)]) == 1
    diffs = json.loads(capsys.readouterr().out)["differences"]
    assert any(d["kind"] == "scaling_fitted" and says in d["detail"] for d in diffs), diffs


def test_a_degenerate_fit_is_flagged_recorded_and_recomputed(ladder, capsys):
    """What the fit warns of (the main job's grid has nothing to warn of; the six pilots before it drove E to 0,
    which the golden ladder in test_serve.py still shows) is printed in the terminal, recorded in the signed fit
    (choice.fit_warnings), recomputed by replay and shown in the report."""
    from trainledger.ladder.scaling import fit_warnings

    out, printed, _ = ladder
    (fit,) = [e for e in read_events(out / "ladder.jsonl") if type(e).__struct_config__.tag == "scaling_fitted"]
    warned = fit_warnings(fit.params, fit.points, fit.entropy_rate)
    assert fit.choice["fit_warnings"] == warned
    if fit.params["E"] < 0.05 * min(p[2] for p in fit.points):   # the degenerate case the issue saw
        assert any("irreducible loss is not identified" in w for w in warned)
    for w in warned:
        assert f"FIT WARNING: {w}" in printed
    assert main(["replay", "--pubkey", str(out / "trainledger.pub"), str(out)]) == 0
    shown = capsys.readouterr().out
    assert all(f"FIT WARNING (the fit that sized rung_iv_headline): {w}" in shown for w in warned)
    html = (out / "report.html").read_text()
    assert ("FIT WARNING" in html) == bool(warned)
    # the tables a reader scans: headed, MFU in percent as everywhere, an interval as two short numbers
    import re

    assert "<h3>Gate verdicts</h3>" in html and "<h3>Decisions</h3>" in html
    # one MFU figure, the same in replay and the report, each saying which steps it covers
    mean, n = re.search(r"MFU mean ([0-9.]+%) .*over the last segment's ([0-9,]+) steps", shown).groups()
    assert f"<td>{mean}</td>" in html and f"the last segment&#x27;s {n} steps" in html
    mfus = re.findall(r"mfu_mean=([^,<]+)", html)
    assert mfus and all(m.endswith("%") for m in mfus), mfus
    intervals = re.findall(r"loss_interval=\[([^\]]+)\]", html)
    assert intervals and all(len(x) <= 6 for iv in intervals for x in iv.split(", ")), intervals


def test_fit_warnings_name_each_implausible_parameter():
    from trainledger.ladder.scaling import fit_warnings

    pts = [[1e3, 1e4, 3.0], [1e4, 1e5, 2.8]]
    fine = {"E": 1.5, "A": 10.0, "B": 10.0, "alpha": 0.34, "beta": 0.28}
    assert fit_warnings(fine, pts) == [] and fit_warnings(fine, pts, entropy_rate=1.6) == []
    w = fit_warnings({**fine, "E": 8.4e-13, "beta": 0.033}, pts, entropy_rate=2.485)
    assert len(w) == 3 and "E = 8.4e-13 is under 5% of the lowest loss measured (2.8)" in w[0]
    assert w[1].startswith("beta = 0.033 is under 0.05") and "true entropy rate (2.485 nats)" in w[2]
    assert "at or above the lowest loss" in fit_warnings({**fine, "E": 2.9}, pts)[0]
    assert fit_warnings({**fine, "alpha": 3.5}, pts)[0].startswith("alpha = 3.5 is over 2")
    assert fit_warnings({**fine, "E": math.nan}, pts)[0] == "E = nan is not a finite number"
    assert fit_warnings({"E": "x"}, pts) == ["the fit's parameters or points are not numbers: nothing can be said "
                                              "of them"]


def test_f5_opt_in_without_pilots_raises_before_training():
    from trainledger.ladder.presets import tiny
    from trainledger.ladder.runner import run_pilot_ladder
    import dataclasses

    rungs = tiny()
    rungs[-1] = dataclasses.replace(rungs[-1], exercise_scaling_law_fit=True, candidate_widths=(8,),
                                    candidate_layers=(1,), eval_batches=2)
    with pytest.raises(NotImplementedError, match="needs F5 to fit a scaling law.*0 held-out losses"):
        run_pilot_ladder(rungs)


def test_a_fit_too_large_to_recompute_is_refused_not_run(tmp_path, signer, pubkey):
    """A signed journal may claim a million points: replay names it instead of spending hours on it."""
    from trainledger.journal import Journal
    from trainledger.ladder.kinds import ScalingFitted
    from trainledger.audit import replay

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer) as j:
        j.append(ScalingFitted(rung="r", points=[[1e6, 1e9, 3.0]] * 1_001, evidence=["00" * 32] * 1_001, params={},
                               theta=[0.0] * 5, seed=0, boot=10 ** 9, level=0.9, loo_error=0.0, box={},
                               candidates=[], choice={}))
    diffs = replay(p, keys=[pubkey]).differences
    assert [d["kind"] for d in diffs] == ["scaling_fitted"] and "too large to recompute" in diffs[0]["detail"]


def test_a_widened_interval_on_the_headline_verdict_is_named(ladder, tmp_path, capsys):
    """The headline's gate bar must be the interval F5 recorded: widening it in the verdict (re-signed with the
    run's key) is named."""
    out, _, key = ladder
    p = _doctor(out, tmp_path, lambda o: o["bars"].update(loss_interval=[0.0, 100.0]), ladder_key=key,
                markers=(b'"kind":"gate_verdict"', b"rung_iv_headline"))
    assert main(["replay", "--pubkey", str(out / "trainledger.pub"), "--json", str(p)]) == 1
    diffs = json.loads(capsys.readouterr().out)["differences"]
    assert any(d["kind"] == "gate_verdict" and "is not the one F5 recorded" in d["detail"] for d in diffs), diffs
