"""Checkpoints with receipts (what a checkpoint binds, save, restore and its verdicts), checkpoint folders
written by other code, and spike rewind."""
