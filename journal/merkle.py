"""RFC 6962 / RFC 9162 Merkle trees over a journal's lines.

A journal's lines are the leaves: leaf hash = SHA-256(0x00 || the line's bytes without its newline), node =
SHA-256(0x01 || left || right). :func:`root` is the Merkle Tree Hash of RFC 9162 section 2.1.1;
:func:`inclusion_proof` and :func:`consistency_proof` generate the audit paths of sections 2.1.3.1 and 2.1.4.1
from a list of leaf hashes, and :func:`verify_inclusion` and :func:`verify_consistency` check them with the
algorithms of sections 2.1.3.2 and 2.1.4.2, which take nothing but the proof, the sizes and the roots.
:class:`CompactTree` keeps a growing tree's right edge (at most log2(n) hashes), so a writer appends a leaf in
O(log n) amortised and knows the root at any size. Checked against transparency-dev/merkle's test vectors and a
naive recursive reference (tests/unit/journal/test_merkle.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from trainledger.journal.errors import TrainledgerError

__all__ = ["leaf_hash", "node_hash", "root", "inclusion_proof", "consistency_proof", "verify_inclusion",
           "verify_consistency", "CompactTree", "CompactRange", "ProofError", "EMPTY_ROOT", "range_of_lines",
           "range_of_hashes", "leaf_hashes", "node_level"]

#: The root of the empty tree: SHA-256 of nothing.
EMPTY_ROOT = hashlib.sha256(b"").digest()


class ProofError(TrainledgerError, ValueError):
    """A proof that does not check out (the message says why); an integrity failure (exit 1)."""

    exit_code = 1


def leaf_hash(line: bytes) -> bytes:
    return hashlib.sha256(b"\x00" + line).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    return 1 << ((n - 1).bit_length() - 1)


def root(leaves: Sequence[bytes]) -> bytes:
    """MTH(D[n]) over leaf *hashes* (not the lines), iteratively: hash pairs level by level, an odd last node
    carried up unpaired; the same tree as RFC 9162's recursive definition."""
    if not leaves:
        return EMPTY_ROOT
    level = list(leaves)
    while len(level) > 1:
        nxt = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


def inclusion_proof(leaves: Sequence[bytes], index: int) -> list[bytes]:
    """PATH(m, D[n]) of RFC 9162 section 2.1.3.1: the audit path of leaf ``index`` in the tree of ``leaves``."""
    n = len(leaves)
    if not 0 <= index < n:
        raise ValueError(f"leaf {index} is not in a tree of {n}")
    path: list[bytes] = []
    lo, hi = 0, n
    while hi - lo > 1:
        k = _split(hi - lo)
        if index - lo < k:
            path.append(root(leaves[lo + k:hi]))
            hi = lo + k
        else:
            path.append(root(leaves[lo:lo + k]))
            lo = lo + k
    return path[::-1]


def consistency_proof(leaves: Sequence[bytes], size1: int) -> list[bytes]:
    """PROOF(m, D[n]) of RFC 9162 section 2.1.4.1: that the tree of the first ``size1`` leaves is a prefix of
    the tree of all of ``leaves``."""
    n = len(leaves)
    if not 0 < size1 <= n:
        raise ValueError(f"no consistency proof from size {size1} to {n}")

    def sub(m: int, d: Sequence[bytes], complete: bool) -> list[bytes]:
        if m == len(d):
            return [] if complete else [root(d)]
        k = _split(len(d))
        if m <= k:
            return sub(m, d[:k], complete) + [root(d[k:])]
        return sub(m - k, d[k:], False) + [root(d[:k])]

    return sub(size1, leaves, True)


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], want_root: bytes) -> None:
    """RFC 9162 section 2.1.3.2; raises :class:`ProofError` unless ``proof`` shows ``leaf`` (a leaf hash) at
    ``index`` of the tree of ``size`` whose root is ``want_root``."""
    if not 0 <= index < size:
        raise ProofError(f"index {index} is beyond a tree of size {size}")
    if len(leaf) != 32 or len(want_root) != 32:
        raise ProofError("a leaf hash and a root are 32 bytes")
    fn, sn = index, size - 1
    r = leaf
    for p in proof:
        if len(p) != 32:
            raise ProofError("a proof hash is not 32 bytes")
        if sn == 0:
            raise ProofError("the proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the proof is shorter than the tree is deep")
    if r != want_root:
        raise ProofError("the proof leads to another root")


def verify_consistency(size1: int, size2: int, root1: bytes, root2: bytes, proof: Sequence[bytes]) -> None:
    """RFC 9162 section 2.1.4.2; raises :class:`ProofError` unless ``proof`` shows that the tree of ``size1``
    with ``root1`` is a prefix of the tree of ``size2`` with ``root2``."""
    if size2 < size1:
        raise ProofError(f"no consistency from size {size1} to a smaller size {size2}: a rollback")
    if size1 < 1:
        raise ProofError("no consistency from the empty tree: it proves nothing (every tree extends it)")
    if any(len(p) != 32 for p in proof):
        raise ProofError("a proof hash is not 32 bytes")
    if size1 == size2:
        if proof:
            raise ProofError("equal sizes need an empty proof")
        if root1 != root2:
            raise ProofError("equal sizes, different roots: a fork")
        return
    if not proof:
        raise ProofError("an empty proof between different sizes")
    path = list(proof)
    if size1 & (size1 - 1) == 0:  # a power of two: the old root is the first node
        path.insert(0, root1)
    fn, sn = size1 - 1, size2 - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise ProofError("the proof is longer than the trees need")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise ProofError("the proof is shorter than the trees need")
    if fr != root1:
        raise ProofError("the proof does not lead to the old root")
    if sr != root2:
        raise ProofError("the proof does not lead to the new root")


class CompactTree:
    """A growing tree's right edge: the roots of its perfect subtrees, largest first (at most log2(n) hashes).
    :meth:`append` is O(1) amortised (O(log n) at worst); :meth:`root` folds the edge (O(log n))."""

    __slots__ = ("size", "_edge")

    def __init__(self) -> None:
        self.size = 0
        self._edge: list[bytes] = []

    def append(self, leaf: bytes) -> None:
        """Add a leaf *hash*."""
        h = leaf
        n = self.size
        edge = self._edge
        while n & 1:  # every trailing 1 bit is a perfect subtree that the new leaf completes
            h = node_hash(edge.pop(), h)
            n >>= 1
        edge.append(h)
        self.size += 1

    def root(self) -> bytes:
        if not self._edge:
            return EMPTY_ROOT
        r = self._edge[-1]
        for h in reversed(self._edge[:-1]):
            r = node_hash(h, r)
        return r


class CompactRange:
    """The leaves ``[begin, end)`` of a tree as the fewest perfect subtrees aligned to it (at most 2 log2 n hashes):
    what a verifier's worker hands back for its byte range, so that ranges checked in parallel merge into the tree of
    the whole journal. A range that starts at 0 is a :class:`CompactTree`'s edge and has a :meth:`root`."""

    __slots__ = ("begin", "end", "_nodes")

    def __init__(self, begin: int = 0) -> None:
        if begin < 0:
            raise ValueError("a range begins at a leaf index >= 0")
        self.begin = self.end = begin
        self._nodes: list[tuple[int, bytes]] = []  # (height, hash), left to right

    def append(self, leaf: bytes) -> None:
        self._push(0, leaf)

    def _push(self, height: int, h: bytes) -> None:
        """Add a perfect subtree of ``2**height`` leaves at the end (it must start at a multiple of its size)."""
        nodes = self._nodes
        self.end += 1 << height
        # merge with the left neighbour while they are siblings: same height, and this one is a right child
        while nodes and nodes[-1][0] == height and ((self.end >> height) - 1) & 1:
            h = node_hash(nodes.pop()[1], h)
            height += 1
        nodes.append((height, h))

    def merge(self, other: CompactRange) -> None:
        """Append ``other``, which must begin where this range ends."""
        if other.begin != self.end:
            raise ValueError(f"ranges [{self.begin}, {self.end}) and [{other.begin}, {other.end}) are not adjacent")
        if _range_merge is not None:
            self.end = _range_merge(self._nodes, self.end, other._nodes)
            return
        for height, h in other._nodes:
            if self.end % (1 << height):
                raise ValueError("a subtree is not aligned where it lands")  # pragma: no cover - by construction
            self._push(height, h)

    def copy(self) -> CompactRange:
        c = CompactRange(self.begin)
        c.end, c._nodes = self.end, list(self._nodes)
        return c

    def root(self) -> bytes:
        """The tree hash of leaves ``[0, end)`` (a range that begins at 0)."""
        if self.begin != 0:
            raise ValueError("only a range from leaf 0 has a root")
        if not self._nodes:
            return EMPTY_ROOT
        if _range_root is not None:
            return _range_root(self._nodes)
        r = self._nodes[-1][1]
        for _, h in reversed(self._nodes[:-1]):
            r = node_hash(h, r)
        return r


def _py_leaf_range(begin: int, lines: list[bytes]) -> list[tuple[int, bytes]]:
    r = CompactRange(begin)
    for line in lines:
        r.append(leaf_hash(line))
    return r._nodes


def _py_hash_range(begin: int, hashes) -> list[tuple[int, bytes]]:
    hashes = bytes(hashes)
    if len(hashes) % 32:
        raise ValueError("not a whole number of 32-byte hashes")
    r = CompactRange(begin)
    for i in range(0, len(hashes), 32):
        r.append(hashes[i:i + 32])
    return r._nodes


def _py_leaf_hashes(lines: list[bytes]) -> bytes:
    return b"".join(leaf_hash(x) for x in lines)


def _py_node_level(hashes: bytes) -> bytes:
    if len(hashes) % 32:
        raise ValueError("not a whole number of 32-byte hashes")
    return b"".join(node_hash(hashes[i:i + 32], hashes[i + 32:i + 64]) for i in range(0, len(hashes) - 63, 64))


def _pick():
    from trainledger.journal import accel as _accel

    f = _accel.fast
    if f is not None and hasattr(f, "range_root"):
        return (f.leaf_range, f.hash_range, f.leaf_hashes, f.node_level, f.range_merge, f.range_root,
                getattr(f, "block_range", None))
    return _py_leaf_range, _py_hash_range, _py_leaf_hashes, _py_node_level, None, None, None


#: _range_merge and _range_root: CompactRange's merge and root in C, or None for its Python lines (the same nodes;
#: tests/unit/journal/test_accel.py holds each C function to its Python lines); _block_range: range_of_block's, or None
_leaf_range, _hash_range, leaf_hashes, node_level, _range_merge, _range_root, _block_range = _pick()


def range_of_lines(begin: int, lines: list[bytes]) -> CompactRange:
    """The :class:`CompactRange` of ``lines`` (bytes without their newlines) as leaves ``begin``, ``begin + 1``, ...
    (in C where the accelerator is built)."""
    r = CompactRange(begin)
    r._nodes = _leaf_range(begin, lines)
    r.end = begin + len(lines)
    return r


def range_of_block(begin: int, buf, start: int = 0) -> CompactRange:
    """:func:`range_of_lines` for the whole lines of ``buf[start:]`` (any bytes-like; each line ends in a newline,
    which is not part of its leaf), hashed where they lie (the writer's buffer) instead of copied and split first."""
    fast = _block_range
    if fast is None:
        data = bytes(buf[start:])
        if data and not data.endswith(b"\n"):
            raise ValueError("buf[start:] is not whole lines")
        return range_of_lines(begin, data.split(b"\n")[:-1] if data else [])
    r = CompactRange(begin)
    r._nodes = fast(begin, buf, start)
    r.end = begin + sum(1 << h for h, _ in r._nodes)
    return r


def range_of_hashes(begin: int, hashes) -> CompactRange:
    """:func:`range_of_lines` for leaves given as their hashes (32 bytes each, concatenated, any bytes-like)."""
    r = CompactRange(begin)
    r._nodes = _hash_range(begin, hashes)
    r.end = begin + len(hashes) // 32
    return r
