"""Stragglers under the README's torchrun lines: the Recorder times each rank's own compute (the DDP model's
communication hook: its last gradient bucket ready, before the all-reduce waits on the other rank), journals it as
``compute_time_s`` beside the step's wall time, and scores the ranks in straggler windows. A rank whose compute
takes 1.3x its peer's is flagged in the first two windows; a balanced job is flagged in none; tokens/s stays the
step's; replay recomputes every window from the ranks' journals. Real torchrun, gloo, two processes; the compute is
a sleep, so the verdicts do not depend on the machine's load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from torchrun_tools import free_port, kind

from trainledger.cli import main
from trainledger.journal import keygen, read_events

WORKER = Path(__file__).resolve().parents[2] / "helpers" / "recorder_ddp_worker.py"


def _job(tmp_path, name: str, slow_x: float, priv) -> Path:
    run = tmp_path / name
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TORCHELASTIC_RUN_ID", None)
    env.pop("TRAINLEDGER_RUN", None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           "--master-addr=127.0.0.1", f"--master-port={free_port()}", "--rdzv-id", name,
                           str(WORKER), str(run), str(priv), "40", "-", "10", str(slow_x)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    return keygen(tmp_path_factory.mktemp("keys") / "k")


def test_a_rank_with_30_percent_more_compute_is_flagged_within_two_windows(tmp_path, keys, capsys):
    priv, pub = keys
    run = _job(tmp_path, "slow", 1.3, priv)
    rank0 = list(read_events(run / "rank-00000.jsonl"))
    rank1 = list(read_events(run / "rank-00001.jsonl"))
    scores = [ev for ev in rank0 if kind(ev) == "straggler_scores"]
    flagged = [ev for ev in rank0 if kind(ev) == "straggler_detected"]
    assert len(scores) == 4, [(s.window_start, s.window_end) for s in scores]  # 40 steps, windows of 10
    assert flagged and flagged[0].rank == 1 and flagged[0].window_end <= scores[1].window_end
    assert all(s.scores["1"] < 0.8 < s.scores["0"] for s in scores), [s.scores for s in scores]
    steps1 = [ev for ev in rank1 if kind(ev) == "step_observed"]
    steps0 = [ev for ev in rank0 if kind(ev) == "step_observed"]
    # the rank's own time, and the step's wall time beside it (the all-reduce makes both ranks' steps as long)
    assert all(ev.compute_time_s is not None for ev in steps0 + steps1)
    mid = slice(5, 35)
    own1 = sorted(ev.compute_time_s for ev in steps1[mid])[15]
    own0 = sorted(ev.compute_time_s for ev in steps0[mid])[15]
    assert 1.15 < own1 / own0 < 1.5, (own0, own1)
    wall0 = sorted(ev.step_time_s for ev in steps0[mid])[15]
    assert wall0 > own0 * 1.1 and all(ev.tokens == 16 for ev in steps0)  # rank 0 waits: tokens/s from the wall time
    assert main(["replay", "--pubkey", str(pub), str(run)]) == 0
    assert "straggler" in capsys.readouterr().out


def test_a_balanced_job_flags_no_rank(tmp_path, keys):
    priv, _ = keys
    run = _job(tmp_path, "even", 1.0, priv)
    rank0 = list(read_events(run / "rank-00000.jsonl"))
    scores = [ev for ev in rank0 if kind(ev) == "straggler_scores"]
    assert len(scores) == 4 and not [ev for ev in rank0 if kind(ev) == "straggler_detected"]
    assert all(min(s.scores.values()) > 0.9 for s in scores), [s.scores for s in scores]
