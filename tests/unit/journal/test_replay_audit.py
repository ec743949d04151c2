"""An auditor's attack list: signed journals whose recorded conclusions do not follow from their events.

Each journal here is signed by the writer's own key (a dishonest or buggy writer): every signature checks
out, and replay must still name the conclusion that does not follow, with its seq.
"""

from __future__ import annotations

from trainledger.journal import Journal, StepObserved
from trainledger.training.kinds import CheckpointSelected, EvaluationRecorded, PreflightCompleted, PreflightGate, \
    RewindDecided, RunConfigured
from trainledger.ladder.kinds import DecisionRecorded, GateVerdict, RungStarted
from trainledger.ladder.outcome import gate
from trainledger.audit import replay

BARS = {"max_final_loss": 5.0, "max_forgetting_gap": 1.0, "max_anomalies": 0}


def _ladder(path, signer, *, measured=None, belief_after=None, action=None):
    """One rung: its config, 30 calm steps ending at loss 3.0, the verdict and the decision."""
    with Journal.create(path, signer=signer, background=False) as j:
        _, started = j.append(RungStarted(rung="r1", real_target="1B", spec={}))
        j.append(RunConfigured(n_params=100, n_layer=1, n_head=1, head_dim=4, seq_len=8, peak_flops_per_sec=1e9))
        for i in range(30):
            j.append(StepObserved(step=i, loss=3.3 - 0.01 * i, grad_norm=1.0, step_time_s=0.1, tokens=8))
        m = {"final_loss": 3.3 - 0.29, "forgetting_gap": 0.2, "anomalies": 0} if measured is None else measured
        passed, reason = gate(BARS, m)
        _, vh = j.append(GateVerdict(rung="r1", passed=passed, reason=reason, measured=m, bars=BARS,
                                     artifacts={"forgetting_curve": [3.0, 2.8, 3.0]}))
        j.append(DecisionRecorded(rung="r1", belief_before={"a": 1.0, "b": 1.0, "mean": 0.5}, evidence=[started, vh],
                                  belief_after=belief_after or {"a": 2.0, "b": 1.0, "mean": 2 / 3},
                                  action_chosen=action or "advance"))
    return path


def _diffs(path, pubkey):
    return [(d["seq"], d["kind"], d["detail"]) for d in replay(path, keys=[pubkey]).differences]


def test_an_honest_rung_replays_clean(tmp_path, signer, pubkey):
    assert _diffs(_ladder(tmp_path / "j.jsonl", signer), pubkey) == []


def test_forged_measured_final_loss(tmp_path, signer, pubkey):
    """The steps end at 3.01; the verdict claims 0.1 (and passes a bar of 1.0 that 3.01 would fail)."""
    p = _ladder(tmp_path / "j.jsonl", signer, measured={"final_loss": 0.1, "forgetting_gap": 0.2, "anomalies": 0})
    (seq, kind, detail), = _diffs(p, pubkey)
    assert kind == "gate_verdict" and "final_loss=0.1" in detail and "3.0" in detail


def test_forged_anomaly_count_and_forgetting_gap(tmp_path, signer, pubkey):
    p = _ladder(tmp_path / "j.jsonl", signer, measured={"final_loss": 3.3 - 0.29, "forgetting_gap": 0.0,
                                                        "anomalies": 0})
    assert [k for _, k, d in _diffs(p, pubkey) if "forgetting_gap" in d] == ["gate_verdict"]


def test_forged_belief(tmp_path, signer, pubkey):
    p = _ladder(tmp_path / "j.jsonl", signer, belief_after={"a": 9.0, "b": 1.0, "mean": 0.9})
    (seq, kind, detail), = _diffs(p, pubkey)
    assert kind == "decision_recorded" and "'a': 9.0" in detail


def test_rewind_past_the_budget(tmp_path, signer, pubkey):
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        for spike in (120, 150, 160):
            j.append(RewindDecided(spike_step=spike, anomaly="loss_spike", checkpoint="c.pt", from_step=99,
                                   skip_batches=5, lr_scale=1.0, reason="spike", max_rewinds=2, window_steps=200))
    (seq, kind, detail), = _diffs(p, pubkey)
    assert kind == "rewind_decided" and "step 160" in detail and "past the budget" in detail and seq == 4


def test_doctored_checkpoint_selection(tmp_path, signer, pubkey):
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        for step, loss in ((10, 2.5), (20, 2.1), (30, 2.3)):
            j.append(EvaluationRecorded(hook="heldout", role="target", step=step, checkpoint=f"c{step}.pt",
                                        checkpoint_sha256=str(step) * 32, metrics={"loss": loss}, cases=4,
                                        cases_sha256="0" * 64, cases_path="evals/x.json"))
        j.append(CheckpointSelected(rule="min:heldout.loss", checkpoint="c30.pt", checkpoint_sha256="30" * 32,
                                    step=30, value=2.3, candidates=3))  # the last, not the best (c20, 2.1)
    (seq, kind, detail), = _diffs(p, pubkey)
    assert kind == "checkpoint_selected" and "picks c20.pt (2.1)" in detail


def test_a_gate_that_cannot_have_run_and_a_false_completion(tmp_path, signer, pubkey):
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        j.append(PreflightGate(gate="schema", status="passed", reason="ok"))
        j.append(PreflightGate(gate="data_lineage", status="failed", reason="digest differs"))
        j.append(PreflightGate(gate="template_compat", status="passed", reason="trust me"))
        j.append(PreflightCompleted(manifest_id="sha256:" + "0" * 64, status="ready-to-train"))
    kinds = [(k, d.split(":")[0][:40]) for _, k, d in _diffs(p, pubkey)]
    assert [k for k, _ in kinds] == ["preflight_gate", "preflight_completed"]


def test_doctored_stops(tmp_path, signer, pubkey):
    from trainledger.training.kinds import RunStopped

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        j.append(RunStopped(rule="target-futility", reason="heldout.loss = 2.1, the rule needs <= 2.5", value=2.1,
                            limit=2.5))  # the value met the threshold: no reason to stop
        j.append(RunStopped(rule="non-finite-loss", reason="loss 3.2", value=3.2))
        j.append(RunStopped(rule="budget-breach", reason="tokens", value=900.0, limit=800.0))  # a real breach
    assert [(s, k) for s, k, _ in _diffs(p, pubkey)] == [(2, "run_stopped"), (3, "run_stopped")]


def test_a_snapshot_that_disagrees_with_the_fold(tmp_path, signer, pubkey):
    from trainledger.training.kinds import CheckpointSaved

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        for i in range(10):
            j.append(StepObserved(step=i, loss=3.0, step_time_s=0.1, tokens=8))
        j.append(CheckpointSaved(step=9, path="checkpoints/step-000000009.pt", bytes=1, sha256="0" * 64,
                                 contents=[], duration_s=0.1, monitor_sha256="ab" * 32))
    (seq, kind, detail), = _diffs(p, pubkey)
    assert kind == "checkpoint_saved" and "not the fold" in detail


def test_a_callback_stop_without_its_anomaly_is_named(tmp_path, signer, pubkey):
    """A framework callback's run_stopped (stop_on:KIND) must rest on a KIND anomaly at that step on record."""
    from trainledger.training.kinds import RunStopped

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        for i in range(10):
            j.append(StepObserved(step=i, loss=3.0 - 0.01 * i))
        j.append(RunStopped(rule="stop_on:nan_loss", reason="nan_loss at step 3", value=float("nan")))
    diffs = replay(p, keys=[pubkey]).differences
    assert [d["kind"] for d in diffs] == ["run_stopped"] and "no nan_loss anomaly" in diffs[0]["detail"]
