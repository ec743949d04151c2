"""Verifying a distributed run's folder: every rank's journal, and every rank against the anchors in the others.

A run folder holds ``rank-00000.jsonl`` ... ``rank-NNNNN.jsonl`` (:mod:`trainledger.training.distributed.ranks`). Each journal is
verified on its own, then the anchors are checked: every head that rank 0
recorded for another rank (``ranks_anchored``) must be a line of that rank's signed prefix with that hash, and
rank 0's head that every other rank recorded (``anchor_recorded``) must be one of rank 0's. A rank journal that was
truncated, rolled back or swapped for another run's fails, naming the rank and the anchor; so does a rank that
some journal says exists and that has no file (never a silent "7 of 8 verified").

Every rank journal belongs to one run (its run id, its ``rank_joined``, one world size per restart round) and is
signed by its own key: the operator's roster, or rank 0's signed record of the keys the ranks anchored with
(:mod:`trainledger.journal.roster`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainledger.journal.roster import RosterMismatch, key_words, split_run_id
from trainledger.journal.codec import decode_line
from trainledger.journal.errors import IntegrityError, JournalIOError, UsageError
from trainledger.journal.paths import is_sidecar
from trainledger.journal.events import KeyCertified
from trainledger.journal.kinds import AnchorRecorded, RankJoined, RanksAnchored
from trainledger.journal.trust import TrustPolicy
from trainledger.journal.verify import SharedWorkers, Verification, VerifyReport, verify_with

__all__ = ["AnchorMismatch", "RunDirReport", "verify_run_dir", "verify_rank", "check_run", "hold_ranks", "is_run_dir",
           "rank_files", "run_journal", "journals_of", "run_journals", "JOURNAL_NAMES",
           "split_run_id"]

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
    #: what binds each rank to its key (journal.audit.roster): "roster" (the operator's), "recorded" (rank 0's
    #: signed record, and the other ranks' of rank 0's), "one key" (every rank signed by the same key), "unsigned"
    keys_bound_by: str = "one key"
    #: a partial view (``partial=True`` and a rank missing): the ranks some journal says exist that have no file,
    #: whose anchors were therefore not checked. Empty for a whole folder
    missing: list[int] = dataclasses.field(default_factory=list)
    #: where the ranks were verified, in words, when not in this process (``--ray``: which cluster)
    engine: str | None = None

    @property
    def partial(self) -> bool:
        """Whether this report covers only the ranks present (some are :attr:`missing`)."""
        return bool(self.missing)

    def keys_binding(self, roster: Any = None) -> str:
        """What bound each rank to its key, in words (``roster``: the policy's, to name its file)."""
        if self.keys_bound_by == "roster":
            return f"the roster {roster.source}" if roster is not None else "the roster"
        return _BINDING[self.keys_bound_by]

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "path": self.path, "world_size": self.world_size, "anchors": self.anchors,
                "keys_bound_by": self.keys_bound_by, "partial": self.partial, "missing": self.missing,
                **({"engine": self.engine} if self.engine else {}),
                "ranks": {str(r): rep.to_dict() for r, rep in sorted(self.ranks.items())}}


_BINDING = {"certified": "certificates of the rank keys, each round's roster signed by the pinned key",
            "recorded": "rank 0's signed record of the ranks' keys (pin --roster to bind them yourself)",
            "one key": "one key signs every rank", "unsigned": "unsigned"}


def rank_files(d: str | os.PathLike) -> dict[int, Path]:
    """``{rank: file}`` of the rank journals in folder ``d``. A rank file that is a link leading out of the folder
    is refused (:class:`UnsafePath`), as a checkpoint path is: the folder is what was sent, not what it points to."""
    from trainledger.journal.paths import confined

    out = {}
    for p in sorted(Path(d).iterdir()):
        m = _RANK_FILE.match(p.name)
        if m and p.is_file():
            if p.is_symlink():
                confined(d, p.name, what="rank journal")
            out[int(m.group(1))] = p
    return out


def journals_of(path: str | os.PathLike) -> dict[int, Path]:
    """``{rank: journal}`` of what a path names: every rank journal of a distributed run's folder; else ``{0: the
    journal}``, a journal file or a run folder's one journal. ``UsageError`` when it names none."""
    p = Path(path)
    ranks = rank_files(p) if p.is_dir() else {}
    if ranks:
        return ranks
    j = run_journal(p) if p.is_dir() else p
    if j is None or not j.is_file():
        raise UsageError(f"{p}: not a journal, a run folder or a distributed run's folder")
    return {0: j}


def run_journals(path: str | os.PathLike) -> list[Path]:
    """The journals a path names (:func:`journals_of`), in rank order."""
    ranks = journals_of(path)
    return [ranks[r] for r in sorted(ranks)]


def run_dirs_among(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Every run folder among ``paths`` or below a folder named there (a folder holding rank journals), sorted:
    what a command over several paths holds whole."""
    folders = set()
    for p in map(Path, paths):
        if p.is_dir():
            folders |= {x.parent for x in p.rglob("rank-*.jsonl") if x.is_file()}
    return [d for d in sorted(folders) if is_run_dir(d)]


#: the journal a one-journal run folder holds, by the writer that made it: the Recorder, the callbacks, the demo
#: and the experiment loop write journal.jsonl, the ladder ladder.jsonl
JOURNAL_NAMES = ("journal.jsonl", "ladder.jsonl")


def run_journal(path: str | os.PathLike) -> Path | None:
    """The one journal a run folder the project wrote holds (``journal.jsonl``, ``ladder.jsonl``, or the folder's
    only ``*.jsonl``), for the commands that read one journal; None when ``path`` is not a folder or is a run
    folder of rank journals. ``UsageError`` for a folder with several journals and none of those names (which one
    was meant is not for a command to guess), or with none at all."""
    p = Path(path)
    if not p.is_dir() or rank_files(p):
        return None
    for name in JOURNAL_NAMES:
        if (p / name).is_file() and not (p / name).is_symlink():
            return p / name
    found = sorted(f for f in p.glob("*.jsonl") if f.is_file() and not f.is_symlink() and not is_sidecar(f))
    if len(found) == 1:
        return found[0]
    if not found:
        raise UsageError(f"{p}: a folder, but no journal in it (journal.jsonl, ladder.jsonl or rank-00000.jsonl, ...)")
    raise UsageError(f"{p}: a folder of {len(found)} journals ({', '.join(f.name for f in found[:4])}"
                     f"{', ...' if len(found) > 4 else ''}): name the one to read")


def is_run_dir(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and bool(rank_files(p))


_ANCHOR_KINDS = frozenset({"rank_joined", "ranks_anchored", "anchor_recorded", "key_certified"})


def _verify_rank(rank: int, f: Path, trust: TrustPolicy, want: frozenset[int] = frozenset(), *,
                 workers: int | None = None, _pool: SharedWorkers | None = None) -> VerifyReport:
    try:
        return verify_with(f, Verification(collect=(_ANCHOR_KINDS, want), pool=_pool), trust=trust, workers=workers)
    except IntegrityError as e:
        raise type(e)(f"rank {rank}: {e}", seq=e.seq, offset=e.offset) from None


def _size(f: Path) -> int:
    try:
        return f.stat().st_size
    except OSError:
        return 0  # gone: that rank's verification says so


def _verify_ranks(files: dict[int, Path], shared: SharedWorkers, trust: TrustPolicy,
                  workers: int | None) -> dict[int, VerifyReport]:
    """Every rank journal's verification; with shared workers, several ranks at once (a thread each, waiting on
    the workers), so that the workers are never idle between ranks. The first failing rank, in rank order, raises."""
    if shared.pool is None or len(files) == 1:
        return {rank: _verify_rank(rank, f, trust, workers=workers) for rank, f in files.items()}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(len(files), 2 * shared.n),
                                               thread_name_prefix="trainledger-verify") as ex:
        futures = {rank: ex.submit(_verify_rank, rank, f, trust, workers=workers, _pool=shared)
                   for rank, f in files.items()}
        try:
            return {rank: fut.result() for rank, fut in futures.items()}
        except BaseException:
            # Ctrl-C or the first failing rank: the ranks not started yet never start, the ones under way stop
            # waiting on the workers, so that leaving this block (which waits for the threads) is prompt
            shared.cancelled.set()
            for fut in futures.values():
                fut.cancel()
            raise


def _hold_to_one_run(reports: dict[int, VerifyReport], joined: list[tuple[int, int, str, int, int]]) -> None:
    """Every rank journal belongs to one run, from line 0 on: its run id (signed in ``run_opened``) is
    ``RUN.rNNNNN`` with its file's rank number and the same ``RUN`` as rank 0's (or the lowest rank's); every
    ``rank_joined`` names that ``RUN``; and in each restart round every rank joined the same world size. A rank
    file copied in from another run with the same key fails here, anchored or not."""
    first = min(reports)
    split = split_run_id(reports[first].run_id)
    if split is None or split[1] != first:
        raise AnchorMismatch(f"rank {first}: its run id {reports[first].run_id!r} is not a rank-{first} journal's "
                             f"(RUN.r{first:05d})", seq=0)
    run = split[0]
    for rank, rep in sorted(reports.items()):
        if rep.run_id != f"{run}.r{rank:05d}":
            raise AnchorMismatch(f"rank {rank}: its run id is {rep.run_id!r}, not {run}.r{rank:05d}: a journal of "
                                 f"another run (or rank) in this folder", seq=0)
    worlds: dict[int, tuple[int, int]] = {}  # restart round -> (world size, the rank that said so)
    for rank, seq, r_run, rnd, w in joined:
        if r_run != run:
            raise AnchorMismatch(f"rank {rank}: rank_joined at seq {seq} names run {r_run!r}, not {run!r}", seq=seq)
        if not 0 <= rank < w:
            raise AnchorMismatch(f"rank {rank}: joined restart round {rnd} as rank {rank} of a world of {w} (no "
                                 "such rank)", seq=seq)
        if worlds.setdefault(rnd, (w, rank))[0] != w:
            raise AnchorMismatch(f"rank {rank}: joined restart round {rnd} with world size {w}, rank "
                                 f"{worlds[rnd][1]} with {worlds[rnd][0]}", seq=seq)


def _hold_to_keys(reports: dict[int, VerifyReport], recorded: dict[int, tuple[str, int]],
                  said: list[tuple[int, int, int, str]], trust: TrustPolicy) -> str:
    """Every rank signed by its own key (journal.audit.roster): the operator's roster (each rank's verification
    held it to that already), else rank 0's signed record of the keys the ranks exchanged (``recorded``: rank ->
    (key id, rank 0's seq)) and the other ranks' of rank 0's (``said``: (rank, its seq, the rank it names, key id)).
    Returns what bound them; raises :class:`RosterMismatch` for a rank signed by another key, or left unbound in a
    folder several keys sign."""
    for r, (key, seq) in sorted(recorded.items()):
        if r in reports and key not in _keys_of(reports[r]):
            raise RosterMismatch(f"rank {r}: signed by {_signed_by(reports[r])}, but rank 0 recorded at its seq "
                                 f"{seq} that rank {r} signs with key {key}", seq=seq)
    for rank, seq, of, key in said:
        if of in reports and key not in _keys_of(reports[of]):
            raise RosterMismatch(f"rank {of}: signed by {_signed_by(reports[of])}, but rank {rank} recorded at its "
                                 f"seq {seq} that rank {of} signs with key {key}", seq=seq)
    if trust.roster is not None:
        return "roster"
    keys = {rep.key_id for rep in reports.values()}
    if len(keys) <= 1:
        if keys != {None} and all(_certified(rep) for rep in reports.values()):
            return "certified"
        return "unsigned" if keys == {None} else "one key"
    named_of = {of for _, _, of, _ in said}
    for r in sorted(reports):
        if (r in named_of) if r == 0 else (r in recorded):
            continue
        raise RosterMismatch(f"rank {r}: this folder is signed by {len(keys)} keys and nothing binds rank {r} to "
                             f"its key ({key_words(reports[r].key_id)}): no anchor recorded the ranks' keys yet (or the "
                             "journals predate format 1.5); pin which key signs which rank with --roster FILE",
                             seq=0)
    return "recorded"


def _keys_of(rep: VerifyReport) -> list[str | None]:
    """The keys a rank journal's seals were checked under (its own key, or the rank keys its certificates certify)."""
    return rep.signing_keys or [rep.key_id]


def _signed_by(rep: VerifyReport) -> str:
    """What signs a rank journal, in words: its key, or the rank keys a key certified."""
    if _certified(rep):
        return f"rank key{'s' if len(rep.signing_keys) > 1 else ''} {', '.join(rep.signing_keys)} (certified by key " \
               f"{rep.key_id})"
    return key_words(rep.key_id)


def _certified(rep: VerifyReport) -> bool:
    return bool(rep.signing_keys) and rep.key_id not in rep.signing_keys


def _hold_to_rosters(certs: list[tuple[int, int, KeyCertified]], joined: list[tuple[int, int, str, int, int]],
                     reports: dict[int, VerifyReport]) -> None:
    """A folder whose rank keys are certified: in each round every rank's certificate comes from one signed roster
    (the same statement), every rank that joined a round did so under that round's certificate, and no rank of the
    folder is signed otherwise. ``certs``: (rank, seq, key_certified) in each rank's order."""
    certified = {r for r, rep in reports.items() if _certified(rep)}
    if not certified:
        return
    plain = sorted(set(reports) - certified)
    if plain:
        raise RosterMismatch(f"rank {plain[0]}: signed by {key_words(reports[plain[0]].key_id)} with no certificate, in "
                             "a folder whose rank keys are certified", seq=0)
    rounds: dict[int, tuple[tuple, int]] = {}
    last: dict[int, list[tuple[int, int]]] = {}  # rank -> [(seq, round)] of its certificates
    for rank, seq, c in certs:
        said = (c.keys_root, c.world_size, c.issued_ns, c.not_after_ns, c.issuer, c.sig)
        first = rounds.setdefault(c.round, (said, rank))
        if first[0] != said:
            raise RosterMismatch(f"rank {rank}: its certificate for round {c.round} (seq {seq}) is not the roster rank "
                                 f"{first[1]} recorded for that round: another roster", seq=seq)
        last.setdefault(rank, []).append((seq, c.round))
    for rank, seq, _, rnd, world in joined:
        before = [r for s, r in last.get(rank, []) if s < seq]
        if not before or before[-1] != rnd:
            got = f"round {before[-1]}'s key" if before else "no certified key"
            raise RosterMismatch(f"rank {rank}: joined restart round {rnd} at seq {seq} under {got}: a rank from "
                                 "another round", seq=seq)
        if rounds[rnd][0][1] != world:
            raise RosterMismatch(f"rank {rank}: joined round {rnd} in a world of {world}, but that round's roster "
                                 f"certifies {rounds[rnd][0][1]} ranks", seq=seq)


def _hold_cosigned(cosigned: list[tuple[int, RanksAnchored]], certs: list[tuple[int, int, KeyCertified]],
                   reports: dict[int, VerifyReport]) -> None:
    """In a folder whose rank keys are certified, rank 0's anchors are countersigned by the key that certified
    them (the certificate's issuer, already held to the pinned key): each ``cosig`` checks out over the anchor's
    heads and keys, and none is missing."""
    import base64
    import binascii

    from trainledger.journal.certify import anchor_statement, issuer_of

    for rank, ev in cosigned:
        if rank != 0 or not _certified(reports[rank]):
            raise RosterMismatch(f"rank {rank}: an anchor countersigned at its seq {ev.seq}, in a journal whose key is "
                                 "not certified (only rank 0 of such a run countersigns)", seq=ev.seq)
        mine = [c for r, s, c in certs if r == 0 and s < ev.seq]
        if ev.cosig is None or not mine:
            raise RosterMismatch(f"rank 0: the anchor at its seq {ev.seq} is not countersigned by the key that "
                                 "certified the rank keys", seq=ev.seq)
        split = split_run_id(reports[0].run_id)
        body = anchor_statement(split[0] if split else "", ev.step, ev.heads, ev.keys)
        try:
            ok = issuer_of(mine[-1]).verify(base64.b64decode(ev.cosig, validate=True), body)
        except (binascii.Error, ValueError):
            ok = False
        if not ok:
            raise RosterMismatch(f"rank 0: the countersignature of the anchor at its seq {ev.seq} does not verify "
                                 "under the key that certified the rank keys", seq=ev.seq)


def verify_run_dir(path: str | os.PathLike, *, trust: TrustPolicy | None = None, workers: int | None = None,
                   partial: bool = False, **trust_options: Any) -> RunDirReport:
    """Verify every rank journal in ``path`` under ``trust`` (a :class:`TrustPolicy`, or its fields as keywords)
    and every cross-rank anchor.

    One verification pass per rank journal: the anchors it holds, and the chain hashes of its seals (the heads
    ``anchor_ranks`` records are sealed heads), are handed over by the pass that checked them, so nothing is read
    twice and nothing unchecked is used. An anchored head that is not a seal line (an anchor some other writer
    recorded) costs that rank one more pass, which must end at the same head as the first.

    ``partial``: the user's opt-in to a view of the ranks present. A missing rank is then listed in the report's
    ``missing`` (``partial`` set) instead of failing, and the anchors naming it are left unchecked; every rank
    present is still held to everything else. A caller must label what it shows from such a report as partial.

    Raises the first rank's :class:`IntegrityError` (its message names the rank), :class:`AnchorMismatch` for a
    missing, truncated, rolled-back or swapped rank, :class:`RosterMismatch` for a rank signed by another key than
    its own, and :class:`JournalIOError` for a folder without journals.
    """
    trust = TrustPolicy.of(trust, **trust_options)
    d = Path(path)
    files = rank_files(d)
    if not files:
        raise JournalIOError(f"{d}: no rank journals (rank-00000.jsonl, ...) in this folder")
    with SharedWorkers(workers, sum(map(_size, files.values()))) as shared:
        checked = _verify_ranks(files, shared, trust, workers)
    return check_run(d, checked, trust=trust, partial=partial,
                     rescan=lambda r, seqs: _verify_rank(r, files[r], trust, seqs, workers=workers))


def verify_rank(rank: int, path: str | os.PathLike, trust: TrustPolicy, seqs: frozenset[int] = frozenset(), *,
                workers: int | None = None) -> VerifyReport:
    """One rank journal's own verification, as :func:`verify_run_dir` does it for each rank: engine-neutral (a
    process pool, a Ray task, a Dask or Spark task may run it; the report pickles). It also hands back what the
    cross-rank check needs: the anchor kinds' lines (``collected``) and the chain hashes of its seals and of
    ``seqs`` (``hashes``). Raises the rank's :class:`IntegrityError`, its message naming the rank."""
    return _verify_rank(rank, Path(path), trust, frozenset(seqs), workers=workers)


def check_run(path: str | os.PathLike, reports: dict[int, VerifyReport], *, trust: TrustPolicy,
              partial: bool = False,
              rescan: Callable[[int, frozenset[int]], VerifyReport] | None = None) -> RunDirReport:
    """The cross-rank half of :func:`verify_run_dir`, from every rank's :func:`verify_rank` report (wherever it
    ran): one run identity, each rank's key, every anchor. ``reports`` must hold every rank file of ``path``
    (a rank without a report fails: never "63 of 64 verified"). ``rescan(rank, seqs)``: a rank's verification again
    for anchored seqs that are not seal lines (default: :func:`verify_rank` here). Raises as :func:`verify_run_dir`."""
    d = Path(path)
    files = rank_files(d)
    lacking = sorted(set(files) - set(reports))
    if lacking:
        raise AnchorMismatch(f"rank {lacking[0]}: its journal is in {d} but was not verified (every rank file "
                             "needs its own verification)", seq=None)
    if rescan is None:
        def rescan(r: int, seqs: frozenset[int]) -> VerifyReport:
            return verify_rank(r, files[r], trust, seqs)
    return hold_ranks(str(d), {r: reports[r] for r in files}, trust=trust, partial=partial, rescan=rescan)


def hold_ranks(where: str, checked: dict[int, VerifyReport], *, trust: TrustPolicy, partial: bool,
               rescan: Callable[[int, frozenset[int]], VerifyReport]) -> RunDirReport:
    """The cross-rank check of one run's ranks, whatever holds them (a run folder, an export's journals): every
    rank's own verification report (``checked``, with the anchor kinds collected) held to one run identity and world
    size per round, each rank's key, and every anchor; a rank some journal says exists and ``checked`` lacks is
    missing (an error unless ``partial``). ``where`` names the ranks' home in messages and the report."""
    files = dict(sorted(checked.items()))  # the ranks present, in order (a dict: O(1) membership at 16,000 ranks)
    reports = {}
    # (anchoring rank, its seq) -> [(anchored rank, seq, hash)]
    wanted: list[tuple[int, int, int, int, str]] = []
    world = 0
    joined: list[tuple[int, int, str, int, int]] = []  # (rank, seq, run, restart round, world size) of rank_joined
    recorded: dict[int, tuple[str, int]] = {}  # rank -> (its key id, rank 0's seq): ranks_anchored.keys
    said: list[tuple[int, int, int, str]] = []  # (rank, its seq, the rank it names, key id): anchor_recorded.key
    certs: list[tuple[int, int, KeyCertified]] = []  # (rank, seq, certificate): certified rank keys
    cosigned: list[tuple[int, RanksAnchored]] = []  # anchors the run key countersigned (or must have)
    for rank in files:
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
                joined.append((rank, ev.seq, ev.run, ev.restart_count, ev.world_size))
            elif isinstance(ev, RanksAnchored):
                if ev.cosig is not None or (rank == 0 and _certified(rep)):
                    cosigned.append((rank, ev))
                for r, head in ev.heads.items():
                    if int(r) != rank or ev.cosig is not None:  # a countersigned anchor holds its own rank too
                        s, _, h = head.partition(":")
                        wanted.append((rank, ev.seq, int(r), int(s), h))
                if rank == 0:
                    for r, key in ev.keys.items():
                        first = recorded.setdefault(int(r), (key, ev.seq))
                        if first[0] != key and _certified(rep):  # a new key each round: each held on its own
                            said.append((0, ev.seq, int(r), key))
                        elif first[0] != key:
                            raise RosterMismatch(f"rank 0: recorded key {recorded[int(r)][0]} for rank {r} at its "
                                                 f"seq {recorded[int(r)][1]} and key {key} at its seq {ev.seq}",
                                                 seq=ev.seq)
            elif isinstance(ev, KeyCertified):
                certs.append((rank, ev.seq, ev))
            elif isinstance(ev, AnchorRecorded):
                s, _, h = ev.head.partition(":")
                wanted.append((rank, ev.seq, ev.rank, int(s), h))
                if ev.key is not None:
                    said.append((rank, ev.seq, ev.rank, ev.key))
        rep.collected = []
    _hold_to_one_run(reports, joined)
    _hold_to_rosters(certs, joined, reports)
    _hold_cosigned(cosigned, certs, reports)
    bound_by = _hold_to_keys(reports, recorded, said, trust)
    missing = [r for r in range(world) if r not in files]
    if missing and not partial:
        raise AnchorMismatch(f"rank {missing[0]} of {world}: no journal in {where} (a run folder is verified whole; "
                             "--partial reads the ranks present, labelled as partial)")
    if missing:
        wanted = [w for w in wanted if w[2] in files]
    found: dict[int, dict[int, str]] = {r: dict(rep.hashes) for r, rep in reports.items()}
    more: dict[int, set[int]] = {}
    for anchoring, at, r, s, h in wanted:
        if r in reports and s not in found[r] and s <= (reports[r].trusted_last_seq or -1):
            more.setdefault(r, set()).add(s)
    for r, seqs in more.items():  # anchors at lines that are not seals: one more pass over that rank
        again = rescan(r, frozenset(seqs))
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
    return RunDirReport(ok=True, path=where, ranks=reports, world_size=max(world, len(files)), anchors=len(wanted),
                        keys_bound_by=bound_by, missing=missing)
