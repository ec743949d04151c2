"""One query's tables, loaded the way its paths call for: :func:`open_query`.

``trainledger query`` and anything else that asks SQL of journals call this and run their SQL on the connection
it returns. It decides what the command used to: Parquet exports (verified, read in place) or journals; a verified
copy from the cache when one is current; the Parquet form's bounded load for large journals when pyarrow is here
(kept as the next query's copy), or every line read into memory; a copy rebuilt in the background for the next
query when a large journal was read into memory; nothing verified at all only when the caller says so. Whatever
it chose is in :attr:`QuerySession.source`; :meth:`QuerySession.close` keeps a cold load's files.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any

from trainledger.journal.errors import JournalError, UsageError
from trainledger.journal.trust import TrustPolicy

__all__ = ["QuerySession", "open_query", "cold_loader"]


class QuerySession:
    """An open query: ``con`` (a read-only DuckDB connection with the views), ``source`` (where the tables came
    from, which ranks of a run folder are missing, what was verified) and what to do once the SQL has run
    (:meth:`close`). A context manager."""

    def __init__(self, con: Any, source: Any, *, keep: bool) -> None:
        self.con, self.source, self._keep = con, source, keep

    @property
    def missing(self) -> dict[str, list[int]]:
        """Run folders read without some of their ranks (``partial=True``): folder -> the ranks missing."""
        return dict(getattr(self.source, "missing", None) or {})

    def close(self) -> None:
        """Close the connection; a cold load's Parquet files become the next query's copy (when kept)."""
        from trainledger.journal.views.query import keep_cold_load

        self.con.close()
        if self._keep and getattr(self.source, "tables", None) is not None:
            keep_cold_load(self.source)

    def __enter__(self) -> QuerySession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def open_query(paths: Sequence[str | os.PathLike], trust: TrustPolicy | None = None, sql: str | None = None, *,
               verify: bool = True, use_cache: bool = True, partial: bool = False) -> QuerySession:
    """The tables of ``paths`` (journals, run folders, or Parquet exports: not both kinds at once) for ``sql`` (the
    one statement the session is for: only the views it reads are defined; None: every view). ``verify=False``
    reads everything unchecked (the caller must say so to whoever reads the answer). ``use_cache``: answer from a
    verified copy when one is current, keep a cold load's files as the next one, and rebuild a copy in the
    background after a large journal was read into memory. ``partial``: a run folder with ranks missing is read as
    far as its ranks go (:attr:`QuerySession.missing` names them). Raises :class:`~trainledger.journal.errors.
    IntegrityError` when a journal does not verify, :class:`UsageError` for exports mixed with journals."""
    from trainledger.journal.views.parquet import is_export
    from trainledger.journal.views.query import CACHE_MIN_BYTES, open_views, refresh_cache_in_background

    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise UsageError("give at least one journal, run folder or export")
    trust = trust if trust is not None else TrustPolicy()
    exports = [p for p in paths if is_export(p)]
    if exports and len(exports) != len(paths):
        raise UsageError("give exports or journals, not both (query them apart)")
    if exports:  # Parquet exports (docs/fleet.md): copied, verified, read in place
        from trainledger.journal.views.parquet.read import open_exports

        con, source = open_exports(paths, verify_first=verify, trust=trust, partial=partial, sql=sql)
        return QuerySession(con, source, keep=False)
    if not verify:
        con, source = open_views(paths, verify_first=False)
        return QuerySession(con, source, keep=False)
    con, source = open_views(paths, use_cache=use_cache, trust=trust, partial=partial,
                             cold=cold_loader(paths, keep=use_cache), sql=sql)
    # Large journals read cold into memory (no pyarrow): a verified columnar copy for next time, built off this
    # process. Through the Parquet form, what the load wrote is kept instead, once the SQL has run (close()).
    if (use_cache and source.origin == "journals" and source.tables is None
            and sum(r["size"] for r in source.files) >= CACHE_MIN_BYTES):
        refresh_cache_in_background(paths, trust=trust)
    return QuerySession(con, source, keep=use_cache)


def cold_loader(paths: Sequence[str | os.PathLike], *, keep: bool = False) -> Any:
    """The Parquet form's load for journals of ``CACHE_MIN_BYTES`` or more when pyarrow is here (memory bounded by
    DuckDB's own: journal/views/parquet/journals.py), else None (read into memory). ``keep``: written in the cache
    folder (when it is this user's alone), so that keeping it for the next query is a rename."""
    from trainledger.journal.views.parquet.journals import available, load_journals
    from trainledger.journal.views.query import CACHE_MIN_BYTES, journal_files, safe_cache_dir

    if not available():
        return None
    try:
        size = sum(f.stat().st_size for f in journal_files(paths))
    except (OSError, JournalError):
        return None  # the load names what is wrong
    if size < CACHE_MIN_BYTES:
        return None
    where = safe_cache_dir(create=True) if keep else None
    return load_journals if where is None else functools.partial(load_journals, where=where)
