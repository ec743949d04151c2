"""Roadmap pieces a rung can exercise: the ones that exist here, for real, and the ones that do not, honestly.

- F9 muP: :func:`transfer_lr`, the muP rule for hidden-layer learning rates under Adam.
- H2 MoE versus dense: :func:`moe_vs_dense` builds a mixture-of-experts variant of the
  rung's model and measures how far its output is from the dense model's on the same batch.
- F5 scaling-law fits: :mod:`trainledger.ladder.scaling`, run by the runner on a rung that opts in after at least
  three distinct sizes of rungs with held-out losses; without them it is skipped, with the reason.
- E7 (a referee eval suite) and E8 (long context) do not exist in this repository: :data:`SKIPPED_REASONS` says
  so, and opting a rung into one raises ``NotImplementedError`` (:func:`refuse_unavailable`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from trainledger.training.reference.model import MLP, CausalLM

__all__ = ["transfer_lr", "MoEMLP", "moe_vs_dense", "SKIPPED_REASONS", "refuse_unavailable"]


def transfer_lr(base_lr: float, base_width: int, target_width: int) -> float:
    """muP (Yang et al., Tensor Programs V, table 3): under Adam, hidden-layer learning rates scale as 1/width.

    ``transfer_lr(0.05, 8, 8) == 0.05``; doubling the width halves it.
    """
    if not base_lr > 0 or base_width < 1 or target_width < 1:
        raise ValueError("transfer_lr needs base_lr > 0 and positive widths")
    return base_lr * base_width / target_width


class MoEMLP(nn.Module):
    """A softmax-gated mixture of ``experts`` MLPs; expert 0 starts as the dense MLP it replaces."""

    def __init__(self, dense: MLP, d_model: int, experts: int, dropout: float = 0.0):
        super().__init__()
        self.router = nn.Linear(d_model, experts, bias=False)
        nn.init.normal_(self.router.weight, std=0.02)
        self.experts = nn.ModuleList([copy.deepcopy(dense)] + [MLP(d_model, dropout) for _ in range(experts - 1)])
        for e in list(self.experts)[1:]:
            for m in e.modules():
                if isinstance(m, nn.Linear):
                    nn.init.normal_(m.weight, std=0.02)
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gates = torch.softmax(self.router(x), dim=-1)  # (B, T, E)
        outs = torch.stack([e(x) for e in self.experts], dim=-1)  # (B, T, C, E)
        return (outs * gates.unsqueeze(-2)).sum(dim=-1)


def moe_vs_dense(model: CausalLM, batch: torch.Tensor, experts: int, max_relative_diff: float,
                 *, seed: int = 0) -> dict[str, Any]:
    """Build the MoE variant of ``model``, compare logits on ``batch``; decide "moe" or "dense".

    ``relative_output_diff = ||moe(x) - dense(x)|| / ||dense(x)||``; "moe" when it is at most
    ``max_relative_diff``. Returns the record the rung stores.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        moe = copy.deepcopy(model)
        for blk in moe.h:
            blk.mlp = MoEMLP(blk.mlp, model.d_model, experts)
    model.eval()
    moe.eval()
    with torch.no_grad():
        dense_out = model(batch)
        moe_out = moe(batch)
    diff = float(torch.linalg.vector_norm(moe_out - dense_out) / torch.linalg.vector_norm(dense_out))
    return {"experts": experts, "relative_output_diff": diff, "max_relative_diff": max_relative_diff,
            "decision": "moe" if diff <= max_relative_diff else "dense",
            "moe_params": sum(p.numel() for p in moe.parameters()),
            "dense_params": sum(p.numel() for p in model.parameters())}


SKIPPED_REASONS = {
    "E7": "the E7 referee evaluation suite does not exist in this repository; this rung ran without an E7 bake-off.",
    "E8": "E8 (long context) has not been built in this repository; this rung ran without it, at its stand-in "
          "block size.",
    "F5": "no scaling law was fitted for this rung: F5 needs at least three earlier rungs of distinct size whose "
          "held-out losses were measured (eval_batches), and this ladder gives it none; the rung used a manually "
          "chosen stand-in configuration instead of one F5 would have chosen.",
    "F1": "F1 (the distributed trainer) does not run here: this rung trained on one CPU process; the FLOP and MFU "
          "accounting is the same code a distributed run would use.",
}

_OPT_INS = {"exercise_eval_suite": "E7", "exercise_context_parallel": "E8"}


def refuse_unavailable(rung: Any, earlier: list[Any] = ()) -> None:
    """Raise ``NotImplementedError`` naming the piece when a rung explicitly opts into one that does not exist,
    or into F5 when the rungs before it cannot supply a fit (fewer than three distinct sizes with held-out
    losses, or fewer points than the law's five parameters)."""
    for flag, piece in _OPT_INS.items():
        if getattr(rung, flag):
            raise NotImplementedError(f"rung {rung.name!r}: {flag}=True needs {piece}, which does not exist here: "
                                      f"{SKIPPED_REASONS[piece]}")
    if getattr(rung, "exercise_scaling_law_fit", False):
        pilots = [r for r in earlier if r.eval_batches]
        sizes = {(r.vocab, r.d_model, r.n_layer, r.n_head, r.block) for r in pilots}
        if len(sizes) < 3 or len(pilots) < 5:
            raise NotImplementedError(
                f"rung {rung.name!r}: exercise_scaling_law_fit=True needs F5 to fit a scaling law to the rungs "
                f"before it, and they supply {len(pilots)} held-out losses from {len(sizes)} distinct sizes (F5 "
                "needs at least 3 sizes and 5 points: set eval_batches on earlier rungs of different sizes)")
