"""Torch-aware side of trainledger: the tiny causal LM, FLOPs/MFU, training data.

Issue 3 (in progress): the model, FLOP accounting, corpus and the health
monitor are here; its detection-quality and speed benchmarks are not yet.
Checkpoints, resume, rewind and the manifest are issues 4 and 7.
"""

from .corpus import MarkovSource, random_batches, text_tokens
from .flops import (
    PEAK_FLOPS,
    FlopConfig,
    FlopCrossCheckRefused,
    count_training_flops,
    flop_config_from_causal_lm,
    mfu,
    peak_flops_per_sec,
)
from .model import CausalLM, build_causal_lm
from .monitor import AnomalyDetected, TrainingHealthMonitor

__all__ = [
    "CausalLM",
    "build_causal_lm",
    "FlopConfig",
    "flop_config_from_causal_lm",
    "PEAK_FLOPS",
    "peak_flops_per_sec",
    "mfu",
    "FlopCrossCheckRefused",
    "count_training_flops",
    "MarkovSource",
    "random_batches",
    "text_tokens",
    "TrainingHealthMonitor",
    "AnomalyDetected",
]
