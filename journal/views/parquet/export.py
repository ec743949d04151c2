"""``trainledger export parquet JOURNAL|RUN_DIR... OUT``: verified events as a Parquet dataset with receipts.

Each journal is verified and written in one streaming pass (:func:`export_journal`): the verifier hands on each
event once a seal covering it has checked out, with its line's exact bytes (``verify``'s one-pass mode, as replay
uses it), and the events are written as they come, a row group at a time, with pyarrow (the ``parquet`` extra).
Nothing is read twice and memory stays bounded by a row group, whatever the journal's size. A run folder's ranks are
held to each other (anchors, one run, each rank's key) by the same check ``verify RUN_DIR`` makes, from the reports
of those passes, before the export is kept. Every table the query layer has (``events`` and each typed view, with
the same columns) gets one zstd Parquet file per journal::

    OUT/receipts.json                                   the listing: every journal's receipt, every file's SHA-256
    OUT/events/run-<run>/rank-00003.parquet             (journal.parquet for a journal that is not a rank's)
    OUT/steps/run-<run>/rank-00003.parquet
    ...

The typed columns of a kind whose fields are all scalars (steps, seals, checkpoints, ...) are built from the
verified events; a kind with a container field (``run_opened``'s ``meta``, ...) is typed by DuckDB from its lines
with the query layer's own SQL, so its JSON cells are spelled as ``query`` spells them. ``trainledger verify OUT``
holds every cell to the lines either way.

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
import functools
import glob
import hashlib
import json
import operator
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainledger.journal import accel as _accel
from trainledger.journal.errors import JournalError, JournalIOError, SchemaError, UsageError
from trainledger.journal.paths import file_sha256
from trainledger.journal.scan import Lines, StepBlock, piece_seq
from trainledger.journal.trust import TrustPolicy

__all__ = ["EXPORT_FORMAT", "LISTING", "RECEIPT_KEY", "ExportReport", "JournalExport", "arrow_column", "export_journal",
           "export_parquet",
           "is_export", "tables", "typed_select"]

EXPORT_FORMAT = "trainledger-parquet/1"
LISTING = "receipts.json"
RECEIPT_KEY = "trainledger_receipt"
_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def tables() -> list[str]:
    """``events`` and one typed table per kind: the query layer's friendly name where a kind has one (``steps``),
    else its tag (each kind once: query has both names for the same rows)."""
    from trainledger.journal.views.query import DERIVED_VIEWS, VIEW_NAMES, view_names

    # the derived views (runs, timeline, mfu, metrics) are recomputed by a reader from these, as the query layer does
    aliased = set(VIEW_NAMES.values())
    return ["events"] + [v for v in view_names() if v not in DERIVED_VIEWS and v not in aliased]


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
    from trainledger.journal.views.query import _rank_of

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
    """The last seal as a C2SP signed note (``trainledger tree-head``'s), when its key is known here."""
    import base64

    from trainledger.journal.keys import PublicKey
    from trainledger.journal.proofs.checkpoint import checkpoint_note
    from trainledger.journal.verify import open_checked, read_opening

    opened = row.get("opened") or read_opening(Path(row["file"]), open_checked(Path(row["file"])))[0]
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


#: events per row group: what one journal's export holds in memory at most, as columns (besides the verifier's block)
ROW_GROUP = 65_536
#: events whose records are made columns at a time (then freed: the same memory is used again while it is still in
#: the caches; 65,536 records at once took pages from the system and gave them back every row group)
BATCH = 8_192


def _pyarrow() -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise UsageError("export parquet writes with pyarrow: pip install 'trainledger[parquet]'") from None
    return pyarrow


class _Typed:
    """How one typed table is built: its kind's fields as the query layer's view has them (``typed_view``)."""

    def __init__(self, table: str, kind: str, cls: type) -> None:
        import msgspec

        from trainledger.journal.views.query import _duck_type, typed_view

        fields = [f for f in msgspec.inspect.type_info(cls).fields if f.name not in ("run_id", "seq", "ts")]
        self.table, self.kind = table, kind
        self.names = [f.name for f in fields]
        self.duck = [_duck_type(f.type) for f in fields]
        #: a container field: typed by DuckDB from the lines, so its JSON is spelled as the query layer spells it
        self.by_sql = "JSON" in self.duck
        self.rank_col = "journal_rank" if "rank" in self.names else "rank"
        self.sql = f"({typed_view(kind)})"


@functools.lru_cache(maxsize=1)
def _specs() -> dict[str, _Typed]:
    """``{kind: _Typed}`` for every typed table (:func:`tables`), worked out once per process."""
    from trainledger.journal import codec
    from trainledger.journal.views.query import VIEW_NAMES

    known = codec.known_kinds()
    return {VIEW_NAMES.get(t, t): _Typed(t, VIEW_NAMES.get(t, t), known[VIEW_NAMES.get(t, t)])
            for t in tables()[1:]}


class _JournalWriter:
    """One journal's tables, written a row group at a time as its verified events arrive."""

    def __init__(self, root: Path, sub: Path, run_id: str, rank: int | None, *, lines: bool,
                 specs: dict[str, _Typed], con: Any, file_column: str | None = None,
                 compression: str = "zstd", only: frozenset[str] | None = None, narrow: bool = False) -> None:
        self.pa = _pyarrow()
        #: integer columns written as int64 (the query layer's private load; its views cast them back), where an
        #: export's are DECIMAL(38,0); a value past int64 raises _Wide
        self.narrow = narrow
        self.root, self.sub, self.run_id, self.rank, self.lines = root, sub, run_id, rank, lines
        self.specs, self.con = specs, con
        #: what verification handed on and is not built yet: lists of records and StepBlocks, in seq order
        self.parts: list[Any] = []
        self.pending = 0
        self.raw: Any = Lines()
        #: a block's step lines may come as columns (a StepBlock) where the steps table's columns are theirs
        step = specs.get("step_observed")
        takes = step is not None and not step.by_sql and tuple(zip(step.names, step.duck)) == _STEP_COLUMNS
        #: the column builder verification hands a block's step lines to (None: they come as records)
        self.step_columns = _step_columns if takes else None
        self.writers: dict[str, tuple[Any, Path]] = {}
        self.rows: dict[str, int] = {}
        #: each table's columns built and not written yet
        self.staged: dict[str, list[Any]] = {}
        self.count = 0
        self._tags: dict[type, str | None] = {}
        pa = self.pa
        self._consts: tuple[Any, Any] = (pa.array([], pa.string()), pa.array([], pa.int32()))
        self.file_column, self.compression = file_column, compression
        #: the tables written (None: every one); the others' columns are never built
        self.events = only is None or "events" in only
        if only is not None:
            self.specs = {k: v for k, v in specs.items() if v.table in only}
        self.events_schema = pa.schema([("run_id", pa.string()), ("rank", pa.int32())]
                                       + ([("file", pa.string())] if file_column is not None else [])
                                       + [("seq", pa.int64()), ("kind", pa.string()), ("ts", pa.int64()),
                                          ("h", pa.string())] + ([("line", pa.string())] if lines else []))

    def __call__(self, recs: Any, raw: Any) -> None:
        if not len(recs):
            return
        self.parts.append(recs)
        self.pending += len(recs)
        self.raw.extend(raw)
        if self.pending >= BATCH:
            self._build()
            self._write_staged()

    def _tag(self, t: type) -> str | None:
        """A record type's kind (None: an unknown kind, whose records carry their own)."""
        if t not in self._tags:
            cfg = getattr(t, "__struct_config__", None)
            self._tags[t] = cfg.tag if cfg is not None and isinstance(cfg.tag, str) else None
        return self._tags[t]

    def _const(self, n: int) -> tuple[Any, Any]:
        """The run id and rank columns of ``n`` rows: slices of ones made once (every table's rows share them)."""
        pa = self.pa
        run, rank = self._consts
        if len(run) < n:
            k = max(n, 2 * len(run), 16384)
            run, rank = self._consts = (pa.repeat(self.run_id, k), pa.nulls(k, pa.int32()) if self.rank is None
                                        else pa.repeat(pa.scalar(self.rank, pa.int32()), k))
        return run.slice(0, n), rank.slice(0, n)

    def _write(self, table: str, data: Any) -> None:
        got = self.writers.get(table)
        if got is None:
            import pyarrow.parquet as pq

            path = self.root / table / self.sub
            path.parent.mkdir(parents=True, exist_ok=True)
            got = self.writers[table] = (pq.ParquetWriter(
                path, data.schema, compression=self.compression, use_dictionary=_DICTIONARY,
                write_statistics=[c for c in data.schema.names if c not in _NO_STATS]), path)
            self.rows[table] = 0
        got[0].write_table(data, row_group_size=ROW_GROUP)
        self.rows[table] += data.num_rows

    def _write_staged(self, final: bool = False) -> None:
        """Each table's staged columns written in whole row groups (ROW_GROUP rows) once it has one, the rows short
        of another kept for the next (every row when ``final``); batches whose columns do not join are written
        each on its own."""
        for table in list(self.staged):
            parts = self.staged[table]
            if not final and sum(p.num_rows for p in parts) < ROW_GROUP:
                continue
            try:
                parts = [parts[0] if len(parts) == 1 else self.pa.concat_tables(parts)]
            except self.pa.ArrowInvalid:
                pass
            last = parts.pop()
            keep = 0 if final else last.num_rows % ROW_GROUP
            for data in parts:
                self._write(table, data)
            if last.num_rows > keep:
                self._write(table, last.slice(0, last.num_rows - keep))
            if keep:
                self.staged[table] = [last.slice(last.num_rows - keep)]
            else:
                del self.staged[table]

    def flush(self) -> None:
        """Everything received written out."""
        self._build()
        self._write_staged(final=True)

    def _build(self) -> None:
        """What was received made each table's columns (staged), and let go."""
        from trainledger.journal.audit.replay import type_run

        parts, raw, n = self.parts, self.raw, self.pending
        self.parts, self.raw, self.pending = [], Lines(), 0
        if not n and ("events" in self.writers or "events" in self.staged or not self.events):
            return
        self.count += n
        #: each table's events, in order: lists of records and StepBlocks (a steps table's alone)
        groups: dict[str, list[Any]] = {}
        lines_of: dict[str, list[bytes]] = {}

        def add(tag: str, recs: Any, at: int) -> None:
            spec = self.specs.get(tag)
            if spec is None:
                return
            chunks = groups.setdefault(tag, [])
            if type(recs) is StepBlock or not chunks or type(chunks[-1]) is StepBlock:
                chunks.append(recs if type(recs) is StepBlock else list(recs))
            else:
                chunks[-1].extend(recs)
            if spec.by_sql:
                lines_of.setdefault(tag, []).extend(raw[at:at + len(recs)])

        at = 0
        for part in parts:
            if type(part) is StepBlock:
                if part.shi > part.slo:
                    add("step_observed", part, -1)
                for i, rec in part.other_records():
                    tag = self._tag(type(rec))
                    if tag is not None:
                        add(tag, [rec], at + i - part.lo)
            else:
                i, m = 0, len(part)
                while i < m:
                    t = type(part[i])
                    j = type_run(part, i, t)
                    tag = self._tag(t)
                    if tag is not None:
                        add(tag, part[i:j], at + i)
                    i = j
            at += len(part)
        if self.events:
            self._events(n, parts, raw)
        for tag, chunks in groups.items():
            spec = self.specs[tag]
            staged = self.staged.setdefault(spec.table, [])
            if spec.by_sql:
                staged.append(self._by_sql(spec, chunks[0], lines_of[tag]))
                continue
            i = 0
            while i < len(chunks):
                if type(chunks[i]) is StepBlock:
                    j = i
                    while j < len(chunks) and type(chunks[j]) is StepBlock:
                        j += 1
                    staged.append(self._step_table(spec, chunks[i:j]))
                else:
                    j = i + 1
                    staged.append(self._scalar(spec, chunks[i]))
                i = j

    def _events(self, n: int, parts: list[Any], raw: Any) -> None:
        """The events table's rows of these parts (``n`` events): seq, kind, ts and h from the columns of a
        StepBlock (every line's ts and h read off its tail) and from the records of the others."""
        import numpy as np

        pa = self.pa
        run, rank = self._const(n)
        first = piece_seq(parts[0]) if n else 0
        # verification hands every event on, in order
        if n and piece_seq(parts[-1]) + len(parts[-1]) != first + n:  # pragma: no cover
            raise AssertionError(f"events {first} to {first + n - 1} were not handed on in order")
        names: dict[str, int] = {"step_observed": 0}
        ts, hs, codes = [np.zeros(0, dtype=np.int64)], [b""], [np.zeros(0, dtype=np.int32)]
        for part in parts:
            if type(part) is StepBlock:
                c = part.cols
                ts.append(np.frombuffer(c.ts, dtype=np.int64)[part.lo:part.hi])
                hs.append(memoryview(c.h)[64 * part.lo:64 * part.hi])
                code = np.zeros(len(part), dtype=np.int32)  # its step lines
                for i, rec in part.other_records():
                    code[i - part.lo] = names.setdefault(self._kind(rec), len(names))
                codes.append(code)
            else:
                ts.append(np.fromiter(map(_TS, part), dtype=np.int64, count=len(part)))
                h = "".join(map(_H, part)).encode("ascii")
                if len(h) != 64 * len(part):  # pragma: no cover - verification held every h to 64 hex digits
                    raise AssertionError("an event's h is not 64 characters")
                hs.append(h)
                codes.append(np.fromiter((names.setdefault(self._kind(r), len(names)) for r in part), dtype=np.int32,
                                         count=len(part)))
        kinds = pa.array(list(names), pa.string()).take(pa.array(np.concatenate(codes)))
        hex_ = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.arange(0, 64 * n + 1, 64, dtype=np.int32)),
                                                      pa.py_buffer(b"".join(hs))])
        cols = [run, rank, *([pa.repeat(self.file_column, n)] if self.file_column is not None else []),
                pa.array(np.arange(first, first + n, dtype=np.int64)), kinds, pa.array(np.concatenate(ts)), hex_]
        if self.lines:
            cols.append(self._text(raw))
        self.staged.setdefault("events", []).append(pa.Table.from_arrays(cols, schema=self.events_schema))

    def _kind(self, rec: Any) -> str:
        tag = self._tag(type(rec))
        return rec.kind if tag is None else tag

    def _step_table(self, spec: _Typed, blocks: list[StepBlock]) -> Any:
        """The steps table's rows of these StepBlocks' step lines, from their columns: what :meth:`_scalar` makes
        of their records."""
        import numpy as np

        pa = self.pa
        seqs, ts, datas, valids = [], [], [], []
        for b in blocks:
            c = b.cols
            width = len(c.mask)
            at = np.flatnonzero(np.frombuffer(c.mask, dtype=np.uint8)[b.lo:b.hi]) + b.lo
            seqs.append(at + b.first)
            ts.append(np.frombuffer(c.ts, dtype=np.int64)[at])
            datas.append(np.frombuffer(c.data, dtype=np.int64).reshape(len(_STEP_COLUMNS), width)[:, b.slo:b.shi])
            valids.append(np.frombuffer(c.valid, dtype=np.uint8).reshape(len(_STEP_COLUMNS), width)[:, b.slo:b.shi])
        data, valid = np.concatenate(datas, axis=1), np.concatenate(valids, axis=1)
        m = data.shape[1]
        run, rank = self._const(m)
        arrays = [run, rank, pa.array(np.concatenate(seqs)), pa.array(np.concatenate(ts))]
        for k, (_, duck) in enumerate(_STEP_COLUMNS):
            have = valid[k]
            nulls = m - int(np.count_nonzero(have))
            bits = np.packbits(have, bitorder="little") if nulls else None
            if duck == "HUGEINT" and self.narrow:  # int64 already (step_columns takes no int past it)
                arrays.append(_from_buffers(pa, (data[k], bits, nulls), "BIGINT", m))
            elif duck == "HUGEINT" and sys.byteorder == "little":
                # DECIMAL(38,0) as Arrow lays it out here (each int64, then its sign: 128 bits), not a cast of it
                wide = np.empty((m, 2), dtype=np.int64)
                wide[:, 0] = data[k]
                np.right_shift(data[k], 63, out=wide[:, 1])
                arrays.append(pa.Array.from_buffers(pa.decimal128(38, 0), m, [None if bits is None else
                                                                              pa.py_buffer(bits), pa.py_buffer(wide)],
                                                    null_count=nulls))
            else:
                arrays.append(_from_buffers(pa, (data[k] if duck == "HUGEINT" else data[k].view(np.float64), bits,
                                                 nulls), duck, m))
        return pa.Table.from_arrays(arrays, names=["run_id", spec.rank_col, "seq", "ts", *spec.names])

    def _scalar(self, spec: _Typed, group: list[Any]) -> Any:
        pa = self.pa
        run, rank = self._const(len(group))
        ducks = ["BIGINT" if d == "HUGEINT" else d for d in spec.duck] if self.narrow else spec.duck
        try:
            arrays = [run, rank, *arrow_columns(group, ["seq", "ts", *spec.names], ["BIGINT", "BIGINT", *ducks])]
        except (OverflowError, pa.ArrowInvalid):
            if not self.narrow:
                raise
            raise _Wide(spec.table) from None
        return pa.Table.from_arrays(arrays, names=["run_id", spec.rank_col, "seq", "ts", *spec.names])

    def _text(self, raw: Any) -> Any:
        """Lines (a list of bytes, or :class:`~trainledger.journal.scan.Lines` where they were read) as a string
        column: ASCII ones (nearly all) as they are, others checked as UTF-8 by the cast."""
        pa = self.pa
        if isinstance(raw, Lines):
            arr, ascii_only = raw.binary(pa)
            if arr.type == pa.binary():  # its offsets 32-bit already
                return arr.view(pa.string()) if ascii_only else arr.cast(pa.string())
            return arr.view(pa.large_string()).cast(pa.string()) if ascii_only else \
                arr.cast(pa.large_string()).cast(pa.string())
        arr = pa.array(raw, pa.binary())
        return arr.view(pa.string()) if all(map(bytes.isascii, raw)) else arr.cast(pa.string())

    def _by_sql(self, spec: _Typed, group: list[Any], raw: list[bytes]) -> Any:
        pa = self.pa
        events = pa.table({"run_id": pa.repeat(self.run_id, len(group)),
                           "seq": pa.array([r.seq for r in group], pa.int64()),
                           "ts": pa.array([r.ts for r in group], pa.int64()),
                           "kind": pa.repeat(spec.kind, len(group)),
                           "line": self._text(raw)})
        self.con.register("events", events)
        try:
            return self.con.sql(typed_select(self.con, spec.sql, "true")).to_arrow_table()
        finally:
            self.con.unregister("events")

    def close(self, receipt: dict[str, Any], *, digests: bool = True) -> list[dict[str, Any]]:
        """Write the footers (each holding ``receipt``) and return the files' listing entries (``digests``: with
        each file's SHA-256, which an export's listing holds; None for files no listing will name)."""
        self.flush()
        meta = {RECEIPT_KEY: json.dumps(receipt, sort_keys=True, separators=(",", ":"))}
        listed = []
        for table, (w, path) in self.writers.items():
            w.add_key_value_metadata(meta)
            w.close()
            listed.append({"path": path.relative_to(self.root).as_posix(), "table": table, "run_id": self.run_id,
                           "rank": receipt["rank"], "rows": self.rows[table], "bytes": path.stat().st_size,
                           "sha256": file_sha256(path)[0] if digests else None})
        self.writers.clear()
        return listed

    def abandon(self) -> None:
        self.staged.clear()
        for w, _ in self.writers.values():
            try:
                w.close()
            except Exception:  # noqa: BLE001 - the files are removed with the folder
                pass
        self.writers.clear()


_H = operator.attrgetter("h")
_TS = operator.attrgetter("ts")
#: the steps table's columns in the order step_columns (journal/views/_fastcols.c) builds them, and their types
_STEP_COLUMNS = (("step", "HUGEINT"), ("loss", "DOUBLE"), ("grad_norm", "DOUBLE"), ("lr", "DOUBLE"),
                 ("step_time_s", "DOUBLE"), ("examples", "HUGEINT"), ("tokens", "HUGEINT"),
                 ("supervised_tokens", "HUGEINT"), ("data_time_s", "DOUBLE"), ("compute_time_s", "DOUBLE"),
                 ("batch_fingerprint", "DOUBLE"))
#: the views' accelerator (journal/views/_fastcols.c), or None: its column builders, or the Python ones
_fast = _accel.load("trainledger.journal.views._fastcols")
_step_columns = getattr(_fast, "step_columns", None)
_record_column = getattr(_fast, "record_column", None)
_record_columns = getattr(_fast, "record_columns", None)
#: record_column's code for a view's column type, and the Arrow type it builds
_CODES = {"HUGEINT": "q", "BIGINT": "q", "DOUBLE": "d", "BOOLEAN": "b"}
_ARROW: dict[str, Callable[[Any], Any]] = {"HUGEINT": lambda pa: pa.int64(), "BIGINT": lambda pa: pa.int64(),
                                           "DOUBLE": lambda pa: pa.float64(), "BOOLEAN": lambda pa: pa.bool_(),
                                           "VARCHAR": lambda pa: pa.string()}
#: the columns a dictionary pays for (few distinct values); the others are written plain
_DICTIONARY = ["run_id", "rank", "journal_rank", "kind"]
#: the columns without min/max statistics (a line's or a hash's are of no use to a reader's pruning)
_NO_STATS = frozenset({"line", "h"})


def arrow_column(recs: list[Any], name: str, duck: str) -> Any:
    """One field of records of one type as the Arrow column of the query layer's type ``duck`` (HUGEINT as
    DECIMAL(38,0), BIGINT, DOUBLE, BOOLEAN, VARCHAR): from the records' slots in C where every value is of the
    field's own type, else value by value. For other readers of verified records (``trainledger serve``)."""
    pa = _pyarrow()
    code = _CODES.get(duck)
    got = _record_column(recs, name, code) if code is not None and _record_column is not None else None
    if got is not None:
        return _from_buffers(pa, got, duck, len(recs))
    col = list(map(operator.attrgetter(name), recs))
    if duck == "HUGEINT":
        try:
            return pa.array(col, pa.int64()).cast(pa.decimal128(38, 0))
        except (OverflowError, pa.ArrowInvalid):
            return pa.array(col, pa.decimal128(38, 0))
    if duck == "DOUBLE":
        try:
            return pa.array(col, pa.float64())
        except pa.ArrowInvalid:  # an int past 2^53 in a float field: the nearest double, as DuckDB casts it
            return pa.array([float(v) if type(v) is int else v for v in col], pa.float64())
    return pa.array(col, _ARROW[duck](pa))


def arrow_columns(recs: list[Any], names: Sequence[str], ducks: Sequence[str]) -> list[Any]:
    """:func:`arrow_column` of each field (``names``, of the query layer's types ``ducks``), the numeric ones in one
    pass over the records (each visited once for all of them, not once a column)."""
    pa = _pyarrow()
    coded = [i for i, duck in enumerate(ducks) if duck in _CODES]
    got = (_record_columns(recs, tuple(names[i] for i in coded), tuple(_CODES[ducks[i]] for i in coded))
           if _record_columns is not None and len(coded) > 1 else None)
    out = []
    for i, (name, duck) in enumerate(zip(names, ducks)):
        bufs = got[coded.index(i)] if got is not None and i in coded else None
        out.append(arrow_column(recs, name, duck) if bufs is None else _from_buffers(pa, bufs, duck, len(recs)))
    return out


def _from_buffers(pa: Any, bufs: tuple[bytes, bytes | None, int], duck: str, n: int) -> Any:
    data, valid, nulls = bufs
    arr = pa.Array.from_buffers(_ARROW[duck](pa), n, [pa.py_buffer(valid) if valid is not None else None,
                                                     pa.py_buffer(data)], null_count=nulls)
    return arr.cast(pa.decimal128(38, 0)) if duck == "HUGEINT" else arr


class _Wide(JournalError):
    """A narrow writer (integers as int64) met an integer past int64: the journal is written again, wide (never
    leaves :func:`export_journal`)."""


@dataclasses.dataclass
class JournalExport:
    """What :func:`export_journal` hands back: the verification report, the receipt, the files written."""
    report: Any
    receipt: dict[str, Any]
    files: list[dict[str, Any]]


def export_journal(path: str | os.PathLike, root: str | os.PathLike, *, lines: bool, trust: TrustPolicy,
                   rank: int | None = None, con: Any = None, file_column: str | None = None,
                   compression: str = "zstd", digests: bool = True,
                   only: frozenset[str] | None = None, narrow: bool = False) -> JournalExport:
    """Verify one journal under ``trust`` and write its signed events under ``root`` (``TABLE/run-<run>/FILE``), in
    one pass: engine-neutral (a Ray, Dask or Spark task may run it; the result pickles). ``rank``: the journal is
    that rank of a run folder: its verification also gathers what :func:`~trainledger.journal.audit.rundir.check_run`
    needs, and an integrity failure's message names the rank. ``con``: a DuckDB connection to type container
    kinds with (one is opened otherwise). ``digests=False``: the files' entries without their SHA-256 (files that
    no listing names: the query layer's private load). ``only``: write these tables alone (the query layer's load
    for one statement; never an export, which holds every table). ``narrow``: integer columns as int64 where every
    value fits (the query layer's private load, whose views cast them to HUGEINT; a journal with an integer past
    int64 is written again, as an export is: DECIMAL(38,0)). Raises what verification raises; the files it
    wrote are then closed and left for the caller to remove with ``root``."""
    from trainledger.journal.views.query import new_connection
    from trainledger.journal.verify import open_checked, read_opening

    f, root = Path(path), Path(root)
    run_id = read_opening(f, open_checked(f))[0].run_id
    own = con is None
    if own:
        con = new_connection()
        con.execute("SET threads = 1")
    try:
        args = (f, root, run_id, lines, trust, rank, con, file_column, compression, digests, only)
        try:
            return _export_once(*args, narrow=narrow)
        except _Wide:
            return _export_once(*args, narrow=False)
    finally:
        if own:
            con.close()


def _export_once(f: Path, root: Path, run_id: str, lines: bool, trust: TrustPolicy, rank: int | None, con: Any,
                 file_column: str | None, compression: str, digests: bool, only: frozenset[str] | None, *,
                 narrow: bool) -> JournalExport:
    """:func:`export_journal`'s pass. A narrow pass that meets an integer past int64 removes what it wrote and
    raises _Wide."""
    from trainledger.journal.audit.rundir import _ANCHOR_KINDS
    from trainledger.journal.errors import IntegrityError
    from trainledger.journal.views.query import _file_row, _rank_of
    from trainledger.journal.verify import Verification, verify_with

    w = _JournalWriter(root, Path(f"run-{folder_name(run_id)}") / file_name(_rank_of(run_id)), run_id,
                       _rank_of(run_id), lines=lines, specs=_specs(), con=con, file_column=file_column,
                       compression=compression, only=only, narrow=narrow)
    try:
        try:
            rep = verify_with(f, Verification(consume=w, with_lines=True,
                                              collect=(_ANCHOR_KINDS, frozenset()) if rank is not None else None),
                              trust=trust)
        except IntegrityError as e:
            if rank is None:
                raise
            raise type(e)(f"rank {rank}: {e}", seq=e.seq, offset=e.offset) from None
        w.flush()
        row = _file_row(f, rep)
        if w.count != row["trusted_last_seq"] + 1:
            raise SchemaError(f"{f}: {w.count} events exported where verification checked "
                              f"{row['trusted_last_seq'] + 1}", seq=None)
        receipt = receipt_of(row, lines=lines, exported=w.count)
        return JournalExport(rep, receipt, w.close(receipt, digests=digests))
    except _Wide:
        written = [path for _, path in w.writers.values()]
        w.abandon()
        for path in written:
            path.unlink(missing_ok=True)
        raise
    except BaseException:
        w.abandon()
        raise


def export_parquet(paths: Sequence[str | os.PathLike], out: str | os.PathLike, *, lines: bool = False,
                   trust: TrustPolicy | None = None, partial: bool = False,
                   progress: Callable[[str], None] | None = None, ray: str | bool | None = None,
                   **trust_options: Any) -> ExportReport:
    """Verify ``paths`` (journals, run folders, folders of journals) under ``trust`` and write their signed events
    to the new folder ``out`` (see the module doc). ``ray``: each journal's pass as a Ray task instead
    (:func:`~trainledger.journal.backends.ray.export_journals_ray`; a cluster's address, or True for one started
    here), the run folders' check and the listing here as without it. Raises what verification raises (nothing is written then),
    :class:`UsageError` when ``out`` exists or two journals share a run id, :class:`JournalIOError` when it cannot
    be written (nothing is left behind)."""
    import duckdb

    from trainledger.journal.views.query import journal_files, new_connection

    t0 = time.perf_counter()
    policy = TrustPolicy.of(trust, **trust_options)
    dest = Path(out)
    if dest.exists() or dest.is_symlink():
        raise UsageError(f"{dest}: exists: an export writes a new folder")
    if not dest.parent.is_dir():
        raise UsageError(f"{dest.parent}: no such folder")
    pa = _pyarrow()
    files = journal_files(paths)
    ranks = _ranks_of(paths)
    _one_run_each(files)
    _remove_stale(dest)
    tmp = dest.parent / f".{dest.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    con = new_connection()
    con.execute("SET threads = 1")
    done: list[JournalExport] = []
    try:
        tmp.mkdir(mode=0o755)
        if ray:
            from trainledger.journal.backends.ray import export_journals_ray

            jobs = [(f, ranks.get(f.resolve(), (None, None))[1]) for f in files]
            done = export_journals_ray(export_journal, jobs, tmp, lines=lines, trust=policy,
                                       address=ray if isinstance(ray, str) else None)
        for i, f in enumerate(files if not ray else ()):
            rank = ranks.get(f.resolve(), (None, None))[1]
            done.append(export_journal(f, tmp, lines=lines, trust=policy, rank=rank, con=con))
            if progress is not None:
                progress(f"{i + 1}/{len(files)} journals, {sum(x.receipt['events'] for x in done):,} events")
        missing = _check_runs(files, ranks, done, policy, partial)
        _write_listing(tmp, lines, done, missing)
        os.rename(tmp, dest)
    except (OSError, duckdb.Error, pa.ArrowException) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e).splitlines()[0]
        raise JournalIOError(f"{dest}: cannot write the export: {why}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        con.close()
    listed = [x for d in done for x in d.files]
    return ExportReport(out=str(dest), journals=len(done), events=sum(d.receipt["events"] for d in done),
                        files=len(listed), bytes=sum(x["bytes"] for x in listed), lines=lines,
                        seconds=time.perf_counter() - t0, missing=missing)


def _remove_stale(dest: Path) -> None:
    """The staging folders of earlier exports to ``dest`` whose process is gone (killed before it could remove
    its own): never an export (no listing), only disk."""
    from trainledger.journal.copies import remove_if_owner_gone

    for p in dest.parent.glob(f".{glob.escape(dest.name)}.partial-*"):
        remove_if_owner_gone(p, p.name.rsplit("-", 1)[-1])


def _ranks_of(paths: Sequence[str | os.PathLike]) -> dict[Path, tuple[Path, int]]:
    """``{resolved file: (run folder, rank)}`` for the rank journals of every run folder among ``paths`` (or below a
    folder named there): those are held to their folder's cross-rank check."""
    from trainledger.journal.audit.rundir import rank_files, run_dirs_among

    return {f.resolve(): (d, rank) for d in run_dirs_among(paths) for rank, f in rank_files(d).items()}


def _one_run_each(files: list[Path]) -> None:
    from trainledger.journal.verify import open_checked, read_opening

    seen: dict[str, Path] = {}
    for f in files:
        run_id = read_opening(f, open_checked(f))[0].run_id
        if run_id in seen:
            raise UsageError(f"{f} and {seen[run_id]} are both run {run_id!r}: export one of them")
        seen[run_id] = f


def _check_runs(files: list[Path], ranks: dict[Path, tuple[Path, int]], done: list[JournalExport],
                policy: TrustPolicy, partial: bool) -> dict[str, list[int]]:
    """Each run folder's cross-rank check (``verify RUN_DIR``'s, from the exports' reports). Returns
    ``{folder: missing ranks}`` of partial ones."""
    from trainledger.journal.audit.rundir import check_run
    from trainledger.journal.errors import TrainledgerError

    by_dir: dict[Path, dict[int, Any]] = {}
    for f, d in zip(files, done):
        if f.resolve() in ranks:
            folder, rank = ranks[f.resolve()]
            by_dir.setdefault(folder, {})[rank] = d.report
    missing = {}
    for folder, reports in sorted(by_dir.items()):
        try:
            rep = check_run(folder, reports, trust=policy, partial=partial)
        except TrainledgerError as e:
            e.path = str(folder)
            raise
        if rep.missing:
            missing[str(folder)] = rep.missing
    return missing


def _write_listing(tmp: Path, lines: bool, done: list[JournalExport], missing: dict[str, list[int]]) -> None:
    listing = {"format": EXPORT_FORMAT, "lines": lines, "journals": [d.receipt for d in done],
               "files": [x for d in done for x in d.files], **({"partial": missing} if missing else {})}
    with open(tmp / LISTING, "w") as f:
        f.write(json.dumps(listing, indent=1, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
