"""``trainledger query OUT SQL``: an export (:mod:`.export`) queried as journals are, without loading it into memory.

Each export is copied first, its listing and the files listed, into a private folder (the bytes read are the
bytes checked: a file swapped in after the check is never read), the copy is verified as ``verify OUT`` verifies
(without ``--no-verify``: from its lines, so only an export written with ``--lines``; a listing verified whole
under the same trust before, as the user's cache remembers, has the files it copies checked against it only, and
then, as with ``--no-verify``, only the files of the tables the statement reads are copied), and the query layer's
views are then views over the copy's Parquet files, which DuckDB reads as the query needs them (memory bounded by
DuckDB's own, not by the export's size). The derived views (``runs``, ``timeline``, ``mfu``) are the query layer's SQL over
them. The private copy lives as long as the process (removed at exit).
"""

from __future__ import annotations

import atexit
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainledger.journal.errors import TrainledgerError
from trainledger.journal.views.parquet.check import check_tree, held_to_listing, open_regular, read_listing, verify_export
from trainledger.journal.views.parquet.export import LISTING, tables
from trainledger.journal.paths import stream_sha256
from trainledger.journal.trust import TrustPolicy

__all__ = ["open_exports", "connect_exports", "views_over"]


def _copy_listing(src: Path, dest: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The listing copied to ``dest`` once ``src`` has been held to it as ``verify OUT`` holds it
    (:func:`~.check.check_tree`: no link, FIFO or unlisted entry anywhere in it). Returns the listing as copied and
    its files' entries (``{path: entry}``)."""
    dest.mkdir(mode=0o700)
    listing, data = read_listing(src)
    files = check_tree(src, listing)
    with open(dest / LISTING, "xb") as f:
        f.write(data)
    return listing, files


def _copy_files(src: Path, dest: Path, rels: list[str]) -> dict[str, str]:
    """The listed files ``rels`` copied from ``src`` to ``dest``, each opened without following a link or
    blocking; returns each one's SHA-256, of the bytes as they were written (the copy is private: they are the
    bytes read later)."""
    digests = {}
    made: set[Path] = set()
    for rel in rels:
        fd = open_regular(src, rel)
        out = dest / rel
        if out.parent not in made:
            out.parent.mkdir(parents=True, exist_ok=True)
            made.add(out.parent)
        with os.fdopen(fd, "rb") as f, open(out, "xb") as g:
            digests[rel] = stream_sha256(f, out=g)[0]
    return digests


def table_of(path: str) -> str:
    """The table a listed file belongs to: its path's first folder (:func:`~.check.check_tree` held it to the
    layout), never the listing's ``table`` label."""
    return path.split("/", 1)[0]


def _memo(local: Path, trust: TrustPolicy) -> Path | None:
    """Where the user's cache remembers that this listing was verified whole under this trust: the listing's
    SHA-256 binds every file's, so a copy whose files match it holds what was verified then. As trustworthy as the
    cache folder (the user's own: query's cache rules); None when there is no safe one."""
    import hashlib

    from trainledger.journal.views.query import safe_cache_dir

    d = safe_cache_dir(create=True)
    if d is None:
        return None
    pinned = ",".join(sorted(k.key_id for k in trust.keys))
    h = hashlib.sha256((local / LISTING).read_bytes() + f"\0{pinned}\0{trust.describe()}".encode()).hexdigest()
    return d / f"x-{h[:40]}.verified"


def _remember(memo: Path | None, missing: dict[str, list[int]], trust_word: str | None) -> None:
    """The memo written: what the whole verification found beside the listing (the ranks missing, the trust)."""
    if memo is None:
        return
    tmp = memo.with_name(f"{memo.name}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"missing": missing, "trust": trust_word}, f)
        os.replace(tmp, memo)
    except OSError:  # no memo: the next query verifies again
        pass


def _remembered(memo: Path) -> tuple[dict[str, list[int]], str | None]:
    """What :func:`_remember` wrote (a memo of an older version, or unreadable: nothing missing, trust pinned, as
    only a whole verification under pinned keys was remembered then)."""
    try:
        with open(memo, "rb") as f:
            got = json.loads(f.read(1 << 20) or b"{}")
        missing = {str(k): [int(r) for r in v] for k, v in dict(got.get("missing") or {}).items()}
        return missing, str(got.get("trust") or "pinned")
    except (OSError, ValueError, TypeError, AttributeError):
        return {}, "pinned"


def views_over(by_table: dict[str, list[str]], sql: str | None = None, con: Any = None) -> Any:
    """A new connection (or ``con``, with nothing defined in it) with the query layer's views over Parquet files of
    the export's layout (``{table: [file, ...]}``; ``events`` with or without ``line`` and ``file``), not locked yet;
    ``sql``: only the views it reads."""
    from trainledger.journal.views.query import views_over_parquet

    return views_over_parquet(by_table, order=tables(), sql=sql, con=con)


def connect_exports(paths: Sequence[str | os.PathLike], *, verify_first: bool = True, trust: TrustPolicy | None = None,
                    **trust_options: Any) -> Any:
    """:func:`trainledger.journal.views.query.connect` for exports: a locked DuckDB connection with the query layer's
    views over them (see the module doc)."""
    return open_exports(paths, verify_first=verify_first, trust=TrustPolicy.of(trust, **trust_options))[0]


def open_exports(paths: Sequence[str | os.PathLike], *, verify_first: bool, trust: TrustPolicy,
                 partial: bool = False, sql: str | None = None) -> tuple[Any, Any]:
    """The query layer's connection, locked, and :class:`~trainledger.journal.views.query.Source` over exports (see the
    module doc). ``verify_first=False`` (``--no-verify``) reads a copy unchecked, typed-only exports included.
    ``partial``: an export of a run with ranks missing is read as far as its ranks present go (the Source's
    ``missing`` names them); without it such an export fails, as ``verify OUT`` fails it. ``sql``: the one
    statement the connection is for (``trainledger query``'s): only the views it reads are defined (every one when
    DuckDB's parse of it cannot tell)."""
    from trainledger.journal.audit.rundir import AnchorMismatch
    from trainledger.journal.copies import PrivateCopies
    from trainledger.journal.views.query import Source, _lock, _safe_cache_file, new_connection, tables_read

    copies = PrivateCopies(owned="query-out")  # a killed query's copy is swept by the next one
    atexit.register(copies.close)
    rows: list[dict[str, Any]] = []
    by_table: dict[str, list[str]] = {}
    found: dict[str, list[int]] = {}
    p = local = None
    con = new_connection()
    #: the tables the statement reads (None: every one, or it cannot be told): an export not verified whole here
    #: has only their files copied, checked and read
    only = tables_read(con, sql)
    try:
        for i, p in enumerate(map(Path, paths)):
            local = copies.dir / f"export-{i}"
            listing, files = _copy_listing(p, local)
            memo = _memo(local, trust) if verify_first else None
            remembered = memo is not None and _safe_cache_file(memo)
            whole = verify_first and not remembered  # verify OUT's check reads every file
            rels = [rel for rel in files if whole or only is None or table_of(rel) in only]
            digests = _copy_files(p, local, rels)
            trust_word = "unchecked"
            if verify_first:
                if remembered:  # the listing was verified whole: the files read are held to it
                    for rel in rels:
                        held_to_listing(local, rel, digests[rel], files[rel])
                    missing, trust_word = _remembered(memo)
                else:
                    check = verify_export(local, trust=trust, partial=partial, _digests=digests)
                    missing, trust_word = check.missing, check.trust
                    _remember(memo, missing, trust_word)
                mine = {where.replace(str(local), str(p), 1): ranks for where, ranks in missing.items()}
                if mine and not partial:  # remembered from a --partial query: this one did not ask for it
                    where, ranks = next(iter(mine.items()))
                    raise AnchorMismatch(f"rank {ranks[0]}: no journal in {where} (--partial reads the ranks "
                                         "present, labelled as partial)", seq=None)
                found.update(mine)
            for rel in rels:
                by_table.setdefault(table_of(rel), []).append(str(local / rel))
            for rc in listing["journals"]:
                rows.append({"file": str(p), "export": str(p), "run_id": rc.get("run_id"), "rank": rc.get("rank"),
                             "last_seq": rc.get("last_seq"), "head": rc.get("head"), "key_id": rc.get("key_id"),
                             "trust": trust_word})
    except BaseException as e:
        con.close()
        copies.close()
        if isinstance(e, TrainledgerError) and local is not None:  # named by the user's folder, not our copy
            e.args = tuple(a.replace(str(local), str(p)) if isinstance(a, str) else a for a in e.args)
            e.path = str(p)
        raise
    con = views_over(by_table, sql=sql, con=con)
    # the lockdown (query._lock) turns file access off for the user's SQL; the private copy alone stays readable,
    # and DuckDB spills into it (its default, ./.tmp of the working folder, would be readable and writable)
    _lock(con, copies.dir)
    return con, Source("export", rows, missing=found)
