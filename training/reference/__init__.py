"""training/reference."""
