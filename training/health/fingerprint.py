"""One number that stands for a training batch, so that a step run again after a resume can be held to the batch
it trained on the first time (``step_observed.batch_fingerprint``, format 1.4; replay's ``data_divergence``).

    fp = batch_fingerprint(x, y)                       # a 0-d float64 tensor, on the batch's device, no sync
    loss_f, fp_f = torch.stack([loss.detach().double(), fp]).tolist()   # one transfer, with the loss
    rec.step(step, loss_f, batch_fingerprint=fp_f)

It is a weighted sum of every element of the tensors laid end to end, in float64, each element weighted by its
position (a golden-ratio sequence in [0.5, 1.5)): the same batch gives the same number, a batch with other rows, other
values or the same rows in another order gives another. It is a check against mistakes (a prefetched batch, a
loader skipped by hand to the wrong place), not a cryptographic digest. Cost: a cast per tensor, one
concatenation and one dot product on its device, the weights kept per shape: on this 2-core CPU, one thread, 50.5 µs a call for a
64x256 float batch and its 64 labels, 4% of a 1.3 ms MLP step on it (``tools/bench_fingerprint.py``,
docs/bench/fingerprint.txt); on a GPU the calls are queued with the step and read with the loss.
"""

from __future__ import annotations

from typing import Any

__all__ = ["batch_fingerprint"]

_PHI = 0.6180339887498949
_CACHE: dict[tuple[int, Any], Any] = {}  # the weights of the last few shapes (a run uses one or two)


def _weights(n: int, device: Any) -> Any:
    import torch

    key = (n, device)
    w = _CACHE.get(key)
    if w is None:
        w = torch.arange(n, device=device, dtype=torch.float64).mul_(_PHI)
        w = w.sub_(w.floor()).add_(0.5)
        if len(_CACHE) >= 8:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = w
    return w


def batch_fingerprint(*tensors: Any) -> Any:
    """A 0-d float64 tensor on the first tensor's device that stands for ``tensors`` (see the module docstring)."""
    import torch

    if not tensors:
        raise ValueError("batch_fingerprint needs at least one tensor")
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"batch_fingerprint takes tensors, got {type(t).__name__}")
    dev = tensors[0].device
    flats = [t.detach().reshape(-1).to(device=dev, dtype=torch.float64) for t in tensors]
    flat = flats[0] if len(flats) == 1 else torch.cat(flats)
    return torch.dot(flat, _weights(flat.numel(), dev))
