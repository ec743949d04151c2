"""Verifying a distributed run's folder: every rank's journal, and every rank against the anchors in the others.

A run folder holds ``rank-00000.jsonl`` ... ``rank-NNNNN.jsonl`` (``training.distributed``). Each journal is
verified on its own, then the anchors are checked: every head that rank 0
recorded for another rank (``ranks_anchored``) must be a line of that rank's signed prefix with that hash, and
rank 0's head that every other rank recorded (``anchor_recorded``) must be one of rank 0's. A rank journal that was
truncated, rolled back or swapped for another run's fails, naming the rank and the anchor; so does a rank that
some journal says exists and that has no file (never a silent "7 of 8 verified").
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
from pathlib import Path
from typing import Any

from .codec import decode_line
from .errors import IntegrityError, JournalIOError
from .kinds import AnchorRecorded, RankJoined, RanksAnchored
from .verify import SharedWorkers, VerifyReport, verify

__all__ = ["AnchorMismatch", "RunDirReport", "RunDirReconstruction", "verify_run_dir", "replay_run_dir", "is_run_dir",
           "rank_files"]

_RANK_FILE = re.compile(r"rank-(\d{5})\.jsonl\Z")


class AnchorMismatch(IntegrityError):
    """A rank journal does not hold a head that another rank anchored, or a rank's journal is missing."""

    reason = "anchor"


@dataclasses.dataclass
class RunDirReport:
    ok: bool
    path: str
    ranks: dict[int, VerifyReport]
    world_size: int
    anchors: int

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "path": self.path, "world_size": self.world_size, "anchors": self.anchors,
                "ranks": {str(r): rep.to_dict() for r, rep in sorted(self.ranks.items())}}


def rank_files(d: str | os.PathLike) -> dict[int, Path]:
    out = {}
    for p in sorted(Path(d).iterdir()):
        m = _RANK_FILE.match(p.name)
        if m and p.is_file():
            out[int(m.group(1))] = p
    return out


def is_run_dir(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and bool(rank_files(p))


_ANCHOR_KINDS = frozenset({"rank_joined", "ranks_anchored", "anchor_recorded"})


def _verify_rank(rank: int, f: Path, want: frozenset[int] = frozenset(), **verify_options: Any) -> VerifyReport:
    try:
        return verify(f, _collect=(_ANCHOR_KINDS, want), **verify_options)
    except IntegrityError as e:
        raise type(e)(f"rank {rank}: {e}", seq=e.seq, offset=e.offset) from None


def _size(f: Path) -> int:
    try:
        return f.stat().st_size
    except OSError:
        return 0  # gone: that rank's verification says so


def _verify_ranks(files: dict[int, Path], shared: SharedWorkers, options: dict[str, Any]) -> dict[int, VerifyReport]:
    """Every rank journal's verification; with shared workers, several ranks at once (a thread each, waiting on
    the workers), so that the workers are never idle between ranks. The first failing rank, in rank order, raises."""
    if shared.pool is None or len(files) == 1:
        return {rank: _verify_rank(rank, f, **options) for rank, f in files.items()}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(files), 2 * shared.n),
                                               thread_name_prefix="trainledger-verify") as ex:
        futures = {rank: ex.submit(_verify_rank, rank, f, _pool=shared, **options) for rank, f in files.items()}
        try:
            return {rank: fut.result() for rank, fut in futures.items()}
        except BaseException:
            # Ctrl-C or the first failing rank: the ranks not started yet never start, the ones under way stop
            # waiting on the workers, so that leaving this block (which waits for the threads) is prompt
            shared.cancelled.set()
            for fut in futures.values():
                fut.cancel()
            raise


def verify_run_dir(path: str | os.PathLike, **verify_options: Any) -> RunDirReport:
    """Verify every rank journal in ``path`` (``verify``'s options) and every cross-rank anchor.

    One verification pass per rank journal: the anchors it holds, and the chain hashes of its seals (the heads
    ``anchor_ranks`` records are sealed heads), are handed over by the pass that checked them, so nothing is read
    twice and nothing unchecked is used. An anchored head that is not a seal line (an anchor some other writer
    recorded) costs that rank one more pass, which must end at the same head as the first.

    Raises the first rank's :class:`IntegrityError` (its message names the rank), :class:`AnchorMismatch` for a
    missing, truncated, rolled-back or swapped rank, and :class:`JournalIOError` for a folder without journals.
    """
    d = Path(path)
    files = rank_files(d)
    if not files:
        raise JournalIOError(f"{d}: no rank journals (rank-00000.jsonl, ...) in this folder")
    reports: dict[int, VerifyReport] = {}
    # (anchoring rank, its seq) -> [(anchored rank, seq, hash)]
    wanted: list[tuple[int, int, int, int, str]] = []
    world = 0
    with SharedWorkers(verify_options.get("workers"), sum(map(_size, files.values()))) as shared:
        checked = _verify_ranks(files, shared, verify_options)
    for rank, f in files.items():
        rep = checked[rank]
        reports[rank] = rep
        trusted = rep.trusted_bytes
        for offset, line in rep.collected:
            if offset >= trusted:
                continue  # past the signed prefix: nothing may rest on it
            ev = decode_line(line)
            if isinstance(ev, RankJoined):
                world = max(world, ev.world_size)
                if ev.rank != rank:
                    raise AnchorMismatch(f"rank {rank}: its journal says it is rank {ev.rank} (a swapped file)",
                                         seq=ev.seq)
            elif isinstance(ev, RanksAnchored):
                for r, head in ev.heads.items():
                    if int(r) != rank:
                        s, _, h = head.partition(":")
                        wanted.append((rank, ev.seq, int(r), int(s), h))
            elif isinstance(ev, AnchorRecorded):
                s, _, h = ev.head.partition(":")
                wanted.append((rank, ev.seq, ev.rank, int(s), h))
        rep.collected = []
    for r in range(world):
        if r not in files:
            raise AnchorMismatch(f"rank {r} of {world}: no journal in {d} (a run folder is verified whole)")
    found: dict[int, dict[int, str]] = {r: dict(rep.hashes) for r, rep in reports.items()}
    more: dict[int, set[int]] = {}
    for anchoring, at, r, s, h in wanted:
        if r in reports and s not in found[r] and s <= (reports[r].trusted_last_seq or -1):
            more.setdefault(r, set()).add(s)
    for r, seqs in more.items():  # anchors at lines that are not seals: one more pass over that rank
        again = _verify_rank(r, files[r], frozenset(seqs), **verify_options)
        if (again.last_seq, again.last_hash) != (reports[r].last_seq, reports[r].last_hash):
            raise AnchorMismatch(f"rank {r}: its journal changed while it was being verified")
        found[r].update(again.hashes)
    for anchoring, at, r, s, h in wanted:
        if r not in files:
            raise AnchorMismatch(f"rank {r}: no journal, but rank {anchoring} anchored it at its seq {at}",
                                 seq=at)
        got = found.get(r, {}).get(s)
        last = reports[r].trusted_last_seq
        if got is None:
            raise AnchorMismatch(f"rank {r}: its signed journal ends at seq {last}, but rank {anchoring} "
                                 f"anchored its seq {s} (rank {anchoring}'s seq {at}): truncated or rolled back",
                                 seq=s)
        if got != h:
            raise AnchorMismatch(f"rank {r}: seq {s} is not the line rank {anchoring} anchored at its seq {at} "
                                 "(rewritten, or another run's journal)", seq=s)
    for rep in reports.values():
        rep.hashes = {}
    return RunDirReport(ok=True, path=str(d), ranks=reports, world_size=max(world, len(files)), anchors=len(wanted))


@dataclasses.dataclass
class RunDirReconstruction:
    """``replay`` of a run folder: every rank's reconstruction, the straggler windows, and every difference."""

    verify: RunDirReport
    ranks: dict[int, Any]
    stragglers: list[dict[str, Any]]
    differences: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        return not self.differences

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "verify": self.verify.to_dict(), "stragglers": self.stragglers,
                "differences": self.differences,
                "ranks": {str(r): rec.to_dict() for r, rec in sorted(self.ranks.items())}}


def replay_run_dir(path: str | os.PathLike, *, observe: Any = None, **verify_options: Any) -> RunDirReconstruction:
    """Verify the folder (:func:`verify_run_dir`), replay every rank, and recompute the straggler windows rank 0
    recorded from every rank's own step times. A rank's differences carry ``rank``. ``observe(rank, event)`` sees
    every signed event of every rank, in order (the report's curves)."""
    from .events import StepObserved
    from .kinds import StragglerDetected, StragglerScores
    from .replay import replay
    from .stragglers import audit_stragglers

    report = verify_run_dir(path, **verify_options)
    keep = (StepObserved, StragglerScores, StragglerDetected, RankJoined)
    events: dict[int, list[Any]] = {}
    recs = {}
    for r, f in rank_files(path).items():
        kept: list[Any] = []
        # replay's own pass over the signed prefix hands over what the straggler audit needs
        def seen(ev: Any, kept: list[Any] = kept, r: int = r) -> None:
            if isinstance(ev, keep):
                kept.append(ev)
            if observe is not None:
                observe(r, ev)

        recs[r] = replay(f, observe=seen, **verify_options)
        events[r] = kept
    differences = [{**d, "rank": r} for r, rec in sorted(recs.items()) for d in rec.differences]
    differences += [{**d, "rank": 0} for d in audit_stragglers(events)]
    flagged = [{"seq": e.seq, "rank": e.rank, "score": e.score, "window": [e.window_start, e.window_end],
                "node": e.node} for e in events.get(0, []) if isinstance(e, StragglerDetected)]
    return RunDirReconstruction(verify=report, ranks=recs, stragglers=flagged, differences=differences)
