"""The tree index: a sidecar (``<journal>.tlindex``) of the RFC 6962 tree's nodes from tile height 10 up, with the
byte offset of every 1,024-line tile, built from the journal and checked against it (a stale or doctored index costs
a rebuild, never a false proof); :class:`TreeView` reads proofs from it; reading a seal or chosen lines without
verifying the whole journal."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import struct
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainledger.journal import codec
from trainledger.journal.paths import open_new, read_regular
from trainledger.journal.scan import worker_ignores_ctrl_c
from trainledger.journal.errors import (
    TrainledgerError,
    IntegrityError,
    SealInvalid,
    UnsafePath,
    UsageError,
)
from trainledger.journal.merkle import EMPTY_ROOT, leaf_hashes, node_hash, node_level
from trainledger.journal.verify import open_checked, read_opening

__all__ = ["TILE_HEIGHT", "TreeIndex", "TreeView", "IndexMismatch", "build_index", "load_index", "save_index",
           "index_path_for", "read_seal", "find_lines"]


TILE_HEIGHT = 10
TILE = 1 << TILE_HEIGHT
_INDEX_MAGIC = b"trainledger-tree-index/v1\n"


#: The most bytes of journal one proof reads (a 1,024-line tile); a writer's lines are a few hundred bytes each.
_MAX_TILE_BYTES = 256 << 20
#: An index is built in parallel worker processes past this many bytes to hash.
_PARALLEL_INDEX_BYTES = 32 << 20


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


def index_limit(journal_size: int) -> int:
    """The most bytes a well-formed index of a journal this size can have (a line is at least 2 bytes: a tile of
    1,024 lines at least 2 KiB): its header, a tile offset and at most two node hashes per tile."""
    tiles = journal_size // (2 * TILE) + 2
    return 8192 + tiles * (8 + 2 * 32)


def load_index(journal: str | os.PathLike, index: str | os.PathLike | None = None, *,
               notes: list[str] | None = None) -> TreeIndex | None:
    """The index beside ``journal`` if there is one that is well formed and names this run; else None. Only a
    regular file no larger than such an index can be is read (a link, a FIFO or a device planted at its name is
    ignored, with a line in ``notes``): the index is never trusted anyway, and is rebuilt."""
    p = Path(index) if index is not None else index_path_for(journal)
    try:
        data = read_regular(p, index_limit(os.path.getsize(journal)), what="tree index")
        idx = _parse_index(data)
    except UnsafePath as e:
        if notes is not None:
            notes.append(f"{e}: ignored (the index is rebuilt from the journal)")
        return None
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


def _complete_end(p: Path, size: int) -> int:
    """The byte after the last complete line (its newline): complete lines only, a torn last line, however long
    (searched back 1 MiB at a time), is not a leaf."""
    with open(p, "rb") as f:
        pos = size
        while pos > 0:
            lo = max(0, pos - (1 << 20))
            f.seek(lo)
            chunk = f.read(pos - lo)
            i = chunk.rfind(b"\n")
            if i >= 0:
                return lo + i + 1
            pos = lo
    return 0


def build_index(journal: str | os.PathLike, *, reuse: TreeIndex | None = None, workers: int | None = None,
                progress: Callable[[int, int], None] | None = None) -> TreeIndex:
    """Index every complete line of ``journal`` (one pass; byte ranges in parallel worker processes). ``reuse``:
    an index of an earlier, shorter state of the same journal; its complete tiles are kept (they are checked
    when a proof reads them) and only the rest is hashed."""
    from trainledger.journal.scan import cpu_count

    p = Path(journal)
    size = open_checked(p)
    opened, _ = read_opening(p, size)
    end = _complete_end(p, size)
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
    """Write the index atomically (a temporary file renamed into place); False when the folder refuses it, or when
    something other than a regular file or a link is at that name (``--index /dev/zero`` is never replaced)."""
    import stat

    try:
        mode = os.lstat(path).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
            return False
    except FileNotFoundError:
        pass
    except OSError:
        return False
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
    """The latest signed seal (searched back from the end) or, with ``tree_size``, the seal at seq ``tree_size``
    (the seal whose tree has that size, read through ``view``): its record and its bytes. Checked for form only:
    the caller checks its signature. A seal signed late (format 1.7) stands as the seal it signs, with the
    signature of its ``seal_signed`` line."""
    if tree_size is not None:
        assert view is not None
        line = view.line(tree_size)
        rec = codec.decode_line(line, seq_hint=tree_size)
        if type(rec).__struct_config__.tag != "seal" or rec.seq != tree_size:
            raise UsageError(f"line {tree_size} is not a seal: no checkpoint of a tree of {tree_size} lines "
                             "(give the seq of a seal)")
        if rec.sig is None and rec.key_id is not None:
            late = find_lines(journal, size, lambda ln: f'"seal_seq":{tree_size},'.encode() in ln,
                              [b'{"kind":"seal_signed",'])
            if not late:
                raise UsageError(f"the seal at seq {tree_size} was never signed (no seal_signed names it): give "
                                 "the seq of a signed seal")
            return _as_seal(codec.decode_line(late[0])), line
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
                    rec = codec.decode_line(line)
                    if rec.sig is not None or rec.key_id is None:
                        return rec, line
                elif line.startswith(b'{"kind":"seal_signed",'):
                    return _as_seal(codec.decode_line(line)), line
    raise SealInvalid("no seal in the last 64 MiB of the journal: pass --tree-size to name one", seq=None)


def _as_seal(rec: Any) -> Any:
    """A ``seal_signed`` line as the seal it signs (its seq, head, tree, key and signature)."""
    from trainledger.journal.events import Seal

    seal = Seal(sealed_seq=rec.sealed_seq, sealed_hash=rec.sealed_hash, key_id=rec.key_id, sig=rec.sig,
                tree_size=rec.tree_size, tree_root=rec.tree_root)
    return codec.record_type(Seal)(**{f: getattr(seal, f) for f in seal.__struct_fields__}, seq=rec.seal_seq,
                                   ts=rec.ts, h="")


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
