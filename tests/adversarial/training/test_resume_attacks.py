"""Nothing in a run folder can make a resume run code or touch files outside the folder.

The attacker can write the run folder (append to the journal, drop files) but does not hold the key.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch
from journal_tools import dump, read_lines, rechain, write_lines

from trainledger.journal import Journal, UnsafePath, read_events, verify
from trainledger.training.kinds import CheckpointSaved
from trainledger.training.checkpoints.state import ResumeRejected, enforce_retention, live_checkpoints, restore_checkpoint
from trainledger.training.reference.loop import LoopConfig, run_training
from trainledger.training.reference.model import build_causal_lm

CFG = LoopConfig(steps=12, ckpt_every=4, keep_last=2)


class _Boom:
    """Unpickling this creates the marker file: what a hostile checkpoint would do instead."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _evil_checkpoint(run: Path, marker: Path, name: str = "step-000000999.pt") -> tuple[str, str]:
    rel = f"checkpoints/{name}"
    torch.save({"format": "trainledger-checkpoint/2", "model": _Boom(str(marker))}, run / rel)
    return rel, hashlib.sha256((run / rel).read_bytes()).hexdigest()


def _checkpoint_line(rel: str, digest: str, step: int) -> bytes:
    return dump({"kind": "checkpoint_saved", "step": step, "path": rel, "bytes": 1, "sha256": digest,
                 "contents": ["model", "optimizer", "scheduler", "scaler", "rng", "sampler", "counters",
                              "accumulation", "manifest_id"], "duration_s": 0.1, "seq": 0, "ts": 1, "h": "0" * 64})


def test_unsealed_checkpoint_record_cannot_run_a_pickle_at_resume(tmp_path, signer, pubkey):
    torch.set_num_threads(1)
    run = tmp_path / "run"
    run_training(run, signer=signer, config=CFG, stop_after=6)  # checkpoint at step 3, then a preemption
    marker = tmp_path / "pwned"
    rel, digest = _evil_checkpoint(run, marker)
    jpath = run / "journal.jsonl"
    write_lines(jpath, rechain(read_lines(jpath) + [_checkpoint_line(rel, digest, 999)]))  # chained, not sealed
    out = run_training(run, signer=signer, config=CFG)
    assert not marker.exists()
    resumed = [e for e in read_events(jpath) if type(e).__struct_config__.tag == "run_resumed"]
    assert [e.checkpoint for e in resumed] == ["checkpoints/step-000000003.pt"]  # the signed one
    assert out["verify"].tail == "closed" and out["verify"].unsealed_events == 0


def test_signed_record_of_a_pickle_is_loaded_without_running_it(tmp_path, signer):
    """Even a checkpoint whose digest matches a signed record is loaded with weights_only=True."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    marker = tmp_path / "pwned"
    rel, digest = _evil_checkpoint(run, marker)
    model = build_causal_lm(vocab=8, d_model=8, n_layer=1, n_head=1, block=4)
    with Journal.create(run / "journal.jsonl", signer=signer, background=False) as j:
        j.append(CheckpointSaved(step=1, path=rel, bytes=1, sha256=digest, contents=[], duration_s=0.0),
                 durable=True)
        with pytest.raises(ResumeRejected) as ei:
            restore_checkpoint(run, j, rel, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert ei.value.code == "resume-invalid-format" and not marker.exists()


def test_checkpoint_path_escaping_the_run_folder_is_refused(tmp_path, signer):
    run = tmp_path / "run"
    run.mkdir()
    victim = tmp_path / "victim.pt"
    victim.write_bytes(b"precious")
    digest = hashlib.sha256(b"precious").hexdigest()
    with Journal.create(run / "journal.jsonl", signer=signer, background=False) as j:
        for path in ("../victim.pt", str(victim)):
            ev = CheckpointSaved(step=1, path=path, bytes=8, sha256=digest, contents=[], duration_s=0.0)
            j.append(ev, durable=True)
            with pytest.raises(UnsafePath):
                live_checkpoints(run, [ev])
            with pytest.raises(UnsafePath):
                enforce_retention(run, j, [ev], keep_last=0)
            model = build_causal_lm(vocab=8, d_model=8, n_layer=1, n_head=1, block=4)
            with pytest.raises(ResumeRejected) as ei:
                restore_checkpoint(run, j, path, model=model)
            assert ei.value.code == "resume-invalid-path"
    assert victim.read_bytes() == b"precious"


def test_link_inside_the_run_folder_leading_out_is_refused(tmp_path, signer):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    victim = tmp_path / "victim.pt"
    victim.write_bytes(b"precious")
    os.symlink(victim, run / "checkpoints" / "step-000000001.pt")
    ev = CheckpointSaved(step=1, path="checkpoints/step-000000001.pt", bytes=8, sha256="0" * 64, contents=[],
                         duration_s=0.0)
    with Journal.create(run / "journal.jsonl", signer=signer, background=False) as j:
        with pytest.raises(UnsafePath):
            enforce_retention(run, j, [ev], keep_last=0)
    assert victim.exists()


def test_unsigned_journal_cannot_drive_a_restore(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    model = build_causal_lm(vocab=8, d_model=8, n_layer=1, n_head=1, block=4)
    with Journal.create(run / "journal.jsonl", signer=None, background=False) as j:
        with pytest.raises(ResumeRejected) as ei:
            restore_checkpoint(run, j, "checkpoints/x.pt", model=model)
    assert ei.value.code == "resume-invalid-unsigned"
    assert verify(run / "journal.jsonl", allow_unsigned=True).kinds["resume_rejected"] == 1


def test_checkpoints_folder_linked_outside_is_refused_before_writing(tmp_path, signer):
    from trainledger.training.checkpoints.state import save_checkpoint

    run = tmp_path / "run"
    run.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, run / "checkpoints")
    model = build_causal_lm(vocab=8, d_model=8, n_layer=1, n_head=1, block=4)
    with Journal.create(run / "journal.jsonl", signer=signer, background=False) as j:
        with pytest.raises(UnsafePath):
            save_checkpoint(run, j, step=0, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert list(outside.iterdir()) == []
