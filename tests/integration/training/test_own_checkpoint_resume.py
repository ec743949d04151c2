"""Resuming from a checkpoint the user's own code writes, the way nanoGPT does (``ckpt.pt`` loaded before the
optimizer exists): recorded by digest, killed by SIGKILL, checked against its signed record before the user's
``torch.load``, the resume recorded with what the file covers, and a changed byte refused with replay saying so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from trainledger.cli import main
from trainledger.journal import keygen, read_events

SCRIPT = Path(__file__).resolve().parents[2] / "helpers" / "nanogpt_shaped.py"


def _run(out, key, mode, iters, die_at=None):
    args = [sys.executable, str(SCRIPT), str(out), str(key), mode, str(iters)] + ([str(die_at)] if die_at else [])
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


def _tag(ev) -> str:
    return type(ev).__struct_config__.tag


def test_a_sigkill_then_the_users_own_load_resumes_from_the_recorded_file(tmp_path, capsys):
    priv, pub = keygen(tmp_path / "keys")
    out = tmp_path / "out"
    first = _run(out, priv, "scratch", 40, die_at=25)
    assert first.returncode == -9, first.stderr[-2000:]
    second = _run(out, priv, "resume", 40)
    assert second.returncode == 0, second.stderr[-2000:]
    events = list(read_events(out / "journal.jsonl"))
    [resumed] = [ev for ev in events if _tag(ev) == "run_resumed"]
    assert (resumed.from_step, resumed.checkpoint) == (19, "ckpt.pt")
    assert resumed.detail["contents"] == ["model", "optimizer", "counters"]
    assert "rng" in resumed.detail["not_covered"] and "sampler" in resumed.detail["not_covered"]
    at = events.index(resumed)
    before = [ev.step for ev in events[:at] if _tag(ev) == "step_observed"]
    after = [ev.step for ev in events[at:] if _tag(ev) == "step_observed"]
    # steps 20..24 of the killed process are on disk or not (the journal flushes within a second); the steps
    # after the resume are 20..40, redone
    assert before[:20] == list(range(20)) and after == list(range(20, 41))
    assert main(["verify", "--pubkey", str(pub), "--require-closed", str(out / "journal.jsonl")]) == 0
    capsys.readouterr()
    assert main(["replay", "--pubkey", str(pub), str(out / "journal.jsonl")]) == 0
    text = capsys.readouterr().out
    assert "resumed from step 19 (ckpt.pt)" in text and "restarts 1" in text


def test_a_changed_byte_in_the_users_checkpoint_is_refused_before_it_is_loaded(tmp_path, capsys):
    priv, pub = keygen(tmp_path / "keys")
    out = tmp_path / "out"
    assert _run(out, priv, "scratch", 40, die_at=25).returncode == -9
    ck = out / "ckpt.pt"
    b = bytearray(ck.read_bytes())
    b[len(b) // 2] ^= 1
    ck.write_bytes(bytes(b))
    second = _run(out, priv, "resume", 40)
    assert second.returncode == 1
    assert "resume-invalid-digest" in second.stderr and "ckpt.pt" in second.stderr
    assert main(["replay", "--pubkey", str(pub), "--allow-unsealed", str(out / "journal.jsonl")]) == 0
    text = capsys.readouterr().out
    assert "RESUME REJECTED" in text and "resume-invalid-digest" in text
