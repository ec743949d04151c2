"""Error types of the journal package.

One root, :class:`JournalError`; messages read ``what: detail``. Each error
knows the CLI exit code it maps to: 1 for an integrity failure (the journal
does not verify), 2 for usage and I/O errors (the journal could not be
checked at all).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "TrainledgerError",
    "CheckpointMismatch",
    "JournalError",
    "UsageError",
    "JournalIOError",
    "KeyFileError",
    "JournalLocked",
    "JournalClosed",
    "UnsafePath",
    "UnsupportedFormat",
    "IntegrityError",
    "NonCanonicalRecord",
    "SchemaError",
    "ChainBroken",
    "SequenceError",
    "SealInvalid",
    "RunMismatch",
    "UntrustedKey",
    "UnsignedJournal",
    "UnsealedEvents",
    "NotClosed",
    "SemanticError",
    "HeadMismatch",
]


class TrainledgerError(Exception):
    """Root of every error trainledger raises on purpose (journal, training and ladder alike).

    ``exit_code`` is what the ``trainledger`` command exits with when one reaches it: 1 when a journal, a
    checkpoint or an approval does not hold up (integrity, semantics), 2 for usage and I/O errors. The CLI
    prints every one as a single line, ``trainledger COMMAND: error: <message>``.
    """

    exit_code = 2
    #: set where an error is raised about one file of several (a run folder's rank, an export's journal), and the
    #: partial report where verification had one: declared for the type checker, absent until then
    path: Any
    report: Any


class JournalError(TrainledgerError):
    """Root of the journal package's errors (the event log, its keys, verification, query)."""

    exit_code = 2


class UsageError(JournalError, ValueError):
    """Bad arguments: a malformed option, an impossible combination."""


class JournalIOError(JournalError, OSError):
    """A file could not be read, written or created."""


class KeyFileError(JournalError):
    """A key file is missing, malformed, of the wrong kind, or too open."""

    reason = "key-file"


class JournalLocked(JournalError):
    """Another writer (this process or another) holds the journal's lock."""


class JournalClosed(JournalError):
    """An append, seal or reopen was attempted on a closed journal."""


class UnsafePath(JournalError):
    """A path recorded in a journal or a manifest leads outside the folder it must stay in."""

    exit_code = 1


class UnsupportedFormat(JournalError):
    """The journal was written in a newer major format version."""


class IntegrityError(JournalError):
    """The journal does not verify.

    ``seq`` is the first bad event's sequence number when it is known (for a
    line that cannot be parsed, the seq it should have had), ``offset`` the
    byte offset of its line, ``reason`` a short machine-friendly tag and
    ``report`` the partial :class:`~trainledger.journal.verify.VerifyReport` when the
    error came out of a verification.
    """

    exit_code = 1
    reason = "integrity"

    def __init__(self, message: str, *, seq: int | None = None, offset: int | None = None):
        super().__init__(message)
        self.seq = seq
        self.offset = offset
        self.report: Any = None  # the partial VerifyReport, when verify raised it

    def fail_line(self, path: str) -> str:
        """The one line every command prints for it: ``FAIL <path>: seq N (byte B): <why>``."""
        where = f"seq {self.seq}" if self.seq is not None else "journal"
        if self.offset is not None:
            where += f" (byte {self.offset})"
        return f"FAIL {path}: {where}: {self}"


class NonCanonicalRecord(IntegrityError):
    """A line is not byte-identical to the canonical encoding of what it says."""

    reason = "non-canonical"


class SchemaError(IntegrityError):
    """A line is not a valid event: not JSON, not UTF-8, wrong field types."""

    reason = "schema"


class ChainBroken(IntegrityError):
    """A line's chain hash does not follow from the line before it."""

    reason = "chain-broken"


class SequenceError(IntegrityError):
    """Sequence numbers skip, repeat or go backwards."""

    reason = "seq"


class SealInvalid(IntegrityError):
    """A seal's signature, key or sealed head does not check out."""

    reason = "seal-invalid"


class RunMismatch(IntegrityError):
    """An event belongs to another run (a second ``run_opened``, a foreign genesis)."""

    reason = "run-mismatch"


class UntrustedKey(IntegrityError):
    """The journal is signed by a key that the caller did not pin."""

    reason = "untrusted-key"


class UnsignedJournal(IntegrityError):
    """The journal carries no signatures and unsigned journals were not allowed."""

    reason = "unsigned"


class UnsealedEvents(IntegrityError):
    """A signed journal holds events that no seal covers, and they were not allowed (``allow_unsealed``).

    Such events carry no signature: anyone who can write the file could have appended them.
    """

    reason = "unsealed"


class SemanticError(IntegrityError):
    """An event that decodes and verifies but that no projection can fold: an impossible value."""

    reason = "semantics"


class NotClosed(IntegrityError):
    """``require_closed`` was asked for and the journal is not closed and sealed."""

    reason = "not-closed"


class HeadMismatch(IntegrityError):
    """The journal does not contain the head recorded elsewhere (``expect_head``)."""

    reason = "head-mismatch"


class CheckpointMismatch(IntegrityError):
    """A checkpoint published earlier is not a prefix of this journal (``verify --expect-checkpoint``): the log
    was rewritten, forked or truncated since."""

    reason = "checkpoint-mismatch"
