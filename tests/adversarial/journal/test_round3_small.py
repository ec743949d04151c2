"""Trust round 3, the small ones: a proof command that says what it refused, a ``file://`` run folder whose rank
is a link out of it, and object-storage errors that name the URL, not the private copy."""

from __future__ import annotations

import os
import shutil

import pytest

from trainledger.cli import main
from trainledger.journal import Journal, StepObserved
from trainledger.training.distributed.ranks import RankInfo, open_rank_journal

pytest.importorskip("pyarrow")


def _journal(path, signer, n=20):
    j = Journal.create(path, signer=signer, run_id="small")
    for i in range(n):
        j.append(StepObserved(step=i, loss=1.0))
    j.close()
    return path


@pytest.mark.parametrize("torn", [False, True], ids=["whole", "torn"])
def test_prove_of_a_journal_with_a_20_mib_line_past_its_seal_says_what_it_refused(tmp_path, keypair, capsys, torn):
    p = _journal(tmp_path / "j.jsonl", keypair[0])
    with open(p, "ab") as f:
        f.write(b"x" * (20 << 20) + (b"" if torn else b"\n"))
    assert main(["verify", str(p), "--pubkey", str(keypair[2])]) == 1
    capsys.readouterr()
    assert main(["prove", str(p), "--seq", "3", "--pubkey", str(keypair[2]), "-o", str(tmp_path / "b.json")]) == 0
    err = capsys.readouterr().err
    if torn:  # was: "the journal's lines do not hash to the tree its seal signed" (the torn line taken as a leaf)
        assert "20,971,520 bytes after the last complete line (a torn line) were not read" in err
    else:
        assert "refused: line 24 is 20,971,520 bytes, over the 16,777,216-byte cap" in err
    assert main(["verify-proof", str(tmp_path / "b.json"), "--pubkey", str(keypair[2])]) == 0


def test_a_file_url_run_folder_whose_rank_is_a_link_out_of_it_is_refused(tmp_path, signer, keypair, capsys):
    d = tmp_path / "run"
    for r in range(2):
        info = RankInfo(run="linked", rank=r, world_size=2, local_rank=0, node="n", restart_count=0)
        with open_rank_journal(d, signer, info=info) as j:
            j.append(StepObserved(step=0, loss=1.0))
    assert main(["verify", f"file://{d}", "--pubkey", str(keypair[2])]) == 0
    capsys.readouterr()
    outside = tmp_path / "outside.jsonl"
    shutil.move(d / "rank-00001.jsonl", outside)
    os.symlink(outside, d / "rank-00001.jsonl")
    assert main(["verify", f"file://{d}", "--pubkey", str(keypair[2])]) == 1  # UnsafePath: exit 1
    err = capsys.readouterr().err
    assert "rank-00001.jsonl is reached through a link" in err and "nothing was read" in err


def test_an_object_storage_error_names_the_url_not_the_private_copy(tmp_path, keypair, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "x.jsonl").write_text("not a journal\n")
    url = f"file://{bad}/x.jsonl"
    code = main(["export", "parquet", url, str(tmp_path / "out"), "--lines", "--pubkey", str(keypair[2])])
    said = capsys.readouterr()
    assert code in (1, 2)
    text = said.out + said.err
    assert url in text and "trainledger-fetch-" not in text, text
