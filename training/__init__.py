"""Torch-aware side of trainledger: the tiny causal LM, FLOPs/MFU, training data, the health monitor,
checkpoints with receipts and restore verdicts, the reference loop with spike rewind, and the experiment
manifest, its preflight and the manifest-driven loop with its stop rules."""

# Names resolve on first use (PEP 562), so that the torch-free modules (training.manifest) import on a
# machine without torch; everything else imports torch when touched.
_WHERE = {
    "CONTRACT": "checkpoint", "CheckpointSaved": "checkpoint", "ResumeRejected": "checkpoint",
    "restore_checkpoint": "checkpoint", "save_checkpoint": "checkpoint",
    "BatchSampler": "corpus", "MarkovSource": "corpus", "random_batches": "corpus", "text_tokens": "corpus",
    "PEAK_FLOPS": "flops", "FlopConfig": "flops", "FlopCrossCheckRefused": "flops", "count_training_flops": "flops",
    "flop_config_from_causal_lm": "flops", "mfu": "flops", "peak_flops_per_sec": "flops",
    "CausalLM": "model", "build_causal_lm": "model",
    "AnomalyDetected": "monitor", "TrainingHealthMonitor": "monitor",
    "ExperimentManifest": "manifest", "load_manifest": "manifest", "validate": "manifest",
    "Recorder": "recorder",
}


def __getattr__(name: str):
    import importlib

    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


__all__ = [
    "Recorder",
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
    "ExperimentManifest",
    "load_manifest",
    "validate",
]
