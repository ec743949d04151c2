"""Experiments: the manifest and its findings (torch-free), signed approvals, the preflight gates and the
manifest-driven loop with its stop rules.

0.1.0's ``trainledger.training.experiment`` names (``run_experiment``, ``write_example``, ``STOP_RULES``, ...)
import from here still; they live in :mod:`.loop` and resolve on first use (PEP 562), so the torch-free
``manifest`` imports without torch.
"""

_LOOP = ("run_experiment", "write_example", "Runtime", "ProtectedDataAccess", "DataGuard", "build_from_manifest",
         "evaluate_hook", "STOP_RULES")


def __getattr__(name: str):
    if name in _LOOP:
        from trainledger.training.experiment import loop

        return getattr(loop, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_LOOP)
