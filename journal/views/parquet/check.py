"""``trainledger verify OUT`` of a Parquet export (:mod:`.export`): the export alone re-verified, as trustworthy
once it passes as the journals and run folders it came from (docs/fleet.md, "Verify an export").

1. The folder's shape (:func:`check_tree`, ``query OUT`` runs the same): the listing (``receipts.json``, a regular
   file of at most 64 MiB) names every file once, each a plain path of the export's layout; ``OUT`` walked without
   following links holds the listing, the listed regular files and the folders on their paths, nothing else (no
   link, FIFO, socket, unlisted file or extra folder); each file hashes to its listed SHA-256.
2. An export written without ``--lines`` stops there: its rows cannot be checked against anything signed, so it is
   not verified (exit 1, saying so); its receipts are what the exporter says.
3. Otherwise each journal's lines are streamed, in seq order, straight into the verification (nothing written),
   bounded before a line is read (seqs, row count, no dictionary, the bytes claimed) and as they come (every batch
   at most ``BATCH_BYTES`` of lines, the line cap), and verified under the caller's trust as any journal is; the
   receipt rebuilt from them must be the listed one and every file's footer receipt. The events file's own cells
   are held to each line by the query that streams them; as the verification reads the lines, every other table
   is rebuilt from the verified events by the exporter's own code (the query layer's types) and must equal the
   exported file in its columns' names and types and row for row in seq order, both ways, a chunk at a time; a
   table the lines give rows for must have its file. DuckDB reads the files under a memory limit, spilling only
   into the private folder.
4. The ranks of one run are held together as ``verify RUN_DIR`` holds a run folder
   (:func:`~trainledger.journal.audit.rundir.hold_ranks`), on the reports of the lines just verified; ranks missing
   are recomputed from them (an error unless ``partial``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from trainledger.journal.roster import split_run_id
from trainledger.journal.copies import PrivateCopies
from trainledger.journal import paths
from trainledger.journal.errors import (IntegrityError, JournalIOError, SchemaError, TrainledgerError, UnsafePath,
                                        UsageError)
from trainledger.journal.paths import read_regular
from trainledger.journal.views.parquet.export import (EXPORT_FORMAT, LISTING, RECEIPT_KEY, _JournalWriter, _lit, _specs,
                                                file_name, folder_name, receipt_of, tables)
from trainledger.journal.views.query import VIEW_NAMES
from trainledger.journal.trust import TrustPolicy

__all__ = ["ExportCheck", "verify_export", "ExportMismatch", "NotVerifiable"]

MAX_LISTING = 64 << 20


class ExportMismatch(IntegrityError):
    """An export's file, receipt or cell is not what its lines (or its listing) say."""


class NotVerifiable(IntegrityError):
    """An export without its lines: nothing signed to hold its rows to."""


@dataclasses.dataclass
class ExportCheck:
    out: str
    journals: int
    events: int
    files: int
    lines: bool
    #: the trust of the verification just run (never the receipt's own word)
    trust: str | None
    receipts: list[dict[str, Any]]
    #: ``{run: missing ranks}`` of a run checked as far as its ranks present go (``partial``); empty when whole
    missing: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    #: ``{run: ranks}`` of the runs whose ranks were held together as ``verify RUN_DIR`` holds a run folder's
    runs: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def partial(self) -> bool:
        return bool(self.missing)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def read_listing(d: Path) -> tuple[dict[str, Any], bytes]:
    """The listing of export folder ``d`` and its bytes: a regular file (not a link) of at most MAX_LISTING."""
    p = d / LISTING
    try:
        data = read_regular(p, MAX_LISTING, what="listing")
    except FileNotFoundError:
        raise JournalIOError(f"{p}: no such file") from None
    except UnsafePath as e:  # a link, a FIFO, too large
        raise SchemaError(str(e), offset=None) from None
    try:
        listing = json.loads(data)
    except (ValueError, RecursionError):
        raise SchemaError(f"{p}: not JSON", offset=None) from None
    if not isinstance(listing, dict) or listing.get("format") != EXPORT_FORMAT or \
            not isinstance(listing.get("files"), list) or not isinstance(listing.get("journals"), list) or \
            not isinstance(listing.get("lines"), bool):
        raise SchemaError(f"{p}: not a {EXPORT_FORMAT} listing", offset=None)
    return listing, data


def _plain(d: Path, rel: Any) -> str:
    """A listed path: relative, plain components, nothing that leaves the export."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        raise ExportMismatch(f"{d}: listed path {str(rel)[:120]!r} is not a relative path", seq=None)
    parts = PurePosixPath(rel).parts
    if PurePosixPath(rel).is_absolute() or any(x in ("", ".", "..") for x in parts) or \
            PurePosixPath(*parts).as_posix() != rel:
        raise ExportMismatch(f"{d}: listed path {rel[:120]!r} leaves the export", seq=None)
    return rel


def open_regular(d: Path, rel: str) -> int:
    """The listed file ``rel`` of ``d`` opened for reading (:func:`~trainledger.journal.paths.open_regular`: never
    through a final link, never blocking on a FIFO, a regular file), else :class:`ExportMismatch` naming it."""
    try:
        return paths.open_regular(d / rel, what="listed file")
    except FileNotFoundError:
        raise ExportMismatch(f"{d}: {rel}: listed but missing", seq=None) from None
    except UnsafePath as e:
        raise ExportMismatch(f"{d}: {rel}: {str(e)[len(str(d / rel)) + 2:]}", seq=None) from None  # what, not where


def check_tree(d: Path, listing: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What ``d`` holds, held to its listing (``verify OUT`` and ``query OUT`` alike): every file entry well formed
    (a plain relative path, its SHA-256, its table the path's first folder), listed once; and every entry of the
    folder, looked at without following links, is the listing, a listed regular file, or a folder on a listed
    file's path: a link (to a file or a folder, dangling or not), a FIFO, a socket, a device, an unlisted file or
    an extra folder is refused (a reader's glob or dataset scan would follow or read it). Returns ``{path:
    entry}``."""
    files: dict[str, dict[str, Any]] = {}
    known = set(tables())
    for x in listing["files"]:
        if not isinstance(x, dict) or not isinstance(x.get("path"), str) or not isinstance(x.get("sha256"), str):
            raise SchemaError(f"{d / LISTING}: a file entry without path and sha256", offset=None)
        rel = _plain(d, x["path"])
        if rel in files:
            raise ExportMismatch(f"{d}: {rel} is listed twice", seq=None)
        table = rel.split("/", 1)[0]
        if table not in known or rel.count("/") != 2:
            raise ExportMismatch(f"{d}: {rel}: not a file of the export's layout (TABLE/run-RUN/FILE)", seq=None)
        if x.get("table", table) != table:
            raise ExportMismatch(f"{d}: {rel}: listed as table {str(x.get('table'))[:60]!r}, but its path is "
                                 f"{table}'s", seq=None)
        files[rel] = x
    folders = {str(PurePosixPath(rel).parents[i]) for rel in files for i in range(len(PurePosixPath(rel).parts) - 1)}
    seen: set[str] = set()
    todo = [("", d)]
    while todo:
        base, p = todo.pop()
        try:
            entries = list(os.scandir(p))
        except OSError as e:
            raise JournalIOError(f"{p}: {e.strerror}") from None
        for entry in entries:
            rel = f"{base}/{entry.name}" if base else entry.name
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError:
                raise ExportMismatch(f"{d}: {rel}: gone while it was being looked at", seq=None) from None
            if stat.S_ISLNK(mode):
                raise ExportMismatch(f"{d}: {rel}: a link (an export holds files only)", seq=None)
            if stat.S_ISDIR(mode):
                if rel not in folders:
                    raise ExportMismatch(f"{d}: {rel}: a folder no listed file is in (planted)", seq=None)
                todo.append((rel, Path(entry.path)))
            elif not stat.S_ISREG(mode):
                raise ExportMismatch(f"{d}: {rel}: not a regular file (a FIFO, socket or device)", seq=None)
            elif rel != LISTING and rel not in files:
                raise ExportMismatch(f"{d}: {rel}: not in the listing (a planted file)", seq=None)
            else:
                seen.add(rel)
    for rel in sorted(set(files) - seen):
        raise ExportMismatch(f"{d}: {rel}: listed but missing", seq=None)
    return files


def hash_regular(d: Path, rel: str) -> str:
    """The SHA-256 of the listed file ``rel`` of ``d``, read through :func:`open_regular`."""
    with os.fdopen(open_regular(d, rel), "rb") as f:
        return paths.stream_sha256(f)[0]


def held_to_listing(d: Path, rel: str, digest: str, entry: dict[str, Any]) -> None:
    """Raise :class:`ExportMismatch` unless ``digest`` (the SHA-256 of ``d``'s file ``rel``) is its listing
    ``entry``'s."""
    if digest != entry["sha256"]:
        raise ExportMismatch(f"{d}: {rel}: its SHA-256 is not the listed one (changed after the export)", seq=None)


def verify_export(out: str | os.PathLike, *, trust: TrustPolicy | None = None, partial: bool = False,
                  expect: dict[str, Any] | None = None, _digests: dict[str, str] | None = None,
                  **trust_options: Any) -> ExportCheck:
    """Re-verify the export folder ``out`` (see the module doc). Raises :class:`ExportMismatch` naming the file,
    table or journal that is not what its lines say, :class:`NotVerifiable` for an export without its lines, what
    verification raises for lines that do not verify, and what ``verify RUN_DIR`` raises for a run's ranks that do
    not hold together (:class:`~trainledger.journal.audit.rundir.AnchorMismatch`, ``RosterMismatch``).
    ``partial``: a run with ranks missing is checked as far as the ranks present go, and the check's ``missing``
    names them (recomputed from the verified lines, never read from the listing). ``expect``: what one journal must
    contain, as ``verify --expect-head`` and ``--expect-checkpoint`` hold a journal to it: ``{"head": (seq, hash)}``
    for an export of one journal, ``{"checkpoint": an opened checkpoint, "run": the run id its origin names}`` (and
    a head with it) for that run's journal, which the export must hold. ``_digests``: ``{path: SHA-256}`` of files
    hashed as they were written into ``out`` (:mod:`.read`'s private copy), held to the listing instead of read
    again."""
    d = Path(out)
    policy = TrustPolicy.of(trust, **trust_options)
    listing, _ = read_listing(d)
    files = check_tree(d, listing)
    for rel, x in files.items():
        held_to_listing(d, rel, _digests[rel] if _digests is not None and rel in _digests else hash_regular(d, rel), x)
    if not listing["lines"]:
        raise NotVerifiable(f"{d}: exported without --lines: its files match the listing, but nothing signed holds "
                            "its rows; it is as trustworthy as whoever exported it", seq=None)
    if not listing["journals"]:
        raise SchemaError(f"{d / LISTING}: names no journal: nothing to verify", offset=None)
    events = 0
    receipts = []
    checked: set[str] = set()
    runs: set[str] = set()
    trusts: list[str] = []
    ranks: dict[str, dict[int, Any]] = {}  # run -> rank -> its verification report
    held_to = None
    if expect:
        ids = [rc.get("run_id") for rc in listing["journals"] if isinstance(rc, dict)]
        held_to = expect.get("run")
        if held_to is None:
            if len(ids) != 1:
                raise UsageError(f"{d}: --expect-head names one journal's head, and this export holds {len(ids)}: "
                                 "hold a run's journal to its published checkpoint with --expect-checkpoint NOTE")
            held_to = ids[0]
        if held_to not in ids:
            raise ExportMismatch(f"{d}: the expected checkpoint is of run {str(held_to)[:80]!r}, which this export "
                                 "does not hold", seq=None)
    with PrivateCopies() as work:
        for rc in listing["journals"]:
            if not isinstance(rc, dict) or not isinstance(rc.get("run_id"), str):
                raise SchemaError(f"{d / LISTING}: a journal entry without a run id", offset=None)
            if rc["run_id"] in runs:
                raise ExportMismatch(f"{d}: run {rc['run_id']} is listed twice", seq=None)
            runs.add(rc["run_id"])
            mine = policy if rc["run_id"] != held_to else dataclasses.replace(
                policy, expect_head=expect.get("head"), expect_checkpoint=expect.get("checkpoint"))
            n, rels, rep = _check_journal(d, rc, files, mine, work.dir)
            events += n
            checked |= rels
            receipts.append(rc)
            trusts.append(rep.trust)
            split = split_run_id(rep.run_id)
            if split is not None:
                ranks.setdefault(split[0], {})[split[1]] = rep
        stray = sorted(set(files) - checked)
        if stray:  # listed, hashed, but held to no journal's lines: a reader's glob would still pick it up
            raise ExportMismatch(f"{d}: {stray[0]}: listed, but of no journal the export verifies", seq=None)
        missing = _hold_runs(d, ranks, policy, partial, work.dir)
    trust_word = trusts[0] if len(set(trusts)) == 1 else ", ".join(sorted(set(trusts)))
    return ExportCheck(out=str(d), journals=len(receipts), events=events, files=len(files), lines=True,
                       trust=trust_word, receipts=receipts, missing=missing,
                       runs={run: len(rs) for run, rs in sorted(ranks.items())})


def _hold_runs(d: Path, ranks: dict[str, dict[int, Any]], policy: TrustPolicy, partial: bool,
               work: Path) -> dict[str, list[int]]:
    """Every run's ranks in the export held together as ``verify RUN_DIR`` holds a run folder's (one run, world
    sizes, every anchor, keys and roster, no rank missing unless ``partial``), from the reports of the lines just
    verified. Returns ``{run: missing ranks}`` of partial ones."""
    from trainledger.journal.audit.rundir import hold_ranks

    missing = {}
    for run, reports in sorted(ranks.items()):
        def rescan(r: int, seqs: frozenset[int]) -> Any:
            # an anchor at a line that is not a seal: that rank's lines verified again, handing back those hashes
            return _verified_lines(d, f"events/run-{folder_name(reports[r].run_id)}/{file_name(r)}", policy, work,
                                   seqs=seqs)[0]

        where = f"{d} (run {run})"
        try:
            rep = hold_ranks(where, reports, trust=policy, partial=partial, rescan=rescan)
        except TrainledgerError as e:
            e.path = str(d)
            raise
        if rep.missing:
            missing[where] = rep.missing
    return missing


#: what DuckDB may hold in memory while an export is checked; past it, it spills into the private folder (never
#: the working folder) or fails: a file's cells can never make the check take the machine's memory
MEMORY_LIMIT = "512MB"
#: lines handed on at a time (a batch's rows are sized from the longest line)
BATCH_BYTES = 32 << 20


def _connection(work: Path) -> Any:
    from trainledger.journal.views.query import new_connection

    con = new_connection()
    spill = work / "spill"
    spill.mkdir(mode=0o700, exist_ok=True)
    con.execute("SET threads = 1")  # one thread: rows come back in file order
    con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
    con.execute(f"SET temp_directory = {_lit(str(spill))}")
    return con


def _verified_lines(d: Path, ev_rel: str, policy: TrustPolicy, work: Path, *, seqs: frozenset[int] = frozenset(),
                    events: int | None = None, con: Any = None, consume: Any = None,
                    held: str = "true") -> tuple[Any, int, Any]:
    """The events file's lines verified under ``policy`` as any journal is, streamed from the file in seq order
    straight into the verification (:class:`_LineStream`: nothing is written; each batch's seqs held to be the next
    ones and each line to a journal's line cap before a block of it is checked). Returns (the verification report,
    with the anchor kinds and ``seqs``' hashes collected; the number of lines; the ``run_opened`` record). Refuses
    before reading a line: an events file whose seqs do not run from 0 to n - 1, n other than the receipt's
    ``events``, a ``line`` column stored with a dictionary (the exporter never writes one: a dictionary is how a small
    file decodes to a huge one) or that claims more bytes than its rows' lines may hold. ``consume(records,
    lines)``: handed the verified events as the verification reads them (:class:`_Holder`); what it raises
    propagates as it is. ``held``: what every row must hold of its line, an SQL condition over the file's columns
    (:func:`_events_held`), checked as it is read."""
    import duckdb

    from trainledger.journal.audit.rundir import _ANCHOR_KINDS
    from trainledger.journal.scan import MAX_LINE
    from trainledger.journal.verify import Verification, read_opening, verify_with

    path = d / ev_rel
    src = f"read_parquet({_lit(str(path))})"
    own = con is None
    con = _connection(work) if own else con
    try:
        try:
            meta = con.execute(
                "SELECT count(*), coalesce(sum(total_uncompressed_size), 0), "
                "bool_or(encodings ILIKE '%DICTIONARY%') FROM parquet_metadata(?) WHERE path_in_schema = 'line'",
                [str(path)]).fetchone()
            rows = con.execute("SELECT coalesce(sum(num_rows), 0) FROM parquet_file_metadata(?)", [str(path)]
                               ).fetchone()[0]
            if not meta[0]:
                raise ExportMismatch(f"{d}: {ev_rel}: no line column: nothing signed to hold its rows to", seq=None)
            if events is not None and rows != events:
                raise ExportMismatch(f"{d}: {ev_rel}: {rows} rows, where its receipt says {events} events",
                                     seq=None)
            if meta[2]:
                raise ExportMismatch(f"{d}: {ev_rel}: its line column is stored with a dictionary (an exporter "
                                     "never writes one)", seq=None)
            if meta[1] > rows * (MAX_LINE + 8):
                raise ExportMismatch(f"{d}: {ev_rel}: its line column claims {meta[1]:,} bytes, more than "
                                     f"{rows:,} lines may hold", seq=None)
            # each once is held as they stream (every row's seq the next one): a distinct count here would hold
            # a hash table of every seq, the one cost of the check that grew with the journal
            n, lo, hi = con.execute(f"SELECT count(*), min(seq), max(seq) FROM {src}").fetchall()[0]
            if n and (lo != 0 or hi != n - 1):
                raise ExportMismatch(f"{d}: {ev_rel}: its seqs are not 0 to {n - 1}", seq=None)
        except duckdb.Error as e:
            raise ExportMismatch(f"{d}: {ev_rel}: not an events table: {str(e).splitlines()[0]}", seq=None) from None
        stream = _LineStream(con, src, d, ev_rel, rows=rows, claimed=int(meta[1]), held=held)
        try:
            opened = read_opening(path, 0, _source=stream)[0]
            rep = verify_with(path, Verification(collect=(_ANCHOR_KINDS, seqs), source=stream,
                                                 consume=consume if consume is not None else _ignore,
                                                 with_lines=consume is not None), trust=policy)
        except _StreamFailed as e:  # the stream's own finding: named by the exported file already
            raise e.error from None
        if stream.want != n:  # pragma: no cover - the seqs were counted, and each batch held to them
            raise ExportMismatch(f"{d}: {ev_rel}: {stream.want} lines read of its {n} rows", seq=None)
        return rep, n, opened
    except TrainledgerError as e:  # named by the exported file its lines came from
        if not getattr(e, "held", False):  # the holder's own finding names its file already
            _rename(e, d, ev_rel)
        raise
    finally:
        if own:
            con.close()


def _ignore(*_: Any) -> None:
    pass


class _StreamFailed(TrainledgerError):
    """What the stream of lines found wrong (an :class:`ExportMismatch`), carried through the verification, which
    would take an integrity error for the journal's own (it is none: the scan passes it on); raised as that error
    once out of it."""

    exit_code = 1

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class _LineStream:
    """An events file's lines, in seq order, as a journal file's reader has them: blocks of whole lines, each line
    with its newline, about a read block's size (``verify``'s ``_source``). DuckDB hands over the lines a batch of
    rows at a time, each batch at most ``BATCH_BYTES`` of lines whatever the file's cells: a line longer than a
    batch's share comes back as its length alone, and is read again with the few others of its batch (a batch of
    them at a time, sized by their lengths), or refused past a journal's line cap, naming its seq. Each row's seq
    is held to be the next one and every row to have a line before its batch is handed on. ``prefix(n)``: the first
    blocks, kept for :meth:`blocks`; ``certificates()``: the lines opening as ``key_certified`` does, decoded (what
    :func:`~trainledger.journal.certify.find_certificates` finds in a file), read by a query of their own."""

    def __init__(self, con: Any, src: str, d: Path, ev_rel: str, *, rows: int, claimed: int,
                 held: str = "true") -> None:
        self.con, self.src, self.d, self.ev_rel, self.held = con, src, d, ev_rel, held
        # rows a batch: about eight times the claimed mean line each in BATCH_BYTES (a claim that lies costs reads
        # again, never memory: a line past its share is never in a batch)
        mean = max(1, claimed // max(1, rows))
        self.per = max(1, min(ROW_BATCH, BATCH_BYTES // (8 * mean)))
        self.share = max(1, BATCH_BYTES // self.per)
        self.want = 0  # the next seq
        self.offset = 0  # bytes handed on
        self.again = 0  # pieces whose long lines were read again
        self.sized = False  # the batches sized by the file's longest line (no line is long after that)
        self._held: list[tuple[bytes, int]] = []
        self._it = self._all()

    def _fail(self, msg: str, seq: int | None) -> _StreamFailed:
        return _StreamFailed(ExportMismatch(f"{self.d}: {self.ev_rel}: {msg}", seq=seq))

    def _all(self) -> Any:
        import duckdb
        import pyarrow as pa

        from trainledger.journal.scan import MAX_LINE

        reader = None
        try:
            reader = self._reader()
            while True:
                try:
                    batch = reader.read_next_batch()
                except StopIteration:
                    return
                if not batch.num_rows:
                    continue
                seq, line, length = batch.column(0), batch.column(1), batch.column(2)
                lens = self._held_to(seq, length, MAX_LINE, batch.column(3))
                long = lens > self.share
                for a, b in _pieces(lens, BATCH_BYTES):  # a batch's rows, a piece at most BATCH_BYTES of lines
                    part = line.slice(a, b - a)
                    if long[a:b].any():
                        if self.again >= AGAIN:  # long lines are not rare: the rest read in batches sized for them
                            self.want += a
                            reader.close()
                            reader = self._sized_reader()
                            break
                        self.again += 1
                        part = self._read_again(part, long[a:b], lens[a:b], self.want + a)
                    yield from self._blocks(part)
                else:
                    self.want += batch.num_rows
        except duckdb.OutOfMemoryException:
            raise self._fail(f"decoding its lines needs more memory than a check may use ({MEMORY_LIMIT}): no "
                             "journal's lines need that", None) from None
        except (duckdb.Error, pa.ArrowException) as e:
            raise self._fail(f"not an events table: {str(e).splitlines()[0]}", None) from None
        finally:
            if reader is not None:
                reader.close()

    def _reader(self) -> Any:
        """The file's rows from seq ``want`` on, in file order, a batch of ``per`` rows at a time: arrays, no Python
        object a row (strlen(NULL) is NULL: a row without a line is refused by :meth:`_held_to`)."""
        return self.con.cursor().sql(
            f"SELECT seq, CASE WHEN strlen(line) <= {self.share} THEN line END, strlen(line), "
            f"coalesce({self.held}, false) FROM {self.src}" + (f" WHERE seq >= {self.want}" if self.want else "")
        ).to_arrow_reader(self.per)

    def _sized_reader(self) -> Any:
        """:meth:`_reader` with its batches sized by the file's longest line (one pass for it), so that no line is
        read again: a file whose claimed mean hides many long lines costs one more pass, never a query a few lines
        (each may read the whole file where its statistics do not narrow it). The rows before ``want`` were each
        the next seq, so those from it on are the rest of the file; a line still long means the file changed."""
        if self.sized:
            raise self._fail(f"its lines from seq {self.want} did not read the same twice (changed while it was "
                             "read)", self.want)
        longest = self.con.cursor().execute(f"SELECT max(strlen(line)) FROM {self.src}").fetchall()[0][0] or 1
        self.per = max(1, min(ROW_BATCH, BATCH_BYTES // max(1, longest)))
        self.share = max(1, BATCH_BYTES // self.per)
        self.sized = True
        return self._reader()

    def _held_to(self, seq: Any, length: Any, cap: int, held: Any) -> Any:
        """The batch's line lengths, each row's seq held to be the next, its line to be there and at most ``cap``
        bytes, and the row to be what its line gives (``held``)."""
        import numpy as np

        k = len(seq)
        want = np.arange(self.want, self.want + k, dtype=np.int64)
        lens = length.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        # a row without a seq reads as seq -1: never the one wanted
        wrong = (lens < 0) | (seq.fill_null(-1).to_numpy(zero_copy_only=False) != want)
        if wrong.any():
            bad = self.want + int(np.argmax(wrong))
            raise self._fail(f"the row at seq {bad} is out of order or has no line", bad)
        if k and int(lens.max()) > cap:
            at = self.want + int(np.argmax(lens))
            raise self._fail(f"the line at seq {at} is {int(lens.max()):,} bytes, longer than a journal's line may "
                             f"be ({cap:,})", at)
        bad = ~held.to_numpy(zero_copy_only=False)
        if bad.any():
            at = self.want + int(np.argmax(bad))
            raise self._fail(f"{int(bad.sum())} row(s) are not what the lines give (first at seq {at})", at)
        return lens

    def _read_again(self, part: Any, long: Any, lens: Any, first: int) -> Any:
        """``part`` (rows from seq ``first``) with its lines past a batch's share read again, in batches sized by
        their lengths; every one must come back, in order (else the file changed while it was read)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        at = first + np.flatnonzero(long)
        per = max(1, BATCH_BYTES // int(lens[long].max()))
        reader = self.con.cursor().sql(
            f"SELECT seq, line FROM {self.src} WHERE seq >= {int(at[0])} AND seq <= {int(at[-1])} "
            f"AND strlen(line) > {self.share}").to_arrow_reader(per)
        got_seq, got = [], []
        for batch in reader:
            got_seq.append(batch.column(0).to_numpy(zero_copy_only=False))
            got.append(batch.column(1))
        reader.close()
        seqs = np.concatenate(got_seq) if got_seq else np.empty(0, np.int64)
        if len(seqs) != len(at) or (seqs != at).any():
            raise self._fail(f"its lines from seq {int(at[0])} did not read the same twice (changed while it was "
                             "read)", int(at[0]))
        return pc.replace_with_mask(part, pa.array(long), pa.chunked_array(got, part.type).combine_chunks())

    def _blocks(self, line: Any) -> Any:
        """``line``'s lines as blocks of whole lines, each with its newline, about BLOCK bytes each."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from trainledger.journal.scan import BLOCK

        k = len(line)
        if not k:
            return
        if not pa.types.is_large_string(line.type):
            line = line.cast(pa.large_string())
        # a newline after each line, in one pass in Arrow: the joined column's data is the lines, one after another
        joined = pc.binary_join_element_wise(line, pa.scalar("\n", line.type), pa.scalar("", line.type))
        ends = np.frombuffer(joined.buffers()[1], dtype=np.int64, count=k + 1, offset=8 * joined.offset)
        data = memoryview(joined.buffers()[2])
        i = 0
        while i < k:
            j = max(i + 1, int(np.searchsorted(ends, ends[i] + BLOCK, "right")) - 1)
            block = bytes(data[ends[i]:ends[j]])
            yield block, self.offset
            self.offset += len(block)
            i = j

    def prefix(self, n: int) -> bytes:
        have = sum(len(b) for b, _ in self._held)
        while have < n:
            nxt = next(self._it, None)
            if nxt is None:
                break
            self._held.append(nxt)
            have += len(nxt[0])
        return b"".join(b for b, _ in self._held)

    def blocks(self) -> Any:
        held, self._held = self._held, []
        yield from held
        yield from self._it

    def certificates(self) -> list[Any]:
        import duckdb

        from trainledger.journal.certify import _MAX_CERT_LINE, _PATTERN, take_certificate

        out: list[Any] = []
        opening = _PATTERN[1:].decode()
        try:
            reader = self.con.cursor().sql(
                f"SELECT seq, CASE WHEN strlen(line) < {_MAX_CERT_LINE} THEN line END, strlen(line) "
                f"FROM {self.src} WHERE starts_with(line, {_lit(opening)}) AND seq > 0 ORDER BY seq"
            ).to_arrow_reader(max(1, BATCH_BYTES // _MAX_CERT_LINE))
            for batch in reader:
                for seq, line, n in zip(*(c.to_pylist() for c in batch.columns)):
                    take_certificate(line.encode() if line is not None else b"", out, seq=seq, length=n)
        except duckdb.Error as e:
            raise self._fail(f"not an events table: {str(e).splitlines()[0]}", None) from None
        return out


def _pieces(lens: Any, cap: int) -> list[tuple[int, int]]:
    """Rows ``[a, b)`` covering ``lens`` in order, each piece's lengths summing to at most ``cap`` (a row alone when
    it is longer)."""
    import numpy as np

    total = int(lens.sum())
    if total <= cap:
        return [(0, len(lens))]
    ends = np.cumsum(lens)
    out, a = [], 0
    while a < len(lens):
        base = int(ends[a - 1]) if a else 0
        b = max(a + 1, int(np.searchsorted(ends, base + cap, "right")))
        out.append((a, b))
        a = b
    return out


#: rows handed on at a time at most
ROW_BATCH = 65_536
#: pieces of a stream whose long lines are read again by a query of their own, at most (then one pass sizes the
#: batches by the longest line instead)
AGAIN = 4


def _rename(e: Exception, d: Path, ev_rel: str) -> None:
    msg = str(e.args[0]).replace(str(d / ev_rel), ev_rel) if e.args else ""
    e.args = (msg if msg.startswith(ev_rel) or msg.startswith(str(d)) else f"{ev_rel}: {msg}",) + tuple(e.args[1:])
    e.path = f"{d / ev_rel}"
    if getattr(e, "report", None) is not None:
        e.report.path = str(d / ev_rel)


def _footer(con: Any, path: Path) -> Any:
    got = con.execute("SELECT value FROM parquet_kv_metadata(?) WHERE key = ?", [str(path), RECEIPT_KEY.encode()]
                      ).fetchall()
    if len(got) != 1:
        return None
    try:
        return json.loads(got[0][0])
    except (ValueError, RecursionError, UnicodeDecodeError):
        return None


def _check_journal(d: Path, rc: dict[str, Any], files: dict[str, dict[str, Any]], policy: TrustPolicy,
                   work: Path) -> tuple[int, set[str], Any]:
    """One journal of the export: its lines verified, its typed files held to them; (events, the files checked,
    its verification report)."""
    run, rank = rc["run_id"], rc.get("rank")
    if rank is not None and (not isinstance(rank, int) or isinstance(rank, bool)):
        raise SchemaError(f"{d / LISTING}: run {run}: rank {rank!r} is not an int", offset=None)
    sub = f"run-{folder_name(run)}/{file_name(rank)}"
    ev_rel = f"events/{sub}"
    if ev_rel not in files:
        raise ExportMismatch(f"{d}: run {run}: no events file ({ev_rel})", seq=None)
    events = rc.get("events") if isinstance(rc.get("events"), int) else None
    con = _connection(work)  # one for the journal: its lines streamed out, then its tables held to them
    holder = _Holder(con, d, rc, files, sub)
    try:
        rep, n, opened = _verified_lines(d, ev_rel, policy, work, events=events, con=con, consume=holder,
                                         held=_events_held(run, rank))
        _hold_receipt(d, rc, ev_rel, rep, opened, n)
        holder.finish(n)
    finally:
        holder.abandon()
        con.close()
    return n, {f"{table}/{sub}" for table in tables() if f"{table}/{sub}" in files}, rep


def _events_held(run: str, rank: int | None) -> str:
    """What an events row must hold of its line, as SQL over the events file's columns (their types held first):
    the journal's run and rank, and the kind, seq, ts and h its verified line has. A verified line opens with
    ``{"kind":"KIND",`` (a kind has no quote) and ends with ``,"seq":SEQ,"ts":TS,"h":"H"}``, H 64 hex digits: a
    cell that differs from its line fails to match (an h of exactly 64 characters, and a kind without a quote, cannot
    reach past their own place in the line)."""
    return (f"run_id = {_lit(run)} AND rank IS NOT DISTINCT FROM {int(rank) if rank is not None else 'NULL'} "
            """AND NOT contains(kind, '"') AND strlen(h) = 64 AND starts_with(line, '{"kind":"' || kind || '",') """
            """AND ends_with(line, ',"seq":' || seq || ',"ts":' || ts || ',"h":"' || h || '"}')""")


def _hold_receipt(d: Path, rc: dict[str, Any], ev_rel: str, rep: Any, opened: Any, n: int) -> None:
    """A journal's verified lines held to its receipt: the receipt rebuilt from them, as the exporter built it, must
    be the listed one (but for what only the export knew: its source file's name, its version, the trust it ran
    under), every line of them trusted."""
    from trainledger.journal.views.query import _file_row

    run = rc["run_id"]
    path = d / ev_rel
    row = {**_file_row(path, rep), "file": str(path), "copy": str(path), "opened": opened}
    if row["run_id"] != run:
        raise ExportMismatch(f"{d}: {ev_rel}: the lines are run {row['run_id']!r}, the receipt says {run!r}",
                             seq=None)
    mine = receipt_of(row, lines=True, exported=n)
    wrong = [k for k in mine if k not in ("source", "exporter", "trust") and mine[k] != rc.get(k)]
    if wrong or row["trusted_bytes"] != row["size"]:
        k = wrong[0] if wrong else "head"
        raise ExportMismatch(f"{d}: run {run}: its lines give {k} {str(mine.get(k))[:80]!r}; its receipt says "
                             f"{str(rc.get(k))[:80]!r}", seq=None)


def _held(e: ExportMismatch) -> ExportMismatch:
    e.held = True  # raised inside the verification: it names its own file (see _verified_lines)
    return e


class _Holder(_JournalWriter):
    """A journal's tables rebuilt from its verified events as the exporter builds them (the same code: the events
    table without its lines, which are the ones verified), and each exported file held to them a chunk at a time
    as they come, instead of written: its columns' names and types, then row for row in seq order (NULL and NaN
    equal themselves), both ways; then its listing entry and footer. Memory: a chunk of events and a batch of
    each file's rows, read by DuckDB under the check's memory limit (a file's cells cannot take more)."""

    def __init__(self, con: Any, d: Path, rc: dict[str, Any], files: dict[str, dict[str, Any]], sub: str) -> None:
        rank = rc.get("rank")
        # the events rows are held to their lines by the stream that reads them (_events_held), not rebuilt
        super().__init__(d, Path(sub), rc["run_id"], rank, lines=False, specs=_specs(), con=con,
                         only=frozenset(tables()) - {"events"})
        self.d, self.rc, self.files, self.sub = d, rc, files, sub
        #: table -> [its file's rows as DuckDB reads them, the rows read but not yet held, rows held]
        self.open: dict[str, list[Any]] = {}

    def _write(self, table: str, data: Any) -> None:
        rel = f"{table}/{self.sub}"
        if rel not in self.files:
            raise _held(ExportMismatch(f"{self.d}: run {self.rc['run_id']}: its lines have {table} rows, and the "
                                       f"export has no {rel}", seq=None))
        st = self.open.get(table)
        if st is None:
            st = self.open[table] = [self._reader(rel, data.schema), None, 0]
        theirs = self._take(st, rel, data.num_rows)
        bad = _differences(data, theirs)
        if bad is not None:
            first, count = bad
            seq = data.column("seq")[first].as_py() if first < data.num_rows else None
            raise _held(ExportMismatch(f"{self.d}: {rel}: {count} row(s) are not what the lines give"
                                       + (f" (first at seq {seq})" if seq is not None else " (rows missing)"),
                                       seq=seq))
        st[2] += data.num_rows

    def _reader(self, rel: str, schema: Any) -> Any:
        """The exported file's columns, after its listing entry, footer and column types are held to what the lines
        give (:meth:`shape`)."""
        import duckdb

        want = self.shape(rel, schema)
        try:
            cols = ", ".join('"' + c.replace('"', '""') + '"' for c, _ in want)
            return self.con.cursor().sql(f"SELECT {cols} FROM read_parquet({_lit(str(self.d / rel))})"
                                         ).to_arrow_reader(ROW_BATCH)
        except duckdb.Error as e:
            raise _held(ExportMismatch(f"{self.d}: {rel}: not the table it should be: {str(e).splitlines()[0]}",
                                       seq=None)) from None

    def shape(self, rel: str, schema: Any) -> list[tuple[str, str]]:
        """The exported file's listing entry, footer and columns' names and types (the events file's but its
        lines) held to what the lines give; its columns."""
        import duckdb

        path = self.d / rel
        want = self._types(schema)
        try:  # the file's footer and columns, as DuckDB reads them: a file that is no Parquet is named
            self._entry_and_footer(rel)
            have = [(c[0], c[1]) for c in self.con.execute(
                f"DESCRIBE SELECT * FROM read_parquet({_lit(str(path))})").fetchall()]
            if rel.startswith("events/"):
                have = [c for c in have if c[0] != "line"]
            if want != have:
                diff = next(((a, b) for a, b in zip(want, have) if a != b), None)
                what = (f"column {diff[1][0]} is {diff[1][1]}, the lines give {diff[0][0]} {diff[0][1]}"
                        if diff is not None else f"{len(have)} columns, the lines give {len(want)}")
                raise _held(ExportMismatch(f"{self.d}: {rel}: {what}", seq=None))
            return want
        except duckdb.Error as e:
            raise _held(ExportMismatch(f"{self.d}: {rel}: not the table it should be: {str(e).splitlines()[0]}",
                                       seq=None)) from None

    def _types(self, schema: Any) -> list[tuple[str, str]]:
        """The DuckDB types of a rebuilt table's columns (JSON cells are stored as Parquet strings)."""
        import pyarrow as pa

        self.con.register("held_schema", pa.Table.from_batches([], schema=schema))
        try:
            return [(c[0], "VARCHAR" if c[1] == "JSON" else c[1])
                    for c in self.con.execute("DESCRIBE SELECT * FROM held_schema").fetchall()]
        finally:
            self.con.unregister("held_schema")

    def _take(self, st: list[Any], rel: str, k: int) -> Any:
        """The next ``k`` rows of a file (fewer at its end), as one table."""
        import duckdb
        import pyarrow as pa

        got, have = [], 0
        while have < k:
            batch = st[1]
            st[1] = None
            if batch is None:
                try:
                    batch = st[0].read_next_batch()
                except StopIteration:
                    break
                except duckdb.OutOfMemoryException:
                    raise _held(ExportMismatch(f"{self.d}: {rel}: decoding it needs more memory than a check may "
                                               f"use ({MEMORY_LIMIT}): no journal's rows need that", seq=None)) from None
                except (duckdb.Error, pa.ArrowException) as e:
                    raise _held(ExportMismatch(f"{self.d}: {rel}: not the table it should be: "
                                               f"{str(e).splitlines()[0]}", seq=None)) from None
            if have + batch.num_rows > k:
                st[1] = batch.slice(k - have)
                batch = batch.slice(0, k - have)
            got.append(batch)
            have += batch.num_rows
        return pa.Table.from_batches(got, schema=st[0].schema)

    def _entry_and_footer(self, rel: str) -> None:
        entry, run, rank = self.files[rel], self.rc["run_id"], self.rc.get("rank")
        if entry.get("run_id", run) != run or entry.get("rank", rank) != rank:
            raise _held(ExportMismatch(f"{self.d}: {rel}: listed as run {str(entry.get('run_id'))[:80]!r} rank "
                                       f"{str(entry.get('rank'))[:20]}, but its path is run {run}'s", seq=None))
        footer = _footer(self.con, self.d / rel)
        if footer != self.rc:
            raise _held(ExportMismatch(f"{self.d}: {rel}: its footer's receipt is not the listed one"
                                       + ("" if footer is not None else " (it has none)"), seq=None))

    def finish(self, n: int) -> None:
        """After the verification: every file held to its end (a row past what the lines give is a difference
        too) and to its listed row count; every other listed file of the journal has no row, and the columns its
        table would have."""
        self.flush()
        if self.count != n:
            raise ExportMismatch(f"{self.d}: run {self.rc['run_id']}: {self.count} events were rebuilt of its {n} "
                                 "verified lines", seq=None)
        for table in tables():
            rel = f"{table}/{self.sub}"
            if rel not in self.files:
                continue
            if table == "events":  # its rows were held to their lines as they were read: every seq, each once
                self.shape(rel, self.events_schema)  # and to the types they were held in
                rows = n
            else:
                st = self.open.get(table)
                if st is None:  # no rows from the lines: the file's columns held, then its rows (none owed)
                    spec = self.specs[VIEW_NAMES.get(table, table)]
                    empty = self._by_sql(spec, [], []) if spec.by_sql else self._scalar(spec, [])
                    st = self.open[table] = [self._reader(rel, empty.schema), None, 0]
                if self._take(st, rel, 1).num_rows:
                    raise ExportMismatch(f"{self.d}: {rel}: row(s) are not what the lines give (rows past the "
                                         f"{st[2]:,} its lines give)", seq=None)
                rows = st[2]
            entry = self.files[rel]
            if "rows" in entry and entry["rows"] != rows:
                raise ExportMismatch(f"{self.d}: {rel}: listed with {str(entry['rows'])[:20]} rows; it has {rows}",
                                     seq=None)

    def abandon(self) -> None:
        for st in self.open.values():
            st[0].close()
        self.open.clear()


def _differences(mine: Any, theirs: Any) -> tuple[int, int] | None:
    """Where two tables of the same columns differ: (the first row, how many rows) or None (NULL and NaN equal
    themselves; a row on one side only is a difference)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    n, m = mine.num_rows, theirs.num_rows
    k = min(n, m)
    wrong = np.zeros(k, dtype=bool)
    for name in mine.column_names:
        a, b = mine.column(name).slice(0, k), theirs.column(name).slice(0, k)
        if a.type != b.type:
            try:
                b = b.cast(a.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return 0, max(n, m)
        if a.equals(b):
            continue
        a, b = a.combine_chunks(), b.combine_chunks()
        same = pc.fill_null(pc.equal(a, b), False)
        if pa.types.is_floating(a.type):  # NaN equals NaN, as DuckDB's IS DISTINCT FROM has it
            same = pc.or_(same, pc.and_(pc.fill_null(pc.is_nan(a), False), pc.fill_null(pc.is_nan(b), False)))
        same = pc.or_(same, pc.and_(a.is_null(), b.is_null()))
        wrong |= ~same.to_numpy(zero_copy_only=False)
    count = int(wrong.sum()) + abs(n - m)
    if not count:
        return None
    return (int(np.argmax(wrong)) if wrong.any() else k), count
