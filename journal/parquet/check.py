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
   every file's footer receipt; as the verification reads them, every table is rebuilt from the verified events by
   the exporter's own code (the query layer's types) and must equal the exported file in its columns' names and
   types and row for row in seq order, both ways, a chunk at a time; a table the lines give rows for must have its
   file. DuckDB reads the files under a memory limit, spilling only into the private folder.
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
from trainledger.journal.parquet.export import (EXPORT_FORMAT, LISTING, RECEIPT_KEY, _JournalWriter, _lit, _specs,
                                                file_name, folder_name, receipt_of, tables)
from trainledger.journal.query import VIEW_NAMES
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
                    events: int | None = None, con: Any = None, consume: Any = None) -> tuple[Any, Path, int]:
    """The events file's lines written back, in seq order, into a private file, chain-checked batch by batch as
    they come (a line that is not the next one stops it at once, having written no more than one batch past it),
    then verified whole under ``policy`` as any journal is. Returns (the verification report, with the anchor
    kinds and ``seqs``' hashes collected; the lines file; the number of lines). Refuses before reading a line: an
    events file whose seqs are not 0 to n - 1 each once, n other than the receipt's ``events``, a ``line`` column
    stored with a dictionary (the exporter never writes one: a dictionary is how a small file decodes to a huge
    one) or that claims more bytes than its rows' lines may hold, and a line longer than a journal's line may be.
    ``consume(records, lines)``: handed the verified events as the verification reads them (:class:`_Holder`);
    what it raises propagates as it is."""
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
            # (arg_max beside count(DISTINCT) made DuckDB's aggregate 5x slower: where, only when one is too long)
            n, lo, hi, distinct, longest = con.execute(
                f"SELECT count(*), min(seq), max(seq), count(DISTINCT seq), max(strlen(line)) FROM {src}"
            ).fetchall()[0]  # all: the result done with
            if n and (lo != 0 or hi != n - 1 or distinct != n):
                raise ExportMismatch(f"{d}: {ev_rel}: its seqs are not 0 to {n - 1}, each once", seq=None)
            if longest is not None and longest > MAX_LINE:
                at = con.execute(f"SELECT arg_max(seq, strlen(line)) FROM {src}").fetchall()[0][0]
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
        rep = verify(lines_path, trust=policy, _collect=(_ANCHOR_KINDS, seqs),
                     **({"_consume": consume, "_with_lines": True} if consume is not None else {}))
    except TrainledgerError as e:
        if not getattr(e, "held", False):  # the holder's own finding names its file already
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
    import pyarrow.compute as pc

    if not (pa.types.is_large_string(line.type) or pa.types.is_large_binary(line.type)):
        line = line.cast(pa.large_binary() if pa.types.is_binary(line.type) else pa.large_string())
    # a newline after each line, in one pass in Arrow: the joined column's data is the block
    joined = pc.binary_join_element_wise(line, pa.scalar(b"\n" if pa.types.is_large_binary(line.type) else "\n",
                                                         line.type), pa.scalar(b"" if pa.types.is_large_binary(
                                                             line.type) else "", line.type))
    offsets = np.frombuffer(joined.buffers()[1], dtype=np.int64, count=k + 1, offset=8 * joined.offset)
    return bytes(memoryview(joined.buffers()[2])[offsets[0]:offsets[-1]])


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
    holder = _Holder(con, d, rc, files, sub)
    try:
        rep, lines_path, n = _verified_lines(d, ev_rel, policy, work, events=events, con=con, consume=holder)
        _hold_receipt(d, rc, ev_rel, rep, lines_path, n)
        holder.finish(n)
    finally:
        holder.abandon()
        con.close()
    try:
        os.unlink(lines_path)
    except OSError:
        pass
    return n, {f"{table}/{sub}" for table in tables() if f"{table}/{sub}" in files}, rep


def _hold_receipt(d: Path, rc: dict[str, Any], ev_rel: str, rep: Any, lines_path: Path, n: int) -> None:
    """A journal's verified lines held to its receipt: the receipt rebuilt from them, as the exporter built it, must
    be the listed one (but for what only the export knew: its source file's name, its version, the trust it ran
    under), every line of them trusted."""
    from trainledger.journal.query import _file_row

    run = rc["run_id"]
    row = {**_file_row(lines_path, rep), "file": str(lines_path), "copy": str(lines_path)}
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
        super().__init__(d, Path(sub), rc["run_id"], rank, lines=False, specs=_specs(), con=con)
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
        """The exported file's columns (the events file's but its lines), after its listing entry, footer and
        column types are held to what the lines give."""
        import duckdb

        path = self.d / rel
        want = self._types(schema)
        try:  # the file's footer, columns and rows, as DuckDB reads them: a file that is no Parquet is named
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
            cols = ", ".join('"' + c.replace('"', '""') + '"' for c, _ in want)
            return self.con.cursor().sql(f"SELECT {cols} FROM read_parquet({_lit(str(path))})").to_arrow_reader(
                ROW_BATCH)
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
            st = self.open.get(table)
            if st is None:  # no rows from the lines: the file's columns held, then its rows (none owed)
                spec = self.specs.get(VIEW_NAMES.get(table, table)) if table != "events" else None
                empty = (self._by_sql(spec, [], []) if spec.by_sql else self._scalar(spec, [])) if spec is not None \
                    else self.pa.Table.from_batches([], schema=self.events_schema)
                st = self.open[table] = [self._reader(rel, empty.schema), None, 0]
            extra = self._take(st, rel, 1).num_rows
            if extra:
                raise ExportMismatch(f"{self.d}: {rel}: row(s) are not what the lines give (rows past the "
                                     f"{st[2]:,} its lines give)", seq=None)
            entry = self.files[rel]
            if "rows" in entry and entry["rows"] != st[2]:
                raise ExportMismatch(f"{self.d}: {rel}: listed with {str(entry['rows'])[:20]} rows; it has {st[2]}",
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
