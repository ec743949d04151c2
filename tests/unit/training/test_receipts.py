"""Receipts that do not overstate: unconfirmed spikes stay on record, an MFU above 100% is flagged, an empty
journal says it is empty."""

from __future__ import annotations

import pytest

from trainledger.journal import Journal, read_events
from trainledger.audit import replay
from trainledger.training.health.flops import measure_matmul_peak
from trainledger.training.health.monitor import TrainingHealthMonitor


def _kinds(p):
    return [type(e).__struct_config__.tag for e in read_events(p)]


@pytest.mark.parametrize("series", ["loss", "grad_norm"])
def test_a_lone_outlier_is_suspected_not_an_anomaly(tmp_path, signer, pubkey, series):
    """Seen on nanoGPT: a batch of random tokens (loss z 10.7), a single-step 51x grad-norm jump (z 27.7): the next
    step is calm, so under the rules of formats 1.4-1.5 neither is an anomaly, and both used to leave no trace at all
    (the default rule flags both: the test below)."""
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer) as j:
        m = TrainingHealthMonitor(journal=j, spike_rule=None)
        for i in range(80):
            loss = 3.0 + 0.01 * (i % 7)
            gn = 1.0 + 0.02 * (i % 5)
            if i == 60:
                loss, gn = (loss + 0.5, gn) if series == "loss" else (loss, gn * 1.5)
            assert m.observe_step(i, loss, grad_norm=gn) == []
    rep = m.report()
    assert rep["anomalies"] == 0 and rep["spikes_suspected"] == 1
    (sus,) = m.suspected
    assert sus.step == 60 and sus.series == series and sus.released_at == 61 and 8 < sus.z_score < 32
    assert _kinds(p).count("spike_suspected") == 1
    rec = replay(p, keys=[pubkey])
    assert rec.ok and rec.health["spikes_suspected"] == 1 and rec.anomalies_by_kind == {}


@pytest.mark.parametrize("series", ["loss", "grad_norm"])
def test_the_default_rule_flags_those_one_step_jumps_and_replay_agrees(tmp_path, signer, pubkey, series):
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer) as j:
        m = TrainingHealthMonitor(journal=j)
        for i in range(80):
            loss = 3.0 + 0.01 * (i % 7)
            gn = 1.0 + 0.02 * (i % 5)
            if i == 60:
                loss, gn = (loss + 0.5, gn) if series == "loss" else (loss, gn * 1.5)
            found = m.observe_step(i, loss, grad_norm=gn)
            assert [a.step for a in found] == ([60] if i == 60 else [])
    rec = replay(p, keys=[pubkey])
    assert rec.ok and rec.anomalies_by_kind == {f"{series}_spike": [60]} and rec.health["spikes_suspected"] == 0


def test_a_doctored_suspicion_is_named_by_replay(tmp_path, signer, pubkey):
    from trainledger.training.kinds import SpikeSuspected

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer) as j:
        m = TrainingHealthMonitor(journal=j)
        for i in range(40):
            m.observe_step(i, 3.0 + 0.01 * (i % 7))
        j.append(SpikeSuspected(step=5, series="loss", value=9.0, baseline_median=3.0, mad=0.01, z_score=20.0,
                                threshold=8.0, released_at=6))
    rec = replay(p, keys=[pubkey])
    assert [d["kind"] for d in rec.differences] == ["spike_suspected"]
    assert "do not support" in rec.differences[0]["detail"]


def test_mfu_above_100_percent_is_flagged_not_reported_as_a_receipt(tmp_path, signer, pubkey, capsys):
    from trainledger.cli import main
    from trainledger.training import build_causal_lm, flop_config_from_causal_lm

    model = build_causal_lm(vocab=32, d_model=16, n_layer=2, n_head=2, block=8)
    cfg = flop_config_from_causal_lm(model, seq_len=8)
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer) as j:
        m = TrainingHealthMonitor(journal=j, flop_config=cfg, peak_flops_per_sec=1e3, peak_source="measured",
                                  peak_spread=0.4)
        for i in range(20):
            m.observe_step(i, 3.0, step_time_s=0.01, tokens=32)
    mfu = m.report()["mfu"]
    assert mfu["implausible"] and mfu["above_100pct"] == 20 and mfu["peak_source"] == "measured"
    rec = replay(p, keys=[pubkey])
    assert any("MFU implausible" in n for n in rec.notes)
    (cfg_ev,) = [e for e in read_events(p) if type(e).__struct_config__.tag == "run_configured"]
    assert cfg_ev.peak_source == "measured" and cfg_ev.peak_spread == 0.4
    assert main(["replay", "--trust-embedded", str(p)]) == 0
    assert "MFU IMPLAUSIBLE: 20 steps above 100%" in capsys.readouterr().out


def test_a_journal_with_no_steps_says_so(tmp_path, signer, pubkey, capsys):
    from trainledger.cli import main

    p = tmp_path / "j.jsonl"
    Journal.create(p, signer=signer).close()
    rec = replay(p, keys=[pubkey])
    assert rec.ok and rec.notes == ["no step observations: the health, MFU and anomaly receipts rest on nothing"]
    assert main(["replay", "--trust-embedded", str(p)]) == 0
    assert "note: no step observations" in capsys.readouterr().out


def test_the_measured_peak_carries_its_spread():
    meas = measure_matmul_peak(n=128, seconds=0.05, detail=True)
    assert meas.samples >= 2 and meas.peak >= meas.median > 0 and 0 <= meas.spread < 1
    assert measure_matmul_peak(n=64, seconds=0.01) > 0  # the plain float, as before
