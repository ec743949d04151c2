"""Trust round 4, ``trainledger serve``: a journal whose seals certified rank keys sign (the golden
``rank_keys_v1_7``) is shown as verify shows it, and a run folder whose rank file is linked out of it is one FAIL
row of a folder of runs, never the end of the page."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("duckdb")

from trainledger.journal import Journal, Signer, StepObserved, TrustPolicy, load_public_key, verify  # noqa: E402
from trainledger.serve.board import open_board  # noqa: E402
from trainledger.serve.fleet import Fleet  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[2] / "assets" / "golden"


def test_a_journal_signed_by_certified_rank_keys_is_shown_as_verify_shows_it(tmp_path):
    src = tmp_path / "journal.jsonl"
    shutil.copy(GOLDEN / "rank_keys_v1_7.jsonl", src)
    keys = [load_public_key(GOLDEN / "rank_keys_v1_7.pub")]
    assert verify(src, keys=keys).ok
    b = open_board(src, TrustPolicy(keys=keys))
    try:
        assert b.fail is None, b.fail
        assert b.journals[None].signed == verify(src, keys=keys).events
    finally:
        b.close()


def test_a_rank_file_linked_out_of_its_folder_is_one_fail_row(tmp_path):
    s = Signer.generate()
    root, outside = tmp_path / "runs", tmp_path / "outside"
    (root / "good").mkdir(parents=True)
    (root / "linked").mkdir()
    outside.mkdir()
    for p, rid in ((root / "good" / "journal.jsonl", "good"), (outside / "rank-00000.jsonl", "linked.r00000")):
        j = Journal.create(p, signer=s, run_id=rid)
        j.append(StepObserved(step=0, loss=1.0))
        j.close()
    (root / "linked" / "rank-00000.jsonl").symlink_to(outside / "rank-00000.jsonl")
    f = Fleet([root], TrustPolicy(keys=[s.public]))
    try:
        assert list(f.boards) == ["good"] and f.boards["good"].fail is None
        assert "outside" in f.unopened["linked"]
    finally:
        f.close()
