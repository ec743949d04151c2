"""The pilot ladder: rungs gated on their own receipts, signed decisions, the outcome as a projection.

Names resolve on first use (PEP 562), so that ``trainledger.cli.ladder`` imports without torch; the rungs,
pieces and runner import torch when touched.
"""

_WHERE = {
    "Rung": "rung", "KNOWN_PIECES": "rung",
    "transfer_lr": "pieces", "MoEMLP": "pieces", "moe_vs_dense": "pieces", "SKIPPED_REASONS": "pieces",
    "refuse_unavailable": "pieces",
    "run_pilot_ladder": "runner", "LadderResult": "runner", "RungOutcome": "runner", "LadderProjection": "runner",
    "PRESETS": "presets",
}


def __getattr__(name: str):
    import importlib

    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


__all__ = ["Rung", "KNOWN_PIECES", "transfer_lr", "MoEMLP", "moe_vs_dense", "SKIPPED_REASONS", "refuse_unavailable",
           "run_pilot_ladder", "LadderResult", "RungOutcome", "LadderProjection", "PRESETS"]
