"""Proving one fact without sharing the run. Every seal of a format 1.3 journal is a C2SP checkpoint of the RFC
6962 tree over the lines before it (docs/FORMAT.md section 4.1); from that:

- :mod:`.merkle`: the tree, compact ranges, inclusion and consistency proofs (RFC 9162);
- :mod:`.note`: C2SP signed notes, checkpoints and cosignatures;
- :mod:`.checkpoint`: a seal as a signed checkpoint, the thing to publish and to cosign;
- :mod:`.index`: the tree index beside a journal, and the views proofs are read from;
- :mod:`.bundle`: proof bundles (``prove``, ``consistency``) and their offline check (``verify_bundle``);
- :mod:`.witness`: witnesses that cosign only a checkpoint that extends the last one they cosigned;
- :mod:`.cli`: the commands ``checkpoint``, ``prove``, ``verify-proof``, ``consistency``, ``witness``.

The public names resolve on first use (``from trainledger.journal.proofs import prove``), so that importing one
module (the verifier imports :mod:`.merkle`) loads no other. docs/proofs.md states the trust model.
"""

_WHERE = {
    "log_verifier": "checkpoint", "checkpoint_note": "checkpoint", "open_checkpoint": "checkpoint",
    "TILE_HEIGHT": "index", "TreeIndex": "index", "TreeView": "index", "IndexMismatch": "index",
    "build_index": "index", "load_index": "index", "save_index": "index", "index_path_for": "index",
    "read_seal": "index", "find_lines": "index",
    "BUNDLE_FORMAT": "bundle", "MAX_BUNDLE_BYTES": "bundle", "ProveResult": "bundle", "BundleResult": "bundle",
    "prove": "bundle", "consistency": "bundle", "parse_bundle": "bundle", "verify_bundle": "bundle",
    "Witness": "witness", "WitnessRefused": "witness", "parse_witness_keys": "witness",
}


def __getattr__(name: str):
    import importlib

    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


__all__ = sorted(_WHERE)
