"""The ladder's foundations: rung specs from the seed document, muP, MoE versus dense, honest refusals."""

from __future__ import annotations

import pytest
import torch

from trainledger.ladder import SKIPPED_REASONS, Rung, moe_vs_dense, refuse_unavailable, transfer_lr
from trainledger.training.reference.model import build_causal_lm


def seed_rungs():
    """The three rungs of 000_…, as written there."""
    return [
        Rung(name="rung_i_shakeout", real_target="1B params / 8k context / 8 GPUs", decision_pieces=("F1", "F4"),
             vocab=24, d_model=8, n_layer=2, n_head=2, block=6, steps=30, batch_size=8, lr=5e-2, seed=0,
             max_final_loss=4.0, max_forgetting_gap=4.0),
        Rung(name="rung_ii_bakeoff", real_target="8B params / 128k context / 256 GPUs",
             decision_pieces=("E7", "H2", "F9"), vocab=24, d_model=8, n_layer=2, n_head=2, block=6, steps=30,
             batch_size=8, lr=5e-2, seed=0, max_final_loss=4.0, max_forgetting_gap=4.0,
             exercise_mup_transfer=True, mup_base_width=8, exercise_moe_decision=True, moe_experts=4),
        Rung(name="rung_iii_context", real_target="8B params / 10M context / 1000 GPUs", decision_pieces=("E8", "F5"),
             vocab=24, d_model=8, n_layer=2, n_head=2, block=6, steps=30, batch_size=8, lr=5e-2, seed=0,
             max_final_loss=4.0, max_forgetting_gap=4.0),
    ]


def test_seed_rungs_construct_and_the_halt_case_uses_defaults():
    assert [r.name for r in seed_rungs()] == ["rung_i_shakeout", "rung_ii_bakeoff", "rung_iii_context"]
    r = Rung(name="rung_ii_impossible", real_target="8B params / 128k context / 256 GPUs", decision_pieces=("H2",),
             max_final_loss=1.0e-6, steps=10)
    assert (r.vocab, r.d_model, r.steps, r.max_final_loss) == (24, 8, 10, 1e-6)


@pytest.mark.parametrize("kw,match", [
    (dict(name=""), "name"), (dict(real_target=""), "real_target"), (dict(decision_pieces=("Z9",)), "unknown"),
    (dict(d_model=10, n_head=3), "divisible"), (dict(lr=0), "lr"), (dict(steps=0), "steps"),
    (dict(max_final_loss=-1), "max_final_loss"), (dict(exercise_mup_transfer=True), "mup_base_width"),
    (dict(exercise_moe_decision=True, moe_experts=1), "moe_experts"), (dict(max_anomalies=-1), "max_anomalies"),
])
def test_invalid_specs_are_rejected_at_construction(kw, match):
    base = dict(name="r", real_target="1B / 8 GPUs")
    with pytest.raises(ValueError, match=match):
        Rung(**{**base, **kw})


def test_mup_transfer():
    assert transfer_lr(0.05, 8, 8) == 0.05  # the seed's no-op transfer
    assert transfer_lr(0.05, 8, 16) == 0.025 and transfer_lr(0.05, 8, 4) == 0.1


def test_moe_vs_dense_measures_and_decides():
    torch.manual_seed(0)
    model = build_causal_lm(vocab=24, d_model=8, n_layer=2, n_head=2, block=6)
    batch = torch.randint(0, 24, (8, 6))
    rec = moe_vs_dense(model, batch, experts=4, max_relative_diff=1.0)
    assert 0 < rec["relative_output_diff"] < 1.0 and rec["decision"] == "moe"
    assert rec["moe_params"] > rec["dense_params"]
    strict = moe_vs_dense(model, batch, experts=4, max_relative_diff=rec["relative_output_diff"] / 2)
    assert strict["decision"] == "dense"
    assert moe_vs_dense(model, batch, experts=4, max_relative_diff=1.0) == rec  # seeded: reproducible


@pytest.mark.parametrize("flag,piece", [("exercise_eval_suite", "E7"), ("exercise_context_parallel", "E8"),
                                        ("exercise_scaling_law_fit", "F5")])
def test_opting_into_a_missing_piece_raises_naming_it(flag, piece):
    extra = {"candidate_widths": (8,), "candidate_layers": (1,), "eval_batches": 2} if piece == "F5" else {}
    rung = Rung(name="r", real_target="x", **{flag: True}, **extra)  # F5 with no rungs before it to fit
    with pytest.raises(NotImplementedError, match=piece):
        refuse_unavailable(rung)
    assert piece in SKIPPED_REASONS


def test_the_ladder_checks_its_arguments_before_it_imports_torch(tmp_path):
    """A folder that already holds a ladder, a key that does not load: named in a fraction of a second, before
    torch (seconds to import) is touched."""
    import subprocess
    import sys

    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "ladder.jsonl").write_text("")
    probe = ("import sys; from trainledger.cli import main; "
             f"codes = [main(['ladder', {str(tmp_path / 'old')!r}]), "
             f"main(['ladder', {str(tmp_path / 'new')!r}, '--key', {str(tmp_path / 'none.key')!r}])]; "
             "print(codes, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["[2,", "2]", "False"], out.stderr
    assert "already exists" in out.stderr and "none.key" in out.stderr
    assert not (tmp_path / "new").exists()
