"""Automatic spike rewind end to end: a poisoned shard, a real spike, a recorded rewind that skips it."""

from __future__ import annotations

import statistics

import pytest
import torch

from trainledger.journal import read_events, verify
from trainledger.training.reference.loop import LoopConfig, run_training
from trainledger.training.checkpoints.rewind import RewindPolicy

BASE = dict(steps=200, ckpt_every=20, keep_last=3, batch_size=16, lr=1e-2)
POLICY = RewindPolicy(lookback_steps=10, skip_batches=30, max_rewinds=2, window_steps=200)


def _kinds(path):
    return [type(e).__struct_config__.tag for e in read_events(path)]


def test_poisoned_shard_is_rewound_and_skipped(tmp_path, signer):
    torch.set_num_threads(1)
    control = run_training(tmp_path / "control", signer=signer, config=LoopConfig(**BASE))
    out = run_training(tmp_path / "run", signer=signer, config=LoopConfig(**BASE, poison_batches=(120, 126)),
                       rewind=POLICY)
    kinds = [k for k in _kinds(tmp_path / "run" / "journal.jsonl") if k in (
        "anomaly_detected", "rewind_decided", "run_resumed", "data_window_skipped", "run_stopped")]
    assert kinds[-3:] == ["rewind_decided", "run_resumed", "data_window_skipped"]
    assert "run_stopped" not in kinds
    decided = next(e for e in read_events(tmp_path / "run" / "journal.jsonl")
                   if type(e).__struct_config__.tag == "rewind_decided")
    assert decided.spike_step == 120 and decided.from_step == 99 and decided.anomaly == "loss_spike"
    # After the rewind the loss stays within 3 robust sigma of the pre-spike trend...
    pre = control["losses"][80:120]
    m = statistics.median(pre)
    sigma = 1.4826 * statistics.median(abs(x - m) for x in pre)
    after = out["losses"][-100:][:20]  # steps 100-119 again, on data past the shard
    assert abs(statistics.median(after) - m) <= 3 * sigma
    assert sum(x > m + 3 * sigma for x in after) <= 1  # noise, not a second spike
    anomalies_after = [e for e in read_events(tmp_path / "run" / "journal.jsonl")
                       if type(e).__struct_config__.tag == "anomaly_detected" and e.seq > decided.seq]
    assert anomalies_after == []
    # ...and the run ends close to a control that never saw the shard.
    assert abs(statistics.fmean(out["losses"][-10:]) - statistics.fmean(control["losses"][-10:])) < 0.1
    assert out["verify"].ok and out["verify"].tail == "closed"


def test_rewind_budget_stops_the_run(tmp_path, signer):
    torch.set_num_threads(1)
    # A long bad shard and a short skip: every rewind lands back in it.
    out = run_training(tmp_path / "run", signer=signer, config=LoopConfig(**BASE, poison_batches=(120, 400)),
                       rewind=RewindPolicy(lookback_steps=10, skip_batches=5, max_rewinds=2, window_steps=200))
    assert out["stopped"].startswith("max_rewinds=2")
    kinds = _kinds(tmp_path / "run" / "journal.jsonl")
    assert kinds.count("rewind_decided") == 2 and "run_stopped" in kinds
    assert verify(tmp_path / "run" / "journal.jsonl", keys=[signer.public], require_closed=True).ok


def test_policy_validates():
    with pytest.raises(ValueError):
        RewindPolicy(max_rewinds=0)
    with pytest.raises(ValueError):
        RewindPolicy(lr_scale=0)


def test_for_run_scales_palm_and_never_undercuts_the_checkpoint_interval():
    big = RewindPolicy.for_run(255_000, ckpt_every=50)
    assert (big.lookback_steps, big.skip_batches) == (100, 350)
    tiny = RewindPolicy.for_run(200, ckpt_every=20)
    assert (tiny.lookback_steps, tiny.skip_batches) == (10, 20)


CRASHING = r"""
import sys, torch
torch.set_num_threads(1)
from trainledger.journal import load_signer
from trainledger.training.reference.loop import LoopConfig, run_training
from trainledger.training.checkpoints.rewind import RewindPolicy
run_training(sys.argv[1], signer=load_signer(sys.argv[2]),
             config=LoopConfig(steps=200, ckpt_every=20, keep_last=3, batch_size=16, lr=1e-2, poison_batches=(120, 400)),
             rewind=RewindPolicy(lookback_steps=10, skip_batches=5, max_rewinds=2, window_steps=200))
"""


def test_rewind_budget_survives_a_crash(tmp_path, keypair):
    """Killed after its first rewind and started again, the run does not get a fresh budget: the rewinds it
    already made are folded from its journal (before, a restart handed out max_rewinds more)."""
    import signal
    import subprocess
    import sys
    import time

    signer, priv, _ = keypair
    run = tmp_path / "run"
    j = run / "journal.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", CRASHING, str(run), str(priv)])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if j.exists() and b'"rewind_decided"' in j.read_bytes():  # durable: sealed and on disk
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait(30)
    before = _kinds(j).count("rewind_decided")
    assert before >= 1
    torch.set_num_threads(1)
    out = run_training(run, signer=signer, config=LoopConfig(**BASE, poison_batches=(120, 400)),
                       rewind=RewindPolicy(lookback_steps=10, skip_batches=5, max_rewinds=2, window_steps=200))
    assert out["stopped"].startswith("max_rewinds=2")
    assert _kinds(j).count("rewind_decided") == 2
    from trainledger.audit import replay

    assert replay(j, keys=[signer.public]).ok
