"""Build a compute statement (:func:`build_statement`) and check one offline (:func:`check_statement`).

A statement covers the runs of one model (run folders of rank journals, or single journals): each is verified
under the pinned keys and replayed, so that every ``compute_totaled`` and ``compute_threshold_crossed`` it rests on is
one the steps before it give. For each journal it carries a proof bundle (journal/proofs/bundle.py) of those events,
its last ``rank_joined`` (the world size), its last ``model_exported`` (the base model a fine-tune names) and the
``run_resumed`` that continues an earlier run folder, against the journal's last signed checkpoint. The figures
(journal/statements/compute/figures.py) are computed from the proven events alone, so that :func:`check_statement`, given only
the statement and the public keys, checks every proof and recomputes every figure.

Problems found while building (a journal that does not verify, a replay difference, a rank missing, a run named
twice, a run continued from one the statement lacks, no ``compute_totaled``) are the statement's ``findings``: it is
written, and says it is not clean. What a statement cannot prove is said in it (:data:`NOT_PROVEN`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from trainledger.journal.errors import IntegrityError, SchemaError, TrainledgerError, UsageError
from trainledger.journal.keys import PublicKey
from trainledger.journal.proofs.bundle import closing_seqs, proven_to_close
from trainledger.journal.text import first_difference
from trainledger.journal.statements.compute.figures import (DEFAULT_COMPUTE_THRESHOLDS, DEFAULT_MFU_RANGE, model_figures,
                                                  run_figures)

__all__ = ["STATEMENT_FORMAT", "MAX_STATEMENT_BYTES", "NOT_PROVEN", "build_statement", "check_statement",
           "StatementCheck", "is_statement"]

STATEMENT_FORMAT = "trainledger-compute-statement/v1"
#: a statement bigger than this is refused before it is parsed (a 16,384-rank run's is about 70 MB)
MAX_STATEMENT_BYTES = 1 << 30
_MAX_RUNS = 10_000
_MAX_JOURNALS = 1 << 20

NOT_PROVEN = ("The receipts are the trainer's own: this statement proves that the figures follow from events signed "
              "by the pinned keys and unchanged since, not that the steps ran on the devices named, that the token "
              "counts, step times and peaks reported were true, or that no run of the model is missing from it.")

_RECORD = ("seq", "ts", "h")


def _fields(ev: Any) -> dict[str, Any]:
    d = msgspec.to_builtins(ev)
    for k in _RECORD:
        d.pop(k, None)
    return d


@dataclasses.dataclass
class _Seen:
    """What one journal's replay saw of the events the statement rests on."""

    compute: Any = None
    steps_after: int = 0
    crossings: list[Any] = dataclasses.field(default_factory=list)
    joined: Any = None
    export: Any = None
    continues: Any = None
    run_id: str | None = None
    closed: Any = None

    def __call__(self, ev: Any) -> None:
        tag = type(ev).__struct_config__.tag
        if tag == "step_observed":
            self.steps_after += 1
        elif tag == "compute_totaled":
            self.compute, self.steps_after = ev, 0
        elif tag == "compute_threshold_crossed":
            self.crossings.append(ev)
        elif tag == "rank_joined":
            self.joined = ev
        elif tag == "model_exported":
            self.export = ev
        elif tag == "run_resumed" and ev.reason == "continued" and self.continues is None:
            self.continues = ev
        elif tag == "run_opened":
            self.run_id = ev.run_id
        elif tag == "run_closed":
            self.closed = ev

    def closing(self) -> list[int]:
        """Every line from the last total to ``run_closed``: proven, they show the total is the journal's last (an
        earlier one cannot reach the close); empty when the journal did not close, or closed too far after it."""
        return closing_seqs(self.compute.seq, self.closed.seq if self.closed is not None else None)


def _continued_run(ev: Any) -> str | None:
    """The run identity a ``run_resumed`` (reason ``continued``) names: the previous journal's run id, its rank
    suffix removed."""
    from trainledger.journal.roster import split_run_id

    link = (ev.detail or {}).get("continues") if isinstance(ev.detail, dict) else None
    rid = link.get("run_id") if isinstance(link, dict) else None
    if not isinstance(rid, str):
        return None
    split = split_run_id(rid)
    return split[0] if split is not None else rid


def _journals_of(path: Path) -> tuple[bool, dict[int, Path]]:
    from trainledger.journal.audit.rundir import is_run_dir, journals_of

    return is_run_dir(path), journals_of(path)


def _replayed(path: Path, keys: Sequence[PublicKey], findings: list[str], replay: Callable[..., Any],
              replay_run_dir: Callable[..., Any],
              progress: Callable[[str], None] | None = None) -> dict[int, tuple[Path, _Seen]] | None:
    """Every journal of ``path`` verified and replayed; each one's events seen (``progress`` told of each rank as its
    replay starts). None (and the finding) when it does not verify."""
    folder, files = _journals_of(path)
    seen = {r: _Seen() for r in files}

    def observe(r: int, ev: Any) -> None:
        if progress is not None and ev.seq == 0:
            progress(f"{path}: replaying rank {r + 1:,} of {len(files):,}")
        seen[r](ev)

    try:
        if folder:
            rec = replay_run_dir(path, keys=list(keys), observe=observe)
            diffs = rec.differences
        else:
            rec = replay(files[0], keys=list(keys), observe=seen[0])
            diffs = [dict(d, rank=0) for d in rec.differences]
    except TrainledgerError as e:
        findings.append(f"{path}: does not verify: {e}")
        return None
    for d in diffs:
        where = f"rank {d['rank']} " if folder else ""
        findings.append(f"{path}: {where}seq {d['seq']} ({d['kind']}): {d['detail']}")
    return {r: (files[r], seen[r]) for r in files}


def _prove(journal: Path, seen: _Seen, keys: Sequence[PublicKey]) -> dict[str, Any]:
    from trainledger.journal.proofs.bundle import prove

    seqs = [e.seq for e in (seen.compute, *seen.crossings, seen.joined, seen.export, seen.continues)
            if e is not None]
    seqs += seen.closing()
    return prove(journal, sorted(set(seqs)), keys=list(keys), keep_index=False).bundle  # the run folder left as it was


def build_statement(paths: Sequence[str | os.PathLike], keys: Sequence[PublicKey], *, replay: Callable[..., Any],
                    replay_run_dir: Callable[..., Any], thresholds: dict[str, float] | None = None,
                    mfu_range: tuple[float, float] = DEFAULT_MFU_RANGE, board_power_w: float | None = None,
                    progress: Callable[[str], None] | None = None,
                    utilisation: float | None = None) -> dict[str, Any]:
    """The statement of the runs at ``paths`` (run folders or journals; one model's), checked under ``keys`` and
    replayed by ``replay`` and ``replay_run_dir`` (:mod:`trainledger.audit`'s, which fold every package's projections:
    :func:`trainledger.audit.compute_statement` passes them).
    ``thresholds``: the cumulative compute to report against (default: 1e23 and 1e25 model FLOPs); ``mfu_range``:
    the tolerance between model- and hardware-based FLOPs; ``board_power_w``: the declared power of a device, for the
    energy estimate where nothing was measured; ``utilisation``: the hardware method's average utilisation, declared
    (default: the one measured from the run's executed FLOPs, format 1.10). Raises :class:`UsageError` for no key or a path that is not a run."""
    if not keys:
        raise UsageError("no key pinned: pass --pubkey FILE (or set TRAINLEDGER_TRUSTED_KEYS): a statement rests on "
                         "signatures by known keys")
    if not paths:
        raise UsageError("no run given: name the model's run folders or journals")
    lo, hi = mfu_range
    if not 0 < lo <= hi:
        raise UsageError(f"--mfu-range {lo},{hi}: needs 0 < LOW <= HIGH")
    if board_power_w is not None and not 0 < board_power_w < 1e6:
        raise UsageError(f"--board-power-w {board_power_w}: a device's power in watts (0 to 1e6)")
    if utilisation is not None and not 0 < utilisation <= 1:
        raise UsageError(f"--utilisation {utilisation}: the devices' average utilisation, above 0 and at most 1")
    findings: list[str] = []
    notes: list[str] = []
    runs: list[dict[str, Any]] = []
    where: dict[str, str] = {}
    for p in map(Path, paths):
        if progress is not None:
            progress(f"{p}: verifying")
        got = _replayed(p, keys, findings, replay, replay_run_dir, progress)
        if not got:
            continue
        rank0 = got[min(got)][1]
        ident = rank0.joined.run if rank0.joined is not None else rank0.run_id
        if ident in where:
            findings.append(f"{p}: run {ident} is also {where[ident]}: counted twice; counted once here")
            continue
        where[ident] = str(p)
        journals = []
        for r, (f, seen) in sorted(got.items()):
            if seen.compute is None:
                findings.append(f"{f}: no compute_totaled: the run did not total its compute (Recorder.close, "
                                "record_compute): its steps are not in the statement")
                continue
            if seen.steps_after:
                findings.append(f"{f}: {seen.steps_after:,} steps after its last compute_totaled (seq "
                                f"{seen.compute.seq}) are not in the statement")
            if not seen.closing():
                findings.append(f"{f}: {_not_last(seen.compute.seq)}")
            if seen.compute.busy_s is None:
                notes.append(f"{f}: a compute_totaled before format 1.7: model FLOPs only (no time, hardware or "
                             "energy)")
            if seen.compute.energy_resets:
                notes.append(f"{f}: the energy counter fell {seen.compute.energy_resets} time(s) (a driver reload, "
                             "a reset): those intervals are not in the measured energy")
            journals.append({"rank": r, "path": str(f), "compute": _fields(seen.compute),
                             "crossings": [dict(_fields(c), date=_date(c.ts)) for c in seen.crossings],
                             "bundle": _prove(f, seen, keys)})
        world = rank0.joined.world_size if rank0.joined is not None else 1
        present = {j["rank"] for j in journals}
        missing = [r for r in range(world) if r not in got]
        if missing:
            findings.append(f"{p}: rank(s) {_ranks(missing)} of {world} missing: their compute is not in the "
                            "statement")
        if not journals:
            continue
        first = got[min(got)][1]
        continues = _continued_run(first.continues) if first.continues is not None else None
        base = rank0.export.base if rank0.export is not None and 0 in present else None
        runs.append({"run": ident, "path": str(p), "world_size": world, "continues": continues,
                     "base": base, "export": rank0.export.digest if rank0.export is not None else None,
                     "journals": journals})
    _link(runs, findings, notes)
    th = dict(DEFAULT_COMPUTE_THRESHOLDS if thresholds is None else thresholds)
    for r in runs:
        r["figures"] = run_figures(r["journals"], board_power_w=board_power_w)
    return {"format": STATEMENT_FORMAT, "generated_ns": time.time_ns(), "thresholds": th,
            "mfu_range": [lo, hi], "board_power_w": board_power_w,
            **({} if utilisation is None else {"utilisation": utilisation}), "runs": runs,
            "figures": model_figures(runs, th, (lo, hi), utilisation=utilisation), "findings": findings,
            "notes": notes, "not_proven": NOT_PROVEN}


def _not_last(seq: int) -> str:
    return (f"its compute_totaled (seq {seq}) is not shown to be its last: the journal was not closed after it "
            "(or closed too many lines later), so the proof cannot reach its run_closed")


def _link(runs: list[dict[str, Any]], findings: list[str], notes: list[str]) -> None:
    """A run continued from one not in the statement is a gap; a fine-tune's base among the runs is its base run."""
    ids = {r["run"] for r in runs}
    by_export = {r["export"]: r["run"] for r in runs if r["export"] is not None}
    for r in runs:
        r["base_run"] = by_export.get(r["base"]) if r["base"] is not None else None
        if r["continues"] is not None and r["continues"] not in ids:
            findings.append(f"{r['path']}: continues run {r['continues']}, which is not in the statement: a gap (its "
                            "compute is missing)")
        if r["base"] is not None and r["base_run"] is None:
            notes.append(f"{r['path']}: fine-tuned from model {r['base'][:16]}..., not trained by a run in this "
                         "statement: its compute is the base model's provider's to state")


def _ranks(rs: list[int]) -> str:
    return ", ".join(map(str, rs[:8])) + (f" and {len(rs) - 8} more" if len(rs) > 8 else "")


def _date(ts_ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts_ns / 1e9))


# ------------------------------------------------------------------ checking a statement offline


class _Journal(msgspec.Struct, forbid_unknown_fields=True):
    rank: int
    path: str
    compute: dict[str, Any]
    crossings: list[dict[str, Any]]
    bundle: msgspec.Raw


class _Run(msgspec.Struct, forbid_unknown_fields=True):
    run: str
    path: str
    world_size: int
    continues: str | None
    base: str | None
    export: str | None
    journals: list[_Journal]
    base_run: str | None
    figures: dict[str, Any]


class _Statement(msgspec.Struct, forbid_unknown_fields=True):
    format: str
    generated_ns: int
    thresholds: dict[str, float]
    mfu_range: list[float]
    board_power_w: float | None
    runs: list[_Run]
    figures: dict[str, Any]
    findings: list[str]
    notes: list[str]
    not_proven: str
    #: the hardware method's utilisation, declared when the statement was built (format 1.10's figures)
    utilisation: float | None = None


def is_statement(data: bytes) -> bool:
    """Whether ``data`` opens like a compute statement (its format named in its first bytes)."""
    return b'"format":"' + STATEMENT_FORMAT.encode() + b'"' in data[:200].replace(b" ", b"").replace(b"\n", b"")


@dataclasses.dataclass
class StatementCheck:
    """What checking a statement established: the runs and journals whose proofs held, and the model's figures."""

    runs: int
    journals: int
    figures: dict[str, Any]
    #: the statement's own findings (what its builder found), as it states them
    findings: list[str]
    seconds: float
    #: what this check found itself: a total not shown to be its journal's last, the text of what the statement
    #: does not prove changed (each fails the check, as a statement's finding does)
    found: list[str] = dataclasses.field(default_factory=list)
    #: the regulation's own thresholds (DEFAULT_COMPUTE_THRESHOLDS) against the proven model FLOPs, evaluated here
    #: whatever thresholds the statement lists
    regulation: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: what no statement proves, as this check says it (never the statement's own text)
    not_proven: str = NOT_PROVEN
    #: what this check could not establish, said beside the verdict (a total written before format 1.8)
    caveats: list[str] = dataclasses.field(default_factory=list)


def _same(a: Any, b: Any) -> bool:
    return msgspec.json.encode(a) == msgspec.json.encode(b)


def check_statement(data: bytes, keys: Sequence[PublicKey]) -> StatementCheck:
    """Check a statement with no journal: every bundle's signature under ``keys`` (a rank key through its
    certificate) and proofs, every proven event the one the statement states, every rank of every run present, no
    run twice, and every figure recomputed from the proven events. Raises :class:`IntegrityError` (exit 1) when
    something does not hold; the statement's own findings are returned for the caller to report."""
    from trainledger.journal.roster import split_run_id
    from trainledger.journal.proofs.bundle import verify_bundle
    from trainledger.journal.proofs.bundle import decode_document

    t0 = time.perf_counter()
    if len(data) > MAX_STATEMENT_BYTES:
        raise UsageError(f"a statement of {len(data):,} bytes: more than {MAX_STATEMENT_BYTES:,}")
    if not keys:
        raise UsageError("no key pinned: pass --pubkey FILE (or set TRAINLEDGER_TRUSTED_KEYS)")
    st = decode_document(data, _Statement, STATEMENT_FORMAT, what="compute statement", short="statement",
                         limit=MAX_STATEMENT_BYTES)
    if not st.runs:
        raise IntegrityError("the statement holds no run: it proves nothing", seq=None)
    if len(st.runs) > _MAX_RUNS or sum(len(r.journals) for r in st.runs) > _MAX_JOURNALS:
        raise SchemaError("more runs or journals than any statement holds", seq=None)
    seen_runs: set[str] = set()
    runs_out = []
    n = 0
    found: list[str] = []
    caveats: list[str] = []
    if st.not_proven != NOT_PROVEN:
        found.append("the statement's text of what it does not prove is not the one trainledger writes (changed "
                     "after it was written): what it does not prove is printed by this check instead")
    for r in st.runs:
        if r.run in seen_runs:
            raise IntegrityError(f"run {r.run} is stated twice: its compute would be counted twice", seq=None)
        seen_runs.add(r.run)
        ranks = [j.rank for j in r.journals]
        if sorted(ranks) != list(range(r.world_size)) and not st.findings:
            raise IntegrityError(f"run {r.run}: {len(ranks)} journal(s) for a world of {r.world_size}, and no finding "
                                 "says so", seq=None)
        journals = []
        for j in r.journals:
            n += 1
            where = f"run {r.run} rank {j.rank}"
            try:
                res = verify_bundle(bytes(j.bundle), keys)
            except UsageError:
                raise
            except TrainledgerError as e:  # a signature, a proof, a key not pinned: the statement does not hold
                raise IntegrityError(f"{where}: {e}", seq=None) from None
            split = split_run_id(res.run_id)
            ident, rank = split if split is not None else (res.run_id, 0)
            by_kind: dict[str, list[Any]] = {}
            for ev in res.events:
                by_kind.setdefault(type(ev).__struct_config__.tag, []).append(ev)
            joined = by_kind.get("rank_joined", [])
            if joined:
                ident = joined[-1].run
                if j.rank == 0 and joined[-1].world_size != r.world_size:
                    raise IntegrityError(f"{where}: stated world size {r.world_size}, its rank_joined says "
                                         f"{joined[-1].world_size}", seq=None)
            if ident != r.run or rank != j.rank:
                raise IntegrityError(f"{where}: the bundle is of run {ident} rank {rank}", seq=None)
            totals = by_kind.get("compute_totaled", [])
            if len(totals) != 1 or not _same(_fields(totals[0]), j.compute):
                raise IntegrityError(f"{where}: the compute stated is not the compute_totaled the bundle proves"
                                     + (f" ({len(totals)} totals proven: one was left for an earlier one)"
                                        if len(totals) > 1 else ""), seq=None)
            total = totals[0]
            if not proven_to_close(res.events, total.seq):
                found.append(f"{where}: {_not_last(total.seq)}")
            crossed = sorted(by_kind.get("compute_threshold_crossed", []), key=lambda c: c.seq)
            if total.crossed is not None:
                names = [c.name for c in crossed if c.seq < total.seq]
                if names != list(total.crossed) or len(names) != len(crossed):
                    raise IntegrityError(f"{where}: its compute_totaled says the steps crossed "
                                         f"{', '.join(total.crossed) or 'no threshold'}; the statement proves "
                                         f"{', '.join(names) or 'no crossing'}: a crossing left out or added",
                                         seq=None)
            else:
                caveats.append(f"{where}: a total written before format 1.8 does not list the thresholds crossed: "
                               "whether every compute_threshold_crossed is in the statement cannot be shown")
            proven = [dict(_fields(c), date=_date(c.ts)) for c in crossed]
            if not _same(proven, j.crossings):
                raise IntegrityError(f"{where}: the thresholds stated crossed are not the ones the bundle proves",
                                     seq=None)
            if j.rank == 0:
                export = by_kind.get("model_exported", [])
                if (export[-1].digest if export else None) != r.export or \
                        (export[-1].base if export else None) != r.base:
                    raise IntegrityError(f"{where}: the export and base stated are not the bundle's", seq=None)
                resumed = [e for e in by_kind.get("run_resumed", []) if e.reason == "continued"]
                if (_continued_run(resumed[0]) if resumed else None) != r.continues:
                    raise IntegrityError(f"{where}: the run it continues is stated as {r.continues}, the bundle "
                                         "proves otherwise", seq=None)
            journals.append({"compute": j.compute})
        want = run_figures(journals, board_power_w=st.board_power_w)
        if not _same(want, r.figures):
            name = first_difference(r.figures, want, _same) or "the figures"
            raise IntegrityError(f"run {r.run}: the figure {name} stated is not the one its proven compute gives",
                                 seq=None)
        runs_out.append({"run": r.run, "figures": r.figures, "base_run": r.base_run})
    by_export = {r.export: r.run for r in st.runs if r.export is not None}
    for r in st.runs:
        if r.base_run != (by_export.get(r.base) if r.base is not None else None):
            raise IntegrityError(f"run {r.run}: its base run is stated as {r.base_run}, its proven base gives "
                                 f"{by_export.get(r.base) if r.base else None}", seq=None)
    lo, hi = (st.mfu_range + [0.0, 0.0])[:2]
    want = model_figures(runs_out, st.thresholds, (lo, hi), utilisation=st.utilisation)
    if not _same(want, st.figures):
        name = first_difference(st.figures, want, _same) or "the figures"
        raise IntegrityError(f"the model's figure {name} stated is not the one its runs' proven figures give",
                             seq=None)
    regulation = model_figures(runs_out, dict(DEFAULT_COMPUTE_THRESHOLDS), (lo, hi))["thresholds"]
    return StatementCheck(len(st.runs), n, st.figures, list(st.findings), time.perf_counter() - t0, found=found,
                          regulation=regulation, caveats=caveats)
