"""``trainledger verify RUN_DIR --ray [ADDRESS]`` and ``export parquet ... --ray``: each rank journal verified (and
exported) as a Ray task (``trainledger[ray]``).

- Tasks take pinned keys only (``--pubkey``, ``--roster``): a task never trusts a journal's own key.
- The largest journals are submitted first, one task each; a worker or node lost mid-task is retried by Ray
  (``max_retries``); an integrity failure is the task's verdict, returned and never retried.
- Every rank file needs its result: a task lost beyond its retries fails the run (never "63 of 64 verified").
- The driver checks the anchors and the run's identity with the same function ``verify RUN_DIR`` uses
  (:func:`check_run`), and raises the first failing rank's error, in rank order, as ``verify RUN_DIR`` would.
- Tasks read the rank files where they run: a cluster of several machines needs the run folder at the same path on
  each (a shared filesystem). Verification writes nothing (one pass, no copy); an export's tasks write their
  journal's Parquet files into the export's staging folder, which must be shared the same way, and the driver
  writes the listing and renames the folder only once every rank's files and the run's check are in.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainledger.journal.audit.rundir import RunDirReport, _size, check_run, rank_files, verify_rank
from trainledger.journal.errors import IntegrityError, JournalIOError, UsageError
from trainledger.journal.trust import TrustPolicy

__all__ = ["verify_run_dir_ray", "export_journals_ray", "MAX_RETRIES"]

#: how many times Ray runs a rank's task again after losing its worker or node
MAX_RETRIES = 3


def _ray():
    try:
        import ray
    except ImportError:
        raise UsageError("verification on Ray needs ray: pip install 'trainledger[ray]'") from None
    return ray


def _task(rank: int, path: str, trust: TrustPolicy, seqs: frozenset[int]) -> tuple[str, Any]:
    """One rank's verification, where the task runs: ("ok", report), or ("fail", the error as plain values)."""
    try:
        return "ok", verify_rank(rank, path, trust, seqs, workers=1)
    except IntegrityError as e:  # a verdict, not a failure of the task: returned, so Ray never retries it
        return "fail", (type(e).__module__, type(e).__name__, str(e), e.seq, e.offset)
    except JournalIOError as e:
        return "io", str(e)


def _export_task(export: Callable[..., Any], path: str, root: str, lines: bool, trust: TrustPolicy,
                 rank: int | None) -> tuple[str, Any]:
    """One journal's export by ``export`` (the exporter's ``export_journal``, handed in: this module does not import
    the exporter), where the task runs: ("ok", its result) or a verdict as :func:`_task` returns it. A task run
    again after its worker was lost writes the same files over what the first attempt left (the same journal gives
    the same tables)."""
    try:
        return "ok", export(path, root, lines=lines, trust=trust, rank=rank)
    except IntegrityError as e:
        return "fail", (type(e).__module__, type(e).__name__, str(e), e.seq, e.offset)
    except JournalIOError as e:
        return "io", str(e)
    except OSError as e:  # the staging folder cannot be written where the task runs (a disk full, not shared)
        return "io", f"{root}: cannot write the export: {e.strerror or e}"


def _pinned(policy: TrustPolicy) -> None:
    if not policy.keys or policy.trust_embedded or policy.allow_unsigned:
        raise UsageError("verification on Ray takes pinned keys only: pass --pubkey FILE (or --roster FILE)")


def _joined(ray: Any, address: str | None) -> tuple[bool, str]:
    """Join the cluster at ``address``, or start a private one here for the call (``address="local"``: never a
    cluster already running on this machine, which ``address=None`` would join through ``RAY_ADDRESS`` or the last
    ``ray start``: its workers would report whatever their owner likes), unless this process already has; whether
    it did, and which cluster, in words."""
    if ray.is_initialized():
        return False, "the Ray cluster this process had joined"
    ray.init(address=address or "local", include_dashboard=False, log_to_driver=False, configure_logging=False)
    return True, (f"the Ray cluster at {address}" if address else "a private local Ray cluster started for the call")


def _hold_report(rank: int | None, rep: Any, policy: TrustPolicy, where: Any) -> None:
    """What a task reported, held to the policy before anything rests on it: a verification report, under a pinned
    key (the roster's key for that rank, where one is pinned), of that rank's journal. A worker can still lie about
    a journal's contents (the engine is trusted with each journal's verdict: docs/fleet.md), but never make a
    journal signed by a key the caller did not pin, or another rank's, pass."""
    from trainledger.journal.roster import RosterMismatch, split_run_id
    from trainledger.journal.verify import VerifyReport

    label = f"rank {rank}" if rank is not None else str(where)
    if not isinstance(rep, VerifyReport):
        raise IntegrityError(f"{label}: its task returned {type(rep).__name__}, not a verification report", seq=None)
    if rep.trust != "pinned" or rep.key_id not in {k.key_id for k in policy.keys}:
        raise IntegrityError(f"{label}: its task reports trust {rep.trust!r} under key {rep.key_id}, which is not a "
                             "pinned key: the cluster's report is not taken", seq=None)
    if rank is not None:
        split = split_run_id(rep.run_id)
        if split is None or split[1] != rank:
            raise IntegrityError(f"{label}: its task reports run {str(rep.run_id)[:80]!r}, not a rank-{rank} "
                                 "journal's", seq=None)
        if policy.roster is not None:
            try:
                policy.roster.hold(rank, rep.key_id, seq=None)
            except RosterMismatch as e:
                raise RosterMismatch(f"{label}: its task reports a journal {e}", seq=None) from None


def export_journals_ray(export: Callable[..., Any], jobs: list[tuple[Path, int | None]], root: str | os.PathLike, *,
                        lines: bool, trust: TrustPolicy, address: str | None = None) -> list[Any]:
    """Each ``(journal, rank or None)`` of ``jobs`` verified and exported into ``root`` by a Ray task running
    ``export`` (:func:`~trainledger.journal.views.parquet.export.export_journal`), the largest first; their results in ``jobs``'
    order. The first failing journal, in that order, raises; a task lost beyond its retries raises
    :class:`JournalIOError` (no journal goes without its result)."""
    _pinned(trust)
    ray = _ray()
    started, _ = _joined(ray, address)
    try:
        remote = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(_export_task)
        order = sorted(range(len(jobs)), key=lambda i: -_size(jobs[i][0]))
        refs = {i: remote.remote(export, str(Path(jobs[i][0]).resolve()), str(root), lines, trust, jobs[i][1])
                for i in order}
        got: dict[int, tuple[str, Any]] = {}
        for i in order:
            try:
                got[i] = ray.get(refs[i])
            except ray.exceptions.RayError as e:
                raise JournalIOError(f"{jobs[i][0]}: its export task did not return ({type(e).__name__}): nothing "
                                     "was exported") from None
        for i in range(len(jobs)):
            if got[i][0] != "ok":
                _raise(jobs[i][1] if jobs[i][1] is not None else -1, got[i])
            _hold_report(jobs[i][1], getattr(got[i][1], "report", None), trust, jobs[i][0])
        return [got[i][1] for i in range(len(jobs))]
    finally:
        if started:
            ray.shutdown()


def _raise(rank: int, verdict: tuple[str, Any]) -> None:
    kind, what = verdict
    if kind == "io":
        raise JournalIOError(what)
    module, name, msg, seq, offset = what
    import importlib

    cls = getattr(importlib.import_module(module), name, None)
    if not (isinstance(cls, type) and issubclass(cls, IntegrityError)):
        cls = IntegrityError
    try:
        err = cls(msg, seq=seq, offset=offset)
    except TypeError:
        err = IntegrityError(msg, seq=seq, offset=offset)
    raise err


def verify_run_dir_ray(path: str | os.PathLike, *, trust: TrustPolicy | None = None, address: str | None = None,
                       partial: bool = False, **trust_options: Any) -> RunDirReport:
    """:func:`verify_run_dir` with each rank journal verified as a Ray task (see the module doc). ``address``:
    a running cluster's (``ray start``; ``"auto"``), or None for a private one started here for the call (or the
    one this process already joined); the report's ``engine`` says which. Every task's report is held to the
    policy (pinned key, the roster's for that rank, that rank's run) before the run's check."""
    policy = TrustPolicy.of(trust, **trust_options)
    _pinned(policy)
    d = Path(path)
    files = rank_files(d)
    if not files:
        raise JournalIOError(f"{d}: no rank journals (rank-00000.jsonl, ...) in this folder")
    ray = _ray()
    started, cluster = _joined(ray, address)
    try:
        remote = ray.remote(num_cpus=1, max_retries=MAX_RETRIES, retry_exceptions=False)(_task)
        order = sorted(files, key=lambda r: -_size(files[r]))  # the largest first: the slowest start first
        refs = {r: remote.remote(r, str(files[r].resolve()), policy, frozenset()) for r in order}
        verdicts: dict[int, tuple[str, Any]] = {}
        for r in order:
            try:
                verdicts[r] = ray.get(refs[r])
            except ray.exceptions.RayError as e:  # lost beyond its retries: no result, so no verdict on the run
                raise JournalIOError(f"rank {r}: its verification task did not return ({type(e).__name__}): the run "
                                     "is not verified") from None
        for r in sorted(verdicts):
            if verdicts[r][0] != "ok":
                _raise(r, verdicts[r])
            _hold_report(r, verdicts[r][1], policy, files[r])

        def rescan(r: int, seqs: frozenset[int]) -> Any:
            v = ray.get(remote.remote(r, str(files[r].resolve()), policy, seqs))
            if v[0] != "ok":
                _raise(r, v)
            _hold_report(r, v[1], policy, files[r])
            return v[1]

        rep = check_run(d, {r: v[1] for r, v in verdicts.items()}, trust=policy, partial=partial, rescan=rescan)
        rep.engine = cluster
        return rep
    finally:
        if started:
            ray.shutdown()
