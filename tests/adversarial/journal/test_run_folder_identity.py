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
    from trainledger.journal.views.query import build_cache

    c = _run(tmp_path / "C", signer, "runC", world=3)
    (c / "rank-00001.jsonl").unlink()
    with pytest.raises(AnchorMismatch, match="rank 1 of 3"):
        build_cache([c], keys=[signer.public])


def test_a_partial_view_still_holds_every_rank_present_to_the_run(tmp_path, signer, keypair, capsys):
    """--partial allows a missing rank, nothing else: a foreign rank beside the gap still fails."""
    b = _run(tmp_path / "B", signer, "runB", world=4)
    c = _run(tmp_path / "C", signer, "runC", world=4)
    (c / "rank-00002.jsonl").unlink()
    rep = verify_run_dir(c, keys=[signer.public], partial=True)
    assert rep.partial and rep.missing == [2] and sorted(rep.ranks) == [0, 1, 3]
    shutil.copy(b / "rank-00003.jsonl", c / "rank-00003.jsonl")
    with pytest.raises(AnchorMismatch, match="rank 3: its run id is 'runB.r00003'"):
        verify_run_dir(c, keys=[signer.public], partial=True)
    assert main(["query", "--pubkey", str(keypair[2]), "--partial", str(c), "SELECT count(*) FROM steps"]) == 1


def test_replay_and_report_of_a_folder_with_a_rank_missing_fail_unless_partial_and_then_say_so(tmp_path, signer,
                                                                                               keypair, capsys):
    c = _run(tmp_path / "C", signer, "runC", world=3)
    (c / "rank-00001.jsonl").unlink()
    pub = str(keypair[2])
    assert main(["replay", "--pubkey", pub, str(c)]) == 1
    assert "rank 1 of 3: no journal" in capsys.readouterr().out
    assert main(["replay", "--pubkey", pub, "--partial", str(c)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"PARTIAL: {c} lacks rank(s) 1;") and "2 ranks replayed" in out
    assert main(["replay", "--pubkey", pub, "--partial", "--json", str(c)]) == 0
    import json

    got = json.loads(capsys.readouterr().out)["verify"]
    assert got["partial"] is True and got["missing"] == [1]
    assert main(["report", "--pubkey", pub, str(c)]) == 1 and not (c / "report.html").exists()
    capsys.readouterr()
    assert main(["report", "--pubkey", pub, "--partial", str(c)]) == 0
    assert "PARTIAL" in capsys.readouterr().out
    page = (c / "report.html").read_text()
    assert "Run folder C (PARTIAL)" in page and "no journal for rank(s) 1" in page
    one = c / "rank-00000.jsonl"
    assert main(["replay", "--pubkey", pub, "--partial", str(one)]) == 2
    assert "this is one journal" in capsys.readouterr().err


def test_export_of_a_run_folder_checks_it_whole_and_writes_a_tensorboard_run_per_rank(tmp_path, signer, keypair,
                                                                                      capsys):
    b = _run(tmp_path / "B", signer, "runB")
    c = _run(tmp_path / "C", signer, "runC")
    pub = str(keypair[2])
    assert main(["export", "tensorboard", "--pubkey", pub, str(c), str(tmp_path / "tb")]) == 0
    assert "of 2 rank(s)" in capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "tb").iterdir()) == ["rank-00000", "rank-00001"]
    assert all(any(p.iterdir()) for p in (tmp_path / "tb").iterdir())
    shutil.copy(b / "rank-00001.jsonl", c / "rank-00001.jsonl")
    assert main(["export", "tensorboard", "--pubkey", pub, str(c), str(tmp_path / "tb2")]) == 1
    assert "another run" in capsys.readouterr().out and not (tmp_path / "tb2").exists()
    (c / "rank-00001.jsonl").unlink()
    _run(tmp_path / "D", signer, "runD", world=3)
    (tmp_path / "D" / "rank-00002.jsonl").unlink()
    assert main(["export", "tensorboard", "--pubkey", pub, str(tmp_path / "D"), str(tmp_path / "tb3")]) == 1
    assert main(["export", "tensorboard", "--pubkey", pub, "--partial", str(tmp_path / "D"),
                 str(tmp_path / "tb3")]) == 0
    out = capsys.readouterr().out
    assert "PARTIAL" in out and sorted(p.name for p in (tmp_path / "tb3").iterdir()) == ["rank-00000", "rank-00001"]


def test_prove_from_a_run_folder_names_its_rank_and_checks_the_folder_whole(tmp_path, signer, keypair, capsys):
    c = _run(tmp_path / "C", signer, "runC", world=3)
    pub = str(keypair[2])
    out = tmp_path / "b.json"
    assert main(["prove", "--pubkey", pub, "--seq", "1", "-o", str(out), str(c)]) == 2
    assert "--rank N" in capsys.readouterr().err
    assert main(["prove", "--pubkey", pub, "--seq", "1", "--rank", "1", "-o", str(out), str(c)]) == 0
    assert "runC.r00001" in out.read_text()
    (c / "rank-00002.jsonl").unlink()
    out.unlink()
    assert main(["prove", "--pubkey", pub, "--seq", "1", "--rank", "1", "-o", str(out), str(c)]) == 1
    assert "rank 2 of 3: no journal" in capsys.readouterr().err + capsys.readouterr().out and not out.exists()
    assert main(["consistency", "--pubkey", pub, "--from", "2", "--rank", "0", str(c)]) == 1
    assert main(["prove", "--pubkey", pub, "--seq", "1", "--rank", "0", "-o", str(out),
                 str(c / "rank-00000.jsonl")]) == 2


def test_watch_of_a_run_folder_refuses_a_rank_from_another_run_and_ends_on_the_whole_check(tmp_path, signer, keypair,
                                                                                          capsys):
    import io

    from trainledger.training.watch import watch

    b = _run(tmp_path / "B", signer, "runB")
    c = _run(tmp_path / "C", signer, "runC")
    buf = io.StringIO()
    assert watch(c, keys=[signer.public], out=buf, timeout=20, interval=0.05) == 0
    shutil.copy(b / "rank-00001.jsonl", c / "rank-00001.jsonl")
    buf = io.StringIO()
    assert watch(c, keys=[signer.public], out=buf, timeout=20, interval=0.05) == 1
    assert "is not this folder's rank 1 (runC.r00001)" in buf.getvalue()
