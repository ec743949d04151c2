"""A rung of the pilot ladder: what it stands in for, what it trains, and the bars it must clear."""

from __future__ import annotations

import dataclasses

__all__ = ["Rung", "KNOWN_PIECES"]

#: Roadmap pieces a rung may name. F1 distributed trainer, F2 fault tolerance, F4 telemetry,
#: F5 scaling-law fits, F9 muP, H2 MoE versus dense, E7 referee eval suite, E8 long context.
KNOWN_PIECES = frozenset({"F1", "F2", "F4", "F5", "F9", "H2", "E7", "E8"})


@dataclasses.dataclass(frozen=True)
class Rung:
    """One rung. Defaults are the seed document's tiny stand-in scale.

    Example: ``Rung(name="rung_i_shakeout", real_target="1B params / 8k context / 8 GPUs",
    decision_pieces=("F1", "F4"), max_final_loss=5.0)``. Raises ``ValueError`` for an invalid spec.
    """

    name: str
    real_target: str
    decision_pieces: tuple[str, ...] = ()
    vocab: int = 24
    d_model: int = 8
    n_layer: int = 2
    n_head: int = 2
    block: int = 6
    steps: int = 30
    batch_size: int = 8
    lr: float = 5e-2
    seed: int = 0
    max_final_loss: float = 4.0
    max_forgetting_gap: float = 4.0
    min_mfu_mean: float | None = None
    max_anomalies: int | None = None
    max_flops: float | None = None  # compute box: model FLOPs
    max_wall_s: float | None = None  # compute box: wall-clock seconds
    exercise_mup_transfer: bool = False
    mup_base_width: int | None = None
    exercise_moe_decision: bool = False
    moe_experts: int = 4
    moe_max_relative_diff: float = 1.0
    exercise_fault_tolerance: bool = False
    exercise_eval_suite: bool = False
    exercise_context_parallel: bool = False
    exercise_scaling_law_fit: bool = False
    #: held-out batches the rung's final loss is measured on (its point for F5); 0: none
    eval_batches: int = 0
    #: tokens of the Markov corpus the rung samples its batches from
    corpus_tokens: int = 20_000
    weight_decay: float = 0.01
    #: F5 (with exercise_scaling_law_fit): the compute box is this many times the largest earlier rung's FLOPs,
    #: and the candidate shapes are every width x depth below (heads: width // 8, at least 1)
    box_flops_multiple: float = 4.0
    box_wall_s: float = 600.0
    box_memory_bytes: float = 2e9
    candidate_widths: tuple[int, ...] = ()
    candidate_layers: tuple[int, ...] = ()
    interval_level: float = 0.9

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise ValueError(f"Rung {self.name!r}: {msg}")

        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError("Rung: name must be a non-empty string")
        if not isinstance(self.real_target, str) or not self.real_target.strip():
            bad("real_target must say what scale this rung stands in for")
        object.__setattr__(self, "decision_pieces", tuple(self.decision_pieces))
        unknown = [p for p in self.decision_pieces if p not in KNOWN_PIECES]
        if unknown:
            bad(f"unknown decision pieces {unknown} (known: {sorted(KNOWN_PIECES)})")
        for f in ("vocab", "d_model", "n_layer", "n_head", "block", "steps", "batch_size", "moe_experts",
                  "corpus_tokens"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                bad(f"{f} must be a positive integer, got {v!r}")
        if self.vocab < 2:
            bad("vocab must be at least 2")
        if self.d_model % self.n_head:
            bad(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            bad(f"lr must be positive, got {self.lr!r}")
        for f in ("max_final_loss", "max_forgetting_gap", "moe_max_relative_diff"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and v >= 0):
                bad(f"{f} must be a non-negative number, got {v!r}")
        for f in ("min_mfu_mean", "max_flops", "max_wall_s"):
            v = getattr(self, f)
            if v is not None and not (isinstance(v, (int, float)) and v > 0):
                bad(f"{f} must be a positive number or None, got {v!r}")
        if self.max_anomalies is not None and (not isinstance(self.max_anomalies, int) or self.max_anomalies < 0):
            bad(f"max_anomalies must be a non-negative integer or None, got {self.max_anomalies!r}")
        if self.exercise_mup_transfer:
            if self.mup_base_width is None or not isinstance(self.mup_base_width, int) or self.mup_base_width < 1:
                bad("exercise_mup_transfer needs mup_base_width, a positive integer")
        if self.exercise_moe_decision and self.moe_experts < 2:
            bad("exercise_moe_decision needs moe_experts >= 2")
        if not isinstance(self.eval_batches, int) or self.eval_batches < 0:
            bad(f"eval_batches must be a non-negative integer, got {self.eval_batches!r}")
        object.__setattr__(self, "candidate_widths", tuple(self.candidate_widths))
        object.__setattr__(self, "candidate_layers", tuple(self.candidate_layers))
        if self.exercise_scaling_law_fit:
            if not self.candidate_widths or not self.candidate_layers:
                bad("exercise_scaling_law_fit needs candidate_widths and candidate_layers to choose from")
            if not self.eval_batches:
                bad("exercise_scaling_law_fit needs eval_batches: the headline's held-out loss checks the prediction")
            if not 0 < self.interval_level < 1:
                bad(f"interval_level must be in (0, 1), got {self.interval_level!r}")
