"""Which run a torchrun rank belongs to (rank_info): the folder's run wins over a launcher-made id; a name the
user chose that differs from the folder's run is refused at start."""

from __future__ import annotations

import json

import pytest

from trainledger.journal.errors import UsageError
from trainledger.training.distributed import rank_info

UUID = "5105a59e-bd3c-4a8e-9f51-5ceb02dc5f68"


def env(**kw):
    return {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", **kw}


def folder(tmp_path, run="run-A"):
    (tmp_path / "rank-00000.jsonl").write_text(json.dumps({"seq": 0, "meta": {"run": run}}) + "\n")
    return tmp_path


def test_a_new_folder_takes_the_users_name_then_the_launchers(tmp_path):
    assert rank_info(env(TORCHELASTIC_RUN_ID=UUID), run_dir=tmp_path).run == UUID
    assert rank_info(env(TORCHELASTIC_RUN_ID="job-7"), run_dir=tmp_path).run == "job-7"
    assert rank_info(env(TORCHELASTIC_RUN_ID=UUID, TRAINLEDGER_RUN="mine"), run_dir=tmp_path).run == "mine"
    with pytest.raises(UsageError, match="no run identity"):
        rank_info(env(TORCHELASTIC_RUN_ID="none"), run_dir=tmp_path)     # no process group to choose one


def test_a_folder_that_holds_a_run_continues_it_whatever_id_the_launcher_made(tmp_path):
    run_dir = folder(tmp_path)
    assert rank_info(env(TORCHELASTIC_RUN_ID=UUID), run_dir=run_dir).run == "run-A"
    assert rank_info(env(TORCHELASTIC_RUN_ID="none"), run_dir=run_dir).run == "run-A"
    assert rank_info(env(TORCHELASTIC_RUN_ID="run-A"), run_dir=run_dir).run == "run-A"
    assert rank_info(env(TORCHELASTIC_RUN_ID=UUID, TRAINLEDGER_RUN="run-A"), run_dir=run_dir).run == "run-A"


def test_a_different_run_named_for_the_same_folder_is_refused_at_start(tmp_path):
    run_dir = folder(tmp_path)
    with pytest.raises(UsageError, match=r"holds run 'run-A', but TRAINLEDGER_RUN names 'other'.*TRAINLEDGER_RUN=run-A"):
        rank_info(env(TORCHELASTIC_RUN_ID=UUID, TRAINLEDGER_RUN="other"), run_dir=run_dir)
    with pytest.raises(UsageError, match=r"but --rdzv-id \(TORCHELASTIC_RUN_ID\) names 'job-8'"):
        rank_info(env(TORCHELASTIC_RUN_ID="job-8"), run_dir=run_dir)
