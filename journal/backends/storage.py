"""Run folders, journals and exports in object storage: ``s3://`` and ``file://`` URLs, through pyarrow's
filesystem layer (the ``parquet`` extra).

Nothing is verified or queried where it lies. A reader copies the object, or every object below a prefix, into a
private local folder first (``tempfile.mkdtemp``, mode 0700, removed when the command ends) and works on the copy:
the bytes verified are the bytes then read, and no object key becomes a path outside that folder (a key with an
empty, ``.`` or ``..`` component, or a backslash, is refused). A writer (``export parquet ... s3://...``) writes
the export locally, whole, then uploads it with the listing (``receipts.json``) last, so that a prefix without
the listing is never taken for an export; it refuses a prefix that already holds objects.

Credentials and the endpoint come from the environment as the AWS tools read them (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT_URL`` for an S3-compatible server) or from the
URL's query, as pyarrow reads it (``s3://bucket/run?endpoint_override=host:9000&scheme=http``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from trainledger.journal.copies import remove_if_owner_gone
from trainledger.journal.errors import JournalIOError, UnsafePath, UsageError

__all__ = ["SCHEMES", "is_url", "fetch", "must_be_new", "publish", "localized"]

SCHEMES = ("s3://", "file://")
#: the most objects one prefix may hold for a fetch (a 16,000-rank run folder is 16,000)
MAX_OBJECTS = 1_000_000
_CHUNK = 1 << 20


def is_url(s: object) -> bool:
    """Whether ``s`` is an ``s3://`` or ``file://`` URL (anything else is a local path)."""
    return isinstance(s, str) and s.startswith(SCHEMES)


def _filesystem(url: str) -> tuple[Any, str]:
    try:
        import pyarrow.fs as pafs
    except ImportError:
        raise UsageError(f"{url}: object storage is read with pyarrow: pip install 'trainledger[parquet]'") from None
    try:
        return pafs.FileSystem.from_uri(url)
    except (ValueError, TypeError, OSError) as e:  # pyarrow's ArrowInvalid is a ValueError
        if _unreachable(e):
            raise JournalIOError(f"{url}: {_why(e)}") from None
        raise UsageError(f"{url}: not a URL pyarrow can open: {_why(e)}") from None


def _unreachable(e: BaseException) -> str | None:
    """The endpoint pyarrow could not reach (a network error from its S3 client), or None for any other error."""
    import re

    text = str(e)
    if "NETWORK_CONNECTION" not in text and "curlCode" not in text:
        return None
    for pattern in (r"Could not resolve host: ([^\s;,]+)", r"Failed to connect to ([^\s;,]+)( port \d+)?"):
        m = re.search(pattern, text)
        if m:
            return m.group(1) + (f":{m.group(2).split()[-1]}" if m.lastindex == 2 and m.group(2) else "")
    return "the endpoint"


def _why(e: BaseException) -> str:
    """The first line of a storage error; a network error says which endpoint could not be reached and where the
    endpoint comes from."""
    host = _unreachable(e)
    if host is not None:
        return (f"could not reach the S3 endpoint {host} (is the server up? the endpoint comes from "
                "AWS_ENDPOINT_URL or the URL's ?endpoint_override=host:port&scheme=http)")
    return (str(e).splitlines() or [type(e).__name__])[0]


def _safe_parts(rel: str, url: str) -> PurePosixPath:
    parts = rel.split("/")
    if not rel or "\\" in rel or any(p in ("", ".", "..") for p in parts):
        raise UnsafePath(f"{url}: the object key {rel!r} is not a plain path below the prefix; nothing was read")
    return PurePosixPath(*parts)


def fetch(url: str, into: str | os.PathLike, *, progress: Callable[[int, int], None] | None = None) -> Path:
    """Copy the object ``url`` names, or every object below it, into the folder ``into``; return the local file or
    folder (named as the URL's last component). Raises :class:`JournalIOError` when nothing is there or a read
    fails, :class:`UnsafePath` for a key that is not a plain path below the prefix."""
    import pyarrow.fs as pafs

    fs, path = _filesystem(url)
    path = path.rstrip("/")
    name = PurePosixPath(path).name or "root"
    dest = Path(into) / name
    try:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.File:
            _copy_in(fs, path, dest, url)
            return dest
        sel = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        objects = [x for x in fs.get_file_info(sel) if x.type == pafs.FileType.File]
    except OSError as e:
        raise JournalIOError(f"{url}: cannot be read: {_why(e)}") from None
    if not objects:
        raise JournalIOError(f"{url}: no such object, and no objects below it")
    if len(objects) > MAX_OBJECTS:
        raise JournalIOError(f"{url}: more than {MAX_OBJECTS:,} objects below it; name a narrower prefix")
    rels = [(_safe_parts(x.path[len(path) + 1:], url), x) for x in objects]  # every key checked before any copy
    if isinstance(fs, pafs.LocalFileSystem):  # file://: pyarrow follows links; a folder sent is its own files
        for rel, x in rels:
            _not_linked(path, rel, url)
    total, done = sum(x.size or 0 for _, x in rels), 0
    dest.mkdir(mode=0o700)
    for rel, x in rels:
        target = dest.joinpath(*rel.parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            _copy_in(fs, x.path, target, url)
        except OSError as e:
            raise JournalIOError(f"{url}: {x.path} cannot be read: {_why(e)}") from None
        done += x.size or 0
        if progress is not None:
            progress(done, total)
    return dest


def _not_linked(root: str, rel: PurePosixPath, url: str) -> None:
    """A ``file://`` prefix's object reached without a link below the prefix (a rank file linked out of the run
    folder would otherwise be copied in as if it were the folder's own): else :class:`UnsafePath`."""
    import stat

    p = Path(root)
    for part in rel.parts:
        p = p / part
        try:
            if stat.S_ISLNK(os.lstat(p).st_mode):
                raise UnsafePath(f"{url}: {rel.as_posix()} is reached through a link ({p.relative_to(root)}); "
                                 "nothing was read")
        except FileNotFoundError:
            raise JournalIOError(f"{url}: {rel.as_posix()} is gone") from None


def _copy_in(fs: Any, path: str, target: Path, url: str) -> None:
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out, fs.open_input_stream(path) as src:
        while True:
            chunk = src.read(_CHUNK)
            if not chunk:
                break
            out.write(chunk)


def must_be_new(url: str) -> tuple[Any, str]:
    """The filesystem and path of ``url``, which must name nothing yet (no object, none below it): else
    :class:`UsageError`."""
    import pyarrow.fs as pafs

    fs, path = _filesystem(url)
    path = path.rstrip("/")
    try:
        if fs.get_file_info(path).type != pafs.FileType.NotFound or \
                fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True)):
            raise UsageError(f"{url}: exists: an export writes a new prefix")
    except OSError as e:
        raise JournalIOError(f"{url}: cannot be listed: {_why(e)}") from None
    return fs, path


def publish(local: str | os.PathLike, url: str, *, last: str | None = None) -> int:
    """Upload the folder ``local`` to the prefix ``url``, which must hold no objects yet; ``last`` (a file name in
    ``local``: the export's listing) is uploaded after every other file, in one write, so that a prefix holding it
    holds every file whole. On any failure (a refused part, a lost connection, Ctrl-C) every object uploaded is
    deleted, the listing first, and :class:`JournalIOError` raised; an object that could not be deleted is named
    (none of them is the listing, so ``verify`` never takes what is left for an export). Returns the bytes
    uploaded."""
    import pyarrow.fs as pafs

    fs, path = must_be_new(url)
    local_fs = isinstance(fs, pafs.LocalFileSystem)  # file://: folders are made; S3 has none (no marker objects)
    root = Path(local)
    files = sorted((p for p in root.rglob("*") if p.is_file()), key=lambda p: (p.name == last, str(p)))
    sent: list[str] = []
    total = 0
    try:
        for p in files:
            key = f"{path}/{p.relative_to(root).as_posix()}"
            if local_fs:
                fs.create_dir(str(PurePosixPath(key).parent), recursive=True)
            with open(p, "rb") as src:
                data = src.read() if p.name == last else None  # the listing: read whole before its object opens
                with fs.open_output_stream(key) as out:
                    sent.append(key)
                    if data is not None:
                        out.write(data)
                        total += len(data)
                        continue
                    for chunk in iter(lambda: src.read(_CHUNK), b""):
                        out.write(chunk)
                        total += len(chunk)
    except BaseException as e:  # an object closed on the way out of a failed write may hold part of its file
        left = _remove(fs, sent[::-1])  # the listing, sent last, removed first
        if not left and local_fs:
            _remove_folders(fs, path)
        if not isinstance(e, OSError):
            raise
        if any(PurePosixPath(k).name == last for k in left):  # written after every file was whole: a whole export
            more = (f"; its listing could not be removed, nor {len(left) - 1} other object(s): every file was "
                    "uploaded whole before it, so what is there verifies as the export or not at all")
        elif left:
            more = (f"; {len(left)} object(s) could not be removed ({', '.join(left[:3])}): the prefix holds no "
                    "listing, so it is not taken for an export; remove them")
        else:
            more = "; nothing uploaded was left"
        raise JournalIOError(f"{url}: cannot be written: {_why(e)}{more}") from None
    return total


def _remove_folders(fs: Any, path: str) -> None:
    """The folder markers this upload made below ``path`` (which held nothing before it), once no object is left
    under it: removed, so a failed upload leaves the prefix as it found it."""
    import pyarrow.fs as pafs

    with contextlib.suppress(OSError):
        below = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
        if all(x.type == pafs.FileType.Directory for x in below):
            fs.delete_dir(path)


def _remove(fs: Any, keys: list[str]) -> list[str]:
    """Delete ``keys`` (best effort, in order); the ones still there."""
    left = []
    for key in keys:
        try:
            fs.delete_file(key)
        except FileNotFoundError:
            pass
        except OSError:
            left.append(key)
    return left


def _remove_stale() -> None:
    """Fetched copies left by a command that was killed before it could remove them (its process gone)."""
    root = Path(tempfile.gettempdir())
    for p in root.glob("trainledger-fetch-*-*"):
        remove_if_owner_gone(p, p.name.split("-")[2])


@contextlib.contextmanager
def localized(paths: Sequence[str], *, on_copy: Callable[[str, Path], None] | None = None) -> Iterator[list[str]]:
    """``paths`` with each URL replaced by a private local copy of what it names (see the module doc), removed
    when the block ends; local paths are passed through. ``on_copy(url, local)`` is told of each copy."""
    urls = [p for p in paths if is_url(p)]
    if not urls:
        yield list(paths)
        return
    _remove_stale()
    tmp = Path(tempfile.mkdtemp(prefix=f"trainledger-fetch-{os.getpid()}-"))
    try:
        out = []
        for i, p in enumerate(paths):
            if is_url(p):
                slot = tmp / str(i)
                slot.mkdir(mode=0o700)
                local = fetch(p, slot)
                if on_copy is not None:
                    on_copy(p, local)
                out.append(str(local))
            else:
                out.append(p)
        yield out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
