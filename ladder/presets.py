"""The ladders of the seed document (000_…), as written there: a tiny stand-in scale, honestly labelled."""

from __future__ import annotations

from .rung import Rung

__all__ = ["PRESETS", "tiny", "halt"]


def tiny() -> list[Rung]:
    """Shakeout, bake-off (muP and MoE), context: the three-rung ladder that passes."""
    common = dict(vocab=24, d_model=8, n_layer=2, n_head=2, block=6, steps=30, batch_size=8, lr=5e-2, seed=0,
                  max_final_loss=4.0, max_forgetting_gap=4.0)
    return [
        Rung(name="rung_i_shakeout", real_target="1B params / 8k context / 8 GPUs", decision_pieces=("F1", "F4"),
             **common),
        Rung(name="rung_ii_bakeoff", real_target="8B params / 128k context / 256 GPUs",
             decision_pieces=("E7", "H2", "F9"), exercise_mup_transfer=True, mup_base_width=8,
             exercise_moe_decision=True, moe_experts=4, **common),
        Rung(name="rung_iii_context", real_target="8B params / 10M context / 1000 GPUs",
             decision_pieces=("E8", "F5"), **common),
    ]


def halt() -> list[Rung]:
    """The halt case: an unachievable bar on the second rung stops the ladder there."""
    return [
        Rung(name="rung_i_shakeout", real_target="1B params / 8k context / 8 GPUs", decision_pieces=("F1", "F4"),
             max_final_loss=5.0),
        Rung(name="rung_ii_impossible", real_target="8B params / 128k context / 256 GPUs", decision_pieces=("H2",),
             max_final_loss=1.0e-6, steps=10),
        Rung(name="rung_iii_unreached", real_target="8B params / 10M context / 1000 GPUs",
             decision_pieces=("E8", "F5")),
    ]


PRESETS = {"tiny": tiny, "halt": halt}
