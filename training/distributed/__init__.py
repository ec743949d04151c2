"""training/distributed."""
