#!/usr/bin/env python3
"""Analytic (PaLM appendix B) versus FlopCounterMode FLOPs on GPT-2 small to XL shapes, T = 256 to 8192.

    .venv/bin/python tools/check_flops.py

The same shapes as tests/integration/training/test_flop_counter.py (which asserts < 0.2%); this prints the differences.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainledger.training.health.flops import count_training_flops, flop_config_from_causal_lm  # noqa: E402
from trainledger.training.reference.model import build_causal_lm  # noqa: E402

SHAPES = [(50257, 768, 12, 12, 256, 2), (50257, 1024, 24, 16, 1024, 1), (50257, 1280, 36, 20, 4096, 1),
          (50257, 1600, 48, 25, 8192, 1)]

for vocab, d, layers, heads, t, batch in SHAPES:
    counted = count_training_flops(lambda: build_causal_lm(vocab, d, layers, heads, t), batch, t)
    with torch.device("meta"):
        analytic = flop_config_from_causal_lm(build_causal_lm(vocab, d, layers, heads, t), seq_len=t).flops_per_iter(batch)
    print(f"d={d} L={layers} H={heads} T={t} batch={batch}: analytic {analytic:.6e}, counted {counted:.6e}, "
          f"difference {(analytic - counted) / counted:.4%}")
