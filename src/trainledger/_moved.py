"""Modules that 0.1.0 documented and that moved into the domain folders: importable from their old names still.

``from trainledger.training.checkpoint import ResumeRejected`` keeps working: the old module name is served by an
alias module whose names resolve on first use (PEP 562) from where they live now, each with a
``DeprecationWarning`` that names the new place. The old names go away in 0.3.

The table maps an old module to the module that holds most of its names now, with the names that went elsewhere;
``tests/unit/public_api.json`` holds every one of 0.1.0's names (and their signatures) to it.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import sys
import types
import warnings

REMOVED_IN = "0.3"

MOVED: dict[str, tuple[str, dict[str, str]]] = {
    "trainledger.journal.approval": ("trainledger.training.audit.approval", {}),
    "trainledger.journal.health": ("trainledger.training.health.detectors", {}),
    "trainledger.journal.imports": ("trainledger.training.interop", {}),
    "trainledger.journal.ladder_outcome": ("trainledger.ladder.outcome", {}),
    "trainledger.journal.mfu": ("trainledger.training.health.mfu", {}),
    "trainledger.journal.projections": ("trainledger.training.audit", {
        "LadderAudit": "trainledger.ladder.audit", "default_projections": "trainledger.audit",
        "values_agree": "trainledger.journal.audit.projection"}),
    "trainledger.journal.replay": ("trainledger.audit", {}),
    "trainledger.journal.report": ("trainledger.report", {}),
    "trainledger.journal.rundir": ("trainledger.journal.audit.rundir", {
        "RunDirReconstruction": "trainledger.audit", "replay_run_dir": "trainledger.audit"}),
    "trainledger.journal.scaling": ("trainledger.ladder.scaling", {}),
    "trainledger.journal.stragglers": ("trainledger.training.distributed.stragglers", {}),
    "trainledger.journal.transparency": ("trainledger.journal.proofs.index", {
        "BUNDLE_FORMAT": "trainledger.journal.proofs.bundle", "BundleResult": "trainledger.journal.proofs.bundle",
        "consistency": "trainledger.journal.proofs.bundle", "prove": "trainledger.journal.proofs.bundle",
        "verify_bundle": "trainledger.journal.proofs.bundle",
        "Witness": "trainledger.journal.proofs.witness", "WitnessRefused": "trainledger.journal.proofs.witness",
        "checkpoint_note": "trainledger.journal.proofs.checkpoint",
        "log_verifier": "trainledger.journal.proofs.checkpoint"}),
    "trainledger.journal.watch": ("trainledger.training.watch", {}),
    "trainledger.journal.cli_proofs": ("trainledger.cli.proofs", {}),
    "trainledger.training.checkpoint": ("trainledger.training.checkpoints.state", {}),
    "trainledger.training.corpus": ("trainledger.training.reference.corpus", {}),
    "trainledger.training.distributed_loop": ("trainledger.training.distributed.loop", {}),
    "trainledger.training.flops": ("trainledger.training.health.flops", {}),
    "trainledger.training.loop": ("trainledger.training.reference.loop", {}),
    "trainledger.training.manifest": ("trainledger.training.experiment.manifest", {}),
    "trainledger.training.model": ("trainledger.training.reference.model", {}),
    "trainledger.training.monitor": ("trainledger.training.health.monitor", {}),
    "trainledger.training.preflight": ("trainledger.training.experiment.preflight", {}),
    "trainledger.training.rewind": ("trainledger.training.checkpoints.rewind", {}),
    "trainledger.training.telemetry": ("trainledger.training.health.telemetry", {}),
    # 0.2.0: journal/ in layers (core, proofs, audit, backends, statements, views) and one cli/ package
    "trainledger.journal.proofs.merkle": ("trainledger.journal.merkle", {}),
    "trainledger.journal.proofs.note": ("trainledger.journal.note", {}),
    "trainledger.journal.audit.roster": ("trainledger.journal.roster", {}),
    "trainledger.journal.engines.ray": ("trainledger.journal.backends.ray", {}),
    "trainledger.journal.storage": ("trainledger.journal.backends.storage", {}),
    "trainledger.journal.kms": ("trainledger.journal.backends.kms", {}),
    "trainledger.journal.hsm": ("trainledger.journal.backends.hsm", {}),
    "trainledger.journal.query": ("trainledger.journal.views.query", {}),
    "trainledger.journal.parquet.check": ("trainledger.journal.views.parquet.check", {}),
    "trainledger.journal.parquet.export": ("trainledger.journal.views.parquet.export", {}),
    "trainledger.journal.parquet.journals": ("trainledger.journal.views.parquet.journals", {}),
    "trainledger.journal.parquet.read": ("trainledger.journal.views.parquet.read", {}),
    "trainledger.journal.parquet": ("trainledger.journal.views.parquet", {}),
    "trainledger.journal.release.attest": ("trainledger.journal.statements.release.attest", {}),
    "trainledger.journal.release.dsse": ("trainledger.journal.statements.release.dsse", {}),
    "trainledger.journal.release.export": ("trainledger.journal.statements.release.export", {}),
    "trainledger.journal.release.keys": ("trainledger.journal.statements.release.keys", {}),
    "trainledger.journal.release.manifest": ("trainledger.journal.statements.release.manifest", {}),
    "trainledger.journal.release.verify": ("trainledger.journal.statements.release.verify", {}),
    "trainledger.journal.release.cli": ("trainledger.cli.release", {}),
    "trainledger.journal.release": ("trainledger.journal.statements.release", {}),
    "trainledger.training.compute.statement": ("trainledger.journal.statements.compute.statement", {}),
    "trainledger.training.compute.figures": ("trainledger.journal.statements.compute.figures", {}),
    "trainledger.training.compute.render": ("trainledger.journal.statements.compute.render", {}),
    "trainledger.training.compute.cli": ("trainledger.cli.compute", {}),
    "trainledger.training.compute": ("trainledger.journal.statements.compute", {}),
    "trainledger.journal.proofs.cli": ("trainledger.cli.proofs", {}),
    "trainledger.journal.cli": ("trainledger.cli.journal", {}),
    "trainledger.journal.options": ("trainledger.cli.options", {}),
    "trainledger.training.cli": ("trainledger.cli.training", {}),
    "trainledger.ladder.cli": ("trainledger.cli.ladder", {}),
    "trainledger.training.experiment.approval": ("trainledger.training.audit.approval", {}),
    "trainledger.journal.engines": ("trainledger.journal.backends", {}),
}


def new_home(old: str, name: str) -> str:
    """The module that holds ``name`` of the old module ``old`` now."""
    default, elsewhere = MOVED[old]
    return elsewhere.get(name, default)


class _Moved(types.ModuleType):
    """An old module's name: each attribute read warns and comes from the module that holds it now."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            if name == "__all__":
                default, elsewhere = MOVED[self.__name__]
                names = [*getattr(importlib.import_module(default), "__all__", ()), *elsewhere]
                return list(dict.fromkeys(names))
            raise AttributeError(name)
        where = new_home(self.__name__, name)
        try:
            value = getattr(importlib.import_module(where), name)
        except AttributeError:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r} (it moved to {where}, "
                                 f"which has no such name either)") from None
        warnings.warn(f"{self.__name__} is deprecated and goes away in {REMOVED_IN}: import {name} from {where}",
                      DeprecationWarning, stacklevel=2)
        return value

    def __dir__(self):
        return sorted(set(self.__all__) | set(self.__dict__))


class _Finder:
    """Serves the old module names in :data:`MOVED` (only those: every other import is left to the normal
    finders, which are asked first). The import system asks a finder and its loader only for these methods, so it
    does without ``importlib.abc`` (whose import costs every command ten milliseconds)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        module = _Moved(spec.name, f"Deprecated: moved to {MOVED[spec.name][0]} (goes away in {REMOVED_IN}).")
        module.__spec__ = spec
        if any(old.startswith(spec.name + ".") for old in MOVED):  # an old package: its old submodules import too
            module.__path__ = []
        return module

    def exec_module(self, module):
        return None


def install() -> None:
    """Put the finder last on ``sys.meta_path`` once (the real modules always win)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
