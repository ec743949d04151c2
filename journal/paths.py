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

__all__ = ["confined", "open_new", "write_atomically", "file_sha256", "stream_sha256", "open_regular", "read_regular",
           "SIDECAR_SUFFIXES", "TIMESTAMPS_SUFFIX", "DOCUMENTS_SUFFIX", "is_sidecar"]

#: files written beside a journal that are not runs of their own: its RFC 3161 tokens (``trainledger timestamp``,
#: ``Recorder(tsa=)``) and the journal of documents issued about its run (``trainledger bom``). A folder's journals
#: are found without them; named directly, a documents journal is read as the journal it is.
TIMESTAMPS_SUFFIX = ".timestamps.jsonl"
DOCUMENTS_SUFFIX = ".documents.jsonl"
SIDECAR_SUFFIXES = (TIMESTAMPS_SUFFIX, DOCUMENTS_SUFFIX)


def is_sidecar(path: str | os.PathLike) -> bool:
    """Whether ``path``'s name is one of :data:`SIDECAR_SUFFIXES`'s (``journal.timestamps.jsonl``)."""
    return Path(path).name.endswith(SIDECAR_SUFFIXES)


def file_sha256(path: str | os.PathLike) -> tuple[str, int]:
    """(SHA-256 hex, size) of a file, read in 1 MiB blocks."""
    with open(path, "rb") as f:
        return stream_sha256(f)


def stream_sha256(f, out=None) -> tuple[str, int]:
    """(SHA-256 hex, size) of what the open binary file ``f`` holds from where it is, read in 1 MiB blocks; each
    block also written to the binary file ``out`` when given (a copy hashed as it is made)."""
    h = hashlib.sha256()
    size = 0
    while chunk := f.read(1 << 20):
        h.update(chunk)
        if out is not None:
            out.write(chunk)
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


def write_atomically(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> None:
    """``data`` at ``path`` whole or not at all, never through a link: written to a new temporary file beside it
    (created with ``O_EXCL|O_NOFOLLOW`` under a name of its own, so a link or file planted at any name is neither
    followed nor overwritten), flushed, then renamed over ``path`` (a link at ``path`` itself is replaced, not
    followed). The temporary file is removed when the write fails. For every file a command writes into a folder
    it did not make."""
    import secrets

    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def open_regular(path: str | os.PathLike, *, what: str = "file", follow: bool = False) -> int:
    """A read-only descriptor of ``path`` when it is a regular file (not a FIFO, a socket or a device; not a link
    unless ``follow``): opened without blocking (a FIFO would hang the open) and checked on the open descriptor.
    Raises :class:`UnsafePath` naming what is wrong, ``FileNotFoundError`` when absent."""
    import stat

    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags if follow else flags | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise
    except OSError as e:
        if not follow and os.path.islink(path):
            raise UnsafePath(f"{path}: the {what} is a symbolic link; only a regular file is read") from None
        raise UnsafePath(f"{path}: cannot open the {what}: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(f"{path}: the {what} is not a regular file")
    return fd


def read_regular(path: str | os.PathLike, limit: int, *, what: str = "file", owned: bool = False) -> bytes:
    """The bytes of ``path`` when it is a regular file (not a link, a FIFO or a device) of at most ``limit`` bytes;
    ``owned``: also this user's own, and not writable by group or others (a file that is a program's memory).
    Opened by :func:`open_regular`, read at most ``limit + 1`` bytes. Raises :class:`UnsafePath` naming what is
    wrong, ``FileNotFoundError`` when absent."""
    import stat

    fd = open_regular(path, what=what)
    try:
        st = os.fstat(fd)
        if owned and (st.st_uid != os.getuid() or st.st_mode & 0o022):
            raise UnsafePath(f"{path}: the {what} must be this user's own and writable by no one else "
                             f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})")
        if st.st_size > limit:
            raise UnsafePath(f"{path}: the {what} is {st.st_size:,} bytes, more than the {limit:,} it can be")
        out = bytearray()
        while len(out) <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - len(out)))
            if not chunk:
                break
            out += chunk
        if len(out) > limit:
            raise UnsafePath(f"{path}: the {what} grew past {limit:,} bytes while it was read")
        return bytes(out)
    finally:
        os.close(fd)
