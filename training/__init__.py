"""Torch-aware side of trainledger: the tiny causal LM, FLOPs/MFU, training data.

The model, FLOP accounting, corpus and health monitor (issue 3); checkpoints
with receipts and restore verdicts (issue 4, part 1: retention, background
saves, the reference loop and spike rewind are still to come); the manifest
is issue 7.
"""

from .checkpoint import CONTRACT, CheckpointSaved, ResumeRejected, restore_checkpoint, save_checkpoint
from .corpus import BatchSampler, MarkovSource, random_batches, text_tokens
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
    "BatchSampler",
    "CONTRACT",
    "CheckpointSaved",
    "ResumeRejected",
    "save_checkpoint",
    "restore_checkpoint",
]
