"""The pilot ladder: rungs, their gates and decisions (issue 5, in progress).

Built so far: the :class:`Rung` spec with validation and the roadmap pieces
(F9 muP ``transfer_lr``, H2 ``moe_vs_dense``, the honest ``SKIPPED_REASONS``).
The runner, gate verdicts, decision entries, the outcome projection and the
``trainledger ladder`` command are not built yet.
"""

from .pieces import SKIPPED_REASONS, MoEMLP, moe_vs_dense, refuse_unavailable, transfer_lr
from .rung import KNOWN_PIECES, Rung

__all__ = ["Rung", "KNOWN_PIECES", "transfer_lr", "MoEMLP", "moe_vs_dense", "SKIPPED_REASONS", "refuse_unavailable"]
