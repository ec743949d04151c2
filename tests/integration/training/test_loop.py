"""The reference loop: checkpoints, retention with receipts, and SIGKILL then come back, bitwise equal."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from trainledger.journal import read_events, verify
from trainledger.training.reference.loop import LoopConfig, run_training

CFG = LoopConfig(steps=40, ckpt_every=5, keep_last=2)
CHILD = r"""
import sys, torch
torch.set_num_threads(1)
from trainledger.journal import load_signer
from trainledger.training.reference.loop import LoopConfig, run_training
out = run_training(sys.argv[1], signer=load_signer(sys.argv[2]), config=LoopConfig(steps=40, ckpt_every=5, keep_last=2))
torch.save({"params": out["params"]}, sys.argv[3])
"""


def _kinds(path):
    return [type(e).__struct_config__.tag for e in read_events(path)]


def test_retention_records_every_deletion(tmp_path, signer):
    torch.set_num_threads(1)
    out = run_training(tmp_path / "run", signer=signer, config=LoopConfig(steps=20, ckpt_every=5, keep_last=2))
    kinds = _kinds(tmp_path / "run" / "journal.jsonl")
    assert kinds.count("checkpoint_saved") == 4 and kinds.count("checkpoint_deleted") == 2
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == [
        "step-000000014.pt", "step-000000019.pt"]
    assert out["verify"].tail == "closed"


def test_stop_and_resume_in_process_matches_a_straight_run(tmp_path, signer):
    torch.set_num_threads(1)
    cfg = LoopConfig(steps=30, ckpt_every=5, keep_last=2)
    straight = run_training(tmp_path / "a", signer=signer, config=cfg)
    run_training(tmp_path / "b", signer=signer, config=cfg, stop_after=12)  # stops at step 12; last ckpt: 9
    resumed = run_training(tmp_path / "b", signer=signer, config=cfg)
    for k, v in straight["params"].items():
        assert torch.equal(v, resumed["params"][k]), k
    assert resumed["report"]["restarts"]["count"] == 1 and resumed["report"]["restarts"]["continuity_ok"]
    assert _kinds(tmp_path / "b" / "journal.jsonl").count("run_resumed") == 1


def test_sigkill_mid_run_then_resume_is_bitwise_equal(tmp_path, keypair):
    _, priv, _ = keypair
    torch.set_num_threads(1)  # as the children: the control runs here, in this process
    control = run_training(tmp_path / "control", signer=keypair[0], config=CFG)
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(run), str(priv), str(tmp_path / "x.pt")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    jpath = run / "journal.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:  # kill once two checkpoints are recorded
        if jpath.exists() and jpath.read_bytes().count(b'"kind":"checkpoint_saved"') >= 2:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    r = subprocess.run([sys.executable, "-c", CHILD, str(run), str(priv), str(tmp_path / "r.pt")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    a, b = control["params"], torch.load(tmp_path / "r.pt")["params"]
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rep = verify(jpath, keys=[keypair[0].public], require_closed=True)
    assert rep.kinds["run_resumed"] == 1
    assert Path(run / "checkpoints").exists()
