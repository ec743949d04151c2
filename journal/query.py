"""SQL over journals with DuckDB, in memory, locked down before any user SQL runs.

:func:`connect` verifies each journal (unless told not to), loads every line
into an in-memory table, defines the views, and then turns off DuckDB's
external access and locks its configuration, so a query over an untrusted
journal cannot read or write other files (``COPY ... TO``, ``read_csv(...)``
fail). Non-finite floats (stored as "NaN"/"Infinity") come back as DOUBLE
NaN/inf.

Views: ``events`` (run_id, file, seq, kind, ts, h, line), ``runs``,
``steps``, ``anomalies``, ``checkpoints``, ``resumes``, ``rewinds``,
``verdicts``, ``decisions``, ``seals``, ``configs`` (the monitor's
``run_configured``) and ``mfu`` (per step, from the config in force).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb

from .errors import JournalIOError
from .verify import _open_checked, _read_opening, verify

__all__ = ["connect", "journal_files", "VIEWS"]


def journal_files(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Journal files named directly, or every ``*.jsonl`` under a named folder (recursively)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out += sorted(x for x in p.rglob("*.jsonl") if x.is_file())
        elif p.is_file():
            out.append(p)
        else:
            raise JournalIOError(f"{p}: no such file or folder")
    if not out:
        raise JournalIOError("no journal files found in " + ", ".join(map(str, paths)))
    return out


def _d(field: str) -> str:
    """A float field as DOUBLE: numbers and the "NaN"/"Infinity"/"-Infinity" spellings alike."""
    return f"TRY_CAST(line->>'$.{field}' AS DOUBLE) AS {field}"


def _i(field: str) -> str:
    return f"TRY_CAST(line->>'$.{field}' AS BIGINT) AS {field}"


def _s(field: str) -> str:
    return f"line->>'$.{field}' AS {field}"


_BASE = "run_id, seq, ts"
VIEWS = {
    "runs": "SELECT run_id, file, min(ts) AS created_ns, count(*) AS events, max(seq) AS last_seq FROM events "
            "GROUP BY run_id, file",
    "steps": f"SELECT {_BASE}, {_i('step')}, {_d('loss')}, {_d('grad_norm')}, {_d('lr')}, {_d('step_time_s')}, "
             f"{_i('examples')}, {_i('tokens')}, {_i('supervised_tokens')} FROM events WHERE kind = 'step_observed'",
    "anomalies": f"SELECT {_BASE}, {_i('step')}, {_s('anomaly')}, {_d('value')}, {_d('baseline_median')}, {_d('mad')}, "
                 f"{_d('z_score')}, {_d('threshold')}, {_i('detected_at')} FROM events WHERE kind = 'anomaly_detected'",
    "checkpoints": f"SELECT {_BASE}, {_i('step')}, {_s('path')}, {_i('bytes')}, {_s('sha256')}, {_d('duration_s')}, "
                   f"line->'$.contents' AS contents FROM events WHERE kind = 'checkpoint_saved'",
    "resumes": f"SELECT {_BASE}, {_s('reason')}, {_i('from_step')}, {_s('checkpoint')} FROM events "
               f"WHERE kind = 'run_resumed'",
    "rewinds": f"SELECT {_BASE}, {_i('spike_step')}, {_s('anomaly')}, {_s('checkpoint')}, {_i('from_step')}, "
               f"{_i('skip_batches')}, {_d('lr_scale')}, {_s('reason')} FROM events WHERE kind = 'rewind_decided'",
    "verdicts": f"SELECT {_BASE}, {_s('rung')}, TRY_CAST(line->>'$.passed' AS BOOLEAN) AS passed, {_s('reason')}, "
                f"line->'$.measured' AS measured, line->'$.bars' AS bars FROM events WHERE kind = 'gate_verdict'",
    "decisions": f"SELECT {_BASE}, {_s('rung')}, {_s('action_chosen')}, line->'$.belief_before' AS belief_before, "
                 f"line->'$.belief_after' AS belief_after, line->'$.evidence' AS evidence FROM events "
                 f"WHERE kind = 'decision_recorded'",
    "seals": f"SELECT {_BASE}, {_i('sealed_seq')}, {_s('sealed_hash')}, {_s('key_id')} FROM events WHERE kind = 'seal'",
    "configs": f"SELECT {_BASE}, {_i('n_params')}, {_i('n_layer')}, {_i('n_head')}, {_i('head_dim')}, {_i('seq_len')}, "
               f"{_d('peak_flops_per_sec')}, COALESCE(TRY_CAST(line->>'$.devices' AS BIGINT), 1) AS devices "
               f"FROM events WHERE kind = 'run_configured'",
    # MFU per step, PaLM appendix B against the run_configured in force at that step (ASOF: the latest before it).
    "mfu": "SELECT s.run_id, s.seq, s.step, (6.0 * c.n_params + 12.0 * c.n_layer * c.n_head * c.head_dim * c.seq_len) "
           "* COALESCE(s.tokens, s.examples * c.seq_len) / s.step_time_s / (c.peak_flops_per_sec * c.devices) AS mfu "
           "FROM steps s ASOF JOIN configs c ON s.run_id = c.run_id AND s.seq >= c.seq "
           "WHERE s.step_time_s > 0 AND c.peak_flops_per_sec IS NOT NULL AND c.n_params IS NOT NULL",
}


def connect(paths: Sequence[str | os.PathLike], *, verify_first: bool = True,
            **verify_options: Any) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with every journal loaded and the views defined, then locked.

    ``verify_first`` verifies each journal with ``verify_options`` (the same as
    :func:`journal.verify.verify`) and raises its error on the first that
    fails; ``False`` skips that (the CLI says so). Torn tails are left out.
    """
    files = journal_files(paths)
    run_ids = {}
    for f in files:
        if verify_first:
            run_ids[f] = verify(f, **verify_options).run_id
        else:  # nothing checked: only the run id, from the first line
            run_ids[f] = _read_opening(f, _open_checked(f))[0].run_id
    con = duckdb.connect(":memory:")
    con.execute("CREATE TABLE files (file VARCHAR, run_id VARCHAR)")
    con.executemany("INSERT INTO files VALUES (?, ?)", [[str(f), r] for f, r in run_ids.items()])
    # Lines are canonical JSON (verified); read each as one JSON value. A torn tail is not a line.
    if any(_torn(f) for f in files):
        _load_without_torn_tails(con, files)
    else:
        con.execute("CREATE TABLE raw AS SELECT filename AS file, json AS line "
                    "FROM read_json_objects(?, format = 'newline_delimited', filename = true)",
                    [[str(f) for f in files]])
    con.execute(
        "CREATE TABLE events_t AS SELECT f.run_id, r.file, CAST(r.line->>'$.seq' AS BIGINT) AS seq, "
        "r.line->>'$.kind' AS kind, CAST(r.line->>'$.ts' AS BIGINT) AS ts, r.line->>'$.h' AS h, r.line AS line "
        "FROM raw r JOIN files f ON f.file = r.file"
    )
    con.execute("DROP TABLE raw")
    con.execute("CREATE VIEW events AS SELECT * FROM events_t")
    for name, sql in VIEWS.items():
        con.execute(f"CREATE VIEW {name} AS {sql}")
    # From here on, no file access and no configuration changes: user SQL runs sandboxed.
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def _torn(f: Path) -> bool:
    with open(f, "rb") as fh:
        fh.seek(max(0, f.stat().st_size - 1))
        return fh.read(1) not in (b"\n", b"")


def _load_without_torn_tails(con: duckdb.DuckDBPyConnection, files: list[Path]) -> None:
    con.execute("CREATE TABLE raw (file VARCHAR, line JSON)")
    for f in files:
        data = f.read_bytes()
        body = data[: data.rfind(b"\n") + 1]
        rows = [[str(f), line.decode()] for line in body.splitlines()]
        con.executemany("INSERT INTO raw VALUES (?, ?)", rows)
