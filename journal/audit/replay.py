"""Folding a verified journal: one pass that checks each block and applies every projection to its signed events.

This is the generic half of replay. Which projections are folded, and what the reconstruction of a training run
holds, is the installed face's (:mod:`trainledger.audit`): the journal package knows only the protocol
(:mod:`.projection`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from trainledger.journal.accel import fast as _fast
from trainledger.journal.audit.projection import Projection
from trainledger.journal.errors import SemanticError, TrainledgerError
from trainledger.journal.events import StepObserved
from trainledger.journal.trust import TrustPolicy
from trainledger.journal.verify import Verification, VerifyReport, verify_with

__all__ = ["fold"]


def fold(path: str | os.PathLike, projections: Callable[[str | None], list[Projection]], *,
         trust: TrustPolicy | None = None, observe: Callable[[Any], None] | None = None,
         progress: Callable[[int, int], None] | None = None, **trust_options: Any
         ) -> tuple[VerifyReport, list[Projection]]:
    """Verify ``path`` under ``trust`` (a :class:`TrustPolicy`, or its fields as keywords) and fold its signed
    prefix through ``projections(format_version)`` in the same pass; return the verify report and the folded
    projections.

    One pass over the bytes: each block is checked (canonical form, seq, chain, seals and their signatures) and
    its events decoded from the same bytes, so nothing is read twice, nothing is copied, and a file changed under
    the reader fails as it would fail ``verify``. Only the signed prefix is folded: an event is applied once a seal
    whose signature checks out covers it (in an unsigned journal, every complete line); events after the last seal
    are counted in ``verify.unsealed_events`` and left out (``allow_unsealed=True`` is needed to get that far).
    Each projection sees only the kinds it declares, through its own function for each (``Projection.handlers``). ``observe``, when given, is called with
    every folded event in order; ``progress(done, total)``, when given, is told the bytes read as verify tells it.

    Raises what :func:`verify` raises when the journal does not verify (whatever was folded is then thrown away),
    and :class:`SemanticError` (exit 1) for a signed event that no projection can fold.
    """
    policy = TrustPolicy.of(trust, **trust_options)
    folded: list[Projection] = []
    table: dict[type, list[Callable[[Any], None]]] = {}
    handlers: list[list[tuple[type, Callable[[Any], None]]]] = []
    # the step records' type, once met, and what folds a run of them: each projection's apply_steps, or its
    # apply_step (or apply) on each; a projection is independent of the others, so each takes the whole run in turn
    runs: dict[type, list[Callable[[list[Any], int, int], None]]] = {}

    def applies(t: type) -> list[Callable[[Any], None]]:
        if not handlers:
            handlers.extend(list(p.handlers().items()) for p in folded)
        each = [next((fn for cls, fn in hs if issubclass(t, cls)), None) for hs in handlers]
        table[t] = fns = [fn for fn in each if fn is not None]
        if issubclass(t, StepObserved):
            runs[t] = [_run_of(p, fn) for p, fn in zip(folded, each) if fn is not None]
        return fns

    def consume(batch: list[Any]) -> None:
        if not folded:  # the first checked lines: run_opened names the format the projections read
            folded.extend(projections(getattr(batch[0], "format_version", None) if batch else None))
        get = table.get
        ev = None
        i, n = 0, len(batch)
        try:
            while i < n:
                ev = batch[i]
                t = type(ev)
                fns = get(t)
                if fns is None:
                    fns = applies(t)
                run = runs.get(t)
                if run is not None:  # a run of step records: each projection folds it whole
                    j = type_run(batch, i + 1, t)
                    if observe is not None:
                        for k in range(i, j):
                            observe(batch[k])
                    for fold_run in run:
                        fold_run(batch, i, j)
                    i = j
                    continue
                if observe is not None:
                    observe(ev)
                for apply in fns:
                    apply(ev)
                i += 1
        except (ArithmeticError, ValueError, TypeError, KeyError, IndexError) as e:
            # A signed event with a value no projection can fold: one line, exit 1, never a traceback.
            kind = getattr(ev, "kind", None) if type(ev).__name__ == "UnknownEvent" else (
                type(ev).__struct_config__.tag if ev is not None else "journal")
            raise _FoldFailed(SemanticError(f"{kind} cannot be folded: {type(e).__name__}: {e}",
                                            seq=getattr(ev, "seq", None))) from None

    try:
        report = verify_with(path, Verification(consume=consume), trust=policy, progress=progress)
    except _FoldFailed as f:
        raise f.error from None
    if not folded:  # nothing signed to fold (no seal yet, with allow_unsealed)
        folded.extend(projections(report.format_version))
    return report, folded


def _type_run(items: list[Any], i: int, t: type) -> int:
    """The end of the run of items of exactly type ``t`` from ``i`` (the C accelerator's ``type_run``)."""
    n = len(items)
    while i < n and type(items[i]) is t:
        i += 1
    return i


type_run = getattr(_fast, "type_run", None) or _type_run


def _run_of(p: Projection, fn: Callable[[Any], None]) -> Callable[[list[Any], int, int], None]:
    """What folds a run of step records for ``p``: its ``apply_steps``, or ``fn`` on each."""
    if p.apply_steps is not None:
        return p.apply_steps

    def each(events: list[Any], lo: int, hi: int) -> None:
        for k in range(lo, hi):
            fn(events[k])

    return each


class _FoldFailed(TrainledgerError):
    """Carries a fold's SemanticError out through verify's pass, which catches its own integrity errors (a
    SemanticError is one); never reaches a caller."""

    def __init__(self, error: SemanticError):
        self.error = error
