"""The projection protocol: a deterministic fold over a journal's events, and the registry replay folds.

A projection has ``apply(event)`` (fold one event: no I/O, no clock, no randomness), ``differences()`` (every way
the conclusions a writer recorded differ from what the events they rest on imply, each with its seq) and
``summary()`` (what it rebuilt, for the reconstruction). Each package contributes its own (``training.audit``:
health, checkpoints, rewinds, stops, selection, preflight; ``ladder.audit``: the ladder) by ``register``-ing them
on a :class:`ProjectionRegistry`; the installed face assembles the one list replay folds
(:data:`trainledger.audit.PROJECTIONS`), as it assembles the CLI. The journal package knows the protocol only.

The live code paths reach their conclusions through the same functions the projections recompute them with,
so live state equals the fold.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from trainledger.journal.events import StepObserved

__all__ = ["Projection", "ProjectionRegistry", "difference", "values_agree"]


class Projection:
    """The protocol. Subclasses fold the kinds they care about and ignore the rest; what they find wrong goes in
    ``_diffs`` as they fold (``differences`` returns it unless a subclass compares at the end)."""

    name = "projection"
    #: the event classes ``apply`` folds (a decoded record is an instance of its event's class); the fold hands a
    #: projection only those, so a step costs nothing to the projections that ignore steps. None: every event
    kinds: tuple[type, ...] | None = None
    _diffs: Any = ()  # a subclass that finds anything sets its own list

    def apply(self, ev: Any) -> None:
        raise NotImplementedError

    #: a projection that folds steps may give them a function of their own (``apply_step(event)``), which the
    #: fold then calls for a ``step_observed`` instead of :meth:`apply`: the one kind of nearly every line
    apply_step: Callable[[Any], None] | None = None
    #: and may fold a run of consecutive ``step_observed`` records at once (``apply_steps(events, lo, hi)``: the same
    #: as :attr:`apply_step` on each of ``events[lo:hi]`` in order), which the fold then calls for each such run
    apply_steps: Callable[[list[Any], int, int], None] | None = None

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        """``{event class: function}``: what the fold calls for an event of each kind (the first class the event
        is an instance of, in order): :meth:`apply` for each of :attr:`kinds`, :attr:`apply_step` for the steps."""
        if self.kinds is None:
            return {object: self.apply}
        fns = {k: self.apply for k in self.kinds}
        if StepObserved in fns and self.apply_step is not None:
            fns[StepObserved] = self.apply_step
        return fns

    def differences(self) -> list[dict[str, Any]]:
        return list(self._diffs)

    def summary(self) -> Any:
        return None


def difference(seq: int | None, kind: str, detail: str) -> dict[str, Any]:
    return {"seq": seq, "kind": kind, "detail": detail}


def values_agree(a: Any, b: Any) -> bool:
    """A recorded number against its recomputation: equal within 1e-9 relative (NaN equals NaN), or equal."""
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return a == b
    if math.isinf(a) or math.isinf(b) or a != a or b != b:
        return a == b or (a != a and b != b)
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


class ProjectionRegistry:
    """An ordered list of projection factories, each ``factory(format_version) -> Projection``.

    Names are unique (replay looks its projections up by name); the order is the order of registration, which
    is the order replay applies them to each event and lists their differences in."""

    def __init__(self) -> None:
        self._factories: dict[str, Callable[[str | None], Projection]] = {}

    def add(self, name: str, factory: Callable[[str | None], Projection]) -> None:
        if name in self._factories:
            raise ValueError(f"a projection named {name!r} is registered already")
        self._factories[name] = factory

    def build(self, format_version: str | None = None) -> list[Projection]:
        """A fresh instance of every registered projection, in order."""
        out = []
        for name, factory in self._factories.items():
            p = factory(format_version)
            if p.name != name:
                raise ValueError(f"the projection registered as {name!r} calls itself {p.name!r}")
            out.append(p)
        return out
