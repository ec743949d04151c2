"""SQL over journals with DuckDB, in memory, locked down before any user SQL runs.

:func:`connect` verifies each journal (unless told not to), loads every
verified line into an in-memory table, defines the views, and then turns off
DuckDB's external access and locks its configuration, so a query over an
untrusted journal cannot read or write other files (``COPY ... TO``,
``read_csv(...)`` fail). Non-finite floats (stored as "NaN"/"Infinity") come
back as DOUBLE NaN/inf.

Views: ``events`` (run_id, file, seq, kind, ts, h, line), ``runs``,
``steps``, ``anomalies``, ``checkpoints``, ``resumes``, ``rewinds``,
``verdicts``, ``decisions``, ``seals``, ``stops``, ``configs`` (the
monitor's ``run_configured``), ``mfu`` (per step, from the config in force), and
one typed view per event kind, named by its tag, with the columns of its class.

The warm path. :func:`build_cache` writes a columnar copy of the loaded
tables (every view materialised) to ``<cache dir>/q-<paths digest>.duckdb``
together with what verification established for each file: size, last seq,
head hash, key id and trust. A later :func:`connect` over the same files uses
that copy instead of reading them when, for every file, the size is unchanged,
the last complete line carries the cached head hash, and the cached trust
satisfies the caller's trust options. A head hash commits to every line
before it, so the copy holds exactly the verified content of the journal that
ends in that head; a journal that grew has a new head and the copy is not
used. The copy is as trustworthy as the cache directory (the user's own:
``$TRAINLEDGER_CACHE_DIR``, else ``$XDG_CACHE_HOME/trainledger``, else
``~/.cache/trainledger``). It is attached read-only, so user SQL cannot
change it. ``trainledger query`` refreshes it in a background process after a
cold query over journals of :data:`CACHE_MIN_BYTES` or more (``--no-cache``
turns both off).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb
import msgspec

from trainledger.journal import codec
from trainledger.journal.scan import MAX_LINE
from trainledger.journal.copies import PrivateCopies
from trainledger.journal.errors import JournalIOError, SchemaError, TrainledgerError
from trainledger.journal.kinds import BUILTIN_KINDS
from trainledger.journal.trust import TrustPolicy
from trainledger.journal.verify import Verification, VerifyReport, open_checked, read_opening, verify_with

__all__ = ["connect", "open_views", "build_cache", "refresh_cache_in_background", "keep_cold_load", "cache_dir",
           "journal_files", "VIEWS", "Source", "CACHE_MIN_BYTES"]  # noqa: F822 - VIEWS: __getattr__

CACHE_VERSION = 11  # bumped whenever a view's columns change (timeline, runs.imported, the 1.2 kinds, events.rank,
#                    the 1.6 fields and anomaly_ended, metrics and evaluations, the 1.10 SDC kinds, replicas,
#                    the 1.10 compute settings)
#: ``trainledger query`` keeps a columnar copy only of journals at least this large; smaller ones load in
#: well under a tenth of a second anyway.
CACHE_MIN_BYTES = 16 * 1024 * 1024

#: Friendly names for the kinds people query most; every kind also has a view named by its tag
#: (``SELECT * FROM preflight_gate``). Columns come from the event classes themselves, so they cannot drift.
#: The rank of a distributed run's journal (its run id ends in ``.rNNNNN``, training/distributed/ranks.py); NULL else.
RANK_SQL = r"TRY_CAST(regexp_extract(run_id, '\.r([0-9]{5})$', 1) AS INTEGER)"

VIEW_NAMES = {"steps": "step_observed", "anomalies": "anomaly_detected", "episodes": "anomaly_ended",
              "checkpoints": "checkpoint_saved",
              "resumes": "run_resumed", "rewinds": "rewind_decided", "verdicts": "gate_verdict",
              "decisions": "decision_recorded", "seals": "seal", "stops": "run_stopped", "configs": "run_configured",
              "stragglers": "straggler_detected", "telemetry": "device_sampled", "evaluations": "evaluation_recorded",
              "fingerprints": "state_fingerprinted", "divergences": "state_diverged", "replay_checks": "replay_checked"}


def _duck_type(t: Any) -> str:
    """The DuckDB type of one field: integers as HUGEINT (an event's int may be anything up to 2**64 - 1, which
    BIGINT would turn into NULL), floats as DOUBLE ("NaN"/"Infinity" become NaN/inf), containers as JSON."""
    ti = msgspec.inspect
    if isinstance(t, ti.UnionType):
        rest = [x for x in t.types if not isinstance(x, ti.NoneType)]
        return _duck_type(rest[0]) if len(rest) == 1 else "JSON"
    return {ti.IntType: "HUGEINT", ti.FloatType: "DOUBLE", ti.StrType: "VARCHAR", ti.BoolType: "BOOLEAN"}.get(
        type(t), "JSON")


def _sql_default(value: Any) -> str | None:
    """A field's default as an SQL literal (fields equal to their default are left out of the line)."""
    if value is msgspec.NODEFAULT or value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return "'" + json.dumps(value) + "'::JSON"


def _lit(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _qid(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_TYPE_INFOS: dict[type, Any] = {}


def _type_info(cls: type) -> Any:
    """msgspec's description of an event class. The built-in kinds' are described in one call once a few are
    asked for (one call for all of them costs what a few alone do: the shared types are resolved once); the first
    few, each on its own (a query of one view needs one, in a fiftieth of the time)."""
    got = _TYPE_INFOS.get(cls)
    if got is None:
        if len(_TYPE_INFOS) >= 4:
            classes = [c for c in codec.known_kinds().values() if c not in _TYPE_INFOS]
            _TYPE_INFOS.update(zip(classes, msgspec.inspect.multi_type_info(classes)))
        got = _TYPE_INFOS.get(cls)
        if got is None:
            got = _TYPE_INFOS[cls] = msgspec.inspect.type_info(cls)
    return got


def typed_view(kind: str) -> str:
    """The SELECT of one kind's typed view: run_id, seq, ts, then every field of its class, in order."""
    fields = [f for f in _type_info(codec.known_kinds()[kind]).fields
              if f.name not in ("run_id", "seq", "ts")]  # run_opened's run_id is the column every view has
    shape = json.dumps({f.encode_name: _duck_type(f.type) for f in fields}, separators=(",", ":"))
    cols = []
    for f in fields:
        col = f"x.{_qid(f.encode_name)}"
        d = _sql_default(f.default if f.default is not msgspec.NODEFAULT else (
            f.default_factory() if f.default_factory is not msgspec.NODEFAULT else msgspec.NODEFAULT))
        cols.append(f"{'COALESCE(' + col + ', ' + d + ')' if d is not None else col} AS {_qid(f.name)}")
    # The journal's rank (a distributed run); named journal_rank where the kind has a rank field of its own.
    rank_col = "journal_rank" if any(f.name == "rank" for f in fields) else "rank"
    return (f"SELECT run_id, {RANK_SQL} AS {rank_col}, seq, ts, {', '.join(cols)} FROM (SELECT run_id, seq, ts, "
            f"json_transform(line, '{shape}') AS x FROM events WHERE kind = '{kind}')")


#: The views that are not one kind's typed view: SQL over the others (``runs`` over ``events``).
_DERIVED: dict[str, str] = {
    # imported: a journal `trainledger import` wrote from another tool's files (it attests what they said)
    "runs": f"SELECT run_id, {RANK_SQL} AS rank, file, min(ts) AS created_ns, count(*) AS events, "
            "max(seq) AS last_seq, bool_or(kind = 'run_opened' AND json_extract(line, '$.meta.imported') IS NOT NULL) "
            "AS imported FROM events GROUP BY run_id, file",
    # The final timeline: each step's observations that no later resume or rewind went back before (a resumed
    # stretch's steps appear twice in steps; here once, as the run finally took them).
    "timeline": "SELECT s.* FROM steps s WHERE NOT EXISTS (SELECT 1 FROM resumes r WHERE r.run_id = s.run_id "
                "AND r.rank IS NOT DISTINCT FROM s.rank AND r.seq > s.seq AND r.from_step < s.step AND NOT EXISTS "
                "(SELECT 1 FROM configs c WHERE c.run_id = s.run_id AND c.rank IS NOT DISTINCT FROM s.rank "
                "AND c.seq > s.seq AND c.seq < r.seq))",  # a run_configured between them starts a new segment
    # MFU per step, PaLM appendix B against the run_configured in force at that step (ASOF: the latest before it).
    # 1.10: a causal attention convention halves the attention term.
    "mfu": "SELECT s.run_id, s.rank, s.seq, s.step, (6.0 * c.n_params + (CASE WHEN c.attention_convention = 'causal' "
           "THEN 6.0 ELSE 12.0 END) * c.n_layer * c.n_head * c.head_dim * c.seq_len) "
           "* COALESCE(s.tokens, s.examples * c.seq_len) / s.step_time_s / (c.peak_flops_per_sec * c.devices) AS mfu "
           "FROM steps s ASOF JOIN configs c ON s.run_id = c.run_id AND s.seq >= c.seq "
           "WHERE s.step_time_s > 0 AND c.peak_flops_per_sec IS NOT NULL AND c.n_params IS NOT NULL",
    # Every logged scalar, one row each (metrics_logged's map unnested): NaN and the infinities as DOUBLE's own.
    # The map is cast once a row and unnested in the select list: a lateral json_each over metrics_logged (itself a
    # view that decodes each line) decoded the line again for every key, 20 s for 5 rows of 10,000 names.
    "metrics": "SELECT run_id, rank, seq, step, unnest(map_keys(mm)) AS name, "
               "TRY_CAST(unnest(map_values(mm)) AS DOUBLE) AS value, source "
               "FROM (SELECT run_id, rank, seq, step, CAST(CAST(metrics AS JSON) AS MAP(VARCHAR, JSON)) AS mm, source "
               "FROM metrics_logged)",
}


#: The derived views' names: a reader recomputes them from the typed views (the Parquet export stores none of them)
DERIVED_VIEWS = tuple(_DERIVED)

#: The views each derived view reads besides ``events`` (a test holds it to DuckDB's parse of the SQL).
_DERIVED_READS: dict[str, tuple[str, ...]] = {"runs": (), "timeline": ("steps", "resumes", "configs"),
                                              "mfu": ("steps", "configs"), "metrics": ("metrics_logged",)}


def view_names() -> list[str]:
    """Every view's name (``events`` aside), in the order they are defined: a view after those it reads."""
    return ["runs", *VIEW_NAMES, *BUILTIN_KINDS, "timeline", "mfu", "metrics"]


_VIEW_SQL: dict[str, str] = {}


def view_sql(name: str) -> str:
    """One view's SELECT (what :data:`VIEWS` holds for it), made when first asked for."""
    got = _VIEW_SQL.get(name)
    if got is None:
        got = _VIEW_SQL[name] = _DERIVED[name] if name in _DERIVED else typed_view(VIEW_NAMES.get(name, name))
    return got


def __getattr__(name: str) -> Any:
    # VIEWS (name -> SELECT of every view) is made on first use: most commands define only the views their SQL
    # reads, and describing every kind's fields costs a short query more than the rest of its start
    if name == "VIEWS":
        views = globals()["VIEWS"] = {v: view_sql(v) for v in view_names()}
        return views
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _views_read(con: duckdb.DuckDBPyConnection, sql: str | None) -> list[str] | None:
    """The views ``sql`` reads, with those they read in turn, in definition order; None (define them all) when it
    is not only SELECTs of the views by name: a statement DuckDB cannot serialize, a table function, SHOW or
    DESCRIBE (the catalog: it would miss the rest), a name that is not a view (its error then suggests the right
    one), another schema or catalog. DuckDB's own parser decides (``json_serialize_sql``: parsed, never bound, so
    nothing is read)."""
    got = _names_read(con, sql)
    return None if got is None else got[0]


def _names_read(con: duckdb.DuckDBPyConnection, sql: str | None) -> tuple[list[str], bool] | None:
    """:func:`_views_read`'s views, and whether ``sql`` names ``events`` itself; None as there."""
    if sql is None:
        return None
    try:
        tree = json.loads(con.execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]).fetchall()[0][0])
    except (duckdb.Error, ValueError, TypeError):
        return None
    if not isinstance(tree, dict) or tree.get("error") is not False:
        return None
    names: set[str] = set()
    ctes: set[str] = set()
    todo: list[Any] = [tree]
    while todo:
        x = todo.pop()
        if isinstance(x, list):
            todo.extend(x)
            continue
        if not isinstance(x, dict):
            continue
        kind = x.get("type")
        if kind in ("SHOW_REF", "TABLE_FUNCTION"):
            return None
        if kind == "BASE_TABLE":
            if x.get("catalog_name") not in ("", None) or x.get("schema_name") not in ("", "main", None):
                return None
            names.add(str(x.get("table_name", "")).lower())
        cte = x.get("cte_map")
        if isinstance(cte, dict):
            ctes.update(str(m.get("key", "")).lower() for m in cte.get("map", ()) if isinstance(m, dict))
        todo.extend(x.values())
    names -= ctes
    known = view_names()
    if not names or not names <= {*known, "events"}:
        return None
    need: set[str] = set()
    todo = sorted(names - {"events"})
    while todo:
        n = todo.pop()
        if n not in need:
            need.add(n)
            todo.extend(_DERIVED_READS.get(n, ()))
    return [n for n in known if n in need], "events" in names


def tables_read(con: Any, sql: str | None) -> frozenset[str] | None:
    """The tables of the Parquet form (``trainledger.journal.views.parquet.export.tables()``) that ``sql`` reads: those
    of the views it reads (DuckDB's parse: :func:`~trainledger.journal.views.query._views_read`), ``events`` when it names
    it or reads ``runs``; None (every table) when that cannot be told or ``sql`` is None."""
    got = _names_read(con, sql)
    if got is None:
        return None
    views, events = got
    aliases = {tag: name for name, tag in VIEW_NAMES.items()}
    return frozenset({"events"} if events or "runs" in views else set()) | {
        aliases.get(v, v) for v in views if v not in _DERIVED}


_COMMON = '{"kind":"VARCHAR","seq":"BIGINT","ts":"BIGINT","h":"VARCHAR"}'
#: the table every view reads: one row a line
_COMMON_TABLE = ("CREATE TABLE events_t (run_id VARCHAR, rank INTEGER, file VARCHAR, seq BIGINT, kind VARCHAR, "
                 "ts BIGINT, h VARCHAR, line VARCHAR)")

#: a cold load instead of the in-memory one: ``(files, paths, trust, partial[, sql=]) -> (unlocked connection with
#: every view, or those ``sql`` reads, when given; Source with readable set)``
ColdLoad = Callable[[list[Path], Sequence[Any], TrustPolicy, bool], tuple[duckdb.DuckDBPyConnection, "Source"]]


@dataclasses.dataclass
class Source:
    """Where a connection's tables came from: ``"journals"`` (read now) or ``"cache"`` (a verified copy)."""

    origin: str
    files: list[dict[str, Any]]
    cache_path: Path | None = None
    #: a partial view's run folders (``partial=True``): folder -> the ranks it lacks; what is shown is partial
    missing: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    #: the private folder the views read (a cold load through the Parquet form); the lockdown allows only it
    readable: Path | None = None
    #: a cold load through the Parquet form: the files of each table (under ``readable``), which
    #: :func:`keep_cold_load` keeps as the next query's copy
    tables: dict[str, list[str]] | None = None
    #: the tables such a load wrote when it was for one statement (those it reads); None: every one
    loaded: list[str] | None = None


def journal_files(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Journal files named directly, or every ``*.jsonl`` under a named folder (recursively), the files written
    beside journals left out (their tokens and documents: :data:`trainledger.journal.paths.SIDECAR_SUFFIXES`)."""
    from trainledger.journal.paths import is_sidecar

    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(x for x in p.rglob("*.jsonl") if x.is_file() and not is_sidecar(x))
        elif p.is_file():
            out.append(p)
        else:
            raise JournalIOError(f"{p}: no such file or folder")
    if not out:
        raise JournalIOError("no journal files found in " + ", ".join(map(str, paths)))
    return out


def cache_dir() -> Path:
    """``$TRAINLEDGER_CACHE_DIR``, else ``$XDG_CACHE_HOME/trainledger``, else ``~/.cache/trainledger``."""
    if os.environ.get("TRAINLEDGER_CACHE_DIR"):
        return Path(os.environ["TRAINLEDGER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "trainledger"


def _digest(files: list[Path]) -> str:
    return hashlib.sha256("\0".join(sorted(str(f.resolve()) for f in files)).encode()).hexdigest()[:24]


def _cache_path(files: list[Path]) -> Path:
    return cache_dir() / f"q-{_digest(files)}.duckdb"


def _kept_path(files: list[Path]) -> Path:
    """Where a cold load's Parquet files are kept for the next query over the same files (:func:`keep_cold_load`)."""
    return cache_dir() / f"p-{_digest(files)}"


def keep_cold_load(source: Source) -> Path | None:
    """Keep what a cold load through the Parquet form wrote (the verified events and every typed table, as Parquet
    files, with what verification established for each journal) as the copy the next query over the same files
    answers from: its folder renamed into the cache folder, a ``meta.json`` beside the files. Call it once the
    connection over them is closed. The first query leaves the copy at no cost but the rename; the next one reads
    Parquet as DuckDB would. None (and nothing kept) when there is nothing to keep, the cache folder is not this
    user's alone, or the load was not written there (a rename across file systems would copy)."""
    if source.origin != "journals" or source.tables is None or source.readable is None:
        return None
    d = safe_cache_dir(create=True)
    folder = Path(source.readable)
    if d is None or folder.parent.resolve() != d.resolve():
        return None
    try:
        rel = {t: [str(Path(f).relative_to(folder)) for f in fs] for t, fs in source.tables.items()}
    except ValueError:
        return None
    target = _kept_path([Path(r["resolved"]) for r in source.files])  # the files the load read, as listed then
    shutil.rmtree(folder / "spill", ignore_errors=True)  # the query's own
    fd = os.open(folder / "meta.json", os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"version": CACHE_VERSION, "files": source.files, "tables": rel,  # tables in the load's order
                   "loaded": source.loaded}, f)
    old = target.with_name(f"{target.name}.old-{os.getpid()}")
    try:
        os.rename(target, old)
    except FileNotFoundError:
        old = None
    except OSError:
        return None
    try:
        os.rename(folder, target)
    except OSError:  # another query kept its copy meantime: this one is removed at exit
        return None
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return target


def safe_cache_dir(create: bool) -> Path | None:
    """The cache folder if only this user can write it (a real folder, owned by us, no group/other write);
    created 0700 when ``create``. ``None`` when it is missing or unsafe: the cache is then not used at all."""
    d = cache_dir()
    if create:
        try:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError:
            return None
    try:
        st = os.lstat(d)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        return None
    return d


def _safe_cache_file(path: Path) -> bool:
    """A regular file (not a link), owned by us, that no one else can write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def connect(paths: Sequence[str | os.PathLike], *, verify_first: bool = True, use_cache: bool = True,
            trust: TrustPolicy | None = None, partial: bool = False,
            **trust_options: Any) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with every journal loaded and the views defined, then locked.

    ``verify_first`` verifies each journal under ``trust`` (a :class:`TrustPolicy`, or its fields as keywords,
    as :func:`trainledger.journal.verify.verify` takes them) and raises its error on the first that
    fails; ``False`` skips that (the CLI says so). Torn tails are left out.
    ``use_cache`` answers from a verified columnar copy when one matches (see
    the module docstring); it never builds one (:func:`build_cache` does).
    A run folder of rank journals is first checked whole, as ``verify RUN_DIR`` checks it (a missing rank, a rank
    from another run, a truncated one: :class:`~trainledger.journal.audit.rundir.AnchorMismatch`), unless
    ``partial``: then a missing rank is allowed (every rank present is still checked, anchors included), and the
    caller must say the view is partial (:func:`open_views`' ``Source.missing`` names the ranks).
    """
    return open_views(paths, verify_first=verify_first, use_cache=use_cache, trust=trust, partial=partial,
                      **trust_options)[0]


def open_views(paths: Sequence[str | os.PathLike], *, verify_first: bool = True, use_cache: bool = True,
               trust: TrustPolicy | None = None, partial: bool = False, cold: ColdLoad | None = None,
               sql: str | None = None, **trust_options: Any) -> tuple[duckdb.DuckDBPyConnection, Source]:
    """:func:`connect`, also saying where the tables came from. ``cold``: the load to use instead of reading every
    line into memory when the journals are not cached (``trainledger query`` passes the Parquet form's,
    :func:`trainledger.journal.views.parquet.journals.load_journals`, for large journals); it verifies as this does.
    ``sql``: the one statement the connection is opened for (``trainledger query``'s): answered from a verified
    copy, only the views it reads are defined (every view when DuckDB's parse of it cannot tell which)."""
    trust = TrustPolicy.of(trust, **trust_options)
    files = journal_files(paths)
    if verify_first and use_cache:
        hit = _warm(files, trust, sql)  # a copy is only ever built of whole run folders (build_cache checks them)
        if hit is not None:
            return hit
    try:
        if cold is not None and verify_first:
            con, source = cold(files, paths, trust, partial, **({} if sql is None else {"sql": sql}))
        else:
            missing = _whole_run_dirs(paths, trust, partial=partial) if verify_first else {}
            con, source = _load(files, verify_first, trust)
            source.missing = missing
            _define_views(con)
    except (duckdb.InterruptException, RuntimeError) as e:
        # A Ctrl-C that lands inside one of DuckDB's own statements comes back as its InterruptException, or a
        # RuntimeError saying "Query interrupted": the same Ctrl-C, for the caller to handle as one.
        if isinstance(e, duckdb.InterruptException) or str(e).strip() == "Query interrupted":
            raise KeyboardInterrupt from None
        raise
    _lock(con, source.readable)
    return con, source


def _whole_run_dirs(paths: Sequence[str | os.PathLike], trust: TrustPolicy, *,
                    partial: bool = False) -> dict[str, list[int]]:
    """Every run folder among ``paths`` (or below a folder named there), checked whole (verify_run_dir); with
    ``partial``, checked as far as the ranks present go. Returns ``{folder: missing ranks}`` of partial ones."""
    from trainledger.journal.audit.rundir import run_dirs_among, verify_run_dir

    missing = {}
    for d in run_dirs_among(paths):
        try:
            rep = verify_run_dir(d, trust=trust, partial=partial)
        except TrainledgerError as e:
            e.path = str(d)
            raise
        if rep.missing:
            missing[str(d)] = rep.missing
    return missing


def build_cache(paths: Sequence[str | os.PathLike], *, trust: TrustPolicy | None = None,
                cold: ColdLoad | None = None, **trust_options: Any) -> Path:
    """Verify the journals, load them and write the columnar copy a later :func:`connect` can use.

    Written to a temporary file and renamed into place, so a reader never sees
    half a copy; a copy for the same set of files is replaced. ``cold``: as :func:`open_views` takes it (the
    copy is then written from the Parquet form, one streaming pass, memory bounded by DuckDB's own).
    """
    files = journal_files(paths)
    if safe_cache_dir(create=True) is None:
        raise JournalIOError(f"{cache_dir()}: not a folder that only this user can write: no cache kept there")
    trust = TrustPolicy.of(trust, **trust_options)
    if cold is not None:  # a warm answer skips the run folders' check: cold holds them whole (no partial)
        con, source = cold(files, paths, trust, False)
    else:
        _whole_run_dirs(paths, trust)  # a warm answer skips that check, so no copy is made of a partial folder
        con, source = _load(files, True, trust)
        _define_views(con)
    target = _cache_path(files)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        con.execute("ATTACH ? AS c", [str(tmp)])
        con.execute("CREATE TABLE c.meta AS SELECT ? AS version, ? AS files", [CACHE_VERSION, json.dumps(source.files)])
        con.execute("CREATE TABLE c.events AS SELECT * FROM events")
        for name in view_names():
            con.execute(f"CREATE TABLE c.{name} AS SELECT * FROM {name}")
        con.execute("DETACH c")
        os.replace(tmp, target)
    finally:
        con.close()
        tmp.unlink(missing_ok=True)
        Path(f"{tmp}.wal").unlink(missing_ok=True)
    return target


def refresh_cache_in_background(paths: Sequence[str | os.PathLike], *, trust: TrustPolicy | None = None,
                                **trust_options: Any) -> None:
    """Start a detached, low-priority process that runs :func:`build_cache` (it verifies again itself). Only the
    policy's keys and opt-ins travel; an expected head or checkpoint is never cached."""
    t = TrustPolicy.of(trust, **trust_options)
    spec = {"paths": [str(Path(p).resolve()) for p in paths], "keys": [k.line() for k in t.keys],
            "trust_embedded": t.trust_embedded, "allow_unsigned": t.allow_unsigned, "allow_unsealed": t.allow_unsealed,
            "cache_dir": str(cache_dir())}
    # Isolated (-I: neither the current folder nor PYTHON* variables reach sys.path) and started from /, so a
    # folder named journal/ where the user happens to stand is never imported. With pyarrow, from the Parquet
    # form (bounded memory: journal/views/parquet/journals.py), else loaded into memory here.
    module = "trainledger.journal.views.parquet.journals" if _has_pyarrow() else "trainledger.journal.views.query"
    _REFRESHERS.append(subprocess.Popen(
        [sys.executable, "-I", "-m", module, json.dumps(spec)], stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd="/"))


#: Refreshers started by this process (kept referenced: they outlive the query that started them).
_REFRESHERS: list[subprocess.Popen] = []


# -- loading ----------------------------------------------------------------------------------------------------


def new_connection() -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection as every command here uses one: no extension installed or loaded behind the
    user's back, and no progress bar (DuckDB draws it on stdout once a statement runs two seconds, which would
    corrupt ``--format csv`` or ``json`` output)."""
    con = duckdb.connect(":memory:", config={"autoinstall_known_extensions": False,
                                             "autoload_known_extensions": False})
    con.execute("SET enable_progress_bar = false")  # a connection setting, not a global one
    return con


def _load(files: list[Path], verify_first: bool, trust: TrustPolicy) -> tuple[duckdb.DuckDBPyConnection, Source]:
    con = new_connection()
    con.execute(_COMMON_TABLE)
    # Every file is copied into a private folder first and only the copy is verified and loaded: the bytes
    # DuckDB reads are the bytes verification checked, and the path DuckDB sees is ours (no glob expansion).
    with PrivateCopies() as copies:
        if not verify_first:  # nothing checked: only the run id, from the first line
            rows = []
            for f in files:
                copy = copies.copy(f)
                rows.append({"file": str(f), "copy": str(copy), "run_id": read_opening(copy, open_checked(copy))[0].run_id,
                             "last_seq": None})
            _insert(con, rows, careful=True)
            return con, Source("journals", [_public(r) for r in rows])
        staged = [(f, copies.copy(f)) for f in files]
        names = []
        for f, c in staged:
            with _named(f, c):
                names.append({"file": str(f), "copy": str(c), "run_id": read_opening(c, open_checked(c))[0].run_id})
        quick: list[BaseException] = []

        def read_all() -> None:
            # While the last file is being verified, DuckDB reads them all (it releases the GIL, and the
            # verifier's workers are separate processes), assuming what verification nearly always finds: every
            # line sound and signed. The rows are used only once verification agrees.
            try:
                _insert(con, names, careful=False)
            except duckdb.Error as e:
                quick.append(e)

        rows = []
        for i, (f, c) in enumerate(staged):
            with _named(f, c):
                rep = verify_with(c, Verification(alongside=read_all if i == len(staged) - 1 else None), trust=trust)
            rep.path = str(f)
            rows.append({**_file_row(f, rep), "copy": str(c), "identity": list(copies.identity[str(c)])})
        trimmed = False
        for r in rows:
            if r["trusted_bytes"] != r["size"]:  # an unsigned tail or torn bytes: keep only what was verified
                os.truncate(r["copy"], r["trusted_bytes"])
                trimmed = True
        if quick or trimmed:
            con.execute("DELETE FROM events_t")
            _insert(con, rows, careful=False)
        _check_loaded(con, rows)
    return con, Source("journals", [_public(r) for r in rows])


@contextlib.contextmanager
def _named(original: Path, copy: Path) -> Iterator[None]:
    """An error about a private copy names the user's file instead (``path``, the report, the message)."""
    try:
        yield
    except TrainledgerError as e:
        e.path = str(original)
        if getattr(e, "report", None) is not None:
            e.report.path = str(original)
        e.args = tuple(a.replace(str(copy), str(original)) if isinstance(a, str) else a for a in e.args)
        raise


def _public(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "copy"}


def _check_loaded(con: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]]) -> None:
    """Every verified line, and nothing else, was loaded: per file, the count and the last seq and hash."""
    got = {f: (n, last, h) for f, n, last, h in con.execute(
        "SELECT file, count(*), max(seq), arg_max(h, seq) FROM events_t GROUP BY file").fetchall()}
    for r in rows:
        want = (r["trusted_last_seq"] + 1, r["trusted_last_seq"], r["trusted_hash"])
        if got.get(r["file"]) != want:
            raise SchemaError(f"{r['file']}: DuckDB loaded {got.get(r['file'], (0,))[0]} lines where verification "
                              f"checked {want[0]}", seq=None)


def _insert(con: duckdb.DuckDBPyConnection, rows: list[dict[str, Any]], *, careful: bool) -> None:
    """Read each private copy's lines (one string per line: canonical JSON has no raw control characters, so
    no CSV quoting or splitting applies) and parse the common columns in one pass. ``careful`` (unverified
    files only): a line may not be JSON, and such lines are dropped."""
    for r in rows:
        parse = "try(json_transform(line, ?))" if careful else "json_transform(line, ?)"
        con.execute(
            f"INSERT INTO events_t SELECT ?, ?, ?, c.seq, c.kind, c.ts, c.h, line FROM (SELECT {parse} AS c, line "
            "FROM read_csv(?, columns = {'line': 'VARCHAR'}, delim = '\x01', quote = '', escape = '', "
            f"header = false, auto_detect = false, max_line_size = {MAX_LINE + 2}, "
            f"ignore_errors = {str(careful).lower()}))",
            [r["run_id"], _rank_of(r["run_id"]), r["file"], _COMMON, r["copy"]])
        if careful:
            con.execute("DELETE FROM events_t WHERE file = ? AND seq IS NULL", [r["file"]])


def _rank_of(run_id: str | None) -> int | None:
    """The rank a distributed run's journal has in its run id (``RUN.r00003``, as RANK_SQL reads it), else None."""
    from trainledger.journal.audit.rundir import split_run_id

    split = split_run_id(run_id)
    return None if split is None else split[1]


def _file_row(f: Path, rep: VerifyReport) -> dict[str, Any]:
    trusted_last = rep.trusted_last_seq
    return {"file": str(f), "run_id": rep.run_id, "last_seq": rep.last_seq, "size": rep.bytes,
            "last_hash": rep.last_hash, "key_id": rep.key_id, "trust": rep.trust, "tail": rep.tail,
            "torn_offset": rep.torn_offset, "trusted_bytes": rep.trusted_bytes, "trusted_last_seq": trusted_last,
            "trusted_hash": rep.last_hash if trusted_last == rep.last_seq else rep.seal_line_hash,
            "unsealed_events": rep.unsealed_events if rep.trust in ("pinned", "embedded") else 0,
            "resolved": str(f.resolve()),
            # the last seal's signed tree head (format 1.3): what an export's receipt carries
            "format_version": rep.format_version, "sealed_seq": rep.last_sealed_seq,
            "sealed_hash": rep.last_sealed_hash, "tree_root": rep.last_tree_root, "seal_sig": rep.last_seal_sig}


def _define_views(con: duckdb.DuckDBPyConnection, names: Sequence[str] | None = None) -> None:
    """``events`` and the views ``names`` (each after those it reads: :func:`_views_read`), else every view."""
    con.execute("CREATE VIEW events AS SELECT * FROM events_t")
    for name in view_names() if names is None else names:
        con.execute(f"CREATE VIEW {name} AS {view_sql(name)}")


def _lock(con: duckdb.DuckDBPyConnection, private: Path | None = None, *, readable: Path | None = None) -> None:
    """From here on, no file access and no configuration changes: user SQL runs sandboxed. DuckDB's temporary
    folder is always in ``allowed_directories``, and its default is ``./.tmp`` of the working folder (readable,
    writable, and a planted link there leads anywhere): it is set to ``private``/spill (a private folder the
    caller owns, where spilling may go), or spilling is switched off. ``readable``: a folder the views read (a
    kept copy), allowed too, with spilling off."""
    if private is not None:
        spill = Path(private) / "spill"
        spill.mkdir(mode=0o700, exist_ok=True)
        con.execute(f"SET temp_directory = {_lit(str(spill))}")
        con.execute(f"SET allowed_directories = [{_lit(str(private) + os.sep)}]")
    else:
        con.execute("SET temp_directory = ''")
        if readable is not None:
            con.execute(f"SET allowed_directories = [{_lit(str(readable) + os.sep)}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


# -- the warm path ----------------------------------------------------------------------------------------------

_TAIL = re.compile(rb',"seq":(\d+),"ts":\d+,"h":"([0-9a-f]{64})"\}$')


def _last_line_head(f: Path, size: int, torn_offset: int | None) -> tuple[int, str] | None:
    end = torn_offset if torn_offset is not None else size
    with open(f, "rb") as fh:
        fh.seek(max(0, end - 65536))
        chunk = fh.read(end - max(0, end - 65536))
    if not chunk.endswith(b"\n"):
        return None
    m = _TAIL.search(chunk[chunk.rfind(b"\n", 0, len(chunk) - 1) + 1: -1])
    return (int(m.group(1)), m.group(2).decode()) if m else None


def _trust_ok(row: dict[str, Any], trust: TrustPolicy) -> bool:
    """Whether a copy verified under the trust it records satisfies ``trust``."""
    if trust.expect_head is not None or trust.expect_checkpoint is not None:
        return False  # rare options: verify in full
    if trust.require_closed and row["tail"] != "closed":
        return False
    if row.get("unsealed_events") and not trust.allow_unsealed:
        return False
    if row["trust"] == "unsigned":
        return trust.allow_unsigned
    if row["trust"] not in ("pinned", "embedded"):
        return False
    if trust.keys:
        return row["key_id"] in {k.key_id for k in trust.keys}
    return trust.trust_embedded


def _still_current(con: duckdb.DuckDBPyConnection, files: list[Path], trust: TrustPolicy
                   ) -> list[dict[str, Any]] | None:
    """The attached copy's file rows, if it is of these files, they have not changed, and the trust fits."""
    version, meta = con.execute("SELECT version, files FROM cache.meta").fetchone()
    return _rows_current(version, json.loads(meta), files, trust)


def _rows_current(version: Any, rows: list[dict[str, Any]], files: list[Path], trust: TrustPolicy
                  ) -> list[dict[str, Any]] | None:
    """A copy's file rows, if it is of these files, they have not changed, and the trust fits."""
    if version != CACHE_VERSION or sorted(r["resolved"] for r in rows) != sorted(str(f.resolve()) for f in files):
        return None
    for r in rows:
        f = Path(r["resolved"])
        st = f.stat()
        # Inode, mtime and ctime too: a rewrite that keeps the size and the last line still changes the ctime
        # (which no one but the kernel sets), and then the journal is read and verified afresh.
        if (st.st_size != r["size"] or [st.st_ino, st.st_mtime_ns, st.st_ctime_ns] != r.get("identity")
                or not _trust_ok(r, trust)
                or _last_line_head(f, r["size"], r["torn_offset"]) != (r["last_seq"], r["last_hash"])):
            return None
    return rows


def views_over_parquet(by_table: dict[str, list[str]], *, order: Sequence[str] | None = None,
                       sql: str | None = None, con: duckdb.DuckDBPyConnection | None = None
                       ) -> duckdb.DuckDBPyConnection:
    """A new connection with every view over Parquet files of the export's layout (``{table: [file, ...]}``;
    ``events`` with or without ``line`` and ``file``; the tables in ``order``, else events first), not locked
    yet: every view defined over no rows, then each table with files replacing its own (and its kind's other name:
    steps is step_observed too). ``sql``: the one statement the connection is for; only the views it reads are
    defined then (all when that cannot be told: :func:`_views_read`). ``con``: a connection of
    :func:`new_connection`'s with nothing defined in it yet, to define them in (each new one costs a database)."""
    if con is None:
        con = new_connection()
    con.execute(_COMMON_TABLE)
    aliases = {tag: name for name, tag in VIEW_NAMES.items()}
    wanted = _views_read(con, sql)
    if wanted is not None:  # a kind's two names read the same files: a view of either needs the other's table
        both = set(wanted) | {aliases.get(v) or VIEW_NAMES.get(v) for v in wanted} - {None}
        wanted = [v for v in view_names() if v in both]
    _define_views(con, wanted)
    names = [t for t in (order if order is not None else sorted(by_table, key=lambda t: (t != "events", t)))
             if by_table.get(t) and (wanted is None or t == "events" or t in wanted)]
    for table in names:
        src = f"read_parquet([{', '.join(_lit(f) for f in by_table[table])}], union_by_name = true)"
        if table == "events":
            have = {c for c, *_ in con.execute(f"DESCRIBE SELECT * FROM {src}").fetchall()}
            sql = (f"SELECT run_id, rank, {'file' if 'file' in have else 'NULL::VARCHAR AS file'}, seq, kind, ts, "
                   f"h, {'line' if 'line' in have else 'NULL::VARCHAR AS line'} FROM {src}")
        else:
            sql = f"SELECT * FROM {src}"
            # integers as the query layer types them (HUGEINT): an export's DECIMAL(38,0), a private load's int64
            wide = [c for c, t, *_ in con.execute(f"DESCRIBE {table}").fetchall() if t == "HUGEINT"]
            if wide:
                try:
                    con.execute(f"CREATE OR REPLACE VIEW {table} AS SELECT * REPLACE ("
                                f"{', '.join(f'CAST({_qid(c)} AS HUGEINT) AS {_qid(c)}' for c in wide)}) FROM {src}")
                    sql = None
                except duckdb.BinderException:  # a file without one of them (an older export's): as it is
                    pass
        if sql is not None:
            con.execute(f"CREATE OR REPLACE VIEW {table} AS {sql}")
        other = aliases.get(table) or VIEW_NAMES.get(table)
        if other:
            con.execute(f"CREATE OR REPLACE VIEW {other} AS SELECT * FROM {table}")
    return con


def _warm_kept(files: list[Path], trust: TrustPolicy, sql: str | None = None
               ) -> tuple[duckdb.DuckDBPyConnection, Source] | None:
    """A cold load's Parquet files kept by :func:`keep_cold_load`, if they are of these files, unchanged, and the
    trust fits: views over them (DuckDB reading Parquet), locked, reading that folder only."""
    folder = _kept_path(files)
    try:
        st = os.lstat(folder)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022 \
            or not _safe_cache_file(folder / "meta.json"):
        return None
    con = None
    try:
        from trainledger.journal.keys import read_small_file

        meta = json.loads(read_small_file(folder / "meta.json", "cache", limit=64 << 20))
        rows = _rows_current(meta["version"], meta["files"], files, trust)
        if rows is None:
            return None
        tables = {}
        for t, rels in meta["tables"].items():
            paths = [folder / r for r in rels]
            if any(Path(r).is_absolute() or ".." in Path(r).parts or not _safe_cache_file(p)
                   for r, p in zip(rels, paths)):
                return None  # only regular files of our own, inside the folder
            tables[str(t)] = [str(p) for p in paths]
        loaded = meta.get("loaded")
        con = new_connection()  # the statement's reads told on the connection the views are then defined in
        if loaded is not None:  # a load for one statement: this one must read no other table
            need = tables_read(con, sql)
            if need is None or not need <= set(map(str, loaded)):
                con.close()
                return None
        con = views_over_parquet(tables, order=list(tables), sql=sql, con=con)
    except (ImportError, TrainledgerError, duckdb.Error, OSError, ValueError, KeyError, TypeError, AttributeError):
        if con is not None:
            con.close()
        return None  # an unreadable or foreign copy is ignored, never trusted
    _lock(con, readable=folder)
    return con, Source("cache", rows, cache_path=folder)


def _warm(files: list[Path], trust: TrustPolicy, sql: str | None = None
          ) -> tuple[duckdb.DuckDBPyConnection, Source] | None:
    if safe_cache_dir(create=False) is None:
        return None
    kept = _warm_kept(files, trust, sql)
    if kept is not None:
        return kept
    path = _cache_path(files)
    if not _safe_cache_file(path):
        return None
    con = new_connection()
    try:
        con.execute("ATTACH ? AS cache (READ_ONLY)", [str(path)])
        rows = _still_current(con, files, trust)
    except (duckdb.Error, OSError, ValueError, KeyError, TypeError):
        rows = None  # an unreadable or foreign copy is ignored, never trusted
    if rows is None:
        con.close()
        return None
    try:
        con.execute("CREATE VIEW events AS SELECT * FROM cache.events")
        wanted = _views_read(con, sql)
        for name in view_names() if wanted is None else wanted:
            con.execute(f"CREATE VIEW {name} AS SELECT * FROM cache.{name}")
    except duckdb.Error:  # a copy made by a version with fewer views: read the journals instead
        con.close()
        return None
    _lock(con)
    return con, Source("cache", rows, cache_path=path)


def _has_pyarrow() -> bool:
    import importlib.util

    return importlib.util.find_spec("pyarrow") is not None


def _main(argv: list[str]) -> int:
    """The background refresher: ``python -m trainledger.journal.views.query SPEC_JSON``."""
    return _refresh(argv)


def _refresh(argv: list[str], cold: ColdLoad | None = None) -> int:
    from trainledger.journal.keys import parse_public_key

    spec = json.loads(argv[0])
    try:
        os.nice(10)
    except OSError:
        pass
    os.environ["TRAINLEDGER_CACHE_DIR"] = spec["cache_dir"]  # -I dropped nothing we need but this
    build_cache(spec["paths"], cold=cold, keys=[parse_public_key(k, "cache spec") for k in spec["keys"]],
                trust_embedded=spec["trust_embedded"], allow_unsigned=spec["allow_unsigned"],
                allow_unsealed=spec["allow_unsealed"])
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
