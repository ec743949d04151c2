"""Folding a verified journal: verify a private copy, then apply every projection to every signed event.

This is the generic half of replay. Which projections are folded, and what the reconstruction of a training run
holds, is the installed face's (:mod:`trainledger.audit`): the journal package knows only the protocol
(:mod:`.projection`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from trainledger.journal.audit.projection import Projection
from trainledger.journal.copies import PrivateCopies
from trainledger.journal.errors import SemanticError
from trainledger.journal.reader import unchecked_batches
from trainledger.journal.trust import TrustPolicy
from trainledger.journal.verify import VerifyReport, verify_copy

__all__ = ["fold"]


def fold(path: str | os.PathLike, projections: Callable[[str | None], list[Projection]], *,
         trust: TrustPolicy | None = None, observe: Callable[[Any], None] | None = None,
         **trust_options: Any) -> tuple[VerifyReport, list[Projection]]:
    """Verify ``path`` under ``trust`` (a :class:`TrustPolicy`, or its fields as keywords), then fold its signed
    prefix through ``projections(format_version)``; return the verify report and the folded projections.

    ``observe``, when given, is called with every event in order during the same pass. Only the signed prefix is
    folded (every event a pinned or embedded key's seal covers; in an unsigned journal every complete line):
    events after the last seal are counted in ``verify.unsealed_events`` and left out (``allow_unsealed=True`` is
    needed to get that far). The journal is copied first and the copy is verified and folded, so nothing can be
    swapped in between.

    Raises what :func:`verify` raises when the journal does not verify, and :class:`SemanticError` (exit 1) for a
    signed event that no projection can fold.
    """
    with PrivateCopies() as copies:
        report, copy = verify_copy(path, copies, TrustPolicy.of(trust, **trust_options))
        folded = projections(report.format_version)
        applies = [p.apply for p in folded]
        ev: Any = None
        try:
            # verify() has checked every byte it reported: decode those without checking them a second time.
            for batch in unchecked_batches(copy, report.trusted_bytes):
                for ev in batch:
                    if observe is not None:
                        observe(ev)
                    for apply in applies:
                        apply(ev)
        except (ArithmeticError, ValueError, TypeError, KeyError, IndexError) as e:
            # A signed event with a value no projection can fold: one line, exit 1, never a traceback.
            kind = getattr(ev, "kind", None) if type(ev).__name__ == "UnknownEvent" else (
                type(ev).__struct_config__.tag if ev is not None else "journal")
            err = SemanticError(f"{kind} cannot be folded: {type(e).__name__}: {e}", seq=getattr(ev, "seq", None))
            err.report = report
            raise err from None
    return report, folded
