"""Streaming reader of typed events.

:func:`read_events` yields records (instances of their event class carrying
``seq``, ``ts`` and ``h``) in file order, checking canonical form, seq
continuity and the hash chain as it goes, with memory flat in journal size.
It does not check signatures: call :func:`journal.verify.verify` first when
authenticity matters (``trainledger replay`` and ``query`` do).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from ._scan import RangeResult, ScanContext, Scanner, iter_line_batches
from .chain import genesis
from .verify import _open_checked, _read_opening

__all__ = ["read_events", "read_event_batches"]


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

    p = Path(path)
    size = _open_checked(p)
    opened, _ = _read_opening(p, size)
    ctx = ScanContext(opened.run_id, opened.key_id, None, False, None)
    res = RangeResult(0, size)
    scanner = Scanner(ctx, -1, genesis(opened.run_id), res)
    with open(p, "rb", buffering=0) as f:
        for lines, off in iter_line_batches(f, 0, size, res, is_last=True):
            yield scanner.feed(lines, off)
