"""The pilot ladder: rungs gated on their own receipts, signed decisions, the outcome as a projection."""

from .pieces import SKIPPED_REASONS, MoEMLP, moe_vs_dense, refuse_unavailable, transfer_lr
from .presets import PRESETS
from .rung import KNOWN_PIECES, Rung
from .runner import LadderProjection, LadderResult, RungOutcome, run_pilot_ladder

__all__ = ["Rung", "KNOWN_PIECES", "transfer_lr", "MoEMLP", "moe_vs_dense", "SKIPPED_REASONS", "refuse_unavailable",
           "run_pilot_ladder", "LadderResult", "RungOutcome", "LadderProjection", "PRESETS"]
