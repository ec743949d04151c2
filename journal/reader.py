"""Streaming reader of typed events.

:func:`read_events` yields records (instances of their event class carrying
``seq``, ``ts`` and ``h``) in file order, checking canonical form, seq
continuity and the hash chain as it goes, with memory flat in journal size.
It does not check signatures: call :func:`trainledger.journal.verify.verify` first when
authenticity matters (``trainledger replay`` and ``query`` do).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from trainledger.journal.scan import RangeResult, Scanner, iter_blocks, lines_of, signed_prefix
from trainledger.journal.chain import genesis
from trainledger.journal.verify import open_checked, read_opening

__all__ = ["read_events", "read_event_batches", "read_signed_events"]


def read_events(path: str | os.PathLike) -> Iterator[Any]:
    """Yield every complete event of a journal, in order; a torn tail is skipped.

    Raises the same typed errors as verification when a line is bad, at the
    point where it is reached.
    """
    for batch in read_event_batches(path):
        yield from batch


def read_event_batches(path: str | os.PathLike) -> Iterator[list[Any]]:
    """Like :func:`read_events`, a list of consecutive events at a time (for fast folds)."""
    from pathlib import Path

    from trainledger.journal.follow import open_journal

    o = open_journal(Path(path), check_signatures=False, tree_checked=False)  # the chain only: signatures unchecked
    p, size, opened, ctx = o.path, o.size, o.opened, o.ctx
    res = RangeResult(0, size)
    scanner = Scanner(ctx, -1, genesis(opened.run_id), res)
    with open(p, "rb", buffering=0) as f:
        for block, off in iter_blocks(f, 0, size, res, is_last=True):
            yield scanner.feed_block(block, off)


def read_signed_events(path: str | os.PathLike, keys) -> Iterator[Any]:
    """Yield, in order, only the events that a seal under one of ``keys`` (pinned public keys) covers.

    The one reader that may drive a decision (a resume, a restore, a deletion): each line is checked (canonical
    form, seq, chain) and held back until a seal whose signature verifies covers it, in the same pass, so
    nothing read here can differ from what was checked. Events after the last seal are never yielded.
    Raises :class:`~trainledger.journal.errors.UnsignedJournal` for an unsigned journal, the verifier's
    :class:`~trainledger.journal.errors.IntegrityError` subclasses when a line or seal is bad (at the point it is reached),
    and :class:`~trainledger.journal.errors.UntrustedKey` when the journal's key is not among ``keys``.
    """
    from pathlib import Path

    from trainledger.journal.errors import UnsignedJournal, UsageError
    from trainledger.journal.follow import open_journal

    keys = list(keys)
    if not keys:
        raise UsageError("read_signed_events needs the public key the journal must be signed with")
    o = open_journal(Path(path), keys=keys)
    p, size, opened, signing, ctx = o.path, o.size, o.opened, o.signing, o.ctx
    if signing.trust != "pinned" or (signing.raw is None and signing.certified is None):
        raise UnsignedJournal(f"{p}: the journal is unsigned: nothing in it may drive a resume or a deletion", seq=0)
    res = RangeResult(0, size)
    scanner = Scanner(ctx, -1, genesis(opened.run_id), res)
    pending: list[Any] = []
    with open(p, "rb", buffering=0) as f:
        for block, off in iter_blocks(f, 0, size, res, is_last=True):
            pending += scanner.feed_block(block, off)
            yield from signed_prefix(pending, res)


def fold_events(path: str | os.PathLike, apply_batch) -> None:
    """Call ``apply_batch(events)`` for every batch of complete events, in order, with the checks of :func:`read_events`.

    The fast way to rebuild a projection: where the platform can fork, the
    chain and canonical-form checks run in a second process while this one
    decodes and folds, and any integrity error is raised at the end (the
    fold's result must then be thrown away; the exception says why).
    Elsewhere it is ``for batch in read_event_batches(path): apply_batch(batch)``.
    """
    import multiprocessing
    import threading

    from pathlib import Path

    from trainledger.journal.errors import IntegrityError

    p = Path(path)
    if threading.active_count() != 1 or "fork" not in multiprocessing.get_all_start_methods():
        for batch in read_event_batches(p):
            apply_batch(batch)
        return
    size = open_checked(p)
    read_opening(p, size)  # a file that is not a journal fails here, at once
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_check_in_child, args=(str(p), send), daemon=True)
    child.start()
    send.close()
    fold_error: BaseException | None = None
    try:
        for batch in unchecked_batches(p, size):
            apply_batch(batch)
    except IntegrityError as e:  # the checking process names the problem more precisely
        fold_error = e
    try:
        outcome = recv.recv()
    except EOFError:  # the checking process died before it could say (killed, out of memory): check here instead
        child.join()
        for _ in read_event_batches(p):  # raises the journal's own IntegrityError, if it has one
            pass
        outcome = None
    child.join()
    if outcome is not None:
        from trainledger.journal import errors

        name, msg, seq, off = outcome
        cls = getattr(errors, name, None)
        if isinstance(cls, type) and issubclass(cls, IntegrityError):
            raise cls(msg, seq=seq, offset=off)
        raise errors.JournalIOError(msg)
    if fold_error is not None:
        raise fold_error


def _check_in_child(path: str, send) -> None:
    from trainledger.journal.scan import worker_ignores_ctrl_c
    from trainledger.journal.errors import JournalError

    worker_ignores_ctrl_c()  # the parent is interrupted and stops this (daemon) child
    try:
        for _ in read_event_batches(path):
            pass
        send.send(None)
    except JournalError as e:
        send.send((type(e).__name__, str(e), getattr(e, "seq", None), getattr(e, "offset", None)))
    finally:
        send.close()


def unchecked_batches(p, size: int) -> Iterator[list[Any]]:
    """Decode the first ``size`` bytes without checking them (they are checked elsewhere: by another
    process in :func:`fold_events`, or already by :func:`trainledger.journal.verify.verify` in replay)."""
    from trainledger.journal import codec

    res = RangeResult(0, size)
    with open(p, "rb", buffering=0) as f:
        for block, _ in iter_blocks(f, 0, size, res, is_last=True):
            recs = codec.decode_unchecked_block(block)
            yield recs if recs is not None else [codec.decode_line(x) for x in lines_of(block)]
