"""A transparency log as a static folder in the C2SP tlog-tiles layout (https://c2sp.org/tlog-tiles): what an
organisation's log of its runs is (``trainledger log``, docs/publishing.md), served by any web server or object
store, read by anyone.

    LOGDIR/checkpoint                       the signed tree head (a C2SP checkpoint note), with the witnesses'
                                            cosignatures once published
    LOGDIR/tile/<L>/<N>[.p/<W>]             Merkle tree hashes, 256 a tile: level 0 the leaves' hashes, level l
                                            the roots of the full tiles of level l-1
    LOGDIR/tile/entries/<N>[.p/<W>]         the entries, 256 a bundle, each behind a big-endian u16 length

``<N>`` is the tile's index in 3-digit groups, all but the last led by ``x`` (1234067 -> ``x001/x234/067``); a
partial tile (the rightmost, under 256 wide) carries ``.p/<W>``. The hashes are RFC 6962's (SHA-256, leaves
prefixed 0x00, nodes 0x01), the tree the journal's own seals use. Files are written whole (a temporary file
renamed into place), tiles before the checkpoint that names them, under a lock, so a crash leaves the folder
serving its last checkpoint.

:class:`TileLog` writes a folder; :func:`read_log` reads one through any ``fetch(path) -> bytes`` (a folder, an
HTTP server), checking every tile against the checkpoint's root before an entry is believed.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainledger.journal.errors import IntegrityError, UsageError
from trainledger.journal.merkle import EMPTY_ROOT, leaf_hash, node_hash, root
from trainledger.journal.note import (Checkpoint, NoteError, Verifier, checkpoint_text, key_hash, note_text,
                                      note_signature_line, open_note, parse_checkpoint)

__all__ = ["TileLog", "TileError", "tile_path", "read_log", "LogView", "WIDTH", "MAX_ENTRY", "folder_fetch"]

#: hashes (or entries) in a full tile
WIDTH = 256
#: the largest entry a bundle can hold (its length is a u16)
MAX_ENTRY = 0xFFFF
#: the largest checkpoint note read (a log signature and up to 100 cosignatures, ML-DSA ones at 3.3 KB each)
MAX_CHECKPOINT = 1 << 19


class TileError(IntegrityError):
    """A tile, bundle or checkpoint that is missing, malformed or does not hash to the signed root (the message
    says which path)."""

    reason = "tile-invalid"


def _index(n: int) -> str:
    digits = str(n)
    digits = "0" * (-len(digits) % 3) + digits
    groups = [digits[i:i + 3] for i in range(0, len(digits), 3)]
    return "/".join([f"x{g}" for g in groups[:-1]] + [groups[-1]])


def tile_path(level: int | str, n: int, width: int | None = None) -> str:
    """``tile/<L>/<N>[.p/<W>]`` (level ``entries`` for an entry bundle); ``width`` only for a partial tile."""
    if width is not None and not 1 <= width < WIDTH:
        raise ValueError(f"a partial tile is 1-{WIDTH - 1} wide, not {width}")
    return f"tile/{level}/{_index(n)}" + (f".p/{width}" if width else "")


def _tiles_of(size: int, level: int) -> tuple[int, int]:
    """(full tiles, the partial tile's width or 0) at ``level`` for a tree of ``size`` leaves."""
    count = size // WIDTH ** level
    return count // WIDTH, count % WIDTH


def _levels(leaves: Sequence[bytes]) -> list[list[bytes]]:
    """The hashes of every level a tile holds: level 0 the leaves' hashes, level l + 1 the roots of level l's full
    tiles (each a perfect subtree of 256 hashes)."""
    out = [list(leaves)]
    while len(out[-1]) >= WIDTH:
        below = out[-1]
        out.append([_subtree(below[i:i + WIDTH]) for i in range(0, len(below) - WIDTH + 1, WIDTH)])
    return out


def _subtree(hashes: Sequence[bytes]) -> bytes:
    level = list(hashes)
    while len(level) > 1:
        level = [node_hash(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def _bundle(entries: Sequence[bytes]) -> bytes:
    return b"".join(len(e).to_bytes(2, "big") + e for e in entries)


def _unbundle(data: bytes, where: str) -> list[bytes]:
    out, i = [], 0
    while i < len(data):
        if i + 2 > len(data):
            raise TileError(f"{where}: a truncated entry length", seq=None)
        n = int.from_bytes(data[i:i + 2], "big")
        if i + 2 + n > len(data):
            raise TileError(f"{where}: an entry runs past the bundle's end", seq=None)
        out.append(data[i + 2:i + 2 + n])
        i += 2 + n
    return out


def folder_fetch(folder: str | os.PathLike) -> Callable[[str], bytes]:
    """A ``fetch`` over a local folder: a path inside it (never outside, never through a link), at most 1 MiB."""
    from trainledger.journal.paths import confined, read_regular

    def fetch(rel: str) -> bytes:
        try:
            return read_regular(confined(folder, rel, what="log path"), 1 << 20, what="log file")
        except FileNotFoundError:
            raise TileError(f"{folder}/{rel}: not found", seq=None) from None

    return fetch


@dataclasses.dataclass(frozen=True)
class LogView:
    """A log as read and checked: its signed checkpoint (the note as served, cosignatures included), the leaves'
    hashes and the entries, all hashing to the checkpoint's root."""

    note: str
    checkpoint: Checkpoint
    leaves: list[bytes]
    entries: list[bytes] | None


def read_log(fetch: Callable[[str], bytes], log_key: Verifier, *, entries: bool = True,
             note: str | None = None) -> LogView:
    """Read a log through ``fetch``: its checkpoint (signed by ``log_key``, whose name is the origin), every
    level-0 tile and (``entries``) every entry bundle, each checked: the tiles' hashes make the signed root, each
    entry hashes to its leaf. ``note``: a checkpoint already in hand (a cosigned one) instead of the served one."""
    if note is None:
        raw = fetch("checkpoint")
        if len(raw) > MAX_CHECKPOINT:
            raise TileError(f"checkpoint: larger than {MAX_CHECKPOINT} bytes", seq=None)
        note = raw.decode("utf-8", "replace")
    text, _ = open_note(note, [log_key])
    cp = parse_checkpoint(text)
    if cp.origin != log_key.name:
        raise NoteError(f"the checkpoint's origin {cp.origin!r} is not the log key's name {log_key.name!r}")
    full, part = _tiles_of(cp.size, 0)
    leaves: list[bytes] = []
    for n in range(full + (1 if part else 0)):
        width = WIDTH if n < full else part
        path = tile_path(0, n, None if n < full else part)
        data = fetch(path)
        if len(data) != 32 * width:
            raise TileError(f"{path}: {len(data)} bytes, not {32 * width}", seq=None)
        leaves += [data[i:i + 32] for i in range(0, len(data), 32)]
    if root(leaves) != cp.root:
        raise TileError(f"the level-0 tiles do not hash to the checkpoint's root (size {cp.size})", seq=None)
    got: list[bytes] | None = None
    if entries:
        got = []
        for n in range(full + (1 if part else 0)):
            path = tile_path("entries", n, None if n < full else part)
            bundle = _unbundle(fetch(path), path)
            want = WIDTH if n < full else part
            if len(bundle) != want:
                raise TileError(f"{path}: {len(bundle)} entries, not {want}", seq=None)
            for i, e in enumerate(bundle):
                if leaf_hash(e) != leaves[n * WIDTH + i]:
                    raise TileError(f"{path}: entry {n * WIDTH + i} does not hash to its leaf", seq=None)
            got += bundle
    return LogView(note, cp, leaves, got)


class TileLog:
    """A log folder this process writes (``trainledger log init`` / ``add``). The log's key signs each new
    checkpoint; the origin is the key's name in it (a schema-less URL prefix, as tlog-tiles advises)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)

    @classmethod
    def init(cls, folder: str | os.PathLike, origin: str, signer: Any) -> TileLog:
        """A new, empty log (size 0) in ``folder`` (made; an existing log there is refused)."""
        f = Path(folder)
        if (f / "checkpoint").exists():
            raise UsageError(f"{f}: already a log (its checkpoint is there); add runs with 'trainledger log add'")
        if not origin or any(c.isspace() or c == "+" for c in origin) or "\n" in origin:
            raise UsageError(f"origin {origin!r}: a schema-less URL prefix without spaces or '+' "
                             "(e.g. example.com/ml-runs)")
        f.mkdir(parents=True, exist_ok=True)
        log = cls(f)
        log._write("checkpoint", log._sign(origin, 0, EMPTY_ROOT, signer).encode())
        return log

    def verifier(self, public: bytes) -> Verifier:
        """The log's verifier key for ``public`` (its name the origin)."""
        note = self._note()
        cp = parse_checkpoint(note[:note.rfind("\n\n") + 1])
        return Verifier(cp.origin, key_hash(cp.origin, public), public)

    def _note(self) -> str:
        from trainledger.journal.paths import read_regular

        path = self.folder / "checkpoint"
        return note_text(read_regular(path, MAX_CHECKPOINT, what="log checkpoint"), path, "a signed note")

    def _sign(self, origin: str, size: int, root_: bytes, signer: Any) -> str:
        text = checkpoint_text(origin, size, root_)
        pub = signer.public.raw if hasattr(signer, "public") else signer.public_key().public_bytes_raw()
        return text + "\n" + note_signature_line(origin, pub, signer.sign(text.encode()))

    def _write(self, rel: str, data: bytes) -> None:
        from trainledger.journal.paths import write_atomically

        p = self.folder / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(p, data)

    def read(self, signer_public: bytes, *, entries: bool = True) -> LogView:
        """This folder's log, read and checked as any reader would."""
        return read_log(folder_fetch(self.folder), self.verifier(signer_public), entries=entries)

    def add(self, new: Sequence[bytes], signer: Any, *, dedupe: bool = False) -> tuple[LogView, str, list[int]]:
        """Append ``new`` entries (each at most :data:`MAX_ENTRY` bytes) and sign the new checkpoint; under a lock,
        tiles first, the checkpoint last. ``dedupe``: an entry the log (or this call) holds already is not appended
        again. Returns (the log before, the checkpoint note after, each entry's index); with nothing to append,
        the checkpoint is left as it was."""
        for e in new:
            if not isinstance(e, bytes) or len(e) > MAX_ENTRY:
                raise UsageError(f"a log entry is bytes of at most {MAX_ENTRY}, got {type(e).__name__} "
                                 f"of {len(e) if isinstance(e, bytes) else '?'}")
        lock = os.open(self.folder / ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                       | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            pub = signer.public.raw if hasattr(signer, "public") else signer.public_key().public_bytes_raw()
            before = self.read(pub)
            assert before.entries is not None
            have = {e: i for i, e in enumerate(before.entries)} if dedupe else {}
            add: list[bytes] = []
            where: list[int] = []
            for e in new:
                if e not in have:
                    if dedupe:
                        have[e] = before.checkpoint.size + len(add)
                    where.append(before.checkpoint.size + len(add))
                    add.append(e)
                else:
                    where.append(have[e])
            if not add:
                return before, before.note, where
            entries = before.entries + add
            leaves = before.leaves + [leaf_hash(e) for e in add]
            old, size = before.checkpoint.size, len(leaves)
            levels = _levels(leaves)
            for level, hashes in enumerate(levels):
                first = (old // WIDTH ** level) // WIDTH  # the first tile this append touches
                full, part = _tiles_of(size, level)
                for n in range(first, full + (1 if part else 0)):
                    chunk = hashes[n * WIDTH:(n + 1) * WIDTH]
                    self._write(tile_path(level, n, None if n < full else part), b"".join(chunk))
                    if level == 0:
                        self._write(tile_path("entries", n, None if n < full else part),
                                    _bundle(entries[n * WIDTH:(n + 1) * WIDTH]))
            note = self._sign(before.checkpoint.origin, size, root(leaves), signer)
            self._write("checkpoint", note.encode())
            return before, note, where
        finally:
            os.close(lock)

    def last_cosigned(self) -> str | None:
        """The newest checkpoint served with cosignatures (kept when an add replaces the served one), or None."""
        from trainledger.journal.paths import read_regular

        try:
            path = self.folder / ".cosigned-checkpoint"
            return note_text(read_regular(path, MAX_CHECKPOINT, what="cosigned checkpoint"), path, "a signed note")
        except FileNotFoundError:
            return None

    def cosigned(self, note: str) -> None:
        """Serve ``note`` (the current checkpoint with witnesses' cosignature lines appended) as the checkpoint;
        refused unless its text is the current checkpoint's."""
        cur = self._note()
        base = cur[:cur.rfind("\n\n") + 2]
        if not note.startswith(base + cur[len(base):].split("\n")[0] + "\n"):
            raise UsageError("the cosigned checkpoint is not the log's current one (an add came in between)")
        self._write("checkpoint", note.encode())
        self._write(".cosigned-checkpoint", note.encode())
