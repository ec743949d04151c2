"""The compute statement (journal/statements/compute, docs/compute.md): thresholds crossed at the exact step, on the C fold and
the Python one; every figure recomputed by replay and by verify-proof from the statement alone; a doctored
compute_totaled, a doctored or missing threshold event, a dropped rank, a run counted twice, a continued run whose
predecessor is missing and an energy counter reset each named; a fine-tune against a third of its base model."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from trainledger.audit import replay
from trainledger.cli import main
from trainledger.journal import Journal, Signer, StepObserved
from trainledger.journal.errors import IntegrityError
from trainledger.training.kinds import ComputeThresholdCrossed, ComputeTotaled, RunConfigured
from trainledger.journal.kinds import ModelExported
from trainledger.journal.statements.release.manifest import FileDigest, root_digest
from trainledger.journal.statements.compute.figures import run_figures
from trainledger.journal.statements.compute.render import as_html, as_markdown
from trainledger.audit import compute_statement as build_statement
from trainledger.journal.statements.compute.statement import check_statement
from trainledger.training.health.mfu import record_compute
from trainledger.training.health.monitor import TrainingHealthMonitor
from trainledger.training.health.flops import FlopConfig

from tests.helpers.compute_runs import FPT, OPTS, TOKENS, write_journal, write_run_folder


def _pub(tmp_path, signer):
    p = tmp_path / "k.pub"
    p.write_text(signer.public.line() + "\n")
    return str(p)


# -- the threshold step ---------------------------------------------------------------------------------------------

#: a frontier-sized shape: 6N + 12LHQT FLOPs a token, and a synthetic step of 800M tokens (a whole fleet's step
#: seen as one journal), so that 1e23 is a few hundred steps away
BIG = FlopConfig(n_params=70_000_000_000, n_layer=80, n_head=64, head_dim=128, seq_len=8192)
BIG_FPT = 6 * 70_000_000_000 + 12 * 80 * 64 * 128 * 8192
BIG_TOKENS = 800_000_000


def _first_step_reaching(flops: float, per_step: int, carried: float = 0.0) -> int:
    """The step (from 0) at which k+1 steps of ``per_step`` FLOPs, plus ``carried``, first reach ``flops``: integer
    arithmetic, independent of the fold."""
    k = 0
    while float((k + 1) * per_step) + carried < flops:
        k += 1
    return k


@pytest.mark.parametrize("accel", ["c", "python"])
def test_a_synthetic_run_crosses_1e23_at_the_known_step_and_replay_recomputes_it(tmp_path, accel):
    want = _first_step_reaching(1e23, BIG_FPT * BIG_TOKENS)
    assert 100 < want < 400  # a step deep in a run of common steps: the C fold finds it inside a batch
    s = Signer.generate()
    p = tmp_path / "big.jsonl"
    with Journal.create(p, signer=s, run_id="big", **OPTS) as j:
        m = TrainingHealthMonitor(journal=j, flop_config=BIG, peak_flops_per_sec=989e12, peak_source="datasheet",
                                  devices=1024, device_kind="NVIDIA H100 80GB HBM3")
        for step in range(500):
            m.observe_step(step, 2.0 - 1e-4 * step, grad_norm=1.0, step_time_s=1.0, tokens=BIG_TOKENS)
        record_compute(j)
    crossed = [json.loads(x) for x in p.read_text().splitlines() if '"compute_threshold_crossed"' in x]
    assert [(c["name"], c["step"]) for c in crossed] == [("gpai", want)]
    assert crossed[0]["flops"] == float((want + 1) * BIG_FPT * BIG_TOKENS)
    env = dict(os.environ, TRAINLEDGER_NO_ACCEL="1") if accel == "python" else dict(os.environ)
    env.pop("TRAINLEDGER_NO_ACCEL", None) if accel == "c" else None
    code = ("import sys; from trainledger.audit import replay; from trainledger.journal import load_public_key; "
            "r = replay(sys.argv[1], keys=[load_public_key(sys.argv[2])]); "
            "print(r.ok, r.differences, r.compute['flops'])")
    out = subprocess.run([sys.executable, "-c", code, str(p), _pub(tmp_path, s)], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith("True []"), out
    assert float(out.split()[-1]) == float(500 * BIG_FPT * BIG_TOKENS)


def test_carried_compute_counts_toward_the_thresholds(tmp_path):
    s = Signer.generate()
    p = tmp_path / "cont.jsonl"
    carried = 9.95e24
    with Journal.create(p, signer=s, run_id="cont", **OPTS) as j:
        m = TrainingHealthMonitor(journal=j, flop_config=BIG, peak_flops_per_sec=989e12, carried_flops=carried)
        for step in range(200):
            m.observe_step(step, 2.0, grad_norm=1.0, step_time_s=1.0, tokens=BIG_TOKENS)
        record_compute(j)
    got = {c.name: c for c in _crossings(p)}
    assert got["gpai"].step == 0 and got["gpai"].carried_flops == carried  # the carried compute is past it already
    assert got["systemic-risk"].step == _first_step_reaching(1e25, BIG_FPT * BIG_TOKENS, carried)
    assert replay(p, keys=[s.public]).ok


def _crossings(p):
    from trainledger.journal import read_events

    return [e for e in read_events(p) if isinstance(e, ComputeThresholdCrossed)]


def test_a_doctored_or_missing_threshold_event_is_named_by_replay(tmp_path):
    s = Signer.generate()
    cfg = RunConfigured(n_params=1_000_000, n_layer=2, n_head=4, head_dim=16, seq_len=64,
                        compute_thresholds={"small": 5 * FPT * TOKENS})
    p, q = tmp_path / "doctored.jsonl", tmp_path / "missing.jsonl"
    for path, record in ((p, True), (q, False)):
        with Journal.create(path, signer=s, run_id="t", **OPTS) as j:  # signed by the key: written, not tampered
            j.append(cfg)
            for step in range(10):
                j.append(StepObserved(step=step, loss=2.0, tokens=TOKENS))
            if record:
                j.append(ComputeThresholdCrossed(name="small", threshold=5.0 * FPT * TOKENS, step=7,
                                                 flops=8.0 * FPT * TOKENS))
    diffs = replay(p, keys=[s.public]).differences
    assert [d["kind"] for d in diffs] == ["compute_threshold_crossed"]
    assert "crossed at step 7" in diffs[0]["detail"] and "at step 4" in diffs[0]["detail"]
    diffs = replay(q, keys=[s.public]).differences
    assert len(diffs) == 1 and "at step 4, which was not recorded" in diffs[0]["detail"]


# -- the statement --------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_rank_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    issuer = Signer.generate()
    run = write_run_folder(d / "pretrain", issuer, run="pretrain-1", world=2, steps=40)
    (d / "k.pub").write_text(issuer.public.line() + "\n")
    return run, issuer, d / "k.pub"


def test_the_statement_of_a_run_folder_holds_offline_and_every_figure_is_its_proven_events(two_rank_run, tmp_path):
    run, issuer, pub = two_rank_run
    out = tmp_path / "statement.json"
    assert main(["compute", str(run), "--pubkey", str(pub), "--out", str(out)]) == 0
    st = json.loads(out.read_text())
    f = st["figures"]
    assert f["model_flops"] == float(2 * 40 * TOKENS * FPT)  # both ranks' tokens, every step
    assert f["tokens"] == 2 * 40 * TOKENS and f["devices"] == 2 and st["findings"] == []
    r = st["runs"][0]["figures"]
    assert r["device_kinds"] == ["Test GPU"] and r["peaks"][0]["peak_source"] == "given"
    # the hardware figure: devices x peak x time in steps (40 steps of 2 ms on each rank at 1e12 FLOP/s)
    assert r["hardware_flops"] == pytest.approx(2 * 1e12 * 40 * 0.002)
    # energy: the counter rose 1 MJ... 1,000,000 mJ between samples 10 steps apart: 3 kJ a rank; coverage < 1
    assert r["energy"]["measured_j"] == 2 * 3 * 1000.0 and 0 < r["energy"]["coverage"] <= 1
    # each figure is what replay recomputes from the steps
    for j in st["runs"][0]["journals"]:
        rec = replay(j["path"], keys=[issuer.public])
        assert rec.ok and {k: v for k, v in rec.compute.items() if k != "kind"} == \
            {k: v for k, v in j["compute"].items() if k != "kind"}
    res = check_statement(out.read_bytes(), [issuer.public])
    assert res.journals == 2 and res.figures == f
    assert main(["verify-proof", str(out), "--pubkey", str(pub)]) == 0


def _tampered(tmp_path, st, change):
    st = json.loads(json.dumps(st))
    change(st)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(st))
    return p


def test_a_statement_changed_in_any_figure_or_proof_fails_verify_proof(two_rank_run, tmp_path, capsys):
    run, issuer, pub = two_rank_run
    st = build_statement([run], [issuer.public])

    def figure(s):
        s["figures"]["model_flops"] *= 0.5  # under-reporting the model's compute

    def run_figure(s):
        s["runs"][0]["figures"]["energy"]["total_j"] = 1.0

    def compute(s):
        s["runs"][0]["journals"][1]["compute"]["tokens"] = 1

    def dropped(s):
        del s["runs"][0]["journals"][1]

    def line(s):
        b = s["runs"][0]["journals"][0]["bundle"]
        [e] = [e for e in b["entries"] if '"compute_totaled"' in e["line"]]
        e["line"] = e["line"].replace('"tokens":', '"tokens":1')

    for change, said in ((figure, "model's figure model_flops stated"), (run_figure, "figure energy.total_j stated"),
                         (compute, "compute stated"),
                         (dropped, "journal(s) for a world of 2"), (line, "rank 0")):
        bad = _tampered(tmp_path, st, change)
        with pytest.raises(IntegrityError, match=said.replace("(", r"\(").replace(")", r"\)")):
            check_statement(bad.read_bytes(), [issuer.public])
        assert main(["verify-proof", str(bad), "--pubkey", str(pub)]) == 1
        assert capsys.readouterr().out.startswith("FAIL")
    with pytest.raises(IntegrityError, match="not pinned"):
        check_statement(json.dumps(st).encode(), [Signer.generate().public])


def test_a_dropped_rank_and_a_run_counted_twice_are_named(two_rank_run, tmp_path, capsys):
    run, issuer, pub = two_rank_run
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in run.iterdir():
        if f.suffix == ".jsonl":
            (copy / f.name).write_bytes(f.read_bytes())
    st = build_statement([run, copy], [issuer.public])
    assert len(st["runs"]) == 1 and st["figures"]["model_flops"] == float(2 * 40 * TOKENS * FPT)
    assert any("counted twice" in x and str(copy) in x for x in st["findings"])
    (copy / "rank-00001.jsonl").unlink()
    assert main(["compute", str(copy), "--pubkey", str(pub)]) == 1
    out = capsys.readouterr().out
    assert "FINDING" in out and "rank 1" in out


def test_a_doctored_compute_totaled_is_a_finding(tmp_path, capsys):
    s = Signer.generate()
    p = write_journal(tmp_path / "a.jsonl", s, run_id="a", steps=30)
    lines = p.read_text()
    q = tmp_path / "b.jsonl"
    with Journal.create(q, signer=s, run_id="b", **OPTS) as j:  # a signed journal whose total under-reports
        TrainingHealthMonitor(journal=j, flop_config=FlopConfig(n_params=1_000_000, n_layer=2, n_head=4, head_dim=16,
                                                                seq_len=64))
        for step in range(30):
            j.append(StepObserved(step=step, loss=2.0, tokens=TOKENS))
        j.append(ComputeTotaled(steps=30, tokens=30 * TOKENS, flops=1.0, last_step=29), durable=True)
    assert "compute_totaled" in lines
    code = main(["compute", str(q), "--pubkey", _pub(tmp_path, s)])
    out = capsys.readouterr().out
    assert code == 1 and "FINDING" in out and "compute_totaled" in out and "recorded flops 1.0" in out


def test_an_energy_counter_reset_is_named_and_left_out_of_the_measured_energy(tmp_path):
    s = Signer.generate()
    # samples every 10 steps: 0, 1, 2 J ... then the counter falls to 0.5 J (a reset), and rises again
    p = write_journal(tmp_path / "e.jsonl", s, run_id="e", steps=60, energy=[0, 1000, 2000, 500, 1500, 2500])
    st = build_statement([p], [s.public])
    e = st["runs"][0]["figures"]["energy"]
    assert e["counter_resets"] == 1 and e["measured_j"] == 4.0  # 1 + 1 + (reset: none) + 1 + 1
    assert e["power_estimate_j"] is not None  # the reset interval: estimated from its power samples, labelled
    assert any("energy counter fell 1 time" in n for n in st["notes"])


def _export(j, digest_seed: str, base: str | None = None) -> str:
    files = [{"file": "model.safetensors", "bytes": 10, "sha256": hashlib.sha256(digest_seed.encode()).hexdigest()}]
    digest = root_digest(FileDigest(f["file"], f["bytes"], f["sha256"]) for f in files)
    j.append(ModelExported(path="export", digest=digest, files=files, base=base), durable=True)
    return digest


def test_a_fine_tune_past_a_third_of_its_base_models_compute(tmp_path, capsys):
    s = Signer.generate()
    base_steps, tune_steps = 90, 40  # the fine-tune's 40 steps are more than a third of 90
    with Journal.create(tmp_path / "base.jsonl", signer=s, run_id="base", **OPTS) as j:
        TrainingHealthMonitor(journal=j, flop_config=FlopConfig(n_params=1_000_000, n_layer=2, n_head=4, head_dim=16,
                                                                seq_len=64))
        for step in range(base_steps):
            j.append(StepObserved(step=step, loss=2.0, tokens=TOKENS, step_time_s=0.01))
        digest = _export(j, "base weights")
        record_compute(j)
    third = base_steps * TOKENS * FPT / 3
    with Journal.create(tmp_path / "tune.jsonl", signer=s, run_id="tune", **OPTS) as j:
        m = TrainingHealthMonitor(journal=j, flop_config=FlopConfig(n_params=1_000_000, n_layer=2, n_head=4,
                                                                    head_dim=16, seq_len=64),
                                  compute_thresholds={"third-of-base": third})
        for step in range(tune_steps):
            m.observe_step(step, 2.0, grad_norm=1.0, step_time_s=0.01, tokens=TOKENS)
        _export(j, "tuned weights", base=digest)
        record_compute(j)
    (tmp_path / "k.pub").write_text(s.public.line() + "\n")
    st = build_statement([tmp_path / "base.jsonl", tmp_path / "tune.jsonl"], [s.public])
    assert st["findings"] == []
    ft = st["figures"]["fine_tunes"]
    assert ft == [{"run": "tune", "base_run": "base", "flops": float(tune_steps * TOKENS * FPT),
                   "base_flops": float(base_steps * TOKENS * FPT), "third_of_base": third, "exceeds_third": True}]
    crossed = st["runs"][1]["journals"][0]["crossings"]
    assert [(c["name"], c["step"]) for c in crossed] == [("third-of-base", _first_step_reaching(third, TOKENS * FPT))]
    out = tmp_path / "st.json"
    out.write_text(json.dumps(st))
    assert check_statement(out.read_bytes(), [s.public]).runs == 2
    md, page = as_markdown(st), as_html(st)
    assert "exceeds a third of its base model's compute" in md and "third-of-base" in page
    assert f"model sha256:{digest} (its last model_exported)" in md  # the statement names the model it is of
    # the fine-tune alone: its base is named as not in the statement (a note, not a finding)
    st = build_statement([tmp_path / "tune.jsonl"], [s.public])
    assert st["findings"] == [] and any("not trained by a run in this statement" in n for n in st["notes"])


def test_a_continued_run_whose_predecessor_is_missing_is_a_gap(tmp_path):
    from trainledger.journal import RunResumed

    s = Signer.generate()
    with Journal.create(tmp_path / "second.jsonl", signer=s, run_id="second", **OPTS) as j:
        j.append(RunResumed(reason="continued", from_step=99, checkpoint="c.pt",
                            detail={"continues": {"run_id": "first", "folder": "first"}}), durable=True)
        TrainingHealthMonitor(journal=j)
        for step in range(100, 110):
            j.append(StepObserved(step=step, loss=2.0, tokens=TOKENS))
        record_compute(j)
    st = build_statement([tmp_path / "second.jsonl"], [s.public])
    assert any("continues run first, which is not in the statement: a gap" in x for x in st["findings"])


def test_the_figures_are_one_function_of_the_events(tmp_path):
    """run_figures sums ranks in order, and a journal before format 1.7 (model FLOPs only) still adds up."""
    old = {"compute": {"steps": 10, "tokens": 100, "flops": 5.0}}
    f = run_figures([old, old])
    assert f["model_flops"] == 10.0 and f["hardware_flops"] is None and f["energy"]["total_j"] is None


def test_compute_needs_a_pinned_key_and_names_a_bad_path(tmp_path, capsys):
    assert main(["compute", str(tmp_path / "nothing")]) == 2
    assert "no key pinned" in capsys.readouterr().err


@pytest.mark.parametrize("field, lie", [("crossed", []), ("thresholds", {"small": 1e30}), ("carried_flops", 9e30)])
def test_a_total_whose_18_fields_lie_is_named_by_replay(tmp_path, field, lie):
    """Format 1.8's thresholds, carry and crossings are derived: a total signed by the run's key that drops the
    crossing (the statement would then need none), moves a threshold or inflates the carry is a difference."""
    import msgspec

    from trainledger.journal import read_signed_events
    from trainledger.training.health.mfu import ComputeTotals

    s = Signer.generate()
    p = tmp_path / "lie.jsonl"
    cfg = RunConfigured(n_params=1_000_000, n_layer=2, n_head=4, head_dim=16, seq_len=64,
                        compute_thresholds={"small": 5 * FPT * TOKENS})
    with Journal.create(p, signer=s, run_id="lie", **OPTS) as j:
        m = TrainingHealthMonitor(journal=j, flop_config=FlopConfig(n_params=1_000_000, n_layer=2, n_head=4,
                                                                    head_dim=16, seq_len=64),
                                  compute_thresholds=cfg.compute_thresholds)
        for step in range(10):
            m.observe_step(step, 2.0, grad_norm=1.0, step_time_s=0.01, tokens=TOKENS)
        j.seal(durable=True, signed=True)
        honest = ComputeTotals().fold(read_signed_events(p, [s.public])).event()
        assert honest.crossed == ["small"]
        fields = {k: v for k, v in msgspec.to_builtins(honest).items() if k not in ("kind", "seq", "ts", "h")}
        j.append(ComputeTotaled(**{**fields, field: lie}), durable=True)
    diffs = replay(p, keys=[s.public]).differences
    assert [d["kind"] for d in diffs] == ["compute_totaled"] and f"recorded {field} " in diffs[0]["detail"]
