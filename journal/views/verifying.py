"""Verify whatever a path is: :func:`verify_path`.

A path handed to ``trainledger verify`` is one of three things, and each has its own check: a journal file
(:func:`trainledger.journal.verify`), a distributed run's folder of rank journals with its cross-rank anchors
(:func:`trainledger.journal.audit.rundir.verify_run_dir`, or on a Ray cluster), or a Parquet export whose every
journal is re-verified from its lines and every typed cell held to them
(:func:`trainledger.journal.views.parquet.check.verify_export`). This decides which, refuses the options that do
not apply to what the path is (one line each), and returns that check's result; the command only prints it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from trainledger.journal.errors import UsageError
from trainledger.journal.trust import TrustPolicy

__all__ = ["verify_path", "path_kind"]


def path_kind(path: str | os.PathLike) -> str:
    """``"export"``, ``"run_dir"`` or ``"journal"``: what :func:`verify_path` takes ``path`` for."""
    from trainledger.journal.audit.rundir import is_run_dir
    from trainledger.journal.views.parquet import is_export

    if is_export(path):
        return "export"
    return "run_dir" if is_run_dir(path) else "journal"


def verify_path(path: str | os.PathLike, trust: TrustPolicy | None = None, *, partial: bool = False,
                require_closed: bool = False, expect_head: tuple[int, str] | None = None,
                expect_checkpoint: Any = None, workers: int | None = None, ray: str | None = None,
                progress: Callable[[int, int], None] | None = None, kind: str | None = None) -> Any:
    """Verify ``path`` as what it is (:func:`path_kind`; ``kind``: its answer, when the caller has asked already)
    under ``trust``; returns the check's report (a ``VerifyReport``, a ``RunDirReport`` or an ``ExportCheck``, each
    with ``to_dict()``) or raises
    :class:`~trainledger.journal.errors.IntegrityError` naming the first thing that does not hold.

    ``partial``: a run folder (or its export) with ranks missing is checked as far as its ranks go.
    ``expect_head`` / ``expect_checkpoint`` (a checked ``trainledger.journal.note.Checkpoint``): one journal's head,
    held by the journal, or by an export's journal of that run. ``ray``: a run folder's ranks verified as tasks on
    a Ray cluster (``""``: a local one). ``workers``: processes for one large journal. ``progress``: called as a
    journal's bytes are checked."""
    trust = trust if trust is not None else TrustPolicy()
    if kind is None:
        kind = path_kind(path)
    elif kind not in ("export", "run_dir", "journal"):
        raise UsageError(f"kind must be what path_kind returns (export, run_dir, journal), got {kind!r}")
    if kind == "export":
        from trainledger.journal.views.parquet.check import verify_export

        expect: dict[str, Any] | None = None
        if expect_checkpoint is not None:
            expect = {"checkpoint": expect_checkpoint, "run": expect_checkpoint.origin[len("trainledger/"):]}
        if expect_head is not None:
            expect = {**(expect or {}), "head": expect_head}
        return verify_export(path, trust=dataclasses.replace(trust, require_closed=require_closed), partial=partial,
                             expect=expect)
    if partial and kind != "run_dir":
        raise UsageError(f"{os.fspath(path)}: --partial reads a run folder (or its export) with ranks missing; this "
                         "is one journal")
    if ray is not None and kind != "run_dir":
        raise UsageError("--ray verifies a run folder's rank journals as tasks: give RUN_DIR")
    extra: dict[str, Any] = {"require_closed": require_closed}
    if kind == "run_dir":
        if expect_head is not None or expect_checkpoint is not None:
            raise UsageError("--expect-head and --expect-checkpoint name one journal's head; give that rank's file, "
                             "not the run folder")
        if ray is not None:
            from trainledger.journal.backends.ray import verify_run_dir_ray

            return verify_run_dir_ray(path, trust=trust, address=ray or None, partial=partial, **extra)
        from trainledger.journal.audit.rundir import verify_run_dir

        return verify_run_dir(path, trust=trust, partial=partial, **extra)
    from trainledger.journal.verify import verify

    extra["workers"] = workers
    if expect_head is not None:
        extra["expect_head"] = expect_head
    if expect_checkpoint is not None:
        extra["expect_checkpoint"] = expect_checkpoint
    return verify(path, trust=trust, progress=progress, **extra)
