"""Steps on their way to the monitor: a loop's per-step losses and grad norms, kept as tensors and handed over in
batches (:class:`StepBuffer`), so that a device is synchronised once per batch of steps, not once per step. Used by
the framework callbacks, the Recorder and the distributed reference loop; torch is imported only to read tensors."""

from __future__ import annotations

import time
from typing import Any

from trainledger.journal import Journal
from trainledger.training.kinds import RunStopped

__all__ = ["StepBuffer"]


class NormParts(tuple):
    """A step's gradient norm not yet combined: the L2 norms of its gradients one tensor at a time (0-d tensors, one
    ``torch._foreach_norm`` call in the step). :meth:`StepBuffer.drain` combines the queued steps' parts in one
    call (the norm of each step's norms): in the step it saves the two calls that combine them, which cost a 1 ms
    step 2-3% on the CPU with the caches a training step leaves cold."""

    __slots__ = ()


def _combine(pend: list[tuple[int, Any, Any, dict[str, Any]]]) -> list[tuple[int, Any, Any, dict[str, Any]]]:
    """``pend`` with each :class:`NormParts` replaced by its combined norm: one ``vector_norm`` over the rows of the
    stacked parts where every such step has as many parts on the first one's device and dtype (the usual case: a
    step's parts come from one foreach call, which :func:`~trainledger.training.integrations.hooks.norm_parts` makes
    only for gradients that share both), else one step at a time."""
    import torch

    at = [i for i, p in enumerate(pend) if isinstance(p[2], NormParts)]
    if not at:
        return pend
    first = pend[at[0]][2]
    n, dev, dt = len(first), first[0].device, first[0].dtype
    out = list(pend)
    if all(len(pend[i][2]) == n and pend[i][2][0].device == dev and pend[i][2][0].dtype == dt for i in at):
        rows = torch.linalg.vector_norm(torch.stack([t for i in at for t in pend[i][2]]).view(len(at), n), dim=1)
        norms: list[Any] = rows.tolist() if dev.type == "cpu" else list(rows.unbind())
    else:
        norms = [torch.nn.utils.get_total_norm(list(pend[i][2])) for i in at]
    for i, gn in zip(at, norms):
        step, loss, _, fields = pend[i]
        out[i] = (step, loss, gn, fields)
    return out


def _host(value: Any) -> float | None:
    """A queued batch fingerprint (a 0-d tensor, read here, at drain time, never in the step) as a float."""
    return None if value is None else float(value)


class StepBuffer:
    """Per-step losses (and grad norms) kept as tensors, converted to floats in one transfer every ``every`` steps
    or ``max_wait_s`` seconds, whichever comes first (one host-device sync per batch of steps instead of one per
    step), on the CPU too: the monitor then works on a batch of steps with warm caches instead of one step at a time
    after each training step has cooled them. The time bound is within the journal's own flush interval (1 s), so a
    process that dies loses no more steps than the journal's crash model already allows."""

    def __init__(self, every: int = 16, max_wait_s: float = 0.2):
        self.every = max(1, every)
        self.max_wait_ns = int(max_wait_s * 1e9)
        self.pending: list[tuple[int, Any, Any, dict[str, Any]]] = []
        self._since = 0

    def add(self, step: int, loss: Any, grad_norm: Any, fields: dict[str, Any]) -> bool:
        """Queue a step; True when it is time to :meth:`drain` (a full batch, or the oldest step waited long enough)."""
        pending = self.pending
        now = time.monotonic_ns()
        if not pending:
            self._since = now
        pending.append((step, loss, grad_norm, fields))
        return len(pending) >= self.every or now - self._since >= self.max_wait_ns

    def observe(self, monitor: Any, journal: Journal, stop_on: frozenset[str]) -> RunStopped | None:
        """Hand every queued step to the monitor; the first anomaly in ``stop_on`` is journaled as ``run_stopped``
        (durable) and returned, for the framework to stop on. A framework calls this once it stops asking. A NaN
        grad norm reaches the monitor as it came (its ``nan_grad_norm``, a default stop rule of the callbacks); a
        step with none is ``None``."""
        stop = None
        for step, loss, gn, f in self.drain():
            found = monitor.observe_step(step, loss, grad_norm=gn,
                                         step_time_s=f["step_time_s"], tokens=f["tokens"], lr=f["lr"],
                                         batch_fingerprint=_host(f.get("batch_fingerprint")),
                                         compute_time_s=f.get("compute_time_s"))
            hit = next((a for a in found if a.kind in stop_on), None)
            if hit is not None and stop is None:
                stop = RunStopped(rule=f"stop_on:{hit.kind}", reason=f"{hit.kind} at step {hit.step}",
                                  value=float(hit.value))
                journal.append(stop, durable=True)
        return stop

    def hand_over(self, monitor: Any) -> list[Any]:
        """Hand every queued step to the monitor, in order, each with the fields it was queued with (``observe_step``
        keyword arguments) and its grad norm as it came (a NaN is the monitor's to flag); returns what the monitor
        found (each anomaly names its step). For a loop with no stop rules (the distributed reference loop,
        ``Recorder(batch=)``); the callbacks use :meth:`observe`."""
        found: list[Any] = []
        for step, loss, gn, fields in self.drain():
            found += monitor.observe_step(step, loss, grad_norm=gn, **fields)
        return found

    def drain(self) -> list[tuple[int, float, float | None, dict[str, Any]]]:
        import torch

        if not self.pending:
            return []
        pend, self.pending = _combine(self.pending), []
        if all(getattr(x, "device", None) is None or x.device.type == "cpu" for p in pend for x in (p[1], p[2])):
            return [(step, float(loss), None if gn is None else float(gn), fields)  # on the host: no transfer
                    for step, loss, gn, fields in pend]
        vals: list[Any] = []
        for _, loss, gn, _ in pend:
            vals.append(loss if isinstance(loss, torch.Tensor) else torch.tensor(float(loss)))
            vals.append(gn if isinstance(gn, torch.Tensor) else torch.tensor(float("nan") if gn is None else float(gn)))
        flat = torch.stack([v.detach().float().reshape(()).to(vals[0].device) for v in vals]).tolist()  # one sync
        out = []
        for i, (step, _, gn, fields) in enumerate(pend):
            out.append((step, flat[2 * i], None if gn is None else flat[2 * i + 1], fields))
        return out
