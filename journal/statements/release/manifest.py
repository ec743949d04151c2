"""A model folder's digest as OpenSSF model signing computes it (the ``files`` serialization, SHA-256): every file
under the folder, by its path relative to the folder, in the order of its path's components; each file's SHA-256;
the folder's digest the SHA-256 of those digests' bytes in that order. Files and folders in ``IGNORED`` (the
signature, the provenance beside it, git's own) are left out, as ``model_signing`` leaves them out; a symbolic link,
or anything that is neither a file nor a folder, is refused (its default ``allow_symlinks: false``).

Hashing reads each file in 8 MiB blocks into one reused buffer: the rate of ``sha256sum`` on one core.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path, PurePosixPath
from typing import Any

from trainledger.journal.errors import UsageError

__all__ = ["SIGNATURE", "PROVENANCE", "IGNORED", "ModelManifest", "FileDigest", "model_manifest", "model_listing",
           "root_digest", "ManifestError"]

#: The signature model signing writes and reads by default, and the provenance trainledger writes beside it.
SIGNATURE = "model.sig"
PROVENANCE = "model.provenance.json"
#: Left out of the digest (model signing's defaults, and the provenance)
IGNORED = (SIGNATURE, PROVENANCE, ".git", ".gitattributes", ".github", ".gitignore")
#: The most files a model folder may hold (a bound on what one command reads)
MAX_FILES = 1_000_000
_BLOCK = 8 << 20


class ManifestError(UsageError):
    """The folder cannot be digested (a symbolic link, a special file, a file that changed while it was read)."""


@dataclasses.dataclass(frozen=True)
class FileDigest:
    path: str  # relative, POSIX
    size: int
    sha256: str  # hex

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclasses.dataclass(frozen=True)
class ModelManifest:
    """A folder's files and their digests, in model signing's order, and the folder's digest."""

    name: str
    files: tuple[FileDigest, ...]
    digest: str  # hex: SHA-256 over the files' digests
    ignored: tuple[str, ...] = IGNORED

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def by_path(self) -> dict[str, FileDigest]:
        return {f.path: f for f in self.files}


def root_digest(files: Iterable[FileDigest]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(bytes.fromhex(f.sha256))
    return h.hexdigest()


def _hash_file(path: Path, buf: bytearray, progress: Callable[[int], None] | None) -> tuple[int, str]:
    h = hashlib.sha256()
    view = memoryview(buf)
    size = 0
    with open(path, "rb", buffering=0) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ManifestError(f"{path}: not a regular file")
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])
            size += n
            if progress is not None:
                progress(n)
        if os.fstat(f.fileno()).st_size != st.st_size or size != st.st_size:
            raise ManifestError(f"{path}: changed while it was read ({st.st_size:,} bytes, then {size:,})")
    return size, h.hexdigest()


def _walk(root: Path, ignored: frozenset[str]) -> list[tuple[PurePosixPath, Path]]:
    out: list[tuple[PurePosixPath, Path]] = []
    stack = [(root, PurePosixPath())]
    while stack:
        folder, rel = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError as e:
            raise ManifestError(f"{folder}: cannot be read ({e.strerror or e})") from None
        for entry in entries:
            r = rel / entry.name
            if str(r) in ignored:
                continue
            if entry.is_symlink():
                raise ManifestError(f"{Path(entry.path)}: a symbolic link (model signing's files serialization "
                                    "refuses them: copy the file in)")
            if entry.is_dir(follow_symlinks=False):
                stack.append((Path(entry.path), r))
            elif entry.is_file(follow_symlinks=False):
                out.append((r, Path(entry.path)))
                if len(out) > MAX_FILES:
                    raise ManifestError(f"{root}: more than {MAX_FILES:,} files")
            else:
                raise ManifestError(f"{Path(entry.path)}: neither a file nor a folder")
    out.sort(key=lambda t: t[0])  # by path components, as model signing sorts its items
    return out


def model_listing(folder: str | os.PathLike, *, ignored: Iterable[str] = IGNORED) -> dict[str, int]:
    """The folder's files (model signing's relative paths) and their sizes, nothing read: what a verifier compares
    with the signed names and the recorded sizes before it hashes a byte. Refuses what :func:`model_manifest`
    refuses (a link, a FIFO, a device, too many files)."""
    root = Path(folder)
    if root.is_symlink() or not root.is_dir():
        raise ManifestError(f"{root}: not a folder" + (" (a symbolic link)" if root.is_symlink() else ""))
    out = {}
    for rel, path in _walk(root, frozenset(ignored)):
        try:
            out[str(rel)] = os.lstat(path).st_size
        except OSError as e:
            raise ManifestError(f"{path}: cannot be read ({e.strerror or e})") from None
    return out


def model_manifest(folder: str | os.PathLike, *, ignored: Iterable[str] = IGNORED,
                   progress: Callable[[int], None] | None = None) -> ModelManifest:
    """The folder's files, digests and digest (see the module). ``progress(n)`` is told every block hashed."""
    root = Path(folder)
    if root.is_symlink() or not root.is_dir():
        raise ManifestError(f"{root}: not a folder" + (" (a symbolic link)" if root.is_symlink() else ""))
    ign = frozenset(ignored)
    buf = bytearray(_BLOCK)
    files = []
    for rel, path in _walk(root, ign):
        size, digest = _hash_file(path, buf, progress)
        files.append(FileDigest(str(rel), size, digest))
    name = root.name or os.path.basename(root.resolve())
    return ModelManifest(name=name, files=tuple(files), digest=root_digest(files), ignored=tuple(ign))
