"""query reads exactly what it verified, paths literally, every line; its cache cannot be planted."""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import step
from test_cli import run

from trainledger.journal import Journal, JournalIOError
from trainledger.journal.views import query as q


def _journal(path, signer, n, **meta):
    with Journal.create(path, signer=signer, background=False, meta=meta) as j:
        for i in range(n):
            j.append(step(i))
    return path


def _run_id(path):
    return json.loads(path.read_bytes().split(b"\n")[0])["run_id"]


def test_file_swapped_after_verification_is_not_what_gets_loaded(tmp_path, signer, pubkey, monkeypatch):
    a = _journal(tmp_path / "a.jsonl", signer, 30)
    other = _journal(tmp_path / "other.jsonl", signer, 30)  # same size, another run
    assert a.stat().st_size == other.stat().st_size
    verified_run = _run_id(a)
    real_verify = q.verify_with

    def verify_then_swap(path, hooks, **kw):  # the attacker acts between verification and DuckDB's read
        rep = real_verify(path, hooks, **kw)
        a.write_bytes(other.read_bytes())
        return rep

    monkeypatch.setattr(q, "verify_with", verify_then_swap)
    con = q.connect([a], keys=[pubkey], use_cache=False)
    assert con.execute("SELECT DISTINCT run_id FROM events").fetchall() == [(verified_run,)]
    assert _run_id(a) != verified_run  # the file was swapped; the rows are still what was verified


def test_glob_characters_in_a_path_are_read_literally(tmp_path, signer, pubkey):
    literal = _journal(tmp_path / "[ab].jsonl", signer, 5)
    _journal(tmp_path / "a.jsonl", signer, 50)  # what a glob '[ab].jsonl' would match
    con = q.connect([literal], keys=[pubkey], use_cache=False)
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == 5


def test_lines_longer_than_duckdbs_default_are_loaded(tmp_path, signer, pubkey):
    p = _journal(tmp_path / "big.jsonl", signer, 3, blob="x" * (3 << 20))  # a 3 MiB run_opened line
    con = q.connect([p], keys=[pubkey], use_cache=False)
    assert con.execute("SELECT count(*) FROM events WHERE kind = 'run_opened'").fetchone()[0] == 1
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == 3


def test_cache_folder_writable_by_others_is_refused(tmp_path, signer, pubkey, monkeypatch):
    p = _journal(tmp_path / "j.jsonl", signer, 5)
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv("TRAINLEDGER_CACHE_DIR", str(shared))
    with pytest.raises(JournalIOError, match="only this user can write"):
        q.build_cache([p], keys=[pubkey])
    os.chmod(shared, 0o700)
    q.build_cache([p], keys=[pubkey])
    os.chmod(shared, 0o777)  # opened up later: the copy there is no longer used
    assert q.open_views([p], keys=[pubkey])[1].origin == "journals"


def test_cache_folder_that_is_a_link_is_refused(tmp_path, signer, pubkey, monkeypatch):
    p = _journal(tmp_path / "j.jsonl", signer, 5)
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    os.symlink(real, tmp_path / "link")
    monkeypatch.setenv("TRAINLEDGER_CACHE_DIR", str(tmp_path / "link"))
    with pytest.raises(JournalIOError):
        q.build_cache([p], keys=[pubkey])


def test_planted_cache_copy_is_not_served(tmp_path, signer, pubkey, monkeypatch):
    """A copy built from another run and linked in under the victim's cache name is ignored."""
    victim = _journal(tmp_path / "victim.jsonl", signer, 5)
    other = _journal(tmp_path / "other.jsonl", signer, 80)
    built = q.build_cache([other], keys=[pubkey])
    target = q._cache_path([victim])
    os.symlink(built, target)
    con, source = q.open_views([victim], keys=[pubkey])
    assert source.origin == "journals" and con.execute("SELECT count(*) FROM steps").fetchone()[0] == 5


def test_background_refresher_never_imports_the_current_folder(tmp_path, signer, pubkey, monkeypatch):
    p = _journal(tmp_path / "j.jsonl", signer, 5)
    evil = tmp_path / "cwd" / "journal"
    evil.mkdir(parents=True)
    marker = tmp_path / "pwned"
    (evil / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (evil / "query.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path / "cwd")
    q.refresh_cache_in_background([p], keys=[pubkey])
    target = q._cache_path([p])
    deadline = time.monotonic() + 60
    while not target.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert target.exists() and not marker.exists()


def test_query_with_no_sql_and_empty_sql_are_usage_errors(tmp_path, signer, capsys):
    p = _journal(tmp_path / "j.jsonl", signer, 5)
    code, _, err = run(capsys, "query", "--trust-embedded", p, "   ")
    assert code == 2 and "empty" in err


def test_rewrite_keeping_size_and_last_line_is_not_served_from_the_cache(tmp_path, signer, pubkey):
    """The middle of a cached journal is rewritten (same size, same last line): the cache is not used, the
    journal is verified afresh, and the tampering is reported."""
    from trainledger.journal import ChainBroken

    p = _journal(tmp_path / "j.jsonl", signer, 30)
    q.build_cache([p], keys=[pubkey])
    assert q.open_views([p], keys=[pubkey])[1].origin == "cache"
    data = bytearray(p.read_bytes())
    i = data.index(b'"loss":2.9')
    data[i + 8:i + 9] = b"1" if data[i + 8:i + 9] != b"1" else b"2"
    p.write_bytes(bytes(data))
    with pytest.raises(ChainBroken):
        q.open_views([p], keys=[pubkey])
