"""RFC 6962 trees: transparency-dev/merkle's test vectors (every case as it wants, every mutated valid one
refused), and properties against a naive recursive reference kept here."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainledger.journal.merkle import (
    CompactTree,
    ProofError,
    consistency_proof,
    inclusion_proof,
    leaf_hash,
    root,
    verify_consistency,
    verify_inclusion,
)

VECTORS = Path(__file__).resolve().parents[2] / "assets" / "rfc6962"  # copied unchanged (Apache-2.0, LICENSE)


def _b(x):
    return base64.b64decode(x) if x is not None else b""


def _cases(kind):
    files = sorted((VECTORS / kind).rglob("*.json"))
    assert files, f"no {kind} vectors"
    return files


def _inclusion(c):
    verify_inclusion(_b(c["leafHash"]), c["leafIdx"], c["treeSize"], [_b(p) for p in c["proof"] or []], _b(c["root"]))


def _consistency(c):
    verify_consistency(c["size1"], c["size2"], _b(c["root1"]), _b(c["root2"]), [_b(p) for p in c["proof"] or []])


@pytest.mark.parametrize("path", _cases("inclusion"), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_inclusion_vectors(path):
    c = json.loads(path.read_text())
    if c["wantErr"]:
        with pytest.raises(ProofError):
            _inclusion(c)
    else:
        _inclusion(c)


@pytest.mark.parametrize("path", _cases("consistency"), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_consistency_vectors(path):
    c = json.loads(path.read_text())
    if c["wantErr"]:
        with pytest.raises(ProofError):
            _consistency(c)
    else:
        _consistency(c)


def test_every_mutation_of_a_valid_vector_is_refused():
    """Each hash of each valid proof with one bit flipped, and each proof with a hash dropped or repeated."""
    n = 0
    for kind, check in (("inclusion", _inclusion), ("consistency", _consistency)):
        for path in _cases(kind):
            c = json.loads(path.read_text())
            if c["wantErr"] or not c["proof"]:
                continue
            proof = c["proof"]
            mutants = []
            for i, p in enumerate(proof):
                raw = bytearray(_b(p))
                raw[i % 32] ^= 1
                mutants.append(proof[:i] + [base64.b64encode(bytes(raw)).decode()] + proof[i + 1:])
            mutants += [proof[:-1], proof + [proof[-1]]]
            for m in mutants:
                with pytest.raises(ProofError):
                    check({**c, "proof": m})
                n += 1
    assert n > 30


# ---------------------------------------------------------------- the naive reference (RFC 9162, recursive)

def mth(d):
    if not d:
        return hashlib.sha256(b"").digest()
    if len(d) == 1:
        return d[0]
    k = 1 << ((len(d) - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + mth(d[:k]) + mth(d[k:])).digest()


def leaves(n):
    return [leaf_hash(f"line {i}".encode()) for i in range(n)]


def test_roots_proofs_and_the_compact_tree_agree_with_the_reference_for_every_size_to_200():
    ls = leaves(200)
    tree = CompactTree()
    for n in range(1, 201):
        tree.append(ls[n - 1])
        d = ls[:n]
        r = mth(d)
        assert root(d) == r and tree.root() == r and tree.size == n
        for i in (0, n // 3, n - 1):
            proof = inclusion_proof(d, i)
            assert len(proof) <= max(1, (n - 1).bit_length())
            verify_inclusion(d[i], i, n, proof, r)
        for m in (1, n // 2 or 1, n - 1 or 1, n):
            verify_consistency(m, n, mth(ls[:m]), r, consistency_proof(d, m))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 3000), data=st.data())
def test_random_sizes(n, data):
    ls = leaves(n)
    r = root(ls)
    i = data.draw(st.integers(0, n - 1))
    verify_inclusion(ls[i], i, n, inclusion_proof(ls, i), r)
    with pytest.raises(ProofError):
        verify_inclusion(leaf_hash(b"not a line"), i, n, inclusion_proof(ls, i), r)
    m = data.draw(st.integers(1, n))
    verify_consistency(m, n, root(ls[:m]), r, consistency_proof(ls, m))
    if m < n:
        with pytest.raises(ProofError):  # a fork: the same size, another history
            verify_consistency(m, n, root(leaves(m + 1)[1:]), r, consistency_proof(ls, m))


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 300), data=st.data())
def test_compact_ranges_checked_apart_merge_into_the_whole_tree(n, data):
    """A journal cut into ranges (as the verifier's workers cut it): each range's compact form, merged in order,
    gives every prefix's root, the whole tree's included, as the naive reference does."""
    from trainledger.journal.merkle import CompactRange

    ls = leaves(n)
    cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=6)) if n > 1 else []))
    bounds = [0, *cuts, n]
    prefix = CompactRange(0)
    for a, b in zip(bounds, bounds[1:]):
        part = CompactRange(a)
        for i in range(a, b):
            part.append(ls[i])
            whole = prefix.copy()
            whole.merge(part)
            assert whole.end == i + 1 and whole.root() == mth(ls[:i + 1])
        prefix.merge(part)
    assert prefix.root() == mth(ls) and len(prefix._nodes) <= n.bit_length()
    with pytest.raises(ValueError):
        CompactRange(3).merge(CompactRange(5))
