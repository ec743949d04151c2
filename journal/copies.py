"""Private copies of journals, so that the bytes a command verified are the bytes it then reads.

``replay``, ``report`` and ``query`` verify a journal and then read it again (to fold it, to load it into
DuckDB). Whoever can write the run folder could swap the file in between. Each such command therefore copies
the journal first into a folder only this user can enter (``tempfile.mkdtemp``, mode 0700), verifies the copy and
reads the copy: there is nothing left to swap. The copy also has a name of our choosing, so no reader ever
expands a user's path as a glob. It costs one sequential copy (about as much as reading the file once) and as
much temporary disk as the journals (``$TMPDIR``).
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from trainledger.journal.errors import JournalIOError

__all__ = ["PrivateCopies", "remove_if_owner_gone"]


class PrivateCopies:
    """A 0700 temporary folder of journal copies, removed on exit."""

    def __init__(self, owned: str | None = None, *, where: str | os.PathLike | None = None) -> None:
        """``owned``: a folder that may outlive a killed process (one ``query OUT`` keeps for the process's life):
        named after the process, and the ones of this kind whose process is gone are removed first. ``where``:
        the folder to make it in (the temporary folder by default)."""
        if owned is not None:
            base = Path(where) if where is not None else Path(tempfile.gettempdir())
            for p in base.glob(f"trainledger-{owned}-*-*"):
                remove_if_owner_gone(p, p.name[len(f"trainledger-{owned}-"):].split("-", 1)[0])
        prefix = "trainledger-" if owned is None else f"trainledger-{owned}-{os.getpid()}-"
        self.dir = Path(tempfile.mkdtemp(prefix=prefix, dir=None if where is None else str(where)))
        self._n = 0
        #: copy path -> (inode, mtime_ns, ctime_ns) of the original when it was opened (what was copied)
        self.identity: dict[str, tuple[int, int, int]] = {}

    def __enter__(self) -> PrivateCopies:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def copy(self, path: str | os.PathLike) -> Path:
        """Copy the regular file ``path`` as it is now (its size when opened) and return the copy's path."""
        p = Path(path)
        try:
            src = os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            raise JournalIOError(f"{p}: no such file") from None
        except OSError as e:
            raise JournalIOError(f"{p}: {e.strerror}") from None
        try:
            st = os.fstat(src)
            if stat.S_ISDIR(st.st_mode):
                raise JournalIOError(f"{p}: is a directory, not a journal file")
            if not stat.S_ISREG(st.st_mode):
                raise JournalIOError(f"{p}: not a regular file")
            self._n += 1
            dst_path = self.dir / f"{self._n}.jsonl"
            self.identity[str(dst_path)] = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
            dst = os.open(dst_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                left = st.st_size
                while left > 0:
                    try:
                        n = os.copy_file_range(src, dst, left)
                    except (AttributeError, OSError):  # older kernels, other filesystems: copy by hand
                        n = os.write(dst, os.read(src, min(left, 1 << 20)))
                    if n == 0:
                        break
                    left -= n
            except OSError as e:
                raise JournalIOError(f"{p}: copying it failed: {e.strerror}") from None
            finally:
                os.close(dst)
        finally:
            os.close(src)
        return dst_path


def remove_if_owner_gone(folder: Path, pid: str) -> None:
    """Remove ``folder``, a temporary folder named after the process that made it, when that process is gone (it
    was killed before it could remove its own) and the folder is this user's own, not a link. Never this process's,
    never a live one's."""
    if not pid.isdigit() or int(pid) == os.getpid():
        return
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        if folder.is_dir() and not folder.is_symlink() and folder.stat().st_uid == os.getuid():
            shutil.rmtree(folder, ignore_errors=True)
    except OSError:  # alive, someone else's
        pass
