"""Replay: verify a journal, fold it through every projection, and recompute every derived event.

The derived events are the ones a writer *concluded*: anomalies and suspected spikes (from the steps), gate
verdicts and their measured receipts (from the rung's own events and the bars), decisions (from the verdicts
and the belief model), rewinds (against their budget), checkpoint selection (by its rule), the preflight's
gates and its authority (from a signed approval). Replay folds the projections of
:mod:`journal.projections` over the signed prefix and reports every difference from what was recorded, with
seq numbers. A signature proves who wrote a journal; replay checks that what they concluded follows from what
they observed.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from ._snapshot import PrivateCopies
from .errors import SemanticError
from .projections import default_projections
from .reader import unchecked_batches
from .verify import VerifyReport, verify_copy

__all__ = ["Reconstruction", "replay"]


@dataclasses.dataclass
class Reconstruction:
    """Everything replay rebuilt, and every way the recorded conclusions differ from it."""

    verify: VerifyReport
    health: dict[str, Any] | None
    anomalies_by_kind: dict[str, list[int]]
    checkpoints: list[dict[str, Any]]
    resumes: list[dict[str, Any]]
    rewinds: list[dict[str, Any]]
    stops: list[dict[str, Any]]
    ladder: dict[str, Any] | None
    differences: list[dict[str, Any]]
    #: what a reader must know even when nothing differs (no steps at all, an implausible MFU)
    notes: list[str] = dataclasses.field(default_factory=list)
    #: the training compute every step of the signed prefix adds up to (journal.mfu.ComputeTotals)
    compute: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return not self.differences

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["verify"] = self.verify.to_dict()
        d["ok"] = self.ok
        return msgspec.to_builtins(d)


def replay(path: str | os.PathLike, *, observe: Callable[[Any], None] | None = None,
           **verify_options: Any) -> Reconstruction:
    """Verify ``path`` (same options as :func:`journal.verify.verify`), then rebuild and audit it.

    ``observe``, when given, is called with every event in order during the same pass (the report draws its
    curves this way instead of decoding the journal a second time).

    Only the signed prefix is folded (every event a pinned or embedded key's seal covers; in an unsigned
    journal every complete line): events after the last seal are counted in ``verify.unsealed_events`` and
    left out (``allow_unsealed=True`` is needed to get that far). The journal is copied first and the copy is
    verified and folded, so nothing can be swapped in between.

    Raises what :func:`verify` raises when the journal does not verify.
    """
    with PrivateCopies() as copies:
        report, copy = verify_copy(path, copies, **verify_options)
        current: list[Any] = [None]
        try:
            return _rebuild(report, copy, observe, current)
        except (ArithmeticError, ValueError, TypeError, KeyError, IndexError) as e:
            # A signed event with a value no projection can fold: one line, exit 1, never a traceback.
            ev = current[0]
            kind = getattr(ev, "kind", None) if type(ev).__name__ == "UnknownEvent" else (
                type(ev).__struct_config__.tag if ev is not None else "journal")
            err = SemanticError(f"{kind} cannot be folded: {type(e).__name__}: {e}", seq=getattr(ev, "seq", None))
            err.report = report
            raise err from None


def _rebuild(report: VerifyReport, copy: Path, observe: Callable[[Any], None] | None,
             current: list[Any]) -> Reconstruction:
    projections = default_projections(report.format_version)
    applies = [p.apply for p in projections]
    # verify() has checked every byte it reported: decode those without checking them a second time.
    for batch in unchecked_batches(copy, report.trusted_bytes):
        for ev in batch:
            current[0] = ev
            if observe is not None:
                observe(ev)
            for apply in applies:
                apply(ev)
    by_name = {p.name: p for p in projections}
    differences = [d for p in projections for d in p.differences()]
    differences.sort(key=lambda d: d["seq"] if d["seq"] is not None else -1)
    health_audit = by_name["health"]
    health = health_audit.summary()
    notes = []
    if health is None or not health["steps"]:
        notes.append("no step observations: the health, MFU and anomaly receipts rest on nothing")
    elif health["mfu"]["implausible"]:
        notes.append(f"MFU implausible: {health['mfu']['above_100pct']:,} steps above 100% (the peak is too low)")
    return Reconstruction(
        verify=report,
        health=health,
        anomalies_by_kind=health_audit.anomalies_by_kind(),
        checkpoints=by_name["checkpoints"].checkpoints,
        resumes=by_name["checkpoints"].resumes,
        rewinds=by_name["rewinds"].rewinds,
        stops=by_name["stops"].stops,
        ladder=by_name["ladder"].summary(),
        differences=differences,
        notes=notes,
        compute=msgspec.to_builtins(health_audit.compute.event()) if health_audit.compute.steps else None,
    )
