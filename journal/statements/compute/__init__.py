"""The compute statement (docs/compute.md): a model's training compute, time, devices and energy across its runs,
every figure folded from signed events (``compute_totaled``, ``compute_threshold_crossed``), recomputed by replay,
and carried with inclusion proofs that ``trainledger verify-proof`` checks offline. Torch-free."""
