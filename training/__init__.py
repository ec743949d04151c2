"""The training domain: what a run's steps mean and what trains.

Folders by concept: ``health/`` (the monitor and its torch-free folds: anomaly detectors, MFU, FLOPs, device
telemetry), ``checkpoints/`` (checkpoints with receipts, restore verdicts, spike rewind), ``distributed/`` (rank
journals, anchors, stragglers, sharded checkpoints, the DDP reference loop), ``experiment/`` (the manifest, its
preflight and approvals, the manifest-driven loop), ``reference/`` (the tiny causal LM, its corpus and loop),
``integrations/`` (Hugging Face Trainer, Lightning); beside them the :class:`Recorder`, the training-side audit
(:mod:`.audit`), the live view (:mod:`.watch`), log import and export (:mod:`.interop`) and the torch-free demo.
Modules import torch only where they train: every fold imports without it."""

# Names resolve on first use (PEP 562), so that the torch-free modules (training.manifest) import on a
# machine without torch; everything else imports torch when touched.
_WHERE = {
    "CONTRACT": "checkpoints.state", "CheckpointSaved": "checkpoints.state", "ResumeRejected": "checkpoints.state",
    "restore_checkpoint": "checkpoints.state", "save_checkpoint": "checkpoints.state",
    "BatchSampler": "reference.corpus", "MarkovSource": "reference.corpus", "random_batches": "reference.corpus", "text_tokens": "reference.corpus",
    "PEAK_FLOPS": "health.flops", "FlopConfig": "health.flops", "FlopCrossCheckRefused": "health.flops", "count_training_flops": "health.flops",
    "flop_config_from_causal_lm": "health.flops", "mfu": "health.flops", "peak_flops_per_sec": "health.flops",
    "CausalLM": "reference.model", "build_causal_lm": "reference.model",
    "AnomalyDetected": "health.monitor", "TrainingHealthMonitor": "health.monitor",
    "ExperimentManifest": "experiment.manifest", "load_manifest": "experiment.manifest", "validate": "experiment.manifest",
    "Recorder": "recorder", "check_checkpoint": "recorder", "batch_fingerprint": "health.fingerprint",
}


def __getattr__(name: str):
    import importlib

    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


__all__ = [
    "Recorder",
    "check_checkpoint",
    "batch_fingerprint",
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
