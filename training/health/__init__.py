"""training/health."""
