"""Every command that reads a journal accepts the folder the main job writes (``trainledger ladder OUT`` leaves
``OUT/ladder.jsonl``; the Recorder and the demo ``journal.jsonl``) and says which file it read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from trainledger.cli import main

GOLDEN = Path(__file__).resolve().parents[2] / "assets" / "golden"


@pytest.fixture
def ladder_folder(tmp_path):
    out = tmp_path / "ladder-run"
    out.mkdir()
    shutil.copy(GOLDEN / "ladder_closed_v1_7.jsonl", out / "ladder.jsonl")  # a ladder that needs no refit
    (out / "report.html").write_text("<html></html>")          # what the main job leaves beside it
    return out, str(GOLDEN / "ladder_closed_v1_7.pub")


@pytest.mark.parametrize("command", [["verify"], ["replay"], ["show"], ["head"],
                                     ["report", "--out", "{tmp}/r.html"]])
def test_a_reading_command_reads_the_main_jobs_folder_and_names_the_file(ladder_folder, tmp_path, command, capsys):
    out, pub = ladder_folder
    args = [a.format(tmp=tmp_path) for a in command]
    trust = [] if command == ["show"] else ["--pubkey", pub]
    assert main([*args, *trust, str(out)]) == 0
    err = capsys.readouterr().err
    assert f"trainledger {command[0]}: reading {out / 'ladder.jsonl'}" in err


def test_query_and_serve_take_the_folder_too(ladder_folder):
    from trainledger.serve.board import Board

    out, pub = ladder_folder
    assert main(["query", "--pubkey", pub, str(out), "SELECT count(*) FROM events"]) == 0
    from trainledger.journal import load_public_key

    board = Board(out, keys=[load_public_key(pub)])
    try:
        assert board.path == out / "ladder.jsonl" and not board.is_run_dir
    finally:
        board.close()


def test_a_folder_of_several_unnamed_journals_is_a_usage_error_naming_them(tmp_path, capsys):
    for name in ("a.jsonl", "b.jsonl"):
        shutil.copy(GOLDEN / "every_kind_v1_3.jsonl", tmp_path / name)
    assert main(["verify", "--trust-embedded", str(tmp_path)]) == 2
    assert "a folder of 2 journals (a.jsonl, b.jsonl): name the one to read" in capsys.readouterr().err
    (tmp_path / "a.jsonl").unlink()
    (tmp_path / "b.jsonl").unlink()
    assert main(["replay", "--trust-embedded", str(tmp_path)]) == 2
    assert "no journal in it" in capsys.readouterr().err
