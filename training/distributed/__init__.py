"""Runs across ranks: one journal per rank, cross-rank anchors, sharded checkpoints (``ranks``), the
straggler fold (``stragglers``, torch-free) and the DDP reference loop (``loop``)."""
