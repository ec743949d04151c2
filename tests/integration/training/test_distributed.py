"""One journal per rank under real torchrun (gloo, 2 processes; one rank killed and the group restarted),
anchored to each other at checkpoints; ``trainledger verify RUN_DIR`` catches a truncated, rolled-back, swapped or
missing rank; stragglers flagged and recomputed by replay; sharded checkpoints checked shard by shard."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from journal_tools import read_lines, write_lines

from trainledger.cli import main
from trainledger.journal import read_events

HELPERS = Path(__file__).resolve().parents[2] / "helpers"
WORKER = HELPERS / "dist_worker.py"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    from trainledger.journal import keygen

    tmp = tmp_path_factory.mktemp("dist")
    priv, pub = keygen(tmp / "keys")  # one run key every rank can read (as a secret store would hand it out)
    run = tmp / "run"
    # Rank 1 is a straggler, and dies by SIGKILL at step 15 of the first attempt: torchrun restarts the group.
    env = dict(os.environ, OMP_NUM_THREADS="1", SLOW_RANK1_S="0.02")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "--max-restarts=1", "--monitor-interval=0.1", str(WORKER), str(run), str(priv), "30",
                           "15"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run, pub


def _copy(run_dir, tmp_path):
    run, pub = run_dir
    dst = tmp_path / "run"
    shutil.copytree(run, dst)
    return dst, pub


def test_every_rank_writes_its_own_journal_and_they_verify_together(run_dir, capsys):
    run, pub = run_dir
    assert sorted(p.name for p in run.iterdir()) == ["rank-00000.jsonl", "rank-00001.jsonl"]
    joined = [e for e in read_events(run / "rank-00001.jsonl") if type(e).__struct_config__.tag == "rank_joined"]
    assert joined[0].rank == 1 and joined[0].world_size == 2 and joined[0].versions["backend"] == "gloo"
    for rank in (0, 1):  # each rank continued its own journal after the restart, and recorded it
        restarts = [e.restart_count for e in read_events(run / f"rank-0000{rank}.jsonl")
                    if type(e).__struct_config__.tag == "rank_joined"]
        assert restarts == [0, 1], (rank, restarts)
    kinds0 = [type(e).__struct_config__.tag for e in read_events(run / "rank-00000.jsonl")]
    assert kinds0.count("ranks_anchored") == 4  # step 9 before the kill, then 9, 19, 29 again
    assert main(["verify", "--pubkey", str(pub), "--require-closed", str(run)]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 ranks verified, 8 cross-rank anchors hold" in out
    assert main(["verify", "--pubkey", str(pub), "--json", str(run)]) == 0
    assert set(json.loads(capsys.readouterr().out)["ranks"]) == {"0", "1"}


def test_a_truncated_rank_is_caught_by_the_anchors(run_dir, tmp_path, capsys):
    run, pub = _copy(run_dir, tmp_path)
    p = run / "rank-00001.jsonl"
    lines = read_lines(p)
    first_anchor = next(i for i, ln in enumerate(lines) if b'"anchor_recorded"' in ln)
    write_lines(p, lines[:first_anchor - 3])  # cut back before its first anchored head: still a valid chain
    assert main(["verify", "--pubkey", str(pub), "--allow-unsealed", str(p)]) == 0  # on its own: no way to tell
    capsys.readouterr()
    assert main(["verify", "--pubkey", str(pub), "--allow-unsealed", str(run)]) == 1
    out = capsys.readouterr().out
    assert "rank 1:" in out and "truncated or rolled back" in out


def test_a_rank_swapped_for_another_ranks_journal_is_caught(run_dir, tmp_path, capsys):
    run, pub = _copy(run_dir, tmp_path)
    shutil.copyfile(run / "rank-00000.jsonl", run / "rank-00001.jsonl")
    assert main(["verify", "--pubkey", str(pub), str(run)]) == 1
    assert "rank 1:" in capsys.readouterr().out


def test_a_missing_rank_is_a_failure_not_a_partial_pass(run_dir, tmp_path, capsys):
    run, pub = _copy(run_dir, tmp_path)
    (run / "rank-00001.jsonl").unlink()
    assert main(["verify", "--pubkey", str(pub), str(run)]) == 1
    out = capsys.readouterr().out
    assert "rank 1" in out and "no journal" in out


def test_a_slow_rank_is_flagged_and_replay_recomputes_it(run_dir, capsys):
    run, pub = run_dir
    flagged = [e for e in read_events(run / "rank-00000.jsonl") if type(e).__struct_config__.tag == "straggler_detected"]
    assert [e.rank for e in flagged] == [1] * 4 and all(e.score < 0.75 for e in flagged)  # 1 window, then 3 more
    assert main(["replay", "--pubkey", str(pub), str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK") and "4 stragglers flagged" in out and "straggler: rank 1" in out


def _replay_hand_run(tmp_path, signer, capsys, rank0_verdicts: list) -> str:
    """Two signed rank journals written by hand, ten steps of 0.1 s each, rank 0's ending with ``rank0_verdicts``:
    what ``trainledger replay`` prints of the run folder (it must exit 1)."""
    from trainledger.journal import Journal, StepObserved
    from trainledger.journal.kinds import RankJoined

    run = tmp_path / "run"
    for rank in (0, 1):
        with Journal.create(run / f"rank-0000{rank}.jsonl", signer=signer, run_id=f"hand.r{rank:05d}") as j:
            j.append(RankJoined(run="hand", rank=rank, world_size=2, local_rank=rank, node="n"))
            for step in range(10):
                j.append(StepObserved(step=step, loss=3.0, step_time_s=0.1))
            if rank == 0:
                for ev in rank0_verdicts:
                    j.append(ev)
    pub = tmp_path / "k.pub"
    pub.write_text(signer.public.line() + "\n")
    assert main(["replay", "--pubkey", str(pub), str(run)]) == 1
    return capsys.readouterr().out


def test_a_forged_straggler_verdict_is_named_by_replay(tmp_path, signer, capsys):
    """Rank 0 claims rank 1 straggled, rank 1's steps say otherwise."""
    from trainledger.training.kinds import StragglerDetected, StragglerScores

    out = _replay_hand_run(tmp_path, signer, capsys, [
        StragglerScores(window_start=0, window_end=9, medians={"0": 0.1, "1": 0.4}, scores={"0": 1.0, "1": 0.25},
                        threshold=0.75),
        StragglerDetected(rank=1, score=0.25, window_start=0, window_end=9)])
    assert "DIFFERENCE rank 0" in out and "straggler_scores" in out and "straggler_detected" in out


DCP_WORKER = HELPERS / "dist_dcp_worker.py"


def test_sharded_checkpoints_record_every_shard_and_restore_checks_them(tmp_path, capsys):
    """torch.distributed.checkpoint writes; each rank records its shard files' digests, rank 0 the metadata's;
    a restore checks every shard first: a changed shard on rank 1 is refused on every rank, naming it."""
    from trainledger.journal import keygen

    priv, pub = keygen(tmp_path / "keys")
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(DCP_WORKER), str(run), str(priv)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outs = [(tmp_path / f"out-{r}.txt").read_text().splitlines() for r in (0, 1)]
    for lines in outs:
        saved, restored, restored_sum, refused, missing = lines
        assert missing == "REJECTED resume-invalid-missing-state"
        assert restored == "RESTORED 9" and restored_sum.split()[1] == saved.split()[1]  # the newest, exactly
        assert refused.startswith("REJECTED resume-invalid-digest") and "rank 1" in refused and "__1_0.distcp" in refused
    shards = [e for e in read_events(run / "rank-00001.jsonl") if type(e).__struct_config__.tag == "shards_saved"]
    assert [s.step for s in shards] == [4, 7, 9] and shards[0].files[0]["file"] == "__1_0.distcp"
    meta = [e for e in read_events(run / "rank-00000.jsonl") if type(e).__struct_config__.tag == "shards_saved"]
    assert all(m.metadata_sha256 for m in meta)
    assert main(["verify", "--pubkey", str(pub), "--require-closed", str(run)]) == 0


def test_query_a_run_folder_by_rank(run_dir, capsys):
    run, pub = run_dir
    assert main(["query", "--pubkey", str(pub), "--format", "json", str(run),
                 "SELECT rank, count(*) AS steps FROM steps GROUP BY rank ORDER BY rank"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["rank"] for r in rows] == [0, 1] and all(r["steps"] >= 30 for r in rows)
    assert main(["query", "--pubkey", str(pub), "--format", "json", str(run),
                 "SELECT DISTINCT rank FROM stragglers"]) == 0
    assert json.loads(capsys.readouterr().out) == [{"rank": 1}]


def test_report_of_a_run_folder_shows_ranks_stragglers_and_the_heatmap(run_dir, tmp_path, capsys):
    run, pub = run_dir
    out = tmp_path / "report.html"
    assert main(["report", "--pubkey", str(pub), str(run), "-o", str(out)]) == 0
    assert "2 ranks" in capsys.readouterr().out
    page = out.read_text()
    assert page.count("data:image/png;base64,") == 1 and "<script" not in page
    assert "2 of 2 ranks, 8 cross-rank anchors hold" in page
    stragglers = page.split("<h2>Stragglers</h2>")[1].split("</table>")[0]
    assert stragglers.count("<tr>") == 1 + 4  # header, and rank 1 in four windows


def test_watch_follows_every_rank_of_a_run_folder(run_dir, tmp_path, capsys):
    run, pub = run_dir
    assert main(["watch", "--pubkey", str(pub), "--timeout", "5", str(run)]) == 0  # every rank closed
    out = capsys.readouterr().out
    assert "watching rank 0" in out and "watching rank 1" in out and "rank 1" in out and "closed" in out
    assert "stragglers: rank 1 score" in out
    # Rank 1 cut back to an earlier seal (still open): watch waits for it, and says so when it gives up.
    dst, _ = _copy(run_dir, tmp_path)
    p = dst / "rank-00001.jsonl"
    lines = read_lines(p)
    seal = max(i for i, ln in enumerate(lines[:len(lines) // 2]) if ln.startswith(b'{"kind":"seal"'))
    write_lines(p, lines[:seal + 1])
    assert main(["watch", "--pubkey", str(pub), "--timeout", "0.5", str(dst)]) == 3
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "closed" in last.split("|")[0] and "closed" not in last.split("|")[1]


def test_four_ranks_verify_together_and_a_rolled_back_rank_is_caught(tmp_path, capsys):
    """4 processes on this 2-core machine: every rank anchored at every checkpoint; one rank rolled back (its
    journal replaced by an earlier copy of itself) is caught by the others' anchors."""
    from trainledger.journal import keygen

    priv, pub = keygen(tmp_path / "keys")
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
                           str(WORKER), str(run), str(priv), "20"], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert main(["verify", "--pubkey", str(pub), "--require-closed", str(run)]) == 0
    assert "4 of 4 ranks verified, 12 cross-rank anchors hold" in capsys.readouterr().out
    p = run / "rank-00002.jsonl"
    lines = read_lines(p)
    first_anchor = next(i for i, ln in enumerate(lines) if b'"anchor_recorded"' in ln)
    later = next(i for i, ln in enumerate(lines) if i > first_anchor and ln.startswith(b'{"kind":"seal"'))
    write_lines(p, lines[:later + 1])  # as it was just after its first anchor: a valid, signed, older journal
    assert main(["verify", "--pubkey", str(pub), "--allow-unsealed", str(run)]) == 1
    out = capsys.readouterr().out
    assert "rank 2:" in out and "truncated or rolled back" in out


def test_one_key_per_node_pinned_together_in_a_trusted_keys_file(tmp_path, capsys):
    """Each node signs with its own key; a trusted-keys file lists them all and a roster says which signs which rank;
    a rank signed by a key not listed fails, named."""
    from trainledger.journal import Journal, Signer, StepObserved
    from trainledger.journal.kinds import RankJoined

    run = tmp_path / "run"
    nodes = [Signer.generate(), Signer.generate()]
    for rank in (0, 1):
        with Journal.create(run / f"rank-0000{rank}.jsonl", signer=nodes[rank], run_id=f"keys.r{rank:05d}") as j:
            j.append(RankJoined(run="keys", rank=rank, world_size=2, local_rank=0, node=f"node-{rank}"))
            j.append(StepObserved(step=0, loss=3.0))
    listing = tmp_path / "trusted-keys"
    listing.write_text("# the cluster's nodes\n" + "".join(s.public.line() + "\n" for s in nodes))
    env = dict(os.environ, TRAINLEDGER_TRUSTED_KEYS=str(listing))
    unbound = subprocess.run([sys.executable, "-m", "trainledger", "verify", str(run)], capture_output=True,
                             text=True, env=env)  # no anchor has recorded which key signs which rank yet
    assert unbound.returncode == 1 and "--roster FILE" in unbound.stdout
    roster = tmp_path / "roster"
    roster.write_text("".join(f"{r} {s.key_id}\n" for r, s in enumerate(nodes)))
    ok = subprocess.run([sys.executable, "-m", "trainledger", "verify", "--roster", str(roster), str(run)],
                        capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and "2 of 2 ranks verified" in ok.stdout
    listing.write_text(nodes[0].public.line() + "\n")
    bad = subprocess.run([sys.executable, "-m", "trainledger", "verify", str(run)], capture_output=True, text=True,
                         env=env)
    assert bad.returncode == 1 and "rank 1" in bad.stdout and "not pinned" in bad.stdout


def test_a_forged_individual_score_is_named_by_replay(tmp_path, signer, capsys):
    """Relative scores true to the step times, individual scores not: replay names the window."""
    from trainledger.training.kinds import StragglerScores

    out = _replay_hand_run(tmp_path, signer, capsys, [
        StragglerScores(window_start=0, window_end=9, medians={"0": 0.1, "1": 0.1}, scores={"0": 1.0, "1": 1.0},
                        threshold=0.75, individual={"0": 1.0, "1": 0.5})])
    assert "DIFFERENCE rank 0" in out and "individual scores" in out


def test_the_kept_staging_buffers_copy_reuse_and_follow_the_state():
    """The background save's stager: a copy the training thread may overwrite at once, the same buffers next time,
    a new one for a tensor that changed shape, none kept for a tensor gone; DCP's own staging for anything else."""
    import io

    import torch

    from trainledger.training.distributed.ranks import _reusable_stager

    stager = _reusable_stager()
    a, b = torch.arange(6.0).reshape(2, 3), torch.ones(4, dtype=torch.int64)
    one = stager.stage({"m": {"a": a, "n": 5}, "opt": [b, "adam", None], "blob": b"x"})
    assert type(one["m"]) is dict and one["m"]["n"] == 5 and one["opt"][1:] == ["adam", None] and one["blob"] == b"x"
    a.add_(100)  # the next step, while the save is being written
    assert one["m"]["a"].tolist() == [[0, 1, 2], [3, 4, 5]] and one["m"]["a"].data_ptr() != a.data_ptr()
    two = stager.stage({"m": {"a": a, "n": 6}, "opt": [b, "adam", None], "blob": b"y"})
    assert two["m"]["a"] is one["m"]["a"] and two["m"]["a"][0, 0].item() == 100  # the same buffer, new values
    assert two["m"]["n"] == 6 and two["blob"] == b"y"
    three = stager.stage({"m": {"a": torch.zeros(3, 3)}})
    assert three["m"]["a"].shape == (3, 3) and len(stager.buffers) == 1  # b's buffer and the old a's dropped
    other = stager.stage({"m": {"a": a}, "extra": io.BytesIO(b"z")})  # not plain: DCP's staging, nothing kept
    assert other["m"]["a"].tolist() == a.tolist() and len(stager.buffers) == 1
    stager.close()
    assert not stager.buffers
