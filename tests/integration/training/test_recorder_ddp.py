"""The Recorder on every rank of a real torchrun DDP job (gloo, 2 processes, no --rdzv-id): one journal per rank,
checkpoints per rank, anchors at every checkpoint and at the end, a SIGKILLed rank resumed with the other from the
newest step both saved, and a run folder ``trainledger verify`` accepts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from torchrun_tools import free_port, kind

from trainledger.cli import main
from trainledger.journal import keygen, read_events

WORKER = Path(__file__).resolve().parents[2] / "helpers" / "recorder_ddp_worker.py"


def test_recorder_under_torchrun_one_journal_per_rank_anchored_resumed_and_verified(tmp_path, capsys):
    priv, pub = keygen(tmp_path / "keys")
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TORCHELASTIC_RUN_ID", None)
    env.pop("TRAINLEDGER_RUN", None)
    # No --standalone and no --rdzv-id: torchrun's run id is then "none", which every such job would share.
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--max-restarts=1",
                           "--monitor-interval=0.1", "--master-addr=127.0.0.1", f"--master-port={free_port()}",
                           str(WORKER), str(run), str(priv), "25", "14"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in run.glob("*.jsonl")) == ["rank-00000.jsonl", "rank-00001.jsonl"]
    events = {r: list(read_events(run / f"rank-{r:05d}.jsonl")) for r in (0, 1)}
    runs = {ev.run for evs in events.values() for ev in evs if kind(ev) == "rank_joined"}
    assert len(runs) == 1 and "none" not in runs  # one identity for both ranks and both attempts, not torchrun's
    for r, evs in events.items():
        assert [ev.restart_count for ev in evs if kind(ev) == "rank_joined"] == [0, 1]
        saved = [ev for ev in evs if kind(ev) == "checkpoint_saved"]
        assert all(ev.path.startswith(f"checkpoints/rank-{r:05d}/") for ev in saved)
        # rank 0 saved step 14 before rank 1 died; both resume from step 9, the newest both have
        assert [ev.from_step for ev in evs if kind(ev) == "run_resumed"] == [9]
        closed = [ev for ev in evs if kind(ev) == "run_closed"]
        assert len(closed) == 1 and closed[0].status == "completed"
    assert {ev.step for ev in events[0] if kind(ev) == "checkpoint_saved"} >= {4, 9, 14, 19, 24}
    anchored = [ev.step for ev in events[0] if kind(ev) == "ranks_anchored"]
    assert anchored[-1] == 24 and 19 in anchored and 9 in anchored
    assert any(kind(ev) == "anchor_recorded" for ev in events[1])
    key_id = events[0][0].key_id  # run_opened: every rank signs with the run's key, and the anchors record it
    assert all(ev.keys == {"0": key_id, "1": key_id} for ev in events[0] if kind(ev) == "ranks_anchored")
    assert all(ev.key == key_id for ev in events[1] if kind(ev) == "anchor_recorded")
    assert main(["verify", "--pubkey", str(pub), "--require-closed", str(run)]) == 0
    out = capsys.readouterr().out
    assert "2 rank" in out and "keys bound to ranks by one key" in out
    assert main(["replay", "--pubkey", str(pub), str(run)]) == 0
    out = capsys.readouterr().out
    assert out.count("resumed 1") == 2  # both ranks, from the same checkpoint step


def test_a_standalone_job_relaunched_by_hand_continues_its_run_and_verifies(tmp_path, capsys):
    """torchrun --standalone makes a new random rendezvous id at every launch. The job dies (rank 1 SIGKILLed,
    no restarts), the user runs the same command again: the relaunch continues the folder's run (its identity
    from rank 0's journal, not the launcher's), and verify and replay accept the folder. A launch that names a
    different run for the same folder is refused before it writes anything."""
    priv, pub = keygen(tmp_path / "keys")
    run = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TORCHELASTIC_RUN_ID", None)
    env.pop("TRAINLEDGER_RUN", None)

    def launch(*extra: str, env=env):
        return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                               "--max-restarts=0", "--monitor-interval=0.1", str(WORKER), str(run), str(priv), "20",
                               *extra], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)

    died = launch("9")
    assert died.returncode != 0                                  # rank 1 was killed and nothing restarted it
    first = {ev.run for ev in read_events(run / "rank-00000.jsonl") if kind(ev) == "rank_joined"}
    again = launch()
    assert again.returncode == 0, again.stderr[-3000:]
    for r in (0, 1):
        joined = [ev for ev in read_events(run / f"rank-{r:05d}.jsonl") if kind(ev) == "rank_joined"]
        assert len(joined) == 2 and {ev.run for ev in joined} == first   # one identity across both launches
    assert main(["verify", "--pubkey", str(pub), "--require-closed", str(run)]) == 0
    assert main(["replay", "--pubkey", str(pub), str(run)]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in run.glob("*.jsonl")}
    other = launch(env=dict(env, TRAINLEDGER_RUN="someone-else"))
    assert other.returncode != 0
    assert f"holds run {next(iter(first))!r}, but TRAINLEDGER_RUN names 'someone-else'" in other.stderr
    assert {p.name: p.read_bytes() for p in run.glob("*.jsonl")} == before
