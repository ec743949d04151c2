"""The pilot ladder's event kinds: a rung started, a gate's verdict, a signed decision and a scaling fit.

Torch-free; loaded with the codec (``trainledger.journal.kinds.KIND_MODULES``), as the training kinds are.
"""

from __future__ import annotations

from typing import Any

from trainledger.journal.events import Event

__all__ = ["RungStarted", "GateVerdict", "DecisionRecorded", "ScalingFitted"]

class RungStarted(Event, tag="rung_started", frozen=True, kw_only=True):
    rung: str
    real_target: str
    spec: dict[str, Any]


class GateVerdict(Event, tag="gate_verdict", frozen=True, kw_only=True):
    rung: str
    passed: bool
    reason: str
    measured: dict[str, Any]
    bars: dict[str, Any]
    artifacts: dict[str, Any]


class DecisionRecorded(Event, tag="decision_recorded", frozen=True, kw_only=True):
    rung: str
    belief_before: dict[str, float]
    evidence: list[str]  # chain hashes of the events the decision rests on
    belief_after: dict[str, float]
    action_chosen: str  # "advance" | "halt_ladder"


#: Every kind trainledger defines, by its tag.
class ScalingFitted(Event, tag="scaling_fitted", frozen=True, kw_only=True):
    """The scaling-law fit (format 1.2): the scaling law fitted to earlier rungs' receipts and the headline run it sized inside a
    compute box (ladder/scaling.py). Derived: replay refits the points the cited verdicts measured and chooses
    again."""

    rung: str  # the rung it sizes
    points: list[list[float]]  # [n_params, tokens, eval_loss] per earlier rung, as their verdicts measured them
    evidence: list[str]  # chain hashes of those verdicts
    params: dict[str, float]  # E, A, B, alpha, beta
    theta: list[float]  # log A, log B, log E, alpha, beta as fitted
    seed: int
    boot: int
    level: float
    loo_error: float
    box: dict[str, float]  # ComputeBox fields
    candidates: list[dict[str, Any]]  # name, n_params, flops_per_token, and the shape
    choice: dict[str, Any]  # candidate, tokens, predicted_loss, interval, binding, usage, ...
    entropy_rate: float | None = None  # the true E: the corpus's entropy rate, when the data has a known one
    fitter: str | None = None  # format 1.5: the minimiser (ladder.scaling.FITTERS); absent = "lbfgs", as before


#: the kinds this module defines, as the codec's registry lists them (journal.kinds.BUILTIN_KINDS)
KINDS: tuple[type[Event], ...] = (RungStarted, GateVerdict, DecisionRecorded, ScalingFitted,)
