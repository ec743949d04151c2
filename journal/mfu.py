"""Model FLOPs and MFU: the one implementation the health fold, the report, replay's ladder audit, the ladder
runner and ``training.flops.FlopConfig`` share (the SQL ``mfu`` view spells the same formula; a test holds it to
this one).

PaLM (Chowdhery et al. 2022), appendix B: a training step costs ``6N + 12·L·H·Q·T`` FLOPs per token, N the
parameters without position embeddings, L layers, H heads of size Q, T the sequence length. MFU is the model
FLOPs of the step over its time, over the peak of every device.
"""

from __future__ import annotations

from typing import Any

__all__ = ["model_flops_per_token", "MfuAccounting"]


def model_flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> int:
    """PaLM appendix B: 6N + 12·L·H·Q·T."""
    return 6 * n_params + 12 * n_layer * n_head * head_dim * seq_len


class MfuAccounting:
    """MFU per step under one ``run_configured`` (anything with its FLOP-shape, peak and devices fields)."""

    __slots__ = ("fpt", "peak", "seq_len")

    def __init__(self, config: Any) -> None:
        c = config
        self.fpt = (model_flops_per_token(c.n_params, c.n_layer, c.n_head, c.head_dim, c.seq_len)
                    if c.n_params is not None else None)
        self.peak = c.peak_flops_per_sec * c.devices if c.peak_flops_per_sec is not None else None
        self.seq_len = c.seq_len

    def step(self, tokens: int | None, examples: int | None, step_time_s: float | None) -> float | None:
        """The step's MFU: ``None`` without a FLOP shape, a peak, a positive finite step time, or a token count
        (``tokens``, else ``examples × seq_len``)."""
        fpt, peak = self.fpt, self.peak
        if fpt is None or peak is None or step_time_s is None or not 0 < step_time_s < float("inf"):
            return None
        if tokens is None:
            if examples is None or self.seq_len is None:
                return None
            tokens = examples * self.seq_len
        return fpt * tokens / step_time_s / peak
