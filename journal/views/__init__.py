"""The journal's views: SQL over verified events (:mod:`.query`, one query's load chosen by :func:`open_query`),
their Parquet storage with receipts (:mod:`.parquet`), and :func:`verify_path`, which checks whatever a path is (a
journal, a run folder, an export). Stands on the core, the proofs, the audit and the back ends; nothing below
imports it. The names resolve on first use: importing the package loads no DuckDB."""

_WHERE = {"open_query": "session", "QuerySession": "session", "verify_path": "verifying",
          "path_kind": "verifying"}


def __getattr__(name: str):
    import importlib

    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


__all__ = sorted(_WHERE)
