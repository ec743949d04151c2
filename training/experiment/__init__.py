"""training/experiment."""
