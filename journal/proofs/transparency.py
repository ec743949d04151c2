"""Proving one fact without sharing the run : signed checkpoints, inclusion and consistency proofs, the
tree index, and witnesses.

Every seal of a format 1.3 journal is a C2SP checkpoint of the RFC 6962 tree over the lines before it
(docs/FORMAT.md section 4.1). From that:

- :func:`checkpoint_note` is a seal as a signed note, the thing to publish, and the thing a witness cosigns;
- :func:`prove` writes a bundle: chosen lines, each with its inclusion proof against one seal's checkpoint. The
  proofs come from a :class:`TreeIndex`, a sidecar (``<journal>.tlindex``) of the tree's nodes from tile height 10
  up, with the byte offset of every 1,024-line tile: proving reads one tile of the journal and at most log2(n)
  stored nodes. The index is built from the journal and checked against it (each tile it reads is hashed again
  and held to the stored node, and every proof is verified against the signed root before it is written), so a
  stale or doctored index costs a rebuild, never a false proof;
- :func:`verify_bundle` checks a bundle offline, with no journal: the checkpoint's signature under a pinned key,
  each line's proof, optionally the checkpoint's cosignatures (a quorum of pinned witnesses), and, for a
  consistency bundle, that an older checkpoint is a prefix of it;
- :class:`Witness` keeps, per origin, the last checkpoint it cosigned, and cosigns a new one only given a valid
  consistency proof from it: it refuses a rollback and a fork, and says which.

docs/proofs.md states the trust model.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import fcntl
import json
import multiprocessing
import os
import struct
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from trainledger.journal import codec
from trainledger.journal.paths import open_new
from trainledger.journal.scan import worker_ignores_ctrl_c
from trainledger.journal.chain import HEAD_EXTENSION, has_tree, is_hash_hex, origin, seal_checkpoint
from trainledger.journal.errors import (
    TrainledgerError,
    CheckpointMismatch,
    IntegrityError,
    JournalIOError,
    SchemaError,
    SealInvalid,
    UntrustedKey,
    UsageError,
)
from trainledger.journal.keys import PublicKey
from trainledger.journal.proofs.merkle import EMPTY_ROOT, ProofError, leaf_hash, leaf_hashes, node_hash, node_level, verify_consistency, \
    verify_inclusion
from trainledger.journal.proofs.note import (
    Checkpoint,
    NoteError,
    Verifier,
    check_cosignatures,
    cosign,
    key_hash,
    note_signature_line,
    open_note,
    parse_checkpoint,
    parse_verifier_key,
)
from trainledger.journal.trust import TrustPolicy
from trainledger.journal.verify import open_checked, read_opening, resolve_key

__all__ = ["BUNDLE_FORMAT", "TILE_HEIGHT", "TreeIndex", "TreeView", "checkpoint_note", "log_verifier", "prove",
           "consistency", "verify_bundle", "BundleResult", "Witness", "WitnessRefused", "build_index", "load_index",
           "index_path_for", "read_seal", "find_lines"]

BUNDLE_FORMAT = "trainledger-proof/v1"
TILE_HEIGHT = 10
TILE = 1 << TILE_HEIGHT
_INDEX_MAGIC = b"trainledger-tree-index/v1\n"
#: A bundle bigger than this is refused before it is parsed.
MAX_BUNDLE_BYTES = 64 << 20
MAX_ENTRIES = 100_000
_MAX_PROOF = 64  # hashes: a tree of 2**64 lines
#: The most bytes of journal one proof reads (a 1,024-line tile); a writer's lines are a few hundred bytes each.
_MAX_TILE_BYTES = 256 << 20
#: An index is built in parallel worker processes past this many bytes to hash.
_PARALLEL_INDEX_BYTES = 32 << 20


class WitnessRefused(IntegrityError):
    """A witness will not cosign: a rollback, a fork, or a checkpoint it cannot check (the message says which)."""

    reason = "witness-refused"


# ------------------------------------------------------------------ checkpoints as signed notes


def log_verifier(run_id: str, public: PublicKey | bytes) -> Verifier:
    """The signed-note verifier of a run's checkpoints: key name = origin = ``trainledger/<run id>``."""
    raw = public.raw if isinstance(public, PublicKey) else public
    name = origin(run_id)
    return Verifier(name, key_hash(name, raw), raw)


def checkpoint_note(run_id: str, tree_size: int, tree_root: bytes, sealed_hash: bytes, sig: bytes,
                    public: PublicKey | bytes) -> str:
    """A format 1.3 seal as a C2SP signed note: its checkpoint text, a blank line, the signature line."""
    raw = public.raw if isinstance(public, PublicKey) else public
    text = seal_checkpoint(run_id, tree_size, tree_root, tree_size - 1, sealed_hash)
    return text + "\n" + note_signature_line(origin(run_id), raw, sig)


def _parse_head_extension(cp: Checkpoint) -> tuple[int, str]:
    heads = [x for x in cp.extensions if x.startswith(HEAD_EXTENSION + " ")]
    if len(heads) != 1:
        raise NoteError("the checkpoint does not name one trainledger chain head")
    seq_s, _, h = heads[0][len(HEAD_EXTENSION) + 1:].partition(":")
    if not seq_s.isdigit() or int(seq_s) != cp.size - 1 or not is_hash_hex(h):
        raise NoteError("the checkpoint's trainledger-head line is not SIZE-1:HASH")
    return int(seq_s), h


def open_checkpoint(note: str, run_id: str | None, keys: Sequence[PublicKey]) -> tuple[Checkpoint, PublicKey]:
    """A run's signed checkpoint, opened under a pinned key: its parsed text and the key that signed it. The
    run id is the one the checkpoint's origin names when ``run_id`` is None."""
    text_end = note.rfind("\n\n")
    if text_end < 0:
        raise NoteError("not a signed note")
    cp = parse_checkpoint(note[:text_end + 1])
    if not cp.origin.startswith("trainledger/"):
        raise NoteError(f"origin {cp.origin[:80]!r} is not a trainledger run's")
    rid = cp.origin[len("trainledger/"):]
    if run_id is not None and rid != run_id:
        raise NoteError(f"the checkpoint is of run {rid[:80]!r}, not {run_id!r}")
    if not keys:
        raise UsageError("no key pinned: pass --pubkey FILE (or set TRAINLEDGER_TRUSTED_KEYS)")
    verifiers = {log_verifier(rid, k): k for k in keys}
    try:
        _, ok = open_note(note, list(verifiers))
    except NoteError as e:
        if "no signature by a pinned key" in str(e):
            raise UntrustedKey(f"the checkpoint of run {rid} is not signed by a pinned key "
                               f"(pinned: {', '.join(k.key_id for k in keys)})", seq=None) from None
        raise
    _parse_head_extension(cp)
    return cp, verifiers[ok[0]]


# ------------------------------------------------------------------ the index


def index_path_for(journal: str | os.PathLike) -> Path:
    p = Path(journal)
    return p.with_name(p.name + ".tlindex")


@dataclasses.dataclass
class TreeIndex:
    """The tree's nodes from tile height up, and where each tile starts: what proving a line needs besides one
    tile of the journal. ``levels[0]`` holds the roots of complete 1,024-line tiles, ``levels[k]`` the nodes of
    height ``10 + k`` (32 bytes each, complete subtrees only)."""

    run_id: str
    leaves: int  # complete lines indexed
    covered: int  # bytes of the journal they span
    offsets: list[int]  # byte offset of the first line of every tile (the last one may be partial)
    levels: list[bytes]

    def node(self, lo: int, height: int) -> bytes | None:
        k = height - TILE_HEIGHT
        if k < 0 or k >= len(self.levels):
            return None
        i = lo >> height
        lv = self.levels[k]
        if (i + 1) * 32 > len(lv):
            return None
        return lv[32 * i:32 * i + 32]

    def to_bytes(self) -> bytes:
        head = json.dumps({"run_id": self.run_id, "leaves": self.leaves, "covered": self.covered,
                           "tile_height": TILE_HEIGHT, "tiles": len(self.offsets),
                           "levels": [len(x) // 32 for x in self.levels]}).encode()
        return (_INDEX_MAGIC + head + b"\n" + struct.pack(f">{len(self.offsets)}Q", *self.offsets)
                + b"".join(self.levels))


def _parse_index(data: bytes) -> TreeIndex:
    if not data.startswith(_INDEX_MAGIC):
        raise ValueError("not a tree index")
    nl = data.find(b"\n", len(_INDEX_MAGIC), len(_INDEX_MAGIC) + 4096)
    if nl < 0:
        raise ValueError("no header")
    h = json.loads(data[len(_INDEX_MAGIC):nl])
    leaves, covered, tiles, levels = h["leaves"], h["covered"], h["tiles"], h["levels"]
    if h["tile_height"] != TILE_HEIGHT or not all(type(x) is int and x >= 0 for x in (leaves, covered, tiles)):
        raise ValueError("bad header")
    if tiles != -(-leaves // TILE) or [n for n in levels] != [leaves >> (TILE_HEIGHT + k) for k in range(len(levels))]:
        raise ValueError("inconsistent sizes")
    pos = nl + 1
    offsets = list(struct.unpack_from(f">{tiles}Q", data, pos))
    pos += 8 * tiles
    out = []
    for n in levels:
        out.append(data[pos:pos + 32 * n])
        pos += 32 * n
    if pos != len(data) or any(b <= a for a, b in zip(offsets, offsets[1:])) or (offsets and offsets[-1] >= covered):
        raise ValueError("inconsistent body")
    return TreeIndex(h["run_id"], leaves, covered, offsets, out)


def load_index(journal: str | os.PathLike, index: str | os.PathLike | None = None) -> TreeIndex | None:
    """The index beside ``journal`` if there is one that is well formed and names this run; else None."""
    p = Path(index) if index is not None else index_path_for(journal)
    try:
        data = p.read_bytes()
        idx = _parse_index(data)
    except (OSError, ValueError, KeyError, TypeError, struct.error, json.JSONDecodeError):
        return None
    try:
        opened, _ = read_opening(Path(journal), open_checked(Path(journal)))
    except IntegrityError:
        return None
    if idx.run_id != opened.run_id or idx.covered > os.path.getsize(journal):
        return None
    return idx


def _tile_root(leaves: bytes) -> bytes:
    """The root over a power of two of leaf hashes (a tile, or an aligned part of one): pairs hashed level by level in
    C (``node_level`` leaves an odd last hash out, which a power of two never has)."""
    level = leaves
    while len(level) > 32:
        level = node_level(level)
    return level


def _count_lines(args: tuple[str, int, int]) -> int:
    path, start, end = args
    n = 0
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        pos = start
        while pos < end:
            block = f.read(min(8 << 20, end - pos))
            if not block:
                break
            n += block.count(b"\n")
            pos += len(block)
    return n


def _hash_range(args: tuple[str, int, int, int]) -> tuple[bytes, list[tuple[int, bytes]], int, bytes]:
    """Leaf-hash the lines of ``[start, end)`` (whole lines), the first being leaf ``first``: the leaf hashes of the
    lines that finish the tile begun before this range, the (offset, root) of every tile that starts and ends in
    it, and the offset and leaf hashes of the tile it leaves unfinished."""
    path, start, end, first = args
    head = bytearray()
    tiles: list[tuple[int, bytes]] = []
    cur = bytearray()
    cur_off = start
    in_head = first % TILE != 0
    leaf = first
    off = start
    carry = b""
    with open(path, "rb", buffering=0) as f:
        f.seek(start)
        pos = start
        while pos < end:
            block = f.read(min(4 << 20, end - pos))
            if not block:
                break
            pos += len(block)
            lines = (carry + block).split(b"\n")
            carry = lines.pop()
            i = 0
            while i < len(lines):
                need = TILE - (leaf % TILE)
                chunk = lines[i:i + need]
                hashes = leaf_hashes(chunk)
                if in_head:
                    head += hashes
                else:
                    if not cur:
                        cur_off = off
                    cur += hashes
                off += sum(map(len, chunk)) + len(chunk)
                leaf += len(chunk)
                i += len(chunk)
                if leaf % TILE == 0:
                    if in_head:
                        in_head = False
                    else:
                        tiles.append((cur_off, _tile_root(bytes(cur))))
                        cur = bytearray()
    return bytes(head), tiles, cur_off if cur else off, bytes(cur)


def _cut_points(path: Path, start: int, end: int, parts: int) -> list[int]:
    cuts = [start]
    with open(path, "rb") as f:
        for k in range(1, parts):
            target = start + (end - start) * k // parts
            if target <= cuts[-1]:
                continue
            f.seek(target)
            nl = f.read(1 << 20).find(b"\n")
            if nl < 0:
                continue
            c = target + nl + 1
            if cuts[-1] < c < end:
                cuts.append(c)
    cuts.append(end)
    return cuts


def build_index(journal: str | os.PathLike, *, reuse: TreeIndex | None = None, workers: int | None = None,
                progress: Callable[[int, int], None] | None = None) -> TreeIndex:
    """Index every complete line of ``journal`` (one pass; byte ranges in parallel worker processes). ``reuse``:
    an index of an earlier, shorter state of the same journal; its complete tiles are kept (they are checked
    when a proof reads them) and only the rest is hashed."""
    from trainledger.journal.scan import cpu_count

    p = Path(journal)
    size = open_checked(p)
    opened, _ = read_opening(p, size)
    with open(p, "rb") as f:  # complete lines only: a torn last line is not a leaf
        f.seek(max(0, size - (1 << 20)))
        tail = f.read()
    end = size - (len(tail) - tail.rfind(b"\n") - 1) if b"\n" in tail else size
    keep = 0
    offsets: list[int] = []
    tile_roots = bytearray()
    start = 0
    if reuse is not None and reuse.run_id == opened.run_id and reuse.levels:
        keep = len(reuse.levels[0]) // 32  # complete tiles
        if keep and reuse.covered <= end:
            offsets = reuse.offsets[:keep]
            tile_roots += reuse.levels[0]
            start = reuse.offsets[keep] if keep < len(reuse.offsets) else reuse.covered
        else:
            keep = 0
    first = keep * TILE
    n = cpu_count() if workers is None else max(1, workers)
    parts = n if end - start >= _PARALLEL_INDEX_BYTES and n > 1 and threading.active_count() == 1 else 1
    cuts = _cut_points(p, start, end, parts)
    ranges = list(zip(cuts, cuts[1:]))
    if parts > 1 and "fork" in multiprocessing.get_all_start_methods():
        with multiprocessing.get_context("fork").Pool(len(ranges), initializer=worker_ignores_ctrl_c) as pool:
            counts = pool.map(_count_lines, [(str(p), a, b) for a, b in ranges])
            firsts = [first + sum(counts[:i]) for i in range(len(ranges))]
            results = []
            for i, r in enumerate(pool.imap(_hash_range, [(str(p), a, b, f) for (a, b), f in zip(ranges, firsts)])):
                results.append(r)
                if progress is not None:
                    progress(ranges[i][1] - start, end - start)
    else:
        results = [_hash_range((str(p), a, b, first)) for a, b in ranges]
    # Join the ranges: a tile cut by a range boundary is finished from the next range's head.
    partial = bytearray()
    partial_off = start
    for head, tiles, tail_off, tail in results:
        if head:
            partial += head
            if len(partial) == TILE * 32:
                offsets.append(partial_off)
                tile_roots += _tile_root(bytes(partial))
                partial = bytearray()
        for off, root in tiles:
            offsets.append(off)
            tile_roots += root
        if tail:
            partial, partial_off = bytearray(tail), tail_off
    if partial:
        offsets.append(partial_off)
    leaves = len(tile_roots) // 32 * TILE + len(partial) // 32
    levels = [bytes(tile_roots)]
    while len(levels[-1]) >= 64:
        levels.append(node_level(levels[-1]))
    if not levels[0]:
        levels = []
    return TreeIndex(opened.run_id, leaves, end, offsets, levels)


def save_index(idx: TreeIndex, path: Path) -> bool:
    """Write the index atomically (a temporary file renamed into place); False when the folder refuses it."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        try:
            with open_new(tmp) as f:
                f.write(idx.to_bytes())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, path)
        return True
    except OSError:
        return False


# ------------------------------------------------------------------ proofs from the index and the journal


class TreeView:
    """Subtree hashes of the tree of the first ``size`` lines, from the index and the journal's tiles."""

    def __init__(self, journal: Path, idx: TreeIndex, size: int, *, fresh: bool = False):
        self.fresh = fresh  # the index was built from the journal just now (not read from its sidecar)
        if size > idx.leaves:
            raise ValueError(f"the index covers {idx.leaves} lines, not {size}")
        self.path = journal
        self.idx = idx
        self.size = size
        self._tiles: dict[int, tuple[list[bytes], bytes]] = {}  # tile -> (lines, leaf hashes)
        self.reads = 0

    def _tile(self, t: int) -> tuple[list[bytes], bytes]:
        got = self._tiles.get(t)
        if got is not None:
            return got
        idx = self.idx
        if t >= len(idx.offsets):
            raise IndexMismatch(f"no tile {t} in the index")
        start = idx.offsets[t]
        end = idx.offsets[t + 1] if t + 1 < len(idx.offsets) else idx.covered
        want = min(TILE, idx.leaves - t * TILE)
        if end - start > _MAX_TILE_BYTES:
            if not self.fresh:  # a sidecar's offsets are not trusted: build it again before saying anything
                raise IndexMismatch(f"tile {t} spans {end - start:,} bytes")
            raise UsageError(f"{self.path}: lines {t * TILE:,} to {t * TILE + want - 1:,} span {end - start:,} bytes, "
                             f"more than the {_MAX_TILE_BYTES:,} a proof reads at once")
        with open(self.path, "rb", buffering=0) as f:
            f.seek(start)
            data = f.read(end - start)
        self.reads += 1
        lines = data.split(b"\n")
        if len(lines) != want + 1 or lines[-1] != b"":
            raise IndexMismatch(f"tile {t} does not hold {want} lines where the index says")
        lines.pop()
        hashes = leaf_hashes(lines)
        stored = idx.node(t * TILE, TILE_HEIGHT)
        if stored is not None and _tile_root(hashes) != stored:
            raise IndexMismatch(f"tile {t} does not hash to the index's node")
        self._tiles[t] = (lines, hashes)
        return lines, hashes

    def line(self, i: int) -> bytes:
        lines, _ = self._tile(i >> TILE_HEIGHT)
        return lines[i & (TILE - 1)]

    def perfect(self, lo: int, height: int) -> bytes:
        """The hash of the perfect subtree of ``2**height`` leaves starting at ``lo`` (aligned)."""
        stored = self.idx.node(lo, height)
        if stored is not None:
            return stored
        if height >= TILE_HEIGHT:  # pragma: no cover - every complete node at tile height and above is stored
            raise IndexMismatch(f"no stored node at height {height}")
        _, hashes = self._tile(lo >> TILE_HEIGHT)
        a = (lo & (TILE - 1)) * 32
        return _tile_root(hashes[a:a + (32 << height)])

    def subtree(self, lo: int, hi: int) -> bytes:
        """MTH(D[lo:hi]) for a range RFC 6962's recursion reaches (``lo`` aligned to the range's split)."""
        n = hi - lo
        if n <= 0:
            return EMPTY_ROOT
        if n & (n - 1) == 0 and lo % n == 0:
            return self.perfect(lo, n.bit_length() - 1)
        k = 1 << ((n - 1).bit_length() - 1)
        return node_hash(self.subtree(lo, lo + k), self.subtree(lo + k, hi))

    def root(self) -> bytes:
        return self.subtree(0, self.size)

    def inclusion(self, i: int) -> list[bytes]:
        """RFC 9162 2.1.3.1: the audit path of leaf ``i``."""
        path: list[bytes] = []
        lo, hi = 0, self.size
        while hi - lo > 1:
            k = 1 << ((hi - lo - 1).bit_length() - 1)
            if i - lo < k:
                path.append(self.subtree(lo + k, hi))
                hi = lo + k
            else:
                path.append(self.subtree(lo, lo + k))
                lo += k
        return path[::-1]

    def consistency(self, m: int) -> list[bytes]:
        """RFC 9162 2.1.4.1: that the tree of the first ``m`` lines is a prefix of this one."""
        if not 0 < m <= self.size:
            raise ValueError(f"no consistency proof from size {m} to {self.size}")

        def sub(m: int, lo: int, hi: int, complete: bool) -> list[bytes]:
            if m == hi - lo:
                return [] if complete else [self.subtree(lo, hi)]
            k = 1 << ((hi - lo - 1).bit_length() - 1)
            if m <= k:
                return sub(m, lo, lo + k, complete) + [self.subtree(lo + k, hi)]
            return sub(m - k, lo + k, hi, False) + [self.subtree(lo, lo + k)]

        return sub(m, 0, self.size, True)


class IndexMismatch(TrainledgerError):
    """The index does not describe the journal as it is now: rebuild it (prove does, once)."""

    exit_code = 1


# ------------------------------------------------------------------ reading a journal without verifying it all


def read_seal(journal: Path, size: int, *, tree_size: int | None = None,
              view: TreeView | None = None) -> tuple[Any, bytes]:
    """The latest seal line (searched back from the end) or, with ``tree_size``, the seal at seq ``tree_size``
    (the seal whose tree has that size, read through ``view``): its record and its bytes. Checked for form only:
    the caller checks its signature."""
    if tree_size is not None:
        assert view is not None
        line = view.line(tree_size)
        rec = codec.decode_line(line, seq_hint=tree_size)
        if type(rec).__struct_config__.tag != "seal" or rec.seq != tree_size:
            raise UsageError(f"line {tree_size} is not a seal: no checkpoint of a tree of {tree_size} lines "
                             "(give the seq of a seal)")
        return rec, line
    with open(journal, "rb") as f:
        back = 0
        buf = b""
        while back < size and back < (64 << 20):
            step_ = min(1 << 20, size - back)
            back += step_
            f.seek(size - back)
            buf = f.read(step_) + buf
            lines = buf.split(b"\n")
            lines.pop()  # after the last newline: nothing, or a torn line
            for line in reversed(lines[1:] if back < size else lines):
                if line.startswith(b'{"kind":"seal",'):
                    return codec.decode_line(line), line
    raise SealInvalid("no seal in the last 64 MiB of the journal: pass --tree-size to name one", seq=None)


def find_lines(journal: Path, end: int, pred: Callable[[bytes], bool], prefixes: Sequence[bytes]) -> list[bytes]:
    """Every complete line in the first ``end`` bytes that starts with one of ``prefixes`` and satisfies ``pred``:
    a scan at ``bytes.find`` speed for the proof helpers (what a line says is proven, not trusted, afterwards)."""
    out = []
    needles = [b"\n" + p for p in prefixes]
    with open(journal, "rb", buffering=0) as f:
        pos = 0
        carry = b"\n"
        while pos < end:
            block = f.read(min(8 << 20, end - pos))
            if not block:
                break
            pos += len(block)
            data = carry + block
            cut = data.rfind(b"\n")
            for nd in needles:
                i = data.find(nd)
                while 0 <= i < cut:
                    j = data.find(b"\n", i + 1)
                    line = data[i + 1:j]
                    if pred(line):
                        out.append(line)
                    i = data.find(nd, j)
            carry = data[cut:]
    return out


# ------------------------------------------------------------------ prove


@dataclasses.dataclass
class ProveResult:
    bundle: dict[str, Any]
    index_built: bool
    index_saved: bool
    tile_reads: int


def _open_for_proof(journal: Path, keys: Sequence[PublicKey], trust_embedded: bool) -> tuple[Any, int, bytes]:
    size = open_checked(journal)
    opened, _ = read_opening(journal, size)
    if not has_tree(opened.format_version):
        raise UsageError(f"{journal}: format {opened.format_version} journals have no tree heads in their seals; "
                         "proofs need format 1.3 or later")
    if opened.key_id is None:
        raise UsageError(f"{journal}: the journal is unsigned: there is no signed checkpoint to prove against")
    public_raw, trust, _ = resolve_key(opened, keys=keys, trust_embedded=trust_embedded)
    return opened, size, public_raw


def _check_seal_signature(opened: Any, seal: Any, public_raw: bytes) -> bytes:
    root_hex = seal.tree_root
    if seal.tree_size != seal.seq or not is_hash_hex(root_hex) or not is_hash_hex(seal.sealed_hash):
        raise SealInvalid(f"seal at seq {seal.seq} names no tree of the lines before it, or no chain head",
                          seq=seal.seq)
    root = bytes.fromhex(root_hex)
    try:
        sig = base64.b64decode(seal.sig or "", validate=True)
    except (binascii.Error, ValueError):
        sig = b""
    text = seal_checkpoint(opened.run_id, seal.seq, root, seal.seq - 1, bytes.fromhex(seal.sealed_hash))
    if seal.key_id != opened.key_id or not PublicKey(public_raw).verify(sig, text.encode()):
        raise SealInvalid(f"seal at seq {seal.seq}: its signature does not verify under key {opened.key_id}",
                          seq=seal.seq)
    return sig


def _view(journal: Path, need: int, index: Path | None, rebuild: bool,
          progress: Callable[[int, int], None] | None) -> tuple[TreeView, bool, bool, TreeIndex]:
    ip = index or index_path_for(journal)
    idx = None if rebuild else load_index(journal, ip)
    built = saved = False
    if idx is None or idx.leaves < need:
        idx = build_index(journal, reuse=idx, progress=progress)
        built = True
        saved = save_index(idx, ip)
    if idx.leaves < need:
        raise UsageError(f"{journal}: {idx.leaves} complete lines, fewer than the {need} the checkpoint needs")
    return TreeView(journal, idx, need, fresh=built), built, saved, idx


def _against_seal(journal: str | os.PathLike, keys: Sequence[PublicKey], trust_embedded: bool, tree_size: int | None,
                  index: str | os.PathLike | None, progress: Callable[[int, int], None] | None,
                  body: Callable[[TreeView, bytes], dict[str, Any]]) -> ProveResult:
    """A bundle against the latest seal (or the seal at seq ``tree_size``): its signature checked, ``body(view,
    root)`` adding the proofs (each verified against the signed root, raising :class:`IndexMismatch` otherwise). An
    index that disagrees with the journal is rebuilt once; a journal that disagrees with its own seal raises
    :class:`IntegrityError`."""
    p = Path(journal)
    opened, size, public_raw = _open_for_proof(p, keys, trust_embedded)
    ip = Path(index) if index is not None else None
    for rebuild in (False, True):
        try:
            if tree_size is not None:
                view, built, saved, idx = _view(p, tree_size + 1, ip, rebuild, progress)
                seal, _ = read_seal(p, size, tree_size=tree_size, view=view)
            else:
                seal, _ = read_seal(p, size)
                view, built, saved, idx = _view(p, seal.seq, ip, rebuild, progress)
            sig = _check_seal_signature(opened, seal, public_raw)
            if view.size != seal.seq:  # the seal's own line was read through a view one line longer
                view = TreeView(p, idx, seal.seq, fresh=built)
            root = bytes.fromhex(seal.tree_root)
            bundle = {"format": BUNDLE_FORMAT, "run_id": opened.run_id, "key_id": opened.key_id,
                      "checkpoint": checkpoint_note(opened.run_id, seal.seq, root, bytes.fromhex(seal.sealed_hash),
                                                    sig, public_raw),
                      **body(view, root)}
            return ProveResult(bundle, built, saved, view.reads)
        except IndexMismatch:
            if rebuild:
                raise IntegrityError(f"{p}: the journal's lines do not hash to the tree its seal signed "
                                     "(changed after it was sealed)", seq=None) from None
    raise AssertionError("unreachable")  # pragma: no cover


def prove(journal: str | os.PathLike, seqs: Sequence[int], *, trust: TrustPolicy | None = None,
          tree_size: int | None = None, index: str | os.PathLike | None = None,
          progress: Callable[[int, int], None] | None = None,
          select: Callable[[Path, int], list[int]] | None = None, **trust_options: Any) -> ProveResult:
    """A proof bundle for the lines ``seqs`` (and those ``select(journal, tree_size)`` names) against the latest seal
    (or the seal at seq ``tree_size``). Every proof is verified against the seal's signed root before it is
    returned; an index that disagrees with the journal is rebuilt once, and a journal that disagrees with its own
    seal raises :class:`IntegrityError`. ``trust``: whose seal counts (a :class:`TrustPolicy`, or its fields as
    keywords: ``keys=``, ``trust_embedded=``)."""
    p = Path(journal)
    t = TrustPolicy.of(trust, **trust_options)

    def entries(view: TreeView, root: bytes) -> dict[str, Any]:
        n = view.size
        want = list(seqs)
        if select is not None:
            want += [s for s in select(p, n) if s not in want]
        if not want:
            raise UsageError("nothing to prove: give --seq N (or a helper: --checkpoint, --gate, --compute)")
        out = []
        for s in want:
            if not 0 <= s < n:
                raise UsageError(f"seq {s} is not in the tree of {n} lines the checkpoint covers (seqs 0 to {n - 1})")
            line = view.line(s)
            try:
                rec = codec.decode_line(line, seq_hint=s)
            except IntegrityError:
                raise IndexMismatch(f"line {s} does not decode") from None
            if rec.seq != s:
                raise IndexMismatch(f"line {s} holds seq {rec.seq}")
            proof = view.inclusion(s)
            try:
                verify_inclusion(leaf_hash(line), s, n, proof, root)
            except ProofError:
                raise IndexMismatch(f"the proof of line {s} does not reach the signed root") from None
            out.append({"seq": s, "line": line.decode(), "proof": [base64.b64encode(h).decode() for h in proof]})
        return {"entries": out}

    return _against_seal(p, t.keys, t.trust_embedded, tree_size, index, progress, entries)


def consistency(journal: str | os.PathLike, from_size: int, *, trust: TrustPolicy | None = None,
                tree_size: int | None = None, index: str | os.PathLike | None = None,
                progress: Callable[[int, int], None] | None = None, **trust_options: Any) -> ProveResult:
    """A consistency bundle: the latest (or the seal at ``tree_size``'s) signed checkpoint, and the proof that the
    tree of the first ``from_size`` lines is a prefix of it (RFC 9162 2.1.4), with that tree's root."""
    p = Path(journal)
    t = TrustPolicy.of(trust, **trust_options)

    def prefix(view: TreeView, root: bytes) -> dict[str, Any]:
        n = view.size
        if not 0 < from_size <= n:
            raise UsageError(f"--from {from_size}: a consistency proof runs from a size between 1 and the "
                             f"checkpoint's {n}")
        proof = view.consistency(from_size)
        old = TreeView(p, view.idx, from_size, fresh=view.fresh).root()
        try:
            verify_consistency(from_size, n, old, root, proof)
        except ProofError:
            raise IndexMismatch("the consistency proof does not reach the signed root") from None
        return {"entries": [], "consistency": {"from_size": from_size, "from_root": base64.b64encode(old).decode(),
                                               "proof": [base64.b64encode(h).decode() for h in proof]}}

    return _against_seal(p, t.keys, t.trust_embedded, tree_size, index, progress, prefix)


# ------------------------------------------------------------------ verify a bundle


class _Entry(msgspec.Struct, forbid_unknown_fields=True):
    seq: int
    line: str
    proof: list[str]


class _Consistency(msgspec.Struct, forbid_unknown_fields=True):
    from_size: int
    from_root: str
    proof: list[str]


class _Bundle(msgspec.Struct, forbid_unknown_fields=True):
    format: str
    run_id: str
    key_id: str
    checkpoint: str
    entries: list[_Entry]
    consistency: _Consistency | None = None


@dataclasses.dataclass
class BundleResult:
    """What a bundle established."""

    run_id: str
    key_id: str
    tree_size: int
    root: str  # base64
    head: str  # SEQ:HASH
    events: list[Any]  # the proven lines' records, in the bundle's order
    witnesses: list[tuple[str, int]]  # (name, timestamp) of every pinned witness whose cosignature verified
    consistent_from: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": True, "run_id": self.run_id, "key_id": self.key_id, "tree_size": self.tree_size,
                "root": self.root, "head": self.head,
                "entries": [msgspec.to_builtins(e) for e in self.events],
                "witnesses": [{"name": n, "timestamp": t} for n, t in self.witnesses],
                "consistent_from": self.consistent_from}


def _b64_hashes(items: list[str], what: str) -> list[bytes]:
    if len(items) > _MAX_PROOF:
        raise ProofError(f"{what}: {len(items)} hashes, more than any tree needs")
    out = []
    for x in items:
        try:
            h = base64.b64decode(x, validate=True)
        except (binascii.Error, ValueError):
            h = b""
        if len(h) != 32:
            raise ProofError(f"{what}: a hash that is not base64 of 32 bytes")
        out.append(h)
    return out


def parse_bundle(data: bytes) -> Any:
    if len(data) > MAX_BUNDLE_BYTES:
        raise UsageError(f"a bundle of {len(data):,} bytes: more than {MAX_BUNDLE_BYTES:,}")
    try:
        b = msgspec.json.decode(data, type=_Bundle)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError) as e:
        raise SchemaError(f"not a proof bundle: {e}", seq=None) from None
    if b.format != BUNDLE_FORMAT:
        raise SchemaError(f"bundle format {b.format[:40]!r}, not {BUNDLE_FORMAT}", seq=None)
    if len(b.entries) > MAX_ENTRIES:
        raise SchemaError(f"{len(b.entries):,} entries: more than {MAX_ENTRIES:,}", seq=None)
    return b


def verify_bundle(data: bytes, keys: Sequence[PublicKey], *, witnesses: Sequence[Verifier] = (),
                  quorum: int = 0, expect_checkpoint: str | None = None) -> BundleResult:
    """Check a proof bundle offline. Raises :class:`IntegrityError` (:class:`ProofError`, :class:`NoteError`,
    :class:`UntrustedKey`...; exit 1) when it does not hold, :class:`UsageError` when no key is pinned."""
    b = parse_bundle(data)
    if not keys:
        raise UsageError("no key pinned: pass --pubkey FILE (or set TRAINLEDGER_TRUSTED_KEYS)")
    pinned = [k for k in keys if k.key_id == b.key_id]
    if not pinned:
        raise UntrustedKey(f"the bundle is signed by key {b.key_id[:16]}, which is not pinned "
                           f"(pinned: {', '.join(k.key_id for k in keys)})", seq=None)
    cp, _ = open_checkpoint(b.checkpoint, b.run_id, pinned)
    seq, head = _parse_head_extension(cp)
    if quorum > 0:
        if not witnesses:
            raise UsageError("--witness-quorum needs --witness-key")
    got = check_cosignatures(b.checkpoint, list(witnesses)) if witnesses else []
    if len(got) < quorum:
        raise NoteError(f"{len(got)} valid cosignature(s) from pinned witnesses, fewer than the quorum of {quorum}: "
                        "the checkpoint is not published")
    events = []
    seen = set()
    for e in b.entries:
        if not 0 <= e.seq < cp.size:
            raise ProofError(f"entry seq {e.seq} is outside the checkpoint's tree of {cp.size} lines")
        if e.seq in seen:
            raise ProofError(f"seq {e.seq} appears twice")
        seen.add(e.seq)
        line = e.line.encode()
        try:
            rec = codec.decode_line(line, seq_hint=e.seq)
        except IntegrityError as err:
            raise ProofError(f"entry seq {e.seq}: the line is not a journal event: {err}") from None
        if rec.seq != e.seq:
            raise ProofError(f"entry seq {e.seq}: the line says seq {rec.seq}")
        try:
            verify_inclusion(leaf_hash(line), e.seq, cp.size, _b64_hashes(e.proof, f"seq {e.seq}"), cp.root)
        except ProofError as err:
            raise ProofError(f"entry seq {e.seq}: {err}") from None
        events.append(rec)
    consistent_from = None
    if b.consistency is not None:
        c = b.consistency
        old_root = _b64_hashes([c.from_root], "from_root")[0]
        verify_consistency(c.from_size, cp.size, old_root, cp.root, _b64_hashes(c.proof, "consistency"))
        consistent_from = c.from_size
        if expect_checkpoint is not None:
            old, _ = open_checkpoint(expect_checkpoint, b.run_id, pinned)
            if (old.size, old.root) != (c.from_size, old_root):
                raise CheckpointMismatch(f"the bundle proves consistency from size {c.from_size}, not from the "
                                         f"expected checkpoint (size {old.size})", seq=None)
    elif expect_checkpoint is not None:
        raise UsageError("--expect-checkpoint needs a consistency bundle (trainledger consistency)")
    if not events and consistent_from is None:
        raise ProofError("the bundle proves nothing: no entries and no consistency proof")
    return BundleResult(b.run_id, b.key_id, cp.size, base64.b64encode(cp.root).decode(), f"{seq}:{head}", events,
                        [(v.name, t) for v, t in got], consistent_from)


# ------------------------------------------------------------------ witness


class Witness:
    """A witness's state (``state``: a JSON file, per origin the size and root it last cosigned) and its key.

    :meth:`add` cosigns a checkpoint only when it verifies under the log's pinned key and, if a checkpoint of the
    origin was cosigned before, a consistency proof from that size reaches it. It refuses a rollback (a smaller
    size), a fork (same size, another root; or a proof that does not hold) and says which. The state is updated
    under a lock and replaced atomically."""

    def __init__(self, state: str | os.PathLike, name: str, private: Any):
        from trainledger.journal.proofs.note import _valid_name

        _valid_name(name)
        self.state = Path(state)
        self.name = name
        self._priv = private  # an Ed25519PrivateKey

    def _load(self) -> dict[str, Any]:
        try:
            data = self.state.read_bytes()
        except FileNotFoundError:
            return {}
        try:
            d = json.loads(data)
            if not isinstance(d, dict):
                raise ValueError
            for v in d.values():
                if not (isinstance(v, dict) and type(v.get("size")) is int and v["size"] >= 1
                        and len(base64.b64decode(v.get("root", ""), validate=True)) == 32):
                    raise ValueError
            return d
        except (ValueError, TypeError, binascii.Error, RecursionError):
            raise JournalIOError(f"{self.state}: not a witness state file (origin -> size and root)") from None

    def add(self, bundle: bytes, log_keys: Sequence[PublicKey], *, now: int | None = None) -> tuple[str, str]:
        """Cosign the checkpoint of a consistency bundle (``trainledger consistency``; a first checkpoint of an
        origin may come in any bundle). Returns (the cosignature line, the note with it appended)."""
        b = parse_bundle(bundle)
        pinned = [k for k in log_keys if k.key_id == b.key_id]
        if not pinned:
            raise UntrustedKey(f"the checkpoint is signed by key {b.key_id[:16]}, which this witness does not pin",
                               seq=None)
        cp, _ = open_checkpoint(b.checkpoint, b.run_id, pinned)
        lock_path = self.state.with_name(self.state.name + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            st = self._load()
            prev = st.get(cp.origin)
            if prev is not None:
                old_size, old_root = int(prev["size"]), base64.b64decode(prev["root"])
                if cp.size < old_size:
                    raise WitnessRefused(f"rollback: {cp.origin} was cosigned at size {old_size}; this checkpoint "
                                         f"is of size {cp.size}", seq=None)
                if cp.size == old_size and cp.root != old_root:
                    raise WitnessRefused(f"fork: {cp.origin} at size {cp.size} was cosigned with another root",
                                         seq=None)
                if cp.size > old_size:
                    c = b.consistency
                    if c is None or c.from_size != old_size:
                        raise WitnessRefused(f"no consistency proof from size {old_size}, the last this witness "
                                             f"cosigned for {cp.origin} (trainledger consistency --from "
                                             f"{old_size})", seq=None)
                    try:
                        verify_consistency(old_size, cp.size, old_root, cp.root, _b64_hashes(c.proof, "consistency"))
                    except ProofError as e:
                        raise WitnessRefused(f"fork: the checkpoint is not an extension of the one cosigned at "
                                             f"size {old_size} ({e})", seq=None) from None
            text = b.checkpoint[:b.checkpoint.rfind("\n\n") + 1]
            line = cosign(text, self.name, self._priv, int(time.time()) if now is None else now)
            st[cp.origin] = {"size": cp.size, "root": base64.b64encode(cp.root).decode()}
            tmp = self.state.with_name(f"{self.state.name}.{os.getpid()}.tmp")
            with open_new(tmp, 0o600) as f:
                f.write(json.dumps(st, indent=1, sort_keys=True).encode())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.state)
        finally:
            os.close(fd)
        return line, b.checkpoint + line


def parse_witness_keys(items: Sequence[str]) -> list[Verifier]:
    """``--witness-key`` values: a verifier key (``name+hash+base64``), or a file holding one per line."""
    out = []
    for item in items:
        texts = [item]
        if "+" not in item or os.path.exists(item):
            from trainledger.journal.keys import read_small_file

            texts = [x.strip() for x in read_small_file(Path(item), "witness key").decode("utf-8", "replace")
                     .splitlines() if x.strip() and not x.lstrip().startswith("#")]
        for t in texts:
            v = parse_verifier_key(t)
            if v.sig_type != 0x04:
                raise UsageError(f"{t[:60]!r}: not a witness (cosignature/v1) key")
            out.append(v)
    return out
