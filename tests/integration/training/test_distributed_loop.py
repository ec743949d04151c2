"""The reference loop under real torchrun (DDP over gloo, 2 processes): rank 1 SIGKILLed mid-run, torchrun restarts
the group, every rank resumes from the newest sharded checkpoint all ranks recorded, and the run ends bit for bit
where an uninterrupted run ends; the rank journals verify closed with one resume each, and replay agrees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainledger.cli import main
from trainledger.journal import read_events

HELPERS = Path(__file__).resolve().parents[2] / "helpers"
WORKER = HELPERS / "dist_loop_worker.py"
RESHARD = HELPERS / "dist_reshard_worker.py"


def _torchrun(nproc: int, *args: str, cwd: Path, restarts: int = 0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                             f"--nproc_per_node={nproc}", f"--max-restarts={restarts}", "--monitor-interval=0.1",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))


def _finish(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from trainledger.journal import keygen

    tmp = tmp_path_factory.mktemp("ddp")
    priv, pub = keygen(tmp / "keys")
    (tmp / "killed").mkdir()
    (tmp / "whole").mkdir()
    # Both at once (2 processes each): the uninterrupted run, and one whose rank 1 dies at step 25 (after the
    # step-19 checkpoint): torchrun restarts the group and both ranks resume.
    whole = _torchrun(2, str(WORKER), str(tmp / "whole" / "run"), str(priv), "30", cwd=tmp)
    killed = _torchrun(2, str(WORKER), str(tmp / "killed" / "run"), str(priv), "30", "25", cwd=tmp, restarts=1)
    _finish(whole)
    _finish(killed)
    return tmp, pub


def _out(tmp: Path, which: str, rank: int) -> dict:
    return json.loads((tmp / which / f"out-{rank}.json").read_text())


def _journal_losses(path: Path) -> dict[int, str]:
    """The last recorded loss of every step (a resumed run records the steps after its checkpoint twice)."""
    return {e.step: float(e.loss).hex() for e in read_events(path) if type(e).__struct_config__.tag == "step_observed"}


def test_a_killed_and_restarted_run_ends_bit_for_bit_where_an_uninterrupted_one_does(runs):
    tmp, _ = runs
    for rank in (0, 1):
        whole, resumed = _out(tmp, "whole", rank), _out(tmp, "killed", rank)
        assert resumed["start"] == 20  # from the step-19 checkpoint, the newest every rank recorded
        assert resumed["restarts"] == 1 and whole["restarts"] == 0  # the live monitor counts the resume once
        assert resumed["params"] == whole["params"]
        assert resumed["losses"] == whole["losses"][20:]
        name = f"rank-0000{rank}.jsonl"
        recorded = _journal_losses(tmp / "killed" / "run" / name)
        assert recorded == _journal_losses(tmp / "whole" / "run" / name) and len(recorded) == 30
        assert [recorded[s] for s in range(30)] == whole["losses"]


def test_the_resumed_run_verifies_closed_with_one_resume_per_rank_and_replays(runs, capsys):
    tmp, pub = runs
    run = tmp / "killed" / "run"
    for rank in (0, 1):
        evs = list(read_events(run / f"rank-0000{rank}.jsonl"))
        resumes = [e for e in evs if type(e).__struct_config__.tag == "run_resumed"]
        assert len(resumes) == 1 and resumes[0].from_step == 19 and resumes[0].detail["sharded"] is True
        assert resumes[0].detail["resharded"] is False
        shards = [e for e in evs if type(e).__struct_config__.tag == "shards_saved"]
        assert shards and all(f["sha256"] for s in shards for f in s.files)
        assert [e.restart_count for e in evs if type(e).__struct_config__.tag == "rank_joined"] == [0, 1]
        tags = [type(e).__struct_config__.tag for e in evs]
        try:
            import pynvml

            pynvml.nvmlInit()
            has_nvml = True
        except Exception:  # noqa: BLE001 - no GPU here: telemetry must say so, once per process, never invent
            has_nvml = False
        if not has_nvml:
            assert tags.count("telemetry_unavailable") == 2 and "device_sampled" not in tags
    assert main(["verify", "--pubkey", str(pub), "--require-closed", str(run)]) == 0
    assert "2 of 2 ranks verified" in capsys.readouterr().out
    assert main(["replay", "--pubkey", str(pub), str(run)]) == 0
    assert capsys.readouterr().out.startswith("OK")
    assert main(["report", "--pubkey", str(pub), str(run), "-o", str(tmp / "report.html")]) == 0
    shards = (tmp / "report.html").read_text().split("<h2>Sharded checkpoints</h2>")[1].split("</table>")[0]
    # steps 9 and 19 (async, then restored), 29 (blocking, last): every one recorded by both ranks
    assert shards.count("<td>2 of 2</td><td>yes</td>") == 3 and shards.count("<td>yes</td></tr>") == 1


def test_resharding_two_ranks_into_one_is_recorded_and_checks_the_missing_ranks_shards(tmp_path):
    """Saved by 2 ranks, restored by 1: rank 0 checks rank 1's shards against rank 1's signed journal too."""
    from trainledger.journal import keygen

    priv, _ = keygen(tmp_path / "keys")
    run = tmp_path / "run"
    _finish(_torchrun(2, str(RESHARD), str(run), str(priv), "save", cwd=tmp_path))
    _finish(_torchrun(1, str(RESHARD), str(run), str(priv), "restore", cwd=tmp_path))
    saved = (tmp_path / "reshard-save-0.txt").read_text().split()[1]
    restored, refused = (tmp_path / "reshard-restore-0.txt").read_text().splitlines()
    assert restored.startswith("RESTORED 2 resharded=True from=2") and restored.split()[-1] == saved
    assert refused.startswith("REJECTED resume-invalid-digest: rank 1:") and "__1_0.distcp" in refused
    resumed = [e for e in read_events(run / "rank-00000.jsonl") if type(e).__struct_config__.tag == "run_resumed"]
    assert resumed[0].detail == {"sharded": True, "world_size": 1, "saved_world_size": 2, "resharded": True}
