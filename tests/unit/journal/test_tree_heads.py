"""Format 1.3: every seal names the RFC 6962 tree of the lines before it and signs its C2SP checkpoint text."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from conftest import step
from journal_tools import dump, kinds, parse, read_lines, rechain, tree_root, write_lines

from trainledger.journal import Journal, verify
from trainledger.journal.errors import SealInvalid
from trainledger.journal.verify import PARALLEL_MIN_BYTES
from trainledger.journal.merkle import CompactRange, leaf_hash, range_of_lines
from trainledger.journal.merkle import _py_leaf_range


def test_every_seal_names_the_tree_of_the_lines_before_it(make_journal, pubkey):
    p = make_journal(95, seal_every=7)
    lines = read_lines(p)
    seals = [i for i, k in enumerate(kinds(lines)) if k == "seal"]
    assert len(seals) > 10
    for i in seals:
        obj = parse(lines[i])
        assert obj["tree_size"] == i and obj["tree_root"] == tree_root(lines[:i]).hex()
    r = verify(p, keys=[pubkey])
    assert r.last_tree_root == tree_root(lines[:-1]).hex() and r.tree.root() == tree_root(lines)


def test_a_seal_signing_a_wrong_root_with_the_runs_own_key_is_named(make_journal, pubkey, signer):
    """The writer's own key signs a checkpoint whose root leaves a line out: the signature verifies, the tree
    does not."""
    p = make_journal(40, seal_every=10)
    lines = read_lines(p)
    s = len(lines) - 1  # the closing seal: changing it moves no other line's hash
    obj = parse(lines[s])
    fake = tree_root(lines[:s - 1])  # the tree without the line just before the seal
    obj["tree_root"] = fake.hex()
    msg = (f"trainledger/{parse(lines[0])['run_id']}\n{s}\n{base64.b64encode(fake).decode()}\n"
           f"trainledger-head {s - 1}:{obj['sealed_hash']}\n").encode()
    obj["sig"] = base64.b64encode(signer.sign(msg)).decode()
    lines[s] = dump(obj)
    write_lines(p, rechain(lines, fix_seal_heads=False))
    with pytest.raises(SealInvalid, match=f"seal at seq {s}: its tree root is not the root") as ei:
        verify(p, keys=[pubkey])
    assert ei.value.seq == s
    import independent_verifier as iv

    with pytest.raises(iv.Bad, match="seal names another tree"):
        iv.verify(p.read_bytes(), pubkey.raw)


def test_the_independent_verifier_agrees_on_a_long_1_3_journal_and_the_goldens(make_journal, pubkey):
    import independent_verifier as iv

    from trainledger.journal import load_public_key

    p = make_journal(3000, seal_every=333)
    ref = verify(p, keys=[pubkey], require_closed=True)
    assert iv.verify(p.read_bytes(), pubkey.raw) == {"events": ref.events, "last_sealed_seq": ref.last_sealed_seq,
                                                     "tail": "closed"}
    golden = Path(__file__).resolve().parents[2] / "assets" / "golden"
    for name in ("every_kind_v1", "every_kind_v1_2", "every_kind_v1_3"):
        g = golden / f"{name}.jsonl"
        key = load_public_key(g.with_suffix(".pub"))
        assert iv.verify(g.read_bytes(), key.raw)["events"] == verify(g, keys=[key]).events


def test_a_changed_tree_size_or_a_tree_in_an_older_journal_is_refused(make_journal, pubkey):
    p = make_journal(20, seal_every=5)
    lines = read_lines(p)
    s = len(lines) - 1
    obj = parse(lines[s])
    obj["tree_size"] += 1
    lines[s] = dump(obj)
    write_lines(p, rechain(lines, fix_seal_heads=False))
    with pytest.raises(SealInvalid, match="does not name the tree"):
        verify(p, keys=[pubkey])
    lines = read_lines(make_journal(20, seal_every=5))
    opened = parse(lines[0])
    opened["format_version"] = "1.2"
    write_lines(p, rechain([dump(opened)] + lines[1:], fix_trees=False))
    with pytest.raises(SealInvalid, match="names a tree, which seals before format 1.3 do not"):
        verify(p, keys=[pubkey], check_signatures=False)


def test_parallel_ranges_check_each_seals_root_against_the_lines_before_them(tmp_path, signer, pubkey, monkeypatch):
    """Past 16 MiB the verifier checks byte ranges in worker processes; a range that starts mid-file can only
    check its seals' roots once the ranges before it are merged. A root off by one line in the last range is
    still named."""
    p = tmp_path / "big.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        for i in range(110_000):  # past PARALLEL_MIN_BYTES
            j.append(step(i))
    assert p.stat().st_size > PARALLEL_MIN_BYTES
    import sys

    verify_mod = sys.modules["trainledger.journal.verify"]

    merged = []
    real = verify_mod._merge_trees
    monkeypatch.setattr(verify_mod, "_merge_trees",
                        lambda rep, results, *a: (merged.append(sum(len(x.seal_roots) for x in results)),
                                                 real(rep, results, *a))[1])
    import threading

    # With a thread left running (a training script's, a test runner's), the workers come from a fork server
    # instead of a fork of this process, and the ranges are checked in them all the same.
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        started = []
        real_ctx = verify_mod._worker_context
        monkeypatch.setattr(verify_mod, "_worker_context", lambda: (started.append(c := real_ctx()), c)[1])
        r = verify(p, keys=[pubkey], workers=2)
        assert started and started[0].get_start_method() == "forkserver"
    finally:
        stop.set()
        t.join()
    assert merged and merged[0] > 50  # the seals of the ranges after the first were checked at the merge
    lines = read_lines(p)
    assert r.ok and r.tree.end == len(lines) and r.tree.root() == range_of_lines(0, lines).root()
    s = len(lines) - 1
    obj = parse(lines[s])
    obj["tree_root"] = range_of_lines(0, lines[:s - 1]).root().hex()
    msg = (f"trainledger/{parse(lines[0])['run_id']}\n{s}\n"
           f"{base64.b64encode(bytes.fromhex(obj['tree_root'])).decode()}\n"
           f"trainledger-head {s - 1}:{obj['sealed_hash']}\n").encode()
    obj["sig"] = base64.b64encode(signer.sign(msg)).decode()
    lines[s] = dump(obj)
    write_lines(p, rechain(lines, fix_seal_heads=False))
    with pytest.raises(SealInvalid, match=f"seal at seq {s}: its tree root") as ei:
        verify(p, keys=[pubkey], workers=2)
    assert ei.value.offset == p.stat().st_size - len(lines[-1]) - 1


def test_open_append_continues_the_tree_after_cutting_an_unsigned_tail(tmp_path, signer, pubkey):
    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=signer, background=False)
    for i in range(30):
        j.append(step(i))
    j.seal()
    for i in range(30, 37):
        j.append(step(i))  # never sealed: open_append moves them aside
    j.flush()
    j._release()
    with Journal.open_append(p, signer=signer, background=False) as j:
        for i in range(30, 50):
            j.append(step(i))
    lines = read_lines(p)
    assert "tail_repaired" in kinds(lines)
    r = verify(p, keys=[pubkey], require_closed=True)
    assert r.tree.root() == tree_root(lines)


def test_the_accelerated_tree_agrees_with_the_reference(tmp_path):
    import os

    lines = [os.urandom(1 + (i * 37) % 300) for i in range(700)]
    for begin in (0, 1, 3, 512, 1000, 4095):
        ref = CompactRange(begin)
        for x in lines:
            ref.append(leaf_hash(x))
        assert range_of_lines(begin, lines)._nodes == ref._nodes == _py_leaf_range(begin, lines)
    assert range_of_lines(0, lines).root() == tree_root(lines)
