"""``trainledger verify OUT`` of a Parquet export (:mod:`.export`): the export alone re-verified, as trustworthy
once it passes as the journals and run folders it came from (docs/fleet.md, "Verify an export").

1. The folder's shape (:func:`check_tree`, ``query OUT`` runs the same): the listing (``receipts.json``, a regular
   file of at most 64 MiB) names every file once, each a plain path of the export's layout; ``OUT`` walked without
   following links holds the listing, the listed regular files and the folders on their paths, nothing else (no
   link, FIFO, socket, unlisted file or extra folder); each file hashes to its listed SHA-256.
2. An export written without ``--lines`` stops there: its rows cannot be checked against anything signed, so it is
   not verified (exit 1, saying so); its receipts are what the exporter says.
3. Otherwise each journal's lines are streamed, in seq order, into a private file, bounded before a line is read
   (seqs, row count, no dictionary, the bytes claimed, the line cap), chain-checked batch by batch and then
   verified under the caller's trust as any journal is; the receipt rebuilt from them must be the listed one and
   every file's footer receipt; every typed table is recomputed by the query layer's own views and must equal the
   exported file in its columns' names and types and row for row, both ways; a table the lines give rows for must
   have its file. DuckDB runs under a memory limit, spilling only into the private folder.
4. The ranks of one run are held together as ``verify RUN_DIR`` holds a run folder
   (:func:`~trainledger.journal.audit.rundir.hold_ranks`), on the reports of the lines just verified; ranks missing
   are recomputed from them (an error unless ``partial``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from trainledger.journal.audit.roster import split_run_id
from trainledger.journal.copies import PrivateCopies
from trainledger.journal import paths
from trainledger.journal.errors import (IntegrityError, JournalIOError, SchemaError, TrainledgerError, UnsafePath,
                                        UsageError)
from trainledger.journal.paths import read_regular
from trainledger.journal.parquet.export import (EXPORT_FORMAT, LISTING, RECEIPT_KEY, _lit, file_name, folder_name,
                                                receipt_of, tables, typed_select)
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
        for e in entries:
            rel = f"{base}/{e.name}" if base else e.name
            try:
                mode = e.stat(follow_symlinks=False).st_mode
            except OSError:
                raise ExportMismatch(f"{d}: {rel}: gone while it was being looked at", seq=None) from None
            if stat.S_ISLNK(mode):
                raise ExportMismatch(f"{d}: {rel}: a link (an export holds files only)", seq=None)
            if stat.S_ISDIR(mode):
                if rel not in folders:
                    raise ExportMismatch(f"{d}: {rel}: a folder no listed file is in (planted)", seq=None)
                todo.append((rel, Path(e.path)))
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


def verify_export(out: str | os.PathLike, *, trust: TrustPolicy | None = None, partial: bool = False,
                  expect: dict[str, Any] | None = None, _files_only: bool = False,
                  **trust_options: Any) -> ExportCheck:
    """Re-verify the export folder ``out`` (see the module doc). Raises :class:`ExportMismatch` naming the file,
    table or journal that is not what its lines say, :class:`NotVerifiable` for an export without its lines, what
    verification raises for lines that do not verify, and what ``verify RUN_DIR`` raises for a run's ranks that do
    not hold together (:class:`~trainledger.journal.audit.rundir.AnchorMismatch`, ``RosterMismatch``).
    ``partial``: a run with ranks missing is checked as far as the ranks present go, and the check's ``missing``
    names them (recomputed from the verified lines, never read from the listing). ``expect``: what one journal must
    contain, as ``verify --expect-head`` and ``--expect-checkpoint`` hold a journal to it: ``{"head": (seq, hash)}``
    for an export of one journal, ``{"checkpoint": an opened checkpoint, "run": the run id its origin names}`` (and
    a head with it) for that run's journal, which the export must hold. ``_files_only``: step 1 alone
    (``query OUT`` of a listing verified whole before, :mod:`.read`)."""
    d = Path(out)
    policy = TrustPolicy.of(trust, **trust_options)
    listing, _ = read_listing(d)
    files = check_tree(d, listing)
    for rel, x in files.items():
        if hash_regular(d, rel) != x["sha256"]:
            raise ExportMismatch(f"{d}: {rel}: its SHA-256 is not the listed one (changed after the export)",
                                 seq=None)
    if _files_only:
        rcs = [rc for rc in listing["journals"] if isinstance(rc, dict)]
        return ExportCheck(out=str(d), journals=len(rcs), events=sum(int(rc.get("events") or 0) for rc in rcs),
                           files=len(files), lines=listing["lines"], trust=None, receipts=rcs)
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
            rep, lines_path, _ = _verified_lines(d, f"events/run-{folder_name(reports[r].run_id)}/{file_name(r)}",
                                                 policy, work, seqs=seqs)
            lines_path.unlink()
            return rep

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
    from trainledger.journal.query import new_connection

    con = new_connection()
    spill = work / "spill"
    spill.mkdir(mode=0o700, exist_ok=True)
    con.execute("SET threads = 1")  # one thread: rows come back in file order
    con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
    con.execute(f"SET temp_directory = {_lit(str(spill))}")
    return con


def _verified_lines(d: Path, ev_rel: str, policy: TrustPolicy, work: Path, *, seqs: frozenset[int] = frozenset(),
                    events: int | None = None, con: Any = None) -> tuple[Any, Path, int]:
    """The events file's lines written back, in seq order, into a private file, chain-checked batch by batch as
    they come (a line that is not the next one stops it at once, having written no more than one batch past it),
    then verified whole under ``policy`` as any journal is. Returns (the verification report, with the anchor
    kinds and ``seqs``' hashes collected; the lines file; the number of lines). Refuses before reading a line: an
    events file whose seqs are not 0 to n - 1 each once, n other than the receipt's ``events``, a ``line`` column
    stored with a dictionary (the exporter never writes one: a dictionary is how a small file decodes to a huge
    one) or that claims more bytes than its rows' lines may hold, and a line longer than a journal's line may be."""
    import duckdb

    from trainledger.journal.audit.rundir import _ANCHOR_KINDS
    from trainledger.journal.chain import genesis
    from trainledger.journal.scan import MAX_LINE
    from trainledger.journal.verify import read_opening, verify

    path = d / ev_rel
    src = f"read_parquet({_lit(str(path))})"
    fd, name = tempfile.mkstemp(dir=work, prefix="lines-", suffix=".jsonl")  # 0600, a name of its own
    lines_path = Path(name)
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
            n, lo, hi, distinct, longest, at = con.execute(
                f"SELECT count(*), min(seq), max(seq), count(DISTINCT seq), max(strlen(line)), "
                f"arg_max(seq, strlen(line)) FROM {src}").fetchall()[0]  # all: the result done with
            if n and (lo != 0 or hi != n - 1 or distinct != n):
                raise ExportMismatch(f"{d}: {ev_rel}: its seqs are not 0 to {n - 1}, each once", seq=None)
            if longest is not None and longest > MAX_LINE:
                raise ExportMismatch(f"{d}: {ev_rel}: the line at seq {at} is {longest:,} bytes, longer than a "
                                     f"journal's line may be ({MAX_LINE:,})", seq=at)
            per = max(1, min(ROW_BATCH, BATCH_BYTES // max(1, longest or 1)))
            # Arrow batches (no Python object a row): each batch's seqs held to the next ones, its lines joined with
            # newlines as one block and chain-checked in C, then written
            reader = con.sql(f"SELECT seq, line FROM {src}").to_arrow_reader(per)
            prev = None
            want = 0
            with os.fdopen(fd, "wb") as out:
                fd = -1
                for batch in reader:
                    k = batch.num_rows
                    if not k:
                        continue
                    block = _block_of(batch, want, d, ev_rel)
                    out.write(block)
                    if prev is None:  # the opening line binds the chain to its run
                        out.flush()
                        prev = genesis(read_opening(lines_path, lines_path.stat().st_size)[0].run_id)
                    prev = _chained_block(prev, block, want)
                    want += k
                    if prev is None:  # stop here: the verification below names the line and what is wrong
                        break
        except duckdb.OutOfMemoryException:
            raise ExportMismatch(f"{d}: {ev_rel}: decoding its lines needs more memory than a check may use "
                                 f"({MEMORY_LIMIT}): no journal's lines need that", seq=None) from None
        except duckdb.Error as e:
            raise ExportMismatch(f"{d}: {ev_rel}: not an events table: {str(e).splitlines()[0]}", seq=None) from None
    except TrainledgerError as e:  # named by the exported file its lines came from
        _rename(e, lines_path, d, ev_rel)
        raise
    finally:
        if own:
            con.close()
        if fd >= 0:  # failed before the lines were written
            os.close(fd)
    try:
        rep = verify(lines_path, trust=policy, _collect=(_ANCHOR_KINDS, seqs))
    except TrainledgerError as e:
        _rename(e, lines_path, d, ev_rel)
        raise
    return rep, lines_path, n


#: rows handed on at a time at most
ROW_BATCH = 65_536


def _block_of(batch: Any, first: int, d: Path, ev_rel: str) -> bytes:
    """A batch's lines as one newline-terminated block, its seqs held to be ``first``, ``first + 1``, ... (every
    row with a line)."""
    import numpy as np
    import pyarrow as pa

    seq, line = batch.column(0), batch.column(1)
    k = batch.num_rows
    want = np.arange(first, first + k, dtype=np.int64)
    # a row without a seq reads as seq -1: never the one wanted
    wrong = line.is_null().to_numpy(zero_copy_only=False) | (seq.fill_null(-1).to_numpy(zero_copy_only=False) != want)
    if wrong.any():
        bad = first + int(np.argmax(wrong))
        raise ExportMismatch(f"{d}: {ev_rel}: the row at seq {bad} is out of order or has no line", seq=bad)
    if not (pa.types.is_large_string(line.type) or pa.types.is_large_binary(line.type)):
        line = line.cast(pa.large_binary() if pa.types.is_binary(line.type) else pa.large_string())
    offsets = np.frombuffer(line.buffers()[1], dtype=np.int64, count=k + 1, offset=8 * line.offset)
    data = np.frombuffer(line.buffers()[2], dtype=np.uint8)[offsets[0]:offsets[-1]]
    # a newline after each line: inserted at each line's end (offsets relative to the first line)
    return np.insert(data, offsets[1:] - offsets[0], 10).tobytes()


def _chained_block(prev: bytes, block: bytes, first: int) -> bytes | None:
    """The chain hash after ``block``'s lines (seqs from ``first``), each line's seq and hash holding, or None at
    the first that does not (the block scanner where the accelerator is built; :func:`_chained` otherwise)."""
    from trainledger.journal.scan import _scan_block

    if _scan_block is None:
        return _chained(prev, block.split(b"\n")[:-1], first)
    bad, _ends, last, _leaves = _scan_block(prev, block, first, False)
    return last if bad < 0 else None


def _chained(prev: bytes, lines: list[bytes], first: int) -> bytes | None:
    """The chain hash after ``lines`` (seqs from ``first``), each line's seq and hash holding, or None at the first
    that does not (in C where the accelerator is built; hashlib otherwise)."""
    from trainledger.journal.accel import fast
    from trainledger.journal.chain import link

    if not lines:
        return prev
    if fast is not None:
        return bytes.fromhex(lines[-1][-66:-2].decode("ascii", "replace")) if \
            fast.check_lines(prev, lines, first) < 0 else None
    for i, line in enumerate(lines):
        cut = line.rfind(b',"h":"')
        if cut < 0 or not line[:cut].endswith(b'"seq":%d,"ts":' % (first + i) + line[:cut].rsplit(b":", 1)[-1]):
            return None
        prev = link(prev, line[:cut])
        if prev.hex().encode() != line[cut + 6:cut + 70]:
            return None
    return prev


def _rename(e: Exception, lines_path: Path, d: Path, ev_rel: str) -> None:
    msg = str(e.args[0]).replace(str(lines_path), ev_rel) if e.args else ""
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
    try:
        rep, lines_path, n = _verified_lines(d, ev_rel, policy, work, events=events, con=con)
        _hold_journal(con, d, rc, files, sub, rep, lines_path, n)
    finally:
        con.close()
    try:
        os.unlink(lines_path)
    except OSError:
        pass
    return n, {f"{table}/{sub}" for table in tables() if f"{table}/{sub}" in files}, rep


def _hold_journal(con: Any, d: Path, rc: dict[str, Any], files: dict[str, dict[str, Any]], sub: str, rep: Any,
                  lines_path: Path, n: int) -> None:
    """A journal's verified lines held to its receipt, then loaded and every table of it held to its file (a table
    the lines have rows for must have one)."""
    import duckdb

    from trainledger.journal.query import VIEW_NAMES, _COMMON_TABLE, _check_loaded, _define_views, _file_row, _insert

    run, rank = rc["run_id"], rc.get("rank")
    ev_rel = f"events/{sub}"
    row = {**_file_row(lines_path, rep), "file": str(lines_path), "copy": str(lines_path)}
    if row["run_id"] != run:
        raise ExportMismatch(f"{d}: {ev_rel}: the lines are run {row['run_id']!r}, the receipt says {run!r}",
                             seq=None)
    # the receipt rebuilt from the verified lines, as the exporter built it, must be the listed one (but for what
    # only the export knew: its source file's name, its version, the trust it ran under)
    mine = receipt_of(row, lines=True, exported=n)
    wrong = [k for k in mine if k not in ("source", "exporter", "trust") and mine[k] != rc.get(k)]
    if wrong or row["trusted_bytes"] != row["size"]:
        k = wrong[0] if wrong else "head"
        raise ExportMismatch(f"{d}: run {run}: its lines give {k} {str(mine.get(k))[:80]!r}; its receipt says "
                             f"{str(rc.get(k))[:80]!r}", seq=None)
    try:
        con.execute(_COMMON_TABLE)
        _insert(con, [row], careful=False)
        _check_loaded(con, [row])
        _define_views(con)
        present = {k for (k,) in con.execute("SELECT DISTINCT kind FROM events_t").fetchall()}
        for table in tables():
            rel = f"{table}/{sub}"
            if table == "events":
                mine_sql = "SELECT run_id, rank, seq, kind, ts, h, line FROM events_t ORDER BY seq"
            else:
                if rel not in files and VIEW_NAMES.get(table, table) not in present:
                    continue  # a typed view holds its kind's lines only: none here, so no rows and no file owed
                mine_sql = typed_select(con, table, "true")
                if rel not in files:
                    if con.execute(f"SELECT count(*) FROM ({mine_sql})").fetchone()[0]:
                        raise ExportMismatch(f"{d}: run {run}: its lines have {table} rows, and the export has "
                                             f"no {rel}", seq=None)
                    continue
            _hold_file(con, d, rel, files[rel], mine_sql, rc, run, rank)
    except duckdb.Error as e:
        raise ExportMismatch(f"{d}: run {run}: a file is not the table it should be: {str(e).splitlines()[0]}",
                             seq=None) from None


def _hold_file(con: Any, d: Path, rel: str, entry: dict[str, Any], mine: str, rc: dict[str, Any], run: str,
               rank: int | None) -> None:
    """One exported file held to what the verified lines give: its listing entry (run, rank, rows), its footer's
    receipt, its columns' names and types, then every row, both ways."""
    path = d / rel
    theirs = f"SELECT * FROM read_parquet({_lit(str(path))})"
    if entry.get("run_id", run) != run or entry.get("rank", rank) != rank:
        raise ExportMismatch(f"{d}: {rel}: listed as run {str(entry.get('run_id'))[:80]!r} rank "
                             f"{str(entry.get('rank'))[:20]}, but its path is run {run}'s", seq=None)
    footer = _footer(con, path)
    if footer != rc:
        raise ExportMismatch(f"{d}: {rel}: its footer's receipt is not the listed one"
                             + ("" if footer is not None else " (it has none)"), seq=None)
    # JSON cells are stored as Parquet strings (DuckDB reads them back as VARCHAR)
    want = [(c[0], "VARCHAR" if c[1] == "JSON" else c[1]) for c in con.execute(f"DESCRIBE {mine}").fetchall()]
    have = [(c[0], c[1]) for c in con.execute(f"DESCRIBE {theirs}").fetchall()]
    if want != have:
        diff = next(((a, b) for a, b in zip(want, have) if a != b), None)
        what = (f"column {diff[1][0]} is {diff[1][1]}, the lines give {diff[0][0]} {diff[0][1]}" if diff is not None
                else f"{len(have)} columns, the lines give {len(want)}")
        raise ExportMismatch(f"{d}: {rel}: {what}", seq=None)
    # one row an event: matched by seq, each whole row compared (as a struct: NULL and NaN equal themselves), and a
    # row on one side only is a difference too. The events file's lines are the ones just verified (the lines file
    # was written from them, row by row in seq order): its other columns are compared, not its lines again
    if rel.startswith("events/"):
        cols = ", ".join(c for c, _ in want if c != "line")
        mine = f"SELECT {cols} FROM ({mine})"
        theirs = f"SELECT {cols} FROM read_parquet({_lit(str(path))})"
    bad, first = con.execute(
        f"SELECT count(*), min(coalesce(t.seq, m.seq)) FROM ({mine}) m FULL OUTER JOIN ({theirs}) t "
        "ON m.seq = t.seq WHERE m.seq IS NULL OR t.seq IS NULL OR m IS DISTINCT FROM t").fetchone()
    dup, rows = con.execute(f"SELECT count(*) - count(DISTINCT seq), count(*) FROM ({theirs})").fetchone()
    if bad or dup:
        raise ExportMismatch(f"{d}: {rel}: {bad + dup} row(s) are not what the lines give"
                             + (f" (first at seq {first})" if first is not None else ""), seq=first)
    if "rows" in entry and entry["rows"] != rows:
        raise ExportMismatch(f"{d}: {rel}: listed with {str(entry['rows'])[:20]} rows; it has {rows}", seq=None)
