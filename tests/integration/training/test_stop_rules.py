"""Every stop rule fires on a real run built to break it, with run_stopped naming the rule and the number."""

from __future__ import annotations

from manifest_fixtures import short, typed, write

from trainledger.journal import read_events, verify
from trainledger.training.kinds import CheckpointSelected, EvaluationRecorded, ResourceRecorded, RunStopped
from trainledger.training.experiment.loop import Runtime, run_experiment


def _stop(path):
    return [e for e in read_events(path) if isinstance(e, RunStopped)]


def _run(tmp_path, signer, d=None, runtime=Runtime(), name="run", **kw):
    d = d or short()
    write(tmp_path, d)
    return run_experiment(typed(d), tmp_path, tmp_path / name, signer=signer, runtime=runtime, **kw)


def _assert_stopped(tmp_path, signer, out, rule, name="run"):
    assert out["stopped"] == rule, out.get("reason")
    ev = _stop(tmp_path / name / "journal.jsonl")
    assert [e.rule for e in ev] == [rule]
    verify(tmp_path / name / "journal.jsonl", keys=[signer.public], require_closed=True)
    return ev[0]


def test_a_clean_run_evaluates_selects_and_records_resources(tmp_path, signer):
    out = _run(tmp_path, signer)
    assert out["stopped"] is None and out["selected"]["candidates"] == 3
    evs = list(read_events(tmp_path / "run" / "journal.jsonl"))
    evals = [e for e in evs if isinstance(e, EvaluationRecorded)]
    assert {e.hook for e in evals} == {"heldout", "retention"}
    for e in evals:  # bound to the checkpoint, raw cases stored by digest
        blob = (tmp_path / "run" / e.cases_path).read_bytes()
        import hashlib
        assert hashlib.sha256(blob).hexdigest() == e.cases_sha256 and e.checkpoint_sha256 in blob.decode()
    sel = next(e for e in evs if isinstance(e, CheckpointSelected))
    heldout = [e for e in evals if e.hook == "heldout"]
    assert sel.value == min(e.metrics["loss"] for e in heldout)
    res = [e for e in evs if isinstance(e, ResourceRecorded)]
    assert [r.updates for r in res] == [10, 20, 30, 40, 50, 60] and res[-1].examples == 60 * 16
    assert res[-1].tokens == 60 * 16 * 16 and res[-1].checkpoint_bytes > 0 and res[-1].peak_rss_bytes > 0


def test_identity_mismatch_template_changed(tmp_path, signer):
    d = short()
    write(tmp_path, d)
    (tmp_path / "template.json").write_text('{"type": "chatml"}')
    out = run_experiment(typed(d), tmp_path, tmp_path / "run", signer=signer)
    e = _assert_stopped(tmp_path, signer, out, "identity-mismatch")
    assert "template.json has digest" in e.reason


def test_identity_mismatch_resumed_under_another_manifest(tmp_path, signer):
    _run(tmp_path, signer, stop_after=5)
    d = short()
    d["optimization"]["lr"] = 1e-3
    out = run_experiment(typed(d), tmp_path, tmp_path / "run", signer=signer)
    _assert_stopped(tmp_path, signer, out, "identity-mismatch")


def test_protected_data_access(tmp_path, signer):
    out = _run(tmp_path, signer, runtime=Runtime(train_artifacts=("train", "heldout")))
    e = _assert_stopped(tmp_path, signer, out, "protected-data-access")
    assert "heldout" in e.reason


def test_non_finite_loss(tmp_path, signer):
    d = short()
    d["optimization"]["clip_grad_norm"] = None
    out = _run(tmp_path, signer, d, runtime=Runtime(lr=1e12))
    e = _assert_stopped(tmp_path, signer, out, "non-finite-loss")
    assert e.value != e.value or abs(e.value) == float("inf")


def test_unexpected_effective_batch(tmp_path, signer):
    out = _run(tmp_path, signer, runtime=Runtime(accumulation=8))
    e = _assert_stopped(tmp_path, signer, out, "effective-batch")
    assert (e.value, e.limit) == (32, 16)


def test_budget_breach(tmp_path, signer):
    d = short()
    d["budget"]["max_tokens"] = 16 * 16 * 12
    out = _run(tmp_path, signer, d)
    e = _assert_stopped(tmp_path, signer, out, "budget-breach")
    assert e.value == 16 * 16 * 12 and e.limit == 16 * 16 * 12


def test_invalid_checkpoint(tmp_path, signer):
    _run(tmp_path, signer, stop_after=15)
    ck = sorted((tmp_path / "run" / "checkpoints").iterdir())[-1]
    data = bytearray(ck.read_bytes())
    data[len(data) // 2] ^= 0xFF
    ck.write_bytes(bytes(data))
    out = _run(tmp_path, signer)
    e = _assert_stopped(tmp_path, signer, out, "invalid-checkpoint")
    assert "resume-invalid-digest" in e.reason


def test_resume_divergence(tmp_path, signer):
    _run(tmp_path, signer, stop_after=15)  # checkpoint after update 10; updates 10-14 recorded
    out = _run(tmp_path, signer, runtime=Runtime(reseed_sampler_on_resume=12345))
    e = _assert_stopped(tmp_path, signer, out, "resume-divergence")
    assert e.value > 1e-6 and "update 10" in e.reason


def test_a_faithful_resume_does_not_diverge(tmp_path, signer):
    _run(tmp_path, signer, stop_after=15)
    assert _run(tmp_path, signer)["stopped"] is None


def test_target_futility(tmp_path, signer):
    d = short()
    d["question"]["futility"]["threshold"] = 0.5  # heldout loss <= 0.5 nats by update 40: not on this source
    out = _run(tmp_path, signer, d)
    e = _assert_stopped(tmp_path, signer, out, "target-futility")
    assert e.limit == 0.5 and e.value > 0.5


def test_forbidden_regression(tmp_path, signer):
    d = short()
    d["evaluation"]["hooks"][1]["forbidden_regression"] = 0.0  # retention may not get worse at all
    d["evaluation"]["hooks"][1]["every_updates"] = 10
    d["optimization"]["lr"] = 3e-2  # specialise hard on the training distribution
    out = _run(tmp_path, signer, d)
    e = _assert_stopped(tmp_path, signer, out, "forbidden-regression")
    assert e.value > 0.0 and e.limit == 0.0
