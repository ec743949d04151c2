"""``trainledger verify OUT`` of a Parquet export (:mod:`.export`): the export alone re-verified.

1. The listing (``receipts.json``, at most 64 MiB) names every file; each must be a regular file inside ``OUT`` (no
   link on the way) whose SHA-256 is the listed one, and ``OUT`` may hold nothing else (a reader's glob would pick up
   a planted file).
2. An export written without ``--lines`` stops there: its rows cannot be checked against anything signed, so it is
   not verified (exit 1, saying so); its receipts are what the exporter says.
3. Otherwise each journal's lines are written, in seq order, to a private file and verified under the caller's trust
   as any journal is (chain, tree, seals and their signatures under pinned keys); the result must end at the
   receipt's head, tree size and root, and key. Then the typed columns are held to the lines: every table the
   export has is recomputed from those lines by the query layer's own views and must equal the exported file, row
   for row (both ways), and a table the lines give rows for must have its file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path, PurePosixPath
from typing import Any

from trainledger.journal.errors import IntegrityError, JournalIOError, SchemaError, TrainledgerError
from trainledger.journal.parquet.export import (EXPORT_FORMAT, LISTING, _lit, _sha256, file_name, folder_name,
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
    trust: str | None
    receipts: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _read_listing(d: Path) -> dict[str, Any]:
    p = d / LISTING
    try:
        st = os.lstat(p)
        if not stat.S_ISREG(st.st_mode):
            raise SchemaError(f"{p}: not a regular file", offset=None)
        if st.st_size > MAX_LISTING:
            raise SchemaError(f"{p}: {st.st_size} bytes, more than a listing may hold ({MAX_LISTING})", offset=None)
        with open(p, "rb") as f:
            data = f.read(MAX_LISTING + 1)
    except OSError as e:
        raise JournalIOError(f"{p}: {e.strerror}") from None
    try:
        listing = json.loads(data)
    except (ValueError, RecursionError):
        raise SchemaError(f"{p}: not JSON", offset=None) from None
    if not isinstance(listing, dict) or listing.get("format") != EXPORT_FORMAT or \
            not isinstance(listing.get("files"), list) or not isinstance(listing.get("journals"), list) or \
            not isinstance(listing.get("lines"), bool):
        raise SchemaError(f"{p}: not a {EXPORT_FORMAT} listing", offset=None)
    return listing


def _inside(d: Path, rel: Any) -> Path:
    """A listed path as a file of ``d``: relative, plain components, no link on the way, a regular file."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        raise ExportMismatch(f"{d}: listed path {str(rel)[:120]!r} is not a relative path", seq=None)
    parts = PurePosixPath(rel).parts
    if PurePosixPath(rel).is_absolute() or any(x in ("", ".", "..") for x in parts):
        raise ExportMismatch(f"{d}: listed path {rel[:120]!r} leaves the export", seq=None)
    p = d
    for part in parts:
        p = p / part
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            raise ExportMismatch(f"{d}: {rel}: listed but missing", seq=None) from None
        if stat.S_ISLNK(st.st_mode):
            raise ExportMismatch(f"{d}: {rel}: a link in the path", seq=None)
    if not stat.S_ISREG(st.st_mode):
        raise ExportMismatch(f"{d}: {rel}: not a regular file", seq=None)
    return p


def verify_export(out: str | os.PathLike, *, trust: TrustPolicy | None = None, _files_only: bool = False,
                  **trust_options: Any) -> ExportCheck:
    """Re-verify the export folder ``out`` (see the module doc). Raises :class:`ExportMismatch` naming the file,
    table or journal that is not what its lines say, :class:`NotVerifiable` for an export without its lines, and
    what verification raises for lines that do not verify. ``_files_only``: step 1 alone (``query OUT`` of a
    listing verified whole before, :mod:`.read`)."""
    d = Path(out)
    policy = TrustPolicy.of(trust, **trust_options)
    listing = _read_listing(d)
    files: dict[str, dict[str, Any]] = {}
    for x in listing["files"]:
        if not isinstance(x, dict) or not isinstance(x.get("path"), str) or not isinstance(x.get("sha256"), str):
            raise SchemaError(f"{d / LISTING}: a file entry without path and sha256", offset=None)
        p = _inside(d, x["path"])
        if x["path"] in files:
            raise ExportMismatch(f"{d}: {x['path']} is listed twice", seq=None)
        if _sha256(p) != x["sha256"]:
            raise ExportMismatch(f"{d}: {x['path']}: its SHA-256 is not the listed one (changed after the export)",
                                 seq=None)
        files[x["path"]] = x
    for root, dirs, names in os.walk(d):
        for name in names:
            rel = (Path(root) / name).relative_to(d).as_posix()
            if rel != LISTING and rel not in files:
                raise ExportMismatch(f"{d}: {rel}: not in the listing (a planted file)", seq=None)
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
    for rc in listing["journals"]:
        if not isinstance(rc, dict) or not isinstance(rc.get("run_id"), str):
            raise SchemaError(f"{d / LISTING}: a journal entry without a run id", offset=None)
        if rc["run_id"] in runs:
            raise ExportMismatch(f"{d}: run {rc['run_id']} is listed twice", seq=None)
        runs.add(rc["run_id"])
        n, rels = _check_journal(d, rc, files, policy)
        events += n
        checked |= rels
        receipts.append(rc)
    stray = sorted(set(files) - checked)
    if stray:  # listed, hashed, but held to no journal's lines: a reader's glob would still pick it up
        raise ExportMismatch(f"{d}: {stray[0]}: listed, but of no journal the export verifies", seq=None)
    return ExportCheck(out=str(d), journals=len(receipts), events=events, files=len(files), lines=True,
                       trust=receipts[0].get("trust") if receipts else None, receipts=receipts)


def _check_journal(d: Path, rc: dict[str, Any], files: dict[str, dict[str, Any]],
                   policy: TrustPolicy) -> tuple[int, set[str]]:
    """One journal of the export: its lines verified, its typed files held to them; (events, the files checked)."""
    from trainledger.journal.copies import PrivateCopies
    import duckdb

    from trainledger.journal.query import _define_views, _load, new_connection

    run, rank = rc["run_id"], rc.get("rank")
    if rank is not None and not isinstance(rank, int):
        raise SchemaError(f"{d / LISTING}: run {run}: rank {rank!r} is not an int", offset=None)
    sub = f"run-{folder_name(run)}/{file_name(rank)}"
    ev_rel = f"events/{sub}"
    if ev_rel not in files:
        raise ExportMismatch(f"{d}: run {run}: no events file ({ev_rel})", seq=None)
    con = new_connection()
    with PrivateCopies() as copies:
        lines_path = copies.dir / "lines.jsonl"
        src = f"read_parquet({_lit(str(d / ev_rel))})"
        try:
            n, lo, hi, distinct = con.execute(f"SELECT count(*), min(seq), max(seq), count(DISTINCT seq) FROM {src}"
                                              ).fetchone()
            if n and (lo != 0 or hi != n - 1 or distinct != n):
                raise ExportMismatch(f"{d}: {ev_rel}: its seqs are not 0 to {n - 1}, each once", seq=None)
            # the lines in seq order, each written back as it was exported (a line that is not one canonical JSON
            # line written this way fails the verification below: nothing here can make bad lines pass)
            con.execute(f"COPY (SELECT line FROM {src} ORDER BY seq) TO {_lit(str(lines_path))} (FORMAT csv, "
                        "HEADER false, QUOTE '', ESCAPE '', DELIMITER '\x01')")
        except duckdb.Error as e:
            raise ExportMismatch(f"{d}: {ev_rel}: not an events table: {str(e).splitlines()[0]}", seq=None) from None
        finally:
            con.close()
        try:  # verified once, as query loads it (the typed views below are computed from that load)
            con, source = _load([lines_path], True, policy)
        except TrainledgerError as e:  # named by the exported file its lines came from
            msg = str(e.args[0]).replace(str(lines_path), ev_rel) if e.args else ""
            e.args = (msg if msg.startswith(ev_rel) else f"{ev_rel}: {msg}",) + tuple(e.args[1:])
            e.path = f"{d / ev_rel}"
            raise
        (row,) = source.files
        if row["run_id"] != run:
            con.close()
            raise ExportMismatch(f"{d}: {ev_rel}: the lines are run {row['run_id']!r}, the receipt says {run!r}",
                                 seq=None)
        # the receipt rebuilt from the verified lines, as the exporter built it, must be the listed one (but for
        # what only the export knew: its source file's name, its version, the trust it ran under)
        mine = receipt_of(row, lines=True, exported=n)
        wrong = [k for k in mine if k not in ("source", "exporter", "trust") and mine[k] != rc.get(k)]
        if wrong or row["trusted_bytes"] != row["size"]:
            con.close()
            k = wrong[0] if wrong else "head"
            raise ExportMismatch(f"{d}: run {run}: its lines give {k} {str(mine.get(k))[:80]!r}; its receipt says "
                                 f"{str(rc.get(k))[:80]!r}", seq=None)
        # the typed columns held to the lines: the query layer's own views over them, file by file
        _define_views(con)
        rels = {ev_rel}
        try:
            for table in tables():
                rel = f"{table}/{sub}"
                if table == "events":
                    mine = "SELECT run_id, rank, seq, kind, ts, h, line FROM events_t ORDER BY seq"
                else:
                    mine = typed_select(con, table, "true")
                    if rel not in files:
                        if con.execute(f"SELECT count(*) FROM ({mine})").fetchone()[0]:
                            raise ExportMismatch(f"{d}: run {run}: its lines have {table} rows, and the export has "
                                                 f"no {rel}", seq=None)
                        continue
                rels.add(rel)
                theirs = f"SELECT * FROM read_parquet({_lit(str(d / rel))})"
                # one row an event: matched by seq, each whole row compared (as a struct: NULL and NaN equal
                # themselves), and a row on one side only is a difference too
                bad, first = con.execute(
                    f"SELECT count(*), min(coalesce(t.seq, m.seq)) FROM ({mine}) m FULL OUTER JOIN ({theirs}) t "
                    "ON m.seq = t.seq WHERE m.seq IS NULL OR t.seq IS NULL OR m IS DISTINCT FROM t").fetchone()
                dup = con.execute(f"SELECT count(*) - count(DISTINCT seq) FROM ({theirs})").fetchone()[0]
                if bad or dup:
                    raise ExportMismatch(f"{d}: {rel}: {bad + dup} row(s) are not what the lines give"
                                         + (f" (first at seq {first})" if first is not None else ""), seq=first)
        except Exception as e:
            if isinstance(e, duckdb.Error):
                raise ExportMismatch(f"{d}: run {run}: a file is not the table it should be: "
                                     f"{str(e).splitlines()[0]}", seq=None) from None
            raise
        finally:
            con.close()
    return n, rels
