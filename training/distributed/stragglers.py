"""Straggler detection as a fold over every rank's journaled step times (torch-free, so replay recomputes it).

Every window (a number of steps; by default about a minute of wall time) the ranks exchange one number each (the median step time of the steps they observed
since the last exchange; one small collective, never per step) and rank 0 records ``straggler_scores``: per
rank, the *relative score* = the fastest rank's median / this rank's median (nvidia-resiliency-ext's relative
score: 1.0 for the fastest, 0.5 for a rank taking twice as long). A score below the threshold (0.75, theirs)
is a ``straggler_detected`` event. Each window also records the *individual score* (a rank's best window median
so far over this one's: a rank slowing down against itself, which a uniformly slow group hides from the
relative score); it is reported, not flagged: machine noise alone moves it by more than a quarter here. :func:`window_median` and :func:`relative_scores` are what the live detector
(``training.distributed.StragglerDetector``) computes with, and :func:`audit_stragglers` recomputes every recorded
window from the rank journals: each rank's median over the last observation of each step in the window, within
the torchrun round the window was recorded in (a restart re-runs steps; each round is its own).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

__all__ = ["DEFAULT_THRESHOLD", "window_median", "relative_scores", "individual_scores", "audit_stragglers",
           "step_time_for_stragglers"]

DEFAULT_THRESHOLD = 0.75


def window_median(step_times: list[float]) -> float | None:
    """The median of a window's finite, positive step times (``None`` for an empty window)."""
    xs = [x for x in step_times if x is not None and x > 0 and math.isfinite(x)]
    return statistics.median(xs) if xs else None


def relative_scores(medians: dict[int, float]) -> dict[int, float]:
    """Per rank: the fastest rank's median over this rank's (1.0 for the fastest)."""
    ref = min(medians.values())
    return {r: ref / m for r, m in medians.items()}


def step_time_for_stragglers(ev: Any) -> float | None:
    """The time a step's straggler score rests on: the rank's own ``compute_time_s`` where the loop journals it
    (under a synchronous all-reduce every rank's wall-clock step time is the slowest rank's), else ``step_time_s``."""
    return ev.compute_time_s if ev.compute_time_s is not None else ev.step_time_s


def individual_scores(medians: dict[int, float], best: dict[int, float]) -> dict[int, float]:
    """Per rank: its own best (lowest) window median so far, this window's included, over this window's
    (nvidia-resiliency-ext's individual score: a rank that slows down against itself). Updates ``best``."""
    for r, m in medians.items():
        best[r] = min(best.get(r, m), m)
    return {r: best[r] / m for r, m in medians.items()}


def audit_stragglers(rank_events: dict[int, list[Any]]) -> list[dict[str, Any]]:
    """Every difference between the ``straggler_scores`` / ``straggler_detected`` rank 0 recorded and what every
    rank's own step times give (``rank_events``: each rank's signed events, in order)."""
    from trainledger.journal.events import StepObserved
    from trainledger.journal.kinds import RankJoined
    from trainledger.training.kinds import StragglerDetected, StragglerScores
    from trainledger.journal.audit.projection import values_agree

    out: list[dict[str, Any]] = []
    # Per rank and per torchrun round (the restart count of the rank_joined before them): the last observation
    # of each step. A window rank 0 recorded in round k rests on every rank's round-k observations.
    last_time: dict[int, dict[int, dict[int, float]]] = {}
    for r, events in rank_events.items():
        rounds: dict[int, dict[int, float]] = {}
        current = 0
        for ev in events:
            if isinstance(ev, RankJoined):
                current = ev.restart_count
            elif isinstance(ev, StepObserved):
                t = step_time_for_stragglers(ev)
                if t is not None:
                    rounds.setdefault(current, {})[ev.step] = t
        last_time[r] = rounds
    round0 = 0
    pending: dict[int, float] = {}
    best: dict[int, float] = {}  # each rank's best window median in this round (the live detector's memory)

    def unflagged() -> None:
        for r, sc in pending.items():
            out.append({"seq": None, "kind": "straggler_detected",
                        "detail": f"rank {r} scored {sc:.3f}, below the threshold, but was not flagged"})
        pending.clear()

    for ev in rank_events.get(0, []):
        if isinstance(ev, RankJoined):
            round0 = ev.restart_count
            best = {}
        elif isinstance(ev, StragglerScores):
            unflagged()
            medians = {}
            for r_s in ev.medians:
                r = int(r_s)
                if r not in last_time:
                    out.append({"seq": ev.seq, "kind": "straggler_scores", "detail": f"rank {r} has no journal"})
                    continue
                times = last_time[r].get(round0, {})
                medians[r] = window_median([t for s, t in times.items() if ev.window_start <= s <= ev.window_end])
            if None in medians.values() or len(medians) != len(ev.medians):
                out.append({"seq": ev.seq, "kind": "straggler_scores",
                            "detail": f"window {ev.window_start}-{ev.window_end}: some rank journaled no step times"})
                continue
            scores = relative_scores(medians)
            indiv = individual_scores(medians, best)
            if ev.individual is not None and not all(
                    values_agree(ev.individual.get(str(r)), indiv[r]) for r in medians):
                out.append({"seq": ev.seq, "kind": "straggler_scores",
                            "detail": f"window {ev.window_start}-{ev.window_end}: recorded individual scores "
                                      f"{ev.individual}, the step times give "
                                      f"{ {str(r): round(x, 6) for r, x in indiv.items()} }"})
            for r, m in medians.items():
                rec_m, rec_s = ev.medians[str(r)], ev.scores.get(str(r))
                if not (values_agree(rec_m, m) and rec_s is not None and values_agree(rec_s, scores[r])):
                    out.append({"seq": ev.seq, "kind": "straggler_scores",
                                "detail": f"window {ev.window_start}-{ev.window_end}: recorded rank {r} median "
                                          f"{rec_m} score {rec_s}, its journal gives {m} score {scores[r]}"})
            pending.update({r: sc for r, sc in scores.items() if sc < ev.threshold})
        elif isinstance(ev, StragglerDetected):
            s = pending.pop(ev.rank, None)
            if s is None or not values_agree(s, ev.score):
                out.append({"seq": ev.seq, "kind": "straggler_detected",
                            "detail": f"rank {ev.rank} flagged with score {ev.score}, which the step times do not give"})
    unflagged()
    return out
