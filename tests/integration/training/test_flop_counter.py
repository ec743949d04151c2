"""The analytic FLOPs (PaLM appendix B) against torch's own FlopCounterMode on GPT-2 small to XL shapes at T = 256
to 8192: a cross-check against the framework's machinery at full size, seconds a shape."""

from __future__ import annotations

import pytest
import torch

from trainledger.training.health.flops import count_training_flops, flop_config_from_causal_lm
from trainledger.training.reference.model import build_causal_lm


SHAPES = [
    (50257, 768, 12, 12, 256, 2),
    (50257, 1024, 24, 16, 1024, 1),
    (50257, 1280, 36, 20, 4096, 1),
    (50257, 1600, 48, 25, 8192, 1),
]


@pytest.mark.parametrize("vocab,d,layers,heads,t,batch", SHAPES, ids=[f"d{s[1]}-L{s[2]}-T{s[4]}" for s in SHAPES])
def test_analytic_flops_match_the_flop_counter(vocab, d, layers, heads, t, batch):
    def factory():
        return build_causal_lm(vocab, d, layers, heads, t)

    counted = count_training_flops(factory, batch, t)
    with torch.device("meta"):
        cfg = flop_config_from_causal_lm(factory(), seq_len=t)
    analytic = cfg.flops_per_iter(batch)
    # The formula counts biases and LayerNorm parameters in N; the counter counts matmuls only.
    assert abs(analytic - counted) / counted < 0.002
