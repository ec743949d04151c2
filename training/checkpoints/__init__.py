"""training/checkpoints."""
