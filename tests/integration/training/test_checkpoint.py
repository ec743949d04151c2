"""Checkpoints with receipts: resume equivalence in a fresh process, and every way a resume is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainledger.journal import Journal, read_events, verify
from trainledger.training.checkpoints.state import CONTRACT, CheckpointSaved, ResumeRejected, restore_checkpoint, save_checkpoint

HERE = Path(__file__).resolve().parents[2] / "helpers"  # resume_run.py

import resume_run  # noqa: E402


def _run(mode, run_dir, key, out):
    r = subprocess.run([sys.executable, str(HERE / "resume_run.py"), mode, str(run_dir), str(key), str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return torch.load(out, weights_only=False)


def test_resume_in_a_fresh_process_is_bitwise_equal_to_the_control(tmp_path, keypair):
    _, priv, pub = keypair
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    torch.set_num_threads(1)  # as the fresh processes: the control runs here
    model, opt, sched, sampler = resume_run.build()
    control = {"losses": [resume_run.train_step(model, opt, sched, sampler) for _ in range(resume_run.TOTAL)],
               "params": model.state_dict()}
    first = _run("first", run_dir, priv, tmp_path / "first.pt")
    second = _run("resume", run_dir, priv, tmp_path / "second.pt")
    assert first["losses"] + second["losses"] == control["losses"]  # every loss equal
    for k, v in control["params"].items():
        assert torch.equal(v, second["params"][k]), k  # parameters bitwise equal
    r = verify(run_dir / "journal.jsonl", keys=[keypair[0].public], require_closed=True)
    assert r.kinds["checkpoint_saved"] == 1 and r.kinds["run_resumed"] == 1


def _first_half(tmp_path, signer):
    torch.set_num_threads(1)
    run_dir = tmp_path / "run"
    j = Journal.create(run_dir / "journal.jsonl", signer=signer, background=False)
    model, opt, sched, sampler = resume_run.build()
    losses = [resume_run.train_step(model, opt, sched, sampler) for _ in range(resume_run.CUT)]
    ev = save_checkpoint(run_dir, j, step=resume_run.CUT - 1, model=model, optimizer=opt, scheduler=sched,
                         sampler=sampler)
    control = losses + [resume_run.train_step(model, opt, sched, sampler) for _ in range(5)]
    return run_dir, j, ev, control


def _continue(model, opt, sched, sampler, n=5):
    return [resume_run.train_step(model, opt, sched, sampler) for _ in range(n)]


def test_checkpoint_saved_records_the_contract_and_digest(tmp_path, signer):
    run_dir, j, ev, _ = _first_half(tmp_path, signer)
    assert set(ev.contents) == set(CONTRACT) and len(ev.sha256) == 64 and ev.bytes > 0
    assert (run_dir / ev.path).stat().st_size == ev.bytes
    j.close()


def test_restore_without_rng_state_is_rejected_and_diverges(tmp_path, signer):
    run_dir, j, ev, control = _first_half(tmp_path, signer)
    payload = torch.load(run_dir / ev.path, weights_only=False)
    del payload["rng"]
    # What a trainer that saves no RNG state would have written and recorded.
    bad = run_dir / "checkpoints" / "no-rng.pt"
    torch.save(payload, bad)
    from trainledger.training.checkpoints.state import file_sha256

    digest, size = file_sha256(bad)
    j.append(CheckpointSaved(step=ev.step, path="checkpoints/no-rng.pt", bytes=size, sha256=digest,
                             contents=[c for c in ev.contents if c != "rng"], duration_s=0.0), durable=True)
    model, opt, sched, sampler = resume_run.build(seed=5)
    with pytest.raises(ResumeRejected) as ei:
        restore_checkpoint(run_dir, j, "checkpoints/no-rng.pt", model=model, optimizer=opt, scheduler=sched,
                           sampler=sampler)
    assert ei.value.code == "resume-invalid-missing-state" and ei.value.missing == ("rng",)
    # Restoring everything but the RNG by hand: dropout draws differ, the run diverges.
    model.load_state_dict(payload["model"])
    opt.load_state_dict(payload["optimizer"])
    sched.load_state_dict(payload["scheduler"])
    sampler.load_state_dict(payload["sampler"])
    torch.manual_seed(999)
    assert _continue(model, opt, sched, sampler) != control[resume_run.CUT:]
    j.close()
    kinds = [type(e).__struct_config__.tag for e in read_events(run_dir / "journal.jsonl")]
    assert "resume_rejected" in kinds and "run_resumed" not in kinds


def test_weights_only_is_rejected_unless_overridden_and_then_not_a_resume(tmp_path, signer):
    run_dir, j, ev, control = _first_half(tmp_path, signer)
    payload = torch.load(run_dir / ev.path, weights_only=False)
    for k in ("optimizer", "scheduler"):
        payload[k] = None
    wo = run_dir / "checkpoints" / "weights.pt"
    torch.save(payload, wo)
    from trainledger.training.checkpoints.state import file_sha256

    digest, size = file_sha256(wo)
    j.append(CheckpointSaved(step=ev.step, path="checkpoints/weights.pt", bytes=size, sha256=digest,
                             contents=["model", "rng", "sampler", "counters", "accumulation", "manifest_id"],
                             duration_s=0.0), durable=True)
    model, opt, sched, sampler = resume_run.build(seed=5)
    with pytest.raises(ResumeRejected) as ei:
        restore_checkpoint(run_dir, j, "checkpoints/weights.pt", model=model, optimizer=opt, scheduler=sched,
                           sampler=sampler)
    assert ei.value.code == "resume-invalid-missing-state" and set(ei.value.missing) >= {"optimizer", "scheduler"}
    restore_checkpoint(run_dir, j, "checkpoints/weights.pt", model=model, weights_only_override="fine-tune")
    torch.set_rng_state(payload["rng"]["torch"])
    sampler.load_state_dict(payload["sampler"])
    assert _continue(model, opt, sched, sampler) != control[resume_run.CUT:]  # fresh optimizer: another run
    j.close()
    kinds = [type(e).__struct_config__.tag for e in read_events(run_dir / "journal.jsonl")]
    assert kinds.count("weights_restored") == 1 and "run_resumed" not in kinds


def test_changed_file_is_resume_invalid_digest(tmp_path, signer):
    run_dir, j, ev, _ = _first_half(tmp_path, signer)
    data = bytearray((run_dir / ev.path).read_bytes())
    data[len(data) // 2] ^= 1
    (run_dir / ev.path).write_bytes(bytes(data))
    model, opt, sched, sampler = resume_run.build()
    with pytest.raises(ResumeRejected) as ei:
        restore_checkpoint(run_dir, j, ev.path, model=model, optimizer=opt, scheduler=sched, sampler=sampler)
    assert ei.value.code == "resume-invalid-digest"
    j.close()


def test_unrecorded_file_is_resume_invalid_unknown_checkpoint(tmp_path, signer):
    run_dir, j, ev, _ = _first_half(tmp_path, signer)
    other = run_dir / "checkpoints" / "other.pt"
    other.write_bytes((run_dir / ev.path).read_bytes())
    model, opt, sched, sampler = resume_run.build()
    with pytest.raises(ResumeRejected) as ei:
        restore_checkpoint(run_dir, j, "checkpoints/other.pt", model=model, optimizer=opt, scheduler=sched,
                           sampler=sampler)
    assert ei.value.code == "resume-invalid-unknown-checkpoint"
    j.close()
    assert verify(run_dir / "journal.jsonl", keys=[signer.public], require_closed=True).kinds["resume_rejected"] == 1


def test_background_save_records_only_a_durable_file_and_restores(tmp_path, signer):
    from trainledger.training.checkpoints.state import Checkpointer

    torch.set_num_threads(1)
    run_dir = tmp_path / "run"
    j = Journal.create(run_dir / "journal.jsonl", signer=signer, background=False)
    model, opt, sched, sampler = resume_run.build()
    for _ in range(5):
        resume_run.train_step(model, opt, sched, sampler)
    ck = Checkpointer(run_dir, j)
    assert ck.save(step=4, background=True, model=model, optimizer=opt, scheduler=sched, sampler=sampler) is None
    # Training goes on while the file is written; the snapshot was taken before this step.
    after = [resume_run.train_step(model, opt, sched, sampler) for _ in range(3)]
    ev = ck.wait()
    assert ev.background and (run_dir / ev.path).stat().st_size == ev.bytes
    model2, opt2, sched2, sampler2 = resume_run.build(seed=9)
    restore_checkpoint(run_dir, j, ev.path, model=model2, optimizer=opt2, scheduler=sched2, sampler=sampler2)
    assert [resume_run.train_step(model2, opt2, sched2, sampler2) for _ in range(3)] == after
    j.close()


def test_failed_background_save_is_an_event_and_an_error_on_the_next_call(tmp_path, signer):
    from trainledger.training.checkpoints.state import BackgroundSaveError, Checkpointer

    run_dir = tmp_path / "run"
    j = Journal.create(run_dir / "journal.jsonl", signer=signer, background=False)
    (run_dir / "checkpoints").write_text("not a directory")  # the write will fail
    model, opt, sched, sampler = resume_run.build()
    ck = Checkpointer(run_dir, j)
    ck.save(step=0, background=True, model=model, optimizer=opt, scheduler=sched, sampler=sampler)
    with pytest.raises(BackgroundSaveError):
        ck.save(step=1, background=True, model=model, optimizer=opt, scheduler=sched, sampler=sampler)
    j.close()
    kinds = [type(e).__struct_config__.tag for e in read_events(run_dir / "journal.jsonl")]
    assert "checkpoint_failed" in kinds and "checkpoint_saved" not in kinds
