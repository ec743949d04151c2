"""The writer's third part: the sink, where the lines go — one file, locked for one writer, written and fsynced.

A write or fsync that fails raises :class:`OSError` here and leaves the buffer as it was (what was not written stays
in it, and the next write retries it); the journal records the failure and reports it. The background thread that
flushes, seals and fsyncs on time is the sink's :class:`Ticker`; what it does each turn is the journal's.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from trainledger.journal.chainbuffer import ChainBuffer
from trainledger.journal.errors import JournalIOError, JournalLocked, UsageError
from trainledger.journal.events import TailRepaired

__all__ = ["Sink", "Ticker"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class Sink:
    """An open journal file, locked (``flock``: a second writer, in this process or another, is refused)."""

    def __init__(self, path: Path, fd: int):
        self.path = path
        self.fd = fd
        self.open = True

    @classmethod
    def create(cls, p: Path) -> Sink:
        """A new file (never an existing one: :class:`UsageError`), locked; :class:`JournalIOError` if it cannot be."""
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | _CLOEXEC, 0o644)
        except FileExistsError:
            raise UsageError(f"{p}: already exists; use Journal.open_append to continue it") from None
        except OSError as e:
            raise JournalIOError(f"{p}: cannot create journal: {e.strerror}") from None
        return cls._locked(p, fd)

    @classmethod
    def reopen(cls, p: Path) -> Sink:
        """An existing journal, for appending, locked."""
        try:
            fd = os.open(p, os.O_RDWR | os.O_APPEND | _CLOEXEC)
        except FileNotFoundError:
            raise JournalIOError(f"{p}: no such journal") from None
        except IsADirectoryError:
            raise JournalIOError(f"{p}: is a directory, not a journal file") from None
        except OSError as e:
            raise JournalIOError(f"{p}: cannot open journal: {e.strerror}") from None
        return cls._locked(p, fd)

    @classmethod
    def _locked(cls, p: Path, fd: int) -> Sink:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JournalLocked(f"{p}: another writer holds this journal (one writer per file)") from None
        return cls(p, fd)

    def write(self, chain: ChainBuffer) -> None:
        """Hand the chain's buffered lines to the OS (their tree hashed first). :class:`OSError` when the disk
        refuses: what was not written stays buffered."""
        buf = chain.buf
        chain.hash_pending()
        while buf:
            chain.written(os.write(self.fd, buf))

    def fsync(self) -> None:
        os.fsync(self.fd)

    def sync_dir(self) -> None:
        """Make the file's name durable (after it was created or a sidecar was moved beside it)."""
        fsync_dir(self.path.parent)

    def move_tail(self, offset: int | None, length: int, *, unsealed: int = 0) -> TailRepaired:
        """Copy the bytes from ``offset`` to a sidecar (fsynced), then cut them off the journal.

        Streamed in blocks (the tail may be large); the sidecar is created fresh beside the journal: a link or
        anything else planted under its name is replaced, never followed.
        """
        p, fd = self.path, self.fd
        if offset is None:
            raise JournalIOError(f"{p}: no offset for the tail to move")
        tmp = p.with_name(f"{p.name}.tail-{os.getpid()}.tmp")
        try:
            tmp.unlink()
        except FileNotFoundError:
            pass
        h = hashlib.sha256()
        moved = 0
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            while moved < length:
                chunk = os.read(fd, min(1 << 20, length - moved))
                if not chunk:
                    break
                h.update(chunk)
                os.write(out, chunk)
                moved += len(chunk)
            os.fsync(out)
        finally:
            os.close(out)
        digest = h.hexdigest()
        side = p.with_name(f"{p.name}.{'unsealed' if unsealed else 'torn'}-{offset}-{digest[:12]}")
        os.replace(tmp, side)
        self.sync_dir()
        os.ftruncate(fd, offset)
        os.fsync(fd)
        return TailRepaired(offset=offset, length=moved, sha256=digest, sidecar=side.name, unsealed_events=unsealed)

    def close(self) -> None:
        """Drop the lock and close the file (once)."""
        if not self.open:
            return
        self.open = False
        try:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        finally:
            os.close(self.fd)


class Ticker:
    """The journal's background thread: it calls ``turn()`` whenever ``wait()`` seconds have passed or it is
    woken (:attr:`kick`), until it is stopped or ``turn()`` returns False. ``turn`` records failures itself: one
    that raises ends the thread, which is a bug."""

    def __init__(self, name: str, turn: Callable[[], bool], wait: Callable[[], float], kick: threading.Event):
        self.kick = kick
        self._turn, self._wait = turn, wait
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def is_alive(self) -> bool:
        return self.thread.is_alive()

    def _run(self) -> None:
        while True:
            self.kick.wait(self._wait())
            self.kick.clear()
            if self._stop.is_set() or not self._turn():
                return

    def stop(self) -> None:
        """Ask the thread to end (it ends at its next wake, which this causes)."""
        self._stop.set()
        self.kick.set()

    def join(self) -> None:
        """Wait for the thread to end (not from the thread itself, nor before it started)."""
        t = self.thread
        if t.is_alive() and t is not threading.current_thread():
            t.join()


def fsync_dir(d: Path) -> None:
    """fsync a directory (its entries), where the system allows it; a failure here is not the journal's."""
    try:
        dfd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)
