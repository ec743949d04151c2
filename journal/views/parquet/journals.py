"""Journals read by the query layer through the Parquet form: memory bounded by DuckDB's own, whatever their size.

``trainledger query`` over large journals (and the background refresher of its cache) hands this module's
:func:`load_journals` to :func:`trainledger.journal.views.query.open_views` as its cold load: each journal is verified and
written in one streaming pass (:func:`~trainledger.journal.views.parquet.export.export_journal`, every line kept, plus the
``file`` column the query layer has) into a private folder (mode 0700, removed at exit), a run folder's ranks held
to each other from the reports of those passes (``verify RUN_DIR``'s check, no second pass), and the views are
views over those files, which DuckDB reads as each query needs them. The in-memory load (every line in one DuckDB
table) stays the path for small journals and for installs without pyarrow.

    python -m trainledger.journal.views.parquet.journals SPEC_JSON    the cache refresher, built from this form
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainledger.journal.trust import TrustPolicy

__all__ = ["load_journals", "available"]


def available() -> bool:
    """Whether pyarrow is installed (the ``parquet`` extra): else the query layer loads into memory."""
    from trainledger.journal.views.query import _has_pyarrow

    return _has_pyarrow()


def load_journals(files: list[Path], paths: Sequence[str | os.PathLike], trust: TrustPolicy, partial: bool,
                  where: str | os.PathLike | None = None, sql: str | None = None) -> tuple[Any, Any]:
    """The query layer's cold load (see the module doc): a connection with every view over the verified events,
    not locked yet (the caller locks it, reads limited to ``source.readable``), and its
    :class:`~trainledger.journal.views.query.Source` (``tables``: the Parquet files of each table, which
    :func:`~trainledger.journal.views.query.keep_cold_load` may keep as the next query's copy). ``where``: the folder
    to write them in (the temporary folder by default; the cache folder when they are to be kept, so that keeping
    them is a rename). ``sql``: the one statement the load is for: only the tables it reads are written, and only
    its views defined (``Source.loaded`` names those tables; every one when the statement's reads cannot be told).
    Raises what verification raises, naming the user's file."""
    from trainledger.journal.copies import PrivateCopies
    from trainledger.journal.views.parquet.export import _check_runs, _ranks_of, export_journal, tables
    from trainledger.journal.views.parquet.read import views_over
    from trainledger.journal.views.query import Source, _file_row, new_connection, tables_read

    # in the cache folder: named after this process, so that one a killed query left is removed by the next
    copies = PrivateCopies(owned=None if where is None else "load", where=where)
    atexit.register(copies.close)
    rows: list[dict[str, Any]] = []
    by_table: dict[str, list[str]] = {}
    con = None
    try:
        ranks = _ranks_of(paths)
        # one connection: the statement's reads, the container kinds' typing, then the views (each new one costs a
        # database); the load's typing on one thread, the user's statement on DuckDB's default
        con = new_connection()
        con.execute("SET threads = 1")
        only = tables_read(con, sql)
        done = []
        for i, f in enumerate(files):
            st = os.stat(f)
            root = copies.dir / f"j{i}"  # a folder each: two journals may share a run id here
            x = export_journal(f, root, lines=True, trust=trust, rank=ranks.get(f.resolve(), (None, None))[1],
                               con=con, file_column=str(f), compression="none", digests=False, only=only,
                               narrow=True)
            done.append(x)
            rows.append({**_file_row(f, x.report), "identity": [st.st_ino, st.st_mtime_ns, st.st_ctime_ns]})
            for item in x.files:
                by_table.setdefault(item["table"], []).append(str(root / item["path"]))
        missing = _check_runs(files, ranks, done, trust, partial)
        by_table = {t: by_table[t] for t in tables() if t in by_table}  # the export's order (a kept copy's too)
        con.execute("RESET threads")
        con = views_over(by_table, sql=None if only is None else sql, con=con)
    except BaseException:
        if con is not None:
            con.close()
        copies.close()
        raise
    return con, Source("journals", rows, missing=missing, readable=copies.dir, tables=by_table,
                       loaded=None if only is None else sorted(only))


def _main(argv: list[str]) -> int:
    """The cache refresher (``query.refresh_cache_in_background`` starts it when pyarrow is here)."""
    from trainledger.journal.views.query import _refresh

    return _refresh(argv, cold=load_journals)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
