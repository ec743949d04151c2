"""Replay rebuilds every decision and catches a doctored derived event under a valid signature."""

from __future__ import annotations

import json
import math

from trainledger.journal import Journal, StepObserved
from trainledger.cli import main
from trainledger.training.health.detectors import AnomalyDetected, RunConfigured
from trainledger.audit import replay

STEADY = [3.0, 3.05, 2.95, 3.02, 2.98, 3.01]
CFG = RunConfigured(loss_window=10, loss_min_periods=5, loss_z_thresh=6.0)


def _journal(path, signer, events):
    with Journal.create(path, signer=signer, background=False) as j:
        for ev in events:
            j.append(ev)


def _steps(losses):
    return [StepObserved(step=i, loss=x) for i, x in enumerate(losses)]


def test_honest_monitor_journal_replays_clean(tmp_path, signer):
    from trainledger.training.health.monitor import TrainingHealthMonitor

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        m = TrainingHealthMonitor(journal=j, loss_window=10, loss_min_periods=5, loss_z_thresh=6.0)
        for i, x in enumerate(STEADY + [50.0, 3.0, math.nan, 3.01]):
            m.observe_step(i, x)
    rec = replay(p, keys=[signer.public])
    assert rec.ok and rec.anomalies_by_kind == {"loss_spike": [6], "nan_loss": [8]}
    assert rec.health["steps"] == 10


def test_recorded_anomaly_the_observations_do_not_support(tmp_path, signer, capsys):
    p = tmp_path / "j.jsonl"
    fake = AnomalyDetected(step=3, anomaly="loss_spike", value=3.02, baseline_median=3.0, mad=0.01, z_score=9.9,
                           threshold=6.0)
    _journal(p, signer, [CFG, *_steps(STEADY[:4]), fake, *_steps(STEADY)[4:]])
    rec = replay(p, keys=[signer.public])  # the signature is valid: the writer signed a false conclusion
    assert [d["kind"] for d in rec.differences] == ["anomaly_detected"]
    assert "do not support" in rec.differences[0]["detail"]
    code = main(["replay", str(p), "--trust-embedded"])
    assert code == 1 and "DIFFERENCE seq" in capsys.readouterr().out


def test_omitted_anomaly_is_caught(tmp_path, signer, capsys):
    p = tmp_path / "j.jsonl"
    _journal(p, signer, [CFG, *_steps(STEADY + [50.0])])  # a spike with no anomaly recorded
    rec = replay(p, keys=[signer.public])
    assert len(rec.differences) == 1 and "was not recorded" in rec.differences[0]["detail"]
    assert main(["replay", str(p), "--trust-embedded", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert d["ok"] is False and d["differences"][0]["kind"] == "anomaly_detected"


def test_ladder_journal_replays_clean_and_a_doctored_verdict_is_caught(tmp_path, signer):
    from trainledger.ladder.presets import halt
    from trainledger.ladder.runner import run_pilot_ladder

    from trainledger.ladder.kinds import GateVerdict

    p = tmp_path / "ladder.jsonl"
    j = Journal.create(p, signer=signer)
    run_pilot_ladder(halt(), peak_flops_per_sec=1e9, journal=j, work_dir=tmp_path / "w")
    j.close()
    rec = replay(p, keys=[signer.public])
    assert rec.ok and rec.ladder["halted_at"] == "rung_ii_impossible" and rec.ladder["decisions"] == 2
    # A writer that signs a GO for a rung whose receipts miss the bar:
    q = tmp_path / "doctored.jsonl"
    with Journal.create(q, signer=signer, background=False) as j2:
        j2.append(GateVerdict(rung="r", passed=True, reason="final loss 3.2 <= target 1e-06",
                              measured={"final_loss": 3.2, "forgetting_gap": 0.0},
                              bars={"max_final_loss": 1e-6, "max_forgetting_gap": 4.0}, artifacts={}))
    rec = replay(q, keys=[signer.public])
    assert [d["kind"] for d in rec.differences] == ["gate_verdict"]
