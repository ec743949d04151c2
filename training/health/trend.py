"""Format 1.10's two rules for failures a rolling window cannot see: a blow-up of a loss that had fallen far below
where it started, and a slow divergence. Part of the health fold (:class:`~trainledger.training.health.detectors.
HealthProjection` feeds every step through :class:`TrendRules`, live and in replay); torch-free, no I/O.

**Blow-up** (``blowup_factor`` F, anomaly ``loss_blowup``). A loss is a ``loss_blowup`` on the step it rises above
sqrt(F) times the run's *start level* after the run had fallen to at most 1/F of it (with F = 4: above twice the
start, after falling to a quarter of it): the start level is the chance level the user declared (``chance_loss``:
ln 10 for a 10-class classifier), else the segment's first finite positive loss (what the model scored untrained:
a model that learns fast is far below it within 16 steps, so no median of the first ones will do); "fallen" is a
block of ``trend_window`` steps whose median is at most that level over F. A step the spike rules flagged is not
flagged again as a blow-up (it opens the blow-up's episode all the same). Twice the start, not the start itself: a
batch of a model still learning can score above chance now and then (its hardest examples confidently wrong); a
batch averaging twice chance is a model that has stopped working. The rule exists for a fitted classifier whose
batch losses span decades: its rolling window's spread grows so wide that the spike rules' own
thresholds climb with it (an lr x50 step sending a CNN's loss from 0.05 to 23-82 nats, above chance, was not even
suspected). A loss far above what the model scored untrained is a failure whatever the window's spread. One anomaly
an episode; the episode ends at the first loss back at or under the start level.

**Divergence** (``trend_window`` W, ``trend_ratio`` R, anomaly ``loss_divergence`` / ``grad_norm_divergence``).
Each series (the loss; the grad norm) is cut into blocks of W finite positive values; a block's median is its
level. The ``TREND_LOOKBACK`` blocks before a block give a baseline, the second lowest of their levels, and a
spread, their block-to-block wander: 1.4826 x the median absolute difference of consecutive levels' logs, over
sqrt 2 (a steady trend is not wander). A block whose level is above the baseline by at least max(log R,
``TREND_NOISE`` x spread), in log units, after the ``TREND_PERSIST`` blocks before it rose by half that, is a
divergence of that series, flagged at the block's last step (``value`` its level, ``baseline_median`` the baseline, ``mad`` the
spread, ``z_score`` the rise over the spread, ``threshold`` the multiple needed). Nearly the lowest, not the
median: a rise that takes as long as the lookback would carry a median up with it; not the lowest itself, the
luckiest block of a noisy series. A step the spike rules flagged (a spike, a NaN) makes both series forget their
earlier levels too: what follows is measured from where it leaves the run, since the anomaly is on record against
the level before it. A loss that climbs for hundreds of steps follows a rolling window up, so the spike rules never see it; this rule holds the series to its own earlier
level instead, and a series whose block medians wander (a classifier's batch losses span decades) must rise further
than its wandering. Falling curves (warm-up, a schedule's decay, an lr drop) never trip it; a series must have
``TREND_MIN_BLOCKS`` blocks behind it first (a grad norm that grows out of its initialisation does so early). After
a divergence the series' earlier levels are forgotten: the next needs another rise from where it is.
A resume (``run_resumed`` from the checkpoint of step s) drops the blocks that ended after s.
"""

from __future__ import annotations

import math
from statistics import median as _median
from typing import Any

from trainledger.training.kinds import AnomalyDetected

__all__ = ["TrendRules", "TREND_LOOKBACK", "TREND_MIN_BLOCKS", "TREND_NOISE", "TREND_DEFAULTS"]

#: how many earlier blocks a block's level is held against
TREND_LOOKBACK = 24
#: blocks a series needs behind it before a divergence can be flagged
TREND_MIN_BLOCKS = 4
#: a rise must also be this many robust sigma of the earlier blocks' levels (log units): a noisy series' block
#: medians wander by more than a quiet one's
TREND_NOISE = 7.0
#: the blocks before the flagged one that must have risen half as far (a climb, not one block's wander)
TREND_PERSIST = 2
#: 1 / Phi^-1(3/4), as the spike rules' MAD (detectors.MAD_SCALE)
MAD_SCALE = 1.4826
#: what the monitor records by default (format 1.10), with the partial-batch rule of the spike rules
#: (``RunConfigured.partial_batch``: a batch under half the step before's is not scored by them)
TREND_DEFAULTS = {"blowup_factor": 4.0, "trend_window": 25, "trend_ratio": 2.0, "partial_batch": 0.5}


class _Series:
    """One series' blocks: the open block's values, and the closed blocks' (last step, level), oldest first."""

    __slots__ = ("name", "open", "levels")

    def __init__(self, name: str):
        self.name = name
        self.open: list[float] = []
        self.levels: list[list[float]] = []  # [last step, level]

    def add(self, step: int, x: float, window: int, ratio: float) -> AnomalyDetected | None:
        self.open.append(x)
        if len(self.open) < window:
            return None
        level = _median(self.open)
        self.open = []
        levels = self.levels
        found = None
        if len(levels) >= TREND_MIN_BLOCKS:
            logs = [math.log(lv) for _, lv in levels[-TREND_LOOKBACK:]]
            # the block-to-block wander, from consecutive differences (a steady trend does not count as noise)
            spread = MAD_SCALE * _median([abs(b - a) for a, b in zip(logs, logs[1:])]) / math.sqrt(2)
            base = sorted(logs)[1]  # the second lowest: low enough to hold a slow rise, not the luckiest block
            need = max(math.log(ratio), TREND_NOISE * spread)
            rise = math.log(level) - base
            if rise >= need \
                    and all(math.log(lv) - base >= need / 2 for _, lv in levels[-TREND_PERSIST:]):
                found = AnomalyDetected(step=step, anomaly=f"{self.name}_divergence", value=level,
                                        baseline_median=math.exp(base), mad=spread, z_score=rise / spread
                                        if spread > 0 else None, threshold=math.exp(need), rule="trend")
        if found is not None:
            levels.clear()  # a new episode's rise is measured from here
        levels.append([step, level])
        if len(levels) > TREND_LOOKBACK + 1:
            del levels[0]
        return found

    def rewind_to(self, step: int) -> None:
        self.open = []
        self.levels = [lv for lv in self.levels if lv[0] <= step]

    def state(self) -> dict[str, Any]:
        return {"open": list(self.open), "levels": [list(lv) for lv in self.levels]}

    def load(self, d: dict[str, Any]) -> None:
        self.open = [float(x) for x in d.get("open", [])]
        self.levels = [[int(s), float(v)] for s, v in d.get("levels", [])]


class TrendRules:
    """The two rules over one segment's steps (see the module doc). ``step(step, loss, grad_norm)`` returns what
    the step revealed (a new list)."""

    def __init__(self, *, blowup_factor: float | None, chance_loss: float | None, window: int | None,
                 ratio: float):
        self.blowup = blowup_factor
        self._over = math.sqrt(blowup_factor) if blowup_factor is not None else math.inf  # the flag's multiple
        self.window = window
        self.ratio = ratio
        self.start: float | None = chance_loss  # the start level, once known
        self.armed = False  # a block's level fell to the start level / blowup_factor
        self.in_blowup = False
        self.loss = _Series("loss")
        self.grad = _Series("grad_norm")
        self._arm_block: list[float] = []  # the open block of losses that may arm the blow-up rule
        #: the steps each signal was there for (a finite, positive loss; grad norm): what the rules had to go on
        self.seen = {"loss": 0, "grad_norm": 0}

    def step(self, step: int, loss: float, g: float | None, spiked: bool = False) -> list[AnomalyDetected]:
        """``spiked``: the spike rules flagged this step (a spike, a NaN): what follows it is measured from where
        it leaves the run (both series' earlier levels forgotten), not held to the level before it, which that
        anomaly is already on record against."""
        out: list[AnomalyDetected] = []
        seen = self.seen
        if spiked and self.window is not None:
            self.loss.levels.clear()
            self.grad.levels.clear()
        if loss - loss == 0 and loss > 0:  # finite and positive: what both rules read
            seen["loss"] += 1
            if self.blowup is not None:
                a = self._blowup(step, loss, spiked)
                if a is not None:
                    out.append(a)
            if self.window is not None:
                a = self.loss.add(step, loss, self.window, self.ratio)
                if a is not None:
                    out.append(a)
        if g is not None and g - g == 0 and g > 0:
            seen["grad_norm"] += 1
            if self.window is not None:
                a = self.grad.add(step, g, self.window, self.ratio)
                if a is not None:
                    out.append(a)
        return out

    def _blowup(self, step: int, loss: float, spiked: bool) -> AnomalyDetected | None:
        start = self.start
        if start is None:  # the segment's first loss: what the model scored untrained
            self.start = loss
            return None
        if self.in_blowup:
            if loss <= start:
                self.in_blowup = False
            return None
        if self.armed and loss > start * self._over:
            self.in_blowup = True  # (an episode either way: its later steps are the same blow-up)
            if spiked:  # the spike rules flagged it already: one anomaly for one event
                return None
            return AnomalyDetected(step=step, anomaly="loss_blowup", value=loss, baseline_median=start,
                                   threshold=start * self._over, rule="blowup")
        if not self.armed:
            block = self._arm_block
            block.append(loss)
            if len(block) >= (self.window or TREND_DEFAULTS["trend_window"]):
                self.armed = _median(block) * self.blowup <= start
                self._arm_block = []
        return None

    def resume(self, from_step: int | None) -> None:
        """A resume from the checkpoint of ``from_step``: the blocks after it are redone; an open blow-up ends."""
        self.in_blowup = False
        self._arm_block = []
        if from_step is not None:
            self.loss.rewind_to(from_step)
            self.grad.rewind_to(from_step)

    def state(self) -> dict[str, Any]:
        return {"start": self.start, "armed": self.armed, "in_blowup": self.in_blowup,
                "arm_block": list(self._arm_block), "loss": self.loss.state(), "grad_norm": self.grad.state(),
                "seen": dict(self.seen)}

    def load(self, d: dict[str, Any]) -> None:
        s = d.get("start")
        self.start = None if s is None else float(s)
        self.armed, self.in_blowup = bool(d.get("armed")), bool(d.get("in_blowup"))
        self._arm_block = [float(x) for x in d.get("arm_block", [])]
        self.loss.load(d.get("loss", {}))
        self.grad.load(d.get("grad_norm", {}))
        seen = d.get("seen") or {}
        self.seen = {k: int(seen.get(k, 0)) for k in ("loss", "grad_norm")}
