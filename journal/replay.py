"""Replay: verify a journal, fold it through every projection, and recompute every derived event.

The derived events are the ones a writer *concluded*: anomalies (from the
steps), gate verdicts (from the measured receipts and the bars) and
decisions (from the verdicts and the belief model). Replay recomputes each
from the events it rests on and reports every difference from what was
recorded, with seq numbers. A signature proves who wrote a journal; replay
checks that what they concluded follows from what they observed.
"""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from . import health, kinds  # noqa: F401 - registers the kinds replay folds
from .events import RunResumed, StepObserved
from .health import AnomalyDetected, HealthProjection, RunConfigured, SpikeSuspected
from .approval import ApprovalInvalid, SignedApproval, check_approval
from .kinds import PreflightGate
from .kinds import CheckpointSaved, DataWindowSkipped, DecisionRecorded, GateVerdict, RewindDecided, RunStopped
from .ladder_outcome import LadderProjection, beta_update, gate
from .reader import _unchecked_batches
from ._snapshot import PrivateCopies
from .errors import SemanticError
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

    @property
    def ok(self) -> bool:
        return not self.differences

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["verify"] = self.verify.to_dict()
        d["ok"] = self.ok
        return msgspec.to_builtins(d)


def _approval_problem(ev: PreflightGate) -> str | None:
    """Why a passed authority gate does not follow from the approval it recorded (None when it does)."""
    raw = ev.measured.get("approval") if isinstance(ev.measured, dict) else None
    if raw is None:
        return "it records no signed approval"
    try:
        a = msgspec.convert(raw, SignedApproval)
        check_approval(a, manifest_id=ev.manifest_id, approvers=[a.authority], trusted=None)
    except (msgspec.ValidationError, ApprovalInvalid) as e:
        return f"its approval does not hold: {e}"
    if a.decision != "approve":
        return f"the recorded decision is {a.decision!r}"
    return None


_RECORD_ONLY = ("seq", "ts", "h")


def _at_least(version: str | None, want: tuple[int, int]) -> bool:
    try:
        major, minor = (int(x) for x in (version or "").split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= want


def _key(a: Any) -> tuple:
    """A derived event's own fields (not seq, ts, h), hashable, with NaN equal to NaN (it is the recorded
    value of a NaN loss)."""
    vals = (getattr(a, f) for f in type(a).__struct_fields__ if f not in _RECORD_ONLY)
    return tuple("NaN" if isinstance(v, float) and v != v else v for v in vals)


def _what(a: Any) -> str:
    return a.kind if isinstance(a, AnomalyDetected) else f"a suspected {a.series} spike"


def _compare_derived(recomputed: list[tuple[int, Any]], recorded: list[tuple[int, Any]],
                     kind: str) -> list[dict[str, Any]]:
    """What the steps imply against what the writer recorded, as multisets: linear in both (a journal with
    thousands of unsupported anomalies replays in the time it takes to read it)."""
    want = Counter(_key(a) for _, a in recomputed)
    out = []
    for seq, rd in recorded:
        k = _key(rd)
        if want[k] > 0:
            want[k] -= 1
        else:
            out.append({"seq": seq, "kind": kind,
                        "detail": f"recorded {_what(rd)} at step {rd.step}, which the observations do not support"})
    for seq, rc in reversed(recomputed):  # the unmatched ones: the latest of each were left unrecorded
        k = _key(rc)
        if want[k] > 0:
            want[k] -= 1
            out.append({"seq": seq, "kind": kind,
                        "detail": f"the observations give {_what(rc)} at step {rc.step} (z {rc.z_score}), "
                                  "which was not recorded"})
    return out


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
    proj: HealthProjection | None = None
    pending_recomputed: list[tuple[int, AnomalyDetected]] = []  # (seq of the step that produced it, anomaly)
    recorded: list[tuple[int, AnomalyDetected]] = []
    suspected_recomputed: list[tuple[int, SpikeSuspected]] = []
    suspected_recorded: list[tuple[int, SpikeSuspected]] = []
    checkpoints, resumes, rewinds, stops = [], [], [], []
    ladder = LadderProjection()
    saw_ladder = False
    differences: list[dict[str, Any]] = []
    a, b = 1.0, 1.0
    last_verdict: GateVerdict | None = None

    # verify() has checked every byte it reported: decode those without checking them a second time.
    for ev in (e for batch in _unchecked_batches(copy, report.trusted_bytes) for e in batch):
        current[0] = ev
        if observe is not None:
            observe(ev)
        if isinstance(ev, RunConfigured):
            proj = HealthProjection(ev)
        elif isinstance(ev, (StepObserved, RunResumed)):
            if proj is None:
                proj = HealthProjection()
            for an in proj.apply(ev):
                pending_recomputed.append((ev.seq, an))
            if proj.suspected_new:
                suspected_recomputed += [(ev.seq, x) for x in proj.take_suspected()]
            if isinstance(ev, RunResumed):
                resumes.append({"seq": ev.seq, "from_step": ev.from_step, "checkpoint": ev.checkpoint,
                                "reason": ev.reason})
        elif isinstance(ev, AnomalyDetected):
            recorded.append((ev.seq, ev))
        elif isinstance(ev, SpikeSuspected):
            suspected_recorded.append((ev.seq, ev))
        elif isinstance(ev, CheckpointSaved):
            checkpoints.append({"seq": ev.seq, "step": ev.step, "path": ev.path, "sha256": ev.sha256,
                                "background": ev.background})
        elif isinstance(ev, RewindDecided):
            rewinds.append({"seq": ev.seq, "spike_step": ev.spike_step, "checkpoint": ev.checkpoint,
                            "from_step": ev.from_step, "reason": ev.reason})
        elif isinstance(ev, DataWindowSkipped) and rewinds:
            rewinds[-1]["skipped_batches"] = [ev.start_batch, ev.end_batch]
        elif isinstance(ev, RunStopped):
            stops.append({"seq": ev.seq, "rule": ev.rule, "reason": ev.reason})
        elif isinstance(ev, PreflightGate) and ev.gate == "authority" and ev.status == "passed":
            problem = _approval_problem(ev)
            if problem is not None:
                differences.append({"seq": ev.seq, "kind": "preflight_gate",
                                    "detail": f"the authority gate passed, but {problem}"})
        elif isinstance(ev, GateVerdict):
            saw_ladder = True
            ladder.apply(ev)
            try:
                passed, reason = gate(dict(ev.bars), dict(ev.measured))
            except ValueError as e:
                differences.append({"seq": ev.seq, "kind": "gate_verdict",
                                    "detail": f"rung {ev.rung}: the verdict cannot be recomputed: {e}"})
                last_verdict = ev
                continue
            if passed != ev.passed or reason != ev.reason:
                differences.append({"seq": ev.seq, "kind": "gate_verdict",
                                    "detail": f"rung {ev.rung}: recorded passed={ev.passed} ({ev.reason!r}), "
                                              f"the receipts give passed={passed} ({reason!r})"})
            last_verdict = ev
        elif isinstance(ev, DecisionRecorded):
            saw_ladder = True
            ladder.apply(ev)
            before = {"a": a, "b": b, "mean": a / (a + b)}
            if last_verdict is None or last_verdict.rung != ev.rung:
                differences.append({"seq": ev.seq, "kind": "decision_recorded",
                                    "detail": f"decision for rung {ev.rung} without its verdict"})
                continue
            a, b = beta_update(a, b, last_verdict.passed)
            action = "advance" if last_verdict.passed else "halt_ladder"
            after = {"a": a, "b": b, "mean": a / (a + b)}
            if (ev.action_chosen != action or dict(ev.belief_before) != before or dict(ev.belief_after) != after
                    or last_verdict.h not in ev.evidence):
                differences.append({"seq": ev.seq, "kind": "decision_recorded",
                                    "detail": f"rung {ev.rung}: recorded {ev.action_chosen} {dict(ev.belief_after)}, "
                                              f"the verdict gives {action} {after}"})

    differences += _compare_derived(pending_recomputed, recorded, "anomaly_detected")
    if _at_least(report.format_version, (1, 1)):  # spike_suspected came with format 1.1: older runs lack it
        differences += _compare_derived(suspected_recomputed, suspected_recorded, "spike_suspected")
    differences.sort(key=lambda d: d["seq"] if d["seq"] is not None else -1)

    notes = []
    health = proj.report() if proj is not None else None
    if health is None or not health["steps"]:
        notes.append("no step observations: the health, MFU and anomaly receipts rest on nothing")
    elif health["mfu"]["implausible"]:
        notes.append(f"MFU implausible: {health['mfu']['above_100pct']:,} steps above 100% (the peak is too low)")
    by_kind: dict[str, list[int]] = {}
    for _, an in pending_recomputed:
        by_kind.setdefault(an.kind, []).append(an.step)
    res = ladder.result() if saw_ladder else None
    return Reconstruction(
        verify=report,
        health=health,
        anomalies_by_kind=by_kind,
        checkpoints=checkpoints,
        resumes=resumes,
        rewinds=rewinds,
        stops=stops,
        ladder=None if res is None else {"passed_rungs": res.passed_rungs(), "halted_at": res.halted_at,
                                         "decisions": res.decisions,
                                         "outcomes": [{"rung": o.name, "passed": o.passed, "reason": o.reason}
                                                      for o in res.outcomes]},
        differences=differences,
        notes=notes,
    )
