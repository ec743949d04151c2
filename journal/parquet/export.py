"""``trainledger export parquet JOURNAL|RUN_DIR... OUT``: verified events as a Parquet dataset with receipts.

The journals are verified and loaded exactly as ``trainledger query`` loads them (a run folder checked whole
first; only each journal's signed prefix), then every table the query layer has (``events`` and each typed view,
with the same columns) is written with DuckDB, one zstd Parquet file per table and journal::

    OUT/receipts.json                                   the listing: every journal's receipt, every file's SHA-256
    OUT/events/run-<run>/rank-00003.parquet             (journal.parquet for a journal that is not a rank's)
    OUT/steps/run-<run>/rank-00003.parquet
    ...

Each file's footer holds its journal's receipt (key-value metadata ``trainledger_receipt``): run id, rank, the events
exported and their first and last seq, the chain head, the tree size and root, the signed checkpoint note, the key
id and trust, the exporter's version. With ``lines``, ``events`` keeps each line's exact bytes (the ``line``
column), so the export alone re-verifies (:mod:`.check`); without it the export is typed only, as trustworthy as
whoever exported it, and says so.

The dataset is written into a hidden folder beside ``OUT`` and renamed to ``OUT`` once whole: an interrupted export
leaves no ``OUT``. ``OUT`` must not exist.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainledger.journal.errors import JournalIOError, UsageError
from trainledger.journal.trust import TrustPolicy

__all__ = ["EXPORT_FORMAT", "LISTING", "RECEIPT_KEY", "ExportReport", "export_parquet", "is_export", "tables",
           "typed_select"]

EXPORT_FORMAT = "trainledger-parquet/1"
LISTING = "receipts.json"
RECEIPT_KEY = "trainledger_receipt"
#: the query layer's views that hold rows of one kind; the derived ones (runs, timeline, mfu) are recomputed by a
#: reader from these, as the query layer does
_DERIVED = ("runs", "timeline", "mfu")
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def tables() -> list[str]:
    """``events`` and one typed table per kind: the query layer's friendly name where a kind has one (``steps``),
    else its tag (each kind once: query has both names for the same rows)."""
    from trainledger.journal.query import VIEW_NAMES, VIEWS

    aliased = set(VIEW_NAMES.values())
    return ["events"] + [v for v in VIEWS if v not in _DERIVED and v not in aliased]


def is_export(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder an export wrote (it holds the listing)."""
    p = Path(path)
    return p.is_dir() and (p / LISTING).is_file()


@dataclasses.dataclass
class ExportReport:
    out: str
    journals: int
    events: int
    files: int
    bytes: int
    lines: bool
    seconds: float
    missing: dict[str, list[int]] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def folder_name(run_id: str) -> str:
    """A run id as one safe path component: itself when plain, else ``x-`` and its SHA-256 (a run id may hold
    anything its writer put there: never a path)."""
    if _SAFE.fullmatch(run_id) and run_id not in (".", ".."):
        return run_id
    return "x-" + hashlib.sha256(run_id.encode()).hexdigest()[:32]


def file_name(rank: int | None) -> str:
    return "journal.parquet" if rank is None else f"rank-{rank:05d}.parquet"


def receipt_of(row: dict[str, Any], *, lines: bool, exported: int) -> dict[str, Any]:
    """A journal's receipt, from the query layer's file row (its verify report's figures)."""
    from trainledger.journal import __version__
    from trainledger.journal.query import _rank_of

    note = None
    if row.get("tree_root") and row.get("seal_sig") and row.get("sealed_seq") is not None and row.get("key_id"):
        note = _note(row)
    return {"format": EXPORT_FORMAT, "exporter": f"trainledger {__version__}", "run_id": row["run_id"],
            "rank": _rank_of(row["run_id"]), "source": Path(row["file"]).name,
            "format_version": row.get("format_version"), "events": exported, "first_seq": 0 if exported else None,
            "last_seq": row["trusted_last_seq"], "head": f"{row['trusted_last_seq']}:{row['trusted_hash']}",
            "tree_size": row["sealed_seq"] + 1 if row.get("sealed_seq") is not None else None,
            "tree_root": row.get("tree_root"), "checkpoint": note, "key_id": row.get("key_id"),
            "trust": row.get("trust"), "lines": lines}


def _note(row: dict[str, Any]) -> str | None:
    """The last seal as a C2SP signed note (``trainledger checkpoint``'s), when its key is known here."""
    import base64

    from trainledger.journal.keys import PublicKey
    from trainledger.journal.proofs.checkpoint import checkpoint_note
    from trainledger.journal.verify import open_checked, read_opening

    opened, _ = read_opening(Path(row["file"]), open_checked(Path(row["file"])))
    pub = PublicKey(base64.b64decode(opened.public_key), source="embedded")
    if pub.key_id != row["key_id"]:
        return None
    return checkpoint_note(row["run_id"], row["sealed_seq"] + 1, bytes.fromhex(row["tree_root"]),
                           bytes.fromhex(row["sealed_hash"]), base64.b64decode(row["seal_sig"]), pub)


def typed_select(con: Any, table: str, where: str) -> str:
    """The SELECT an export writes of one table (and a check recomputes): its columns as the query layer has them,
    but integers wider than 64 bits as DECIMAL(38,0), since Parquet has no 128-bit integer (DuckDB would write a
    HUGEINT as a DOUBLE, rounding it, and compare it so too)."""
    cols = []
    for name, typ, *_ in con.execute(f"DESCRIBE SELECT * FROM {table}").fetchall():
        q = '"' + name.replace('"', '""') + '"'
        cols.append(f"CAST({q} AS DECIMAL(38,0)) AS {q}" if typ in ("HUGEINT", "UHUGEINT") else q)
    return f"SELECT {', '.join(cols)} FROM {table} WHERE {where}"


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def export_parquet(paths: Sequence[str | os.PathLike], out: str | os.PathLike, *, lines: bool = False,
                   trust: TrustPolicy | None = None, partial: bool = False,
                   progress: Callable[[str], None] | None = None, **trust_options: Any) -> ExportReport:
    """Verify ``paths`` (journals, run folders, folders of journals) under ``trust`` and write their signed events
    to the new folder ``out`` (see the module doc). Raises what verification raises (nothing is written then),
    :class:`UsageError` when ``out`` exists or two journals share a run id, :class:`JournalIOError` when it cannot
    be written (nothing is left behind)."""
    import duckdb

    from trainledger.journal.query import VIEW_NAMES, _define_views, _load, _whole_run_dirs, journal_files

    t0 = time.perf_counter()
    policy = TrustPolicy.of(trust, **trust_options)
    dest = Path(out)
    if dest.exists() or dest.is_symlink():
        raise UsageError(f"{dest}: exists: an export writes a new folder")
    if not dest.parent.is_dir():
        raise UsageError(f"{dest.parent}: no such folder")
    files = journal_files(paths)
    missing = _whole_run_dirs(paths, policy, partial=partial)
    con, source = _load(files, True, policy)
    rows = source.files
    seen: dict[str, str] = {}
    for r in rows:
        if r["run_id"] in seen:
            raise UsageError(f"{r['file']} and {seen[r['run_id']]} are both run {r['run_id']!r}: export one of them")
        seen[r["run_id"]] = r["file"]
    _define_views(con)
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    listed: list[dict[str, Any]] = []
    receipts: list[dict[str, Any]] = []
    total = 0
    try:
        tmp.mkdir(mode=0o755)
        counts = dict(con.execute("SELECT file, count(*) FROM events_t GROUP BY file").fetchall())
        for i, r in enumerate(rows):
            exported = counts.get(r["file"], 0)
            total += exported
            receipt = receipt_of(r, lines=lines, exported=exported)
            receipts.append(receipt)
            meta = _lit(json.dumps(receipt, sort_keys=True, separators=(",", ":")))
            sub = Path(f"run-{folder_name(r['run_id'])}") / file_name(receipt["rank"])
            present = {k for (k,) in con.execute("SELECT DISTINCT kind FROM events_t WHERE file = ?",
                                                    [r["file"]]).fetchall()}
            for table in tables():
                if table == "events":
                    cols = "run_id, rank, seq, kind, ts, h" + (", line" if lines else "")
                    select = f"SELECT {cols} FROM events_t WHERE file = {_lit(r['file'])}"
                else:
                    if VIEW_NAMES.get(table, table) not in present:
                        continue  # no rows of that kind: no file
                    select = typed_select(con, table, f"run_id = {_lit(r['run_id'])}")
                rel = Path(table) / sub
                (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
                # in the journal's order: the events were loaded in it, and DuckDB keeps insertion order
                n_rows = con.execute(f"COPY ({select}) TO {_lit(str(tmp / rel))} (FORMAT parquet, COMPRESSION zstd, "
                                     f"KV_METADATA {{'{RECEIPT_KEY}': {meta}}})").fetchone()[0]
                listed.append({"path": rel.as_posix(), "table": table, "run_id": r["run_id"], "rank": receipt["rank"],
                               "rows": n_rows, "bytes": (tmp / rel).stat().st_size, "sha256": _sha256(tmp / rel)})
            if progress is not None:
                progress(f"{i + 1}/{len(rows)} journals, {total:,} events")
        listing = {"format": EXPORT_FORMAT, "lines": lines, "journals": receipts, "files": listed,
                   **({"partial": missing} if missing else {})}
        with open(tmp / LISTING, "w") as f:
            f.write(json.dumps(listing, indent=1, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, dest)
    except (OSError, duckdb.Error) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
        raise JournalIOError(f"{dest}: cannot write the export: {why}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        con.close()
    return ExportReport(out=str(dest), journals=len(rows), events=total, files=len(listed),
                        bytes=sum(x["bytes"] for x in listed), lines=lines, seconds=time.perf_counter() - t0,
                        missing=missing)
