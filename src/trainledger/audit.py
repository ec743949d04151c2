"""The audit of a run: the projection registry, ``replay`` of a journal and of a distributed run's folder.

Each package registers its projections here, as it registers its commands in :mod:`trainledger.cli`:
:mod:`trainledger.training.audit` (health, checkpoints, rewinds, stops, selection, preflight) and
:mod:`trainledger.ladder.audit` (the ladder). :data:`PROJECTIONS` is the one list replay folds, in that order;
:func:`replay` folds it over a verified journal (:func:`trainledger.journal.audit.replay.fold`) and gathers what a
reviewer reads: the health report, anomalies, checkpoints, resumes, rewinds, stops, the ladder's outcome, the
training compute, and every difference between what was recorded and what the observations imply.

    from trainledger.audit import replay
    rec = replay("runs/mine/journal.jsonl", keys=trusted_keys(["keys/trainledger.pub"]))
    rec.ok, rec.differences, rec.health["mfu"]
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

import msgspec

from trainledger.journal.audit.projection import Projection, ProjectionRegistry
from trainledger.journal.audit.replay import fold
from trainledger.journal.audit.rundir import RunDirReport, rank_files, verify_run_dir
from trainledger.journal.errors import SemanticError
from trainledger.journal.events import StepObserved
from trainledger.journal.kinds import RankJoined
from trainledger.training.kinds import StateDiverged, StateFingerprinted, StragglerDetected, StragglerScores
from trainledger.journal.trust import TrustPolicy
from trainledger.journal.verify import VerifyReport
from trainledger.ladder import audit as _ladder_audit
from trainledger.training import audit as _training_audit
from trainledger.training.distributed.sdc import audit_state
from trainledger.training.distributed.stragglers import audit_stragglers

__all__ = ["PROJECTIONS", "default_projections", "Reconstruction", "replay", "RunDirReconstruction", "replay_run_dir",
           "compute_statement"]

#: every projection replay folds, in order
PROJECTIONS = ProjectionRegistry()
for _package in (_training_audit, _ladder_audit):
    _package.register(PROJECTIONS)


def default_projections(format_version: str | None = None) -> list[Projection]:
    """A fresh instance of every projection replay folds, in a fixed order."""
    return PROJECTIONS.build(format_version)


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
    #: resumes that were refused (``resume_rejected``): what was asked for, and why not (last, with a default:
    #: 0.1.0's positional fields keep their places)
    rejected_resumes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: format 1.6: each closed anomaly episode (``anomaly_ended`` as replay recomputes it): anomaly, series, step,
    #: last_step, steps, peak, peak_step, closed_by, ended_at
    episodes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: format 1.6: each ``model_exported`` (the weights the run shipped): seq, path, digest, step, checkpoint, files,
    #: bytes, same_as_checkpoint (its files that are the checkpoint's bytes), base
    exports: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: which events each conclusion was recomputed from: ``{"conclusion": name, "folds": {kind: events}}`` per
    #: projection (the kinds it folds that the journal holds, with their counts), then ``{"conclusion": None,
    #: "folds": {...}}`` for the kinds no conclusion folds (logged metrics, configuration: records only)
    inputs: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    def anomaly_steps(self, kind: str, limit: int = 10) -> str:
        """The steps of ``kind``'s anomalies as a reader wants them: ``8-9`` for an episode that lasted to step 9
        (format 1.6), the first ``limit`` and ``...`` after them."""
        last = {(e["anomaly"], e["step"]): e["last_step"] for e in self.episodes}
        steps = self.anomalies_by_kind.get(kind, [])
        shown = [f"{s}-{last[kind, s]}" if last.get((kind, s), s) > s else str(s) for s in steps[:limit]]
        return ", ".join(shown) + (" ..." if len(steps) > limit else "")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["verify"] = self.verify.to_dict()
        d["ok"] = self.ok
        return msgspec.to_builtins(d)


def replay(path: str | os.PathLike, *, trust: TrustPolicy | None = None, observe: Callable[[Any], None] | None = None,
           progress: Callable[[int, int], None] | None = None, **trust_options: Any) -> Reconstruction:
    """Verify ``path`` under ``trust`` (a :class:`TrustPolicy`, or its fields as keywords:
    ``replay(path, keys=[pub])``), then rebuild and audit it.

    ``progress(done, total)``, when given, is told the bytes verified. ``observe``, when given, is called with
    every event in order during the same pass (the report draws its
    curves this way instead of decoding the journal a second time). Only the signed prefix is folded; the
    journal is copied first and the copy is verified and folded (:func:`~trainledger.journal.audit.replay.fold`).

    Raises what :func:`verify` raises when the journal does not verify, and ``SemanticError`` (exit 1) for a
    signed event no projection can fold.
    """
    report, projections = fold(path, default_projections, trust=TrustPolicy.of(trust, **trust_options),
                               observe=observe, progress=progress)
    try:
        return _reconstruction(report, projections)
    except (ArithmeticError, ValueError, TypeError, KeyError, IndexError) as e:
        err = SemanticError(f"journal cannot be summarised: {type(e).__name__}: {e}")
        err.report = report
        raise err from None


def _reconstruction(report: VerifyReport, projections: list[Projection]) -> Reconstruction:
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
    exports = by_name.get("exports")
    if exports is not None:
        notes += exports.notes()
    checks = by_name.get("replay_checks")
    if checks is not None:
        notes += checks.notes()
    return Reconstruction(
        verify=report,
        health=health,
        anomalies_by_kind=health_audit.anomalies_by_kind(),
        checkpoints=by_name["checkpoints"].checkpoints,
        resumes=by_name["checkpoints"].resumes,
        rejected_resumes=by_name["checkpoints"].rejected,
        rewinds=by_name["rewinds"].rewinds,
        stops=by_name["stops"].stops,
        ladder=by_name["ladder"].summary(),
        differences=differences,
        notes=notes,
        compute=msgspec.to_builtins(health_audit.compute.event()) if health_audit.compute.steps else None,
        episodes=[{k: getattr(e, k) for k in type(e).__struct_fields__ if k not in ("seq", "ts", "h")}
                  for _, e in health_audit.ended],
        exports=list(exports.exports) if exports is not None else [],
        inputs=conclusion_inputs(projections, report.kinds),
    )


def _tag_of(cls: type) -> str:
    tag = getattr(getattr(cls, "__struct_config__", None), "tag", None)
    return tag if isinstance(tag, str) else cls.__name__


def conclusion_inputs(projections: list[Projection], kinds: dict[str, int]) -> list[dict[str, Any]]:
    """Which of the journal's event kinds (``kinds``: tag -> count) each projection folds, and those none folds:
    what replay names as the inputs of each conclusion (a projection that folds every event lists them all)."""
    out: list[dict[str, Any]] = []
    used: set[str] = set()
    for p in projections:
        if p.kinds is None:
            folds = dict(kinds)
        else:
            tags = {_tag_of(c) for c in p.kinds}
            folds = {t: n for t, n in kinds.items() if t in tags}
        used |= set(folds)
        out.append({"conclusion": p.name, "folds": folds})
    rest = {t: n for t, n in kinds.items() if t not in used and t not in _BOOKKEEPING}
    out.append({"conclusion": None, "folds": rest})
    return out


#: the journal's own lines (opening, seals, closing), which carry no observation of the run
_BOOKKEEPING = frozenset({"run_opened", "seal", "run_closed", "tail_repaired", "seal_signed"})


def _threshold_of(events: list[Any], flagged: Any) -> float | None:
    """The threshold of the ``straggler_scores`` window a ``straggler_detected`` belongs to."""
    from trainledger.training.kinds import StragglerScores

    for e in events:
        if isinstance(e, StragglerScores) and e.window_start == flagged.window_start and \
                e.window_end == flagged.window_end:
            return e.threshold
    return None


@dataclasses.dataclass
class RunDirReconstruction:
    """``replay`` of a run folder: every rank's reconstruction, the straggler windows, the replicas whose state
    diverged (``divergences``, recomputed from every rank's fingerprints), and every difference."""

    verify: RunDirReport
    ranks: dict[int, Any]
    stragglers: list[dict[str, Any]]
    differences: list[dict[str, Any]]
    divergences: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.differences

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "verify": self.verify.to_dict(), "stragglers": self.stragglers,
                "divergences": self.divergences, "differences": self.differences,
                "ranks": {str(r): rec.to_dict() for r, rec in sorted(self.ranks.items())}}


def replay_run_dir(path: str | os.PathLike, *, trust: TrustPolicy | None = None, observe: Any = None,
                   partial: bool = False, **trust_options: Any) -> RunDirReconstruction:
    """Verify the folder (:func:`verify_run_dir`), replay every rank, and recompute the straggler windows rank 0
    recorded from every rank's own step times. A rank's differences carry ``rank``. ``observe(rank, event)`` sees
    every signed event of every rank, in order (the report's curves). ``partial``: a folder with ranks missing is
    replayed as far as the ranks present go (``verify.partial``, ``verify.missing``: the caller labels it)."""
    trust = TrustPolicy.of(trust, **trust_options)
    report = verify_run_dir(path, trust=trust, partial=partial)
    keep = (StepObserved, StragglerScores, StragglerDetected, RankJoined, StateFingerprinted, StateDiverged)
    events: dict[int, list[Any]] = {}
    recs = {}
    for r, f in rank_files(path).items():
        kept: list[Any] = []
        # replay's own pass over the signed prefix hands over what the straggler audit needs
        def seen(ev: Any, kept: list[Any] = kept, r: int = r) -> None:
            if isinstance(ev, keep):
                kept.append(ev)
            if observe is not None:
                observe(r, ev)

        recs[r] = replay(f, trust=trust, observe=seen)
        events[r] = kept
    differences = [{**d, "rank": r} for r, rec in sorted(recs.items()) for d in rec.differences]
    differences += [{**d, "rank": 0} for d in audit_stragglers(events)]
    divergences, sdc = audit_state(events)  # replicas held to each other (docs/sdc.md)
    differences += [{**d, "rank": 0} for d in sdc]
    flagged = [{"seq": e.seq, "rank": e.rank, "score": e.score, "window": [e.window_start, e.window_end],
                "node": e.node, "threshold": _threshold_of(events.get(0, []), e)}
               for e in events.get(0, []) if isinstance(e, StragglerDetected)]
    return RunDirReconstruction(verify=report, ranks=recs, stragglers=flagged, differences=differences,
                                divergences=divergences)


def compute_statement(paths: Any, keys: Any, **options: Any) -> dict[str, Any]:
    """The compute statement of a model's runs (run folders or journals), every run verified under ``keys`` and
    replayed here (docs/compute.md): :func:`trainledger.journal.statements.compute.statement.build_statement` with this
    module's replays. ``options``: ``thresholds``, ``mfu_range``, ``board_power_w``, ``utilisation``, ``progress``."""
    from trainledger.journal.statements.compute.statement import build_statement

    return build_statement(paths, keys, replay=replay, replay_run_dir=replay_run_dir, **options)

