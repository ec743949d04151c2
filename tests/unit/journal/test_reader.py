"""Streaming reads and the parallel-checked fold give the same events, and both refuse tampering."""

from __future__ import annotations

import pytest
from conftest import step
from journal_tools import read_lines, write_lines

from trainledger.journal import ChainBroken, Journal, read_events
from trainledger.journal.reader import fold_events, read_event_batches


def _journal(tmp_path, signer, n=3000):
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        for i in range(n):
            j.append(step(i))
    return p


def test_fold_sees_exactly_what_read_events_yields(tmp_path, signer):
    p = _journal(tmp_path, signer)
    folded = []
    fold_events(p, folded.extend)
    assert [e.h for e in folded] == [e.h for e in read_events(p)]
    assert sum(map(len, read_event_batches(p))) == len(folded)


def test_fold_raises_when_the_chain_is_broken(tmp_path, signer):
    p = _journal(tmp_path, signer)
    lines = read_lines(p)
    i = next(k for k in range(1500, len(lines)) if b'"tokens":4096' in lines[k])
    lines[i] = lines[i].replace(b'"tokens":4096', b'"tokens":4097')
    write_lines(p, lines)
    with pytest.raises(ChainBroken):
        fold_events(p, lambda batch: None)
    with pytest.raises(ChainBroken):
        list(read_events(p))


def test_a_checking_process_that_dies_is_replaced_by_a_check_here(tmp_path, signer, monkeypatch):
    """If the forked checker dies before it reports (killed, out of memory), the journal is checked in-process:
    the answer is the journal's own error, never a vague 'the checking process died'."""
    import os

    from trainledger.journal import reader

    p = _journal(tmp_path, signer)
    lines = read_lines(p)
    i = next(k for k in range(1500, len(lines)) if b'"tokens":4096' in lines[k])
    lines[i] = lines[i].replace(b'"tokens":4096', b'"tokens":4097')
    write_lines(p, lines)
    monkeypatch.setattr(reader, "_check_in_child", lambda path, send: os._exit(9))
    with pytest.raises(ChainBroken):
        fold_events(p, lambda batch: None)
