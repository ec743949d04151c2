"""Reading a journal as every reader does: its opening, its signing keys resolved under the caller's trust (a
journal whose seals certified rank keys sign included: the certificates are checked before the first line and
learned again when a new one is appended), and a scanner holding each line to the chain, its seq, its canonical
form and each seal to its signature and tree.

:func:`open_journal` is the one place that resolves a journal's keys into a scan context (the one-pass readers,
``read_events`` and ``read_signed_events``, start from it); :class:`Follower` follows a journal as it is written
(``watch``, ``serve``): what was appended since the last call, a block of complete lines at a time, with the offset
and length of each line, and a file cut back or rewritten under it noticed. What the seals cover is for the caller
to hand on (:attr:`Follower.last_seal_seq`): a live run always has lines past its last seal.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainledger.journal.chain import genesis
from trainledger.journal.errors import JournalIOError, UnsafePath
from trainledger.journal.keys import PublicKey
from trainledger.journal.scan import Appended, RangeResult, ScanContext, new_scanner, tree_mode
from trainledger.journal.verify import Signing, open_checked, read_opening, resolve_signing

__all__ = ["Opened", "open_journal", "open_journal_file", "Follower"]


@dataclasses.dataclass
class Opened:
    """A journal's opening and how its lines are to be checked: ``ctx`` for a scanner, ``signing`` (the trust, the
    key, the certified keys), ``size`` when it was opened."""

    path: Path
    size: int
    opened: Any
    signing: Signing
    ctx: ScanContext


def open_journal(path: str | os.PathLike, *, keys: Sequence[PublicKey] = (), trust_embedded: bool = False,
                 check_signatures: bool = True, tree_checked: bool = True) -> Opened:
    """Open ``path`` and resolve its signing under ``keys`` / ``trust_embedded``
    (:func:`~trainledger.journal.verify.resolve_signing`: certificates checked here); ``check_signatures=False``
    checks the chain only (``read_events``), ``tree_checked=False`` the seals' tree fields without their roots."""
    p = Path(path)
    size = open_checked(p)
    opened, opened_len = read_opening(p, size)
    signing = resolve_signing(p, size, opened, opened_len, keys=list(keys), trust_embedded=trust_embedded,
                              check_signatures=check_signatures)
    ctx = ScanContext(opened.run_id, opened.key_id, signing.raw, check_signatures and signing.trust != "unsigned",
                      None, tree=tree_mode(opened.format_version, tree_checked), certified=signing.certified)
    return Opened(p, size, opened, signing, ctx)


def open_journal_file(path: Path) -> Any:
    """``path`` opened for reading without blocking (a journal swapped for a FIFO would hang a follower) and held to
    be a regular file (a link followed: the journal the user named may be one); else :class:`JournalIOError`."""
    from trainledger.journal.paths import open_regular

    try:
        return os.fdopen(open_regular(path, what="journal", follow=True), "rb", buffering=0)
    except FileNotFoundError:
        raise JournalIOError(f"{path}: no such file") from None
    except UnsafePath as e:
        raise JournalIOError(str(e)) from None


class Follower:
    """One journal followed as it is written (see the module). ``keys``, ``trust_embedded``: whose seals count;
    ``check_signatures=False``: the chain only (``watch`` without a key says so)."""

    def __init__(self, path: str | os.PathLike, *, keys: Sequence[PublicKey] = (), trust_embedded: bool = False,
                 check_signatures: bool = True) -> None:
        self.path = Path(path)
        self._keys, self._trust_embedded, self._check = list(keys), trust_embedded, check_signatures
        self.restart()

    def restart(self) -> None:
        """From the first line again: the opening read and the keys resolved anew."""
        o = open_journal(self.path, keys=self._keys, trust_embedded=self._trust_embedded,
                         check_signatures=self._check)
        self.opened, self.signing, self.ctx = o.opened, o.signing, o.ctx
        self.res = RangeResult(0, 0)
        self.scanner = new_scanner(self.ctx, -1, genesis(self.opened.run_id), self.res)
        self.appended = Appended()

    @property
    def trust(self) -> str:
        return self.signing.trust

    @property
    def last_seal_seq(self) -> int | None:
        """The seq of the last seal checked (it and every line before it are signed); None before the first."""
        return self.res.last_seal_seq

    def read_new(self, on_block: Callable[[list[Any], list[tuple[int, int]]], None], *,
                 progress: Callable[[int, int], None] | None = None) -> bool:
        """Check what was appended since the last call: ``on_block(records, at)`` for each block of complete lines,
        in order, ``at`` each line's (offset, length). Returns True, having read nothing, when the file was cut
        back or rewritten under the follower (what was read no longer stands): :meth:`restart` it, or drop it."""
        with open_journal_file(self.path) as f:
            size = os.fstat(f.fileno()).st_size
            if self.appended.cut_back(f, size):
                return True
            for whole, start in self.appended.blocks(f, size, progress):
                if b'{"kind":"key_certified",' in whole:
                    self._learn_certificates()
                recs = self.scanner.feed_block(whole, start)
                recs = recs.records() if hasattr(recs, "records") else list(recs)
                lens = list(map(len, whole.split(b"\n")))[:-1]
                offs = list(itertools.accumulate((n + 1 for n in lens), initial=start))[:-1]
                on_block(recs, list(zip(offs, lens)))
        return False

    def _learn_certificates(self) -> None:
        """A certified journal restarted under a new rank key while it was followed: its certificates are read and
        checked again (under the same keys), so that the new key's seals are held to its certificate."""
        table = self.ctx.certified
        if not table or type(table) is not dict:  # none (the journal's own key), or any key (signatures unchecked)
            return
        o = open_journal(self.path, keys=self._keys, trust_embedded=self._trust_embedded)
        table.update(o.signing.certified or {})
