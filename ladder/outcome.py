"""The pilot ladder's outcome as a projection, and its gate: torch-free, shared by the live runner and replay.

Decision belief model: a Beta(a, b) posterior over "the next rung clears its
bar", Beta(1, 1) before the first rung, a += 1 after a pass and b += 1 after a
failure (:func:`beta_update`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from trainledger.ladder.kinds import DecisionRecorded, GateVerdict
from trainledger.journal.reader import read_events

__all__ = ["RungOutcome", "LadderResult", "LadderProjection", "gate", "beta_update", "decide"]


def beta_update(a: float, b: float, passed: bool) -> tuple[float, float]:
    return (a + 1, b) if passed else (a, b + 1)


def decide(a: float, b: float, passed: bool) -> tuple[str, tuple[float, float]]:
    """The ladder's decision after a verdict: the action (``advance`` after a pass, ``halt_ladder`` after a
    failure) and the Beta belief updated by it. The runner decides with this; replay decides again."""
    return ("advance" if passed else "halt_ladder"), beta_update(a, b, passed)


@dataclasses.dataclass
class RungOutcome:
    name: str
    passed: bool
    reason: str
    measured: dict[str, Any]
    bars: dict[str, Any]
    artifacts: dict[str, Any]


@dataclasses.dataclass
class LadderResult:
    outcomes: list[RungOutcome]
    halted_at: str | None
    decisions: int

    def passed_rungs(self) -> list[str]:
        return [o.name for o in self.outcomes if o.passed]


class LadderProjection:
    """The reducer: verdicts and decisions in, :class:`LadderResult` out."""

    def __init__(self) -> None:
        self.outcomes: list[RungOutcome] = []
        self.halted_at: str | None = None
        self.decisions = 0

    def apply(self, ev: Any) -> None:
        if isinstance(ev, GateVerdict):
            self.outcomes.append(RungOutcome(ev.rung, ev.passed, ev.reason, dict(ev.measured), dict(ev.bars),
                                             dict(ev.artifacts)))
        elif isinstance(ev, DecisionRecorded):
            self.decisions += 1
            if ev.action_chosen == "halt_ladder":
                self.halted_at = ev.rung

    def result(self) -> LadderResult:
        return LadderResult(list(self.outcomes), self.halted_at, self.decisions)

    @classmethod
    def replay(cls, path: str | Path) -> LadderResult:
        p = cls()
        for ev in read_events(path):
            p.apply(ev)
        return p.result()


def _fmt(x: float) -> str:
    return f"{x:.4f}" if 1e-3 <= abs(x) < 1e6 else f"{x:g}"


def _number(d: dict[str, Any], key: str, where: str, *, optional: bool = False) -> None:
    v = d.get(key)
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{where} {key!r} is {v!r}, not a number")


def gate(bars: dict[str, Any], m: dict[str, Any]) -> tuple[bool, str]:
    """Every bar set, with the literal margin; the first failure is the reason. Live and replay use this.

    Raises ``ValueError`` when a bar or a measurement the gate needs is missing or not a number (a verdict
    read from a journal may say anything).
    """
    if not isinstance(bars, dict) or not isinstance(m, dict):
        raise ValueError("bars and measured must be objects")
    for key in ("max_final_loss", "max_forgetting_gap"):
        _number(bars, key, "bar")
    for key in ("min_mfu_mean", "max_anomalies", "max_flops", "max_wall_s"):
        _number(bars, key, "bar", optional=True)
    for key in ("final_loss", "forgetting_gap"):
        _number(m, key, "measurement")
    for bar, key in (("min_mfu_mean", "mfu_mean"), ("max_anomalies", "anomalies"), ("max_flops", "flops"),
                     ("max_wall_s", "wall_s")):
        if bars.get(bar) is not None:
            _number(m, key, "measurement", optional=bar == "min_mfu_mean")
    if "continuity_ok" in m and not isinstance(m["continuity_ok"], bool):
        raise ValueError(f"measurement 'continuity_ok' is {m['continuity_ok']!r}, not true or false")
    mfl, mfg = bars["max_final_loss"], bars["max_forgetting_gap"]
    checks = [(m["final_loss"] <= mfl,
               f"final loss {_fmt(m['final_loss'])} {'<=' if m['final_loss'] <= mfl else '>'} target {_fmt(mfl)}"),
              (m["forgetting_gap"] <= mfg,
               f"forgetting gap {_fmt(m['forgetting_gap'])} {'<=' if m['forgetting_gap'] <= mfg else '>'} "
               f"target {_fmt(mfg)}")]
    if bars.get("min_mfu_mean") is not None:
        ok = m["mfu_mean"] is not None and m["mfu_mean"] >= bars["min_mfu_mean"]
        checks.append((ok, f"MFU mean {m['mfu_mean']} {'>=' if ok else '<'} target {bars['min_mfu_mean']}"))
    if bars.get("max_anomalies") is not None:
        ok = m["anomalies"] <= bars["max_anomalies"]
        checks.append((ok, f"anomalies {m['anomalies']} {'<=' if ok else '>'} limit {bars['max_anomalies']}"))
    if bars.get("max_flops") is not None:
        ok = m["flops"] <= bars["max_flops"]
        checks.append((ok, f"FLOPs {m['flops']:.3e} {'<=' if ok else '>'} box {bars['max_flops']:.3e}"))
    if bars.get("max_wall_s") is not None:
        ok = m["wall_s"] <= bars["max_wall_s"]
        checks.append((ok, f"wall {m['wall_s']:.2f} s {'<=' if ok else '>'} box {bars['max_wall_s']} s"))
    if "continuity_ok" in m:
        checks.append((m["continuity_ok"], "restart continuity " + ("ok" if m["continuity_ok"] else "broken")))
    if bars.get("loss_interval") is not None:  # F5's prediction, checked by the run it sized
        iv = bars["loss_interval"]
        if not (isinstance(iv, list) and len(iv) == 2 and all(isinstance(x, (int, float)) for x in iv)):
            raise ValueError(f"bar 'loss_interval' is {iv!r}, not [low, high]")
        _number(bars, "predicted_loss", "bar")
        _number(m, "eval_loss", "measurement")
        ok = iv[0] <= m["eval_loss"] <= iv[1]
        checks.append((ok, f"held-out loss {_fmt(m['eval_loss'])} {'inside' if ok else 'outside'} F5's interval "
                           f"[{_fmt(iv[0])}, {_fmt(iv[1])}] (predicted {_fmt(bars['predicted_loss'])})"))
    failed = [msg for ok, msg in checks if not ok]
    return (not failed, failed[0] if failed else "; ".join(msg for _, msg in checks))
