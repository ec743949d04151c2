"""A run folder is one run: a rank journal copied in from another run signed with the same key, or one that
joined with another world size, fails ``verify RUN_DIR`` by name, before any anchor covers it."""

from __future__ import annotations

import shutil

import pytest

from trainledger.cli import main
from trainledger.journal import StepObserved
from trainledger.journal.audit.rundir import AnchorMismatch, verify_run_dir
from trainledger.training.distributed.ranks import RankInfo, open_rank_journal


def _run(folder, signer, run, world=2, worlds=None):
    for r in range(world):
        w = (worlds or {}).get(r, world)
        info = RankInfo(run=run, rank=r, world_size=w, local_rank=r, node="n", restart_count=0)
        with open_rank_journal(folder, signer, info=info) as j:
            for i in range(3):
                j.append(StepObserved(step=i, loss=1.0))
    return folder


def test_a_rank_from_another_run_with_the_same_key_is_refused(tmp_path, signer, keypair, capsys):
    b = _run(tmp_path / "B", signer, "runB")
    c = _run(tmp_path / "C", signer, "runC")
    assert verify_run_dir(c, keys=[signer.public]).ok
    shutil.copy(b / "rank-00001.jsonl", c / "rank-00001.jsonl")
    with pytest.raises(AnchorMismatch, match=r"rank 1: its run id is 'runB.r00001', not runC.r00001"):
        verify_run_dir(c, keys=[signer.public])
    assert main(["verify", "--pubkey", str(keypair[2]), str(c)]) == 1
    assert "another run" in capsys.readouterr().out


def test_a_rank_file_renamed_to_another_rank_number_is_refused(tmp_path, signer):
    c = _run(tmp_path / "C", signer, "runC", world=3)
    (c / "rank-00002.jsonl").unlink()
    shutil.copy(c / "rank-00001.jsonl", c / "rank-00002.jsonl")
    with pytest.raises(AnchorMismatch, match="rank 2"):
        verify_run_dir(c, keys=[signer.public])


def test_ranks_that_joined_one_round_with_different_world_sizes_are_refused(tmp_path, signer):
    c = _run(tmp_path / "C", signer, "runC", worlds={1: 3})
    with pytest.raises(AnchorMismatch, match="world size"):
        verify_run_dir(c, keys=[signer.public])


def test_query_over_a_run_folder_with_a_rank_missing_fails_unless_asked_for_a_partial_view(tmp_path, signer,
                                                                                          keypair, capsys):
    c = _run(tmp_path / "C", signer, "runC", world=4)
    (c / "rank-00002.jsonl").unlink()
    pub = str(keypair[2])
    assert main(["query", "--pubkey", pub, str(c), "SELECT count(*) FROM steps"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"FAIL {c}: ") and "rank 2 of 4: no journal" in err
    assert main(["query", "--pubkey", pub, "--partial", "--format", "csv", str(c),
                 "SELECT count(DISTINCT rank) AS ranks FROM steps"]) == 0
    out, err = capsys.readouterr()
    assert "PARTIAL" in err and out.strip().splitlines()[-1] == "3"


def test_no_columnar_copy_is_made_of_a_folder_with_a_rank_missing(tmp_path, signer):
    """A warm answer skips the whole-folder check, so build_cache holds a folder to it."""
    from trainledger.journal.query import build_cache

    c = _run(tmp_path / "C", signer, "runC", world=3)
    (c / "rank-00001.jsonl").unlink()
    with pytest.raises(AnchorMismatch, match="rank 1 of 3"):
        build_cache([c], keys=[signer.public])
