"""Paths recorded in a journal resolve inside the run folder, or are refused.

A checkpoint's ``path``, an evaluation's file, a manifest's data ref: anything a journal (or a manifest) names
is relative to a root the caller chose, and nothing it says may make a command read, write or delete a file
outside that root: absolute paths, ``..`` and links that lead out are all refused.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path, PurePosixPath

from trainledger.journal.errors import UnsafePath

__all__ = ["confined", "open_new", "file_sha256"]


def file_sha256(path: str | os.PathLike) -> tuple[str, int]:
    """(SHA-256 hex, size) of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def confined(root: str | os.PathLike, rel: str, *, what: str = "path") -> Path:
    """``root / rel`` when that stays inside ``root`` (links followed); raise :class:`UnsafePath` otherwise."""
    if not isinstance(rel, str) or not rel or "\0" in rel or "\\" in rel:
        raise UnsafePath(f"{what} {rel!r}: not a plain relative path")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts:
        raise UnsafePath(f"{what} {rel!r}: leads outside {root}")
    base = Path(root).resolve()
    target = (base / pure).resolve()
    if target != base and base not in target.parents:
        raise UnsafePath(f"{what} {rel!r}: resolves to {target}, outside {base}")
    return target


def open_new(path: str | os.PathLike, mode: int = 0o644):
    """Open ``path`` for writing as a new file: whatever is at that name (a link an attacker planted, a stale
    temporary file) is removed first and never followed. For temporary files that are renamed into place."""
    p = Path(path)
    try:
        p.unlink()
    except FileNotFoundError:
        pass
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0),
                 mode)
    return os.fdopen(fd, "wb")
