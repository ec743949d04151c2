"""Torch-aware side of trainledger: health monitor, FLOPs/MFU, checkpoints, resume,
rewind, manifest and the reference training loop. Not built yet (issues 3, 4, 7)."""

__all__: list[str] = []
