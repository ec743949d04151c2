"""The query layer's cold load through the Parquet form (journal/views/parquet/journals.py): every view answers what the
in-memory load answers, row for row, over golden journals of every kind and over a run folder; a changed byte is
named; the lockdown still holds; the cache refresher builds its copy from this form and a later query is warm."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from pathlib import Path

import duckdb
import pytest

pytest.importorskip("pyarrow")

from trainledger.cli import main  # noqa: E402
from trainledger.journal import IntegrityError, Signer, StepObserved, load_public_key  # noqa: E402
from trainledger.journal.views.parquet.journals import load_journals  # noqa: E402
from trainledger.journal.views.query import VIEWS, build_cache, open_views  # noqa: E402
from trainledger.training.distributed.ranks import RankInfo, open_rank_journal  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[2] / "assets" / "golden"
NAMES = ["every_kind_v1_3", "every_kind_v1_2", "resumed_rewound_v1_1", "scaling_ladder_v1_2"]


def _plain(v):
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    if isinstance(v, Decimal):
        return int(v)
    return v


def _all(con, view: str) -> list[tuple]:
    return sorted((tuple(map(_plain, r)) for r in con.execute(f"SELECT * FROM {view}").fetchall()), key=repr)


@pytest.mark.parametrize("name", NAMES)
def test_every_view_answers_what_the_in_memory_load_answers(name):
    p, keys = [str(GOLDEN / f"{name}.jsonl")], [load_public_key(GOLDEN / f"{name}.pub")]
    mem, _ = open_views(p, use_cache=False, keys=keys)
    pq, src = open_views(p, use_cache=False, keys=keys, cold=load_journals)
    assert src.readable is not None and src.files[0]["file"] == p[0]
    for view in ["events", *VIEWS]:
        a, b = _all(mem, view), _all(pq, view)
        assert a == b, view
        assert [d[0] for d in mem.execute(f"SELECT * FROM {view}").description] == \
            [d[0] for d in pq.execute(f"SELECT * FROM {view}").description], view


@pytest.mark.parametrize("name", ["every_kind_v1_3", "scaling_ladder_v1_2"])
def test_a_load_for_one_statement_writes_the_tables_it_reads_and_answers_as_every_table_does(name):
    """A cold load for one statement (``trainledger query``'s) writes only the tables the statement reads (the
    typed ones its views read, events when it names it or reads runs) and defines only its views: its answer is the
    in-memory load's, row for row; a view it does not read is not there to answer wrongly (empty)."""
    p, keys = [str(GOLDEN / f"{name}.jsonl")], [load_public_key(GOLDEN / f"{name}.pub")]
    mem, _ = open_views(p, use_cache=False, keys=keys)
    for sql, loaded in [("SELECT * FROM steps", ["steps"]), ("SELECT * FROM step_observed", ["steps"]),
                        ("SELECT * FROM mfu", ["configs", "steps"]),
                        ("SELECT * FROM timeline", ["configs", "resumes", "steps"]),
                        ("SELECT run_id, events, imported FROM runs", ["events"]),
                        ("SELECT kind, count(*) FROM events GROUP BY kind", ["events"]),
                        ("SELECT * FROM run_opened", ["run_opened"]),
                        ("WITH v AS (SELECT * FROM verdicts) SELECT * FROM v, seals", ["seals", "verdicts"])]:
        con, src = open_views(p, use_cache=False, keys=keys, cold=load_journals, sql=sql)
        assert src.loaded == loaded, sql
        got = sorted((tuple(map(_plain, r)) for r in con.execute(sql).fetchall()), key=repr)
        assert got == sorted((tuple(map(_plain, r)) for r in mem.execute(sql).fetchall()), key=repr), sql
        with pytest.raises(duckdb.CatalogException):
            con.execute("SELECT * FROM anomalies")
        con.close()
    con, src = open_views(p, use_cache=False, keys=keys, cold=load_journals, sql="SELECT * FROM steps, range(1)")
    assert src.loaded is None  # a table function: its reads cannot be told, so every table
    assert _all(con, "anomalies") == _all(mem, "anomalies")


def test_a_run_folder_its_partial_view_and_a_changed_byte(tmp_path):
    s = Signer.generate()
    run = tmp_path / "run"
    for r in range(3):
        j = open_rank_journal(run, s, info=RankInfo(run="pf", rank=r, world_size=3, local_rank=0, node="n",
                                                    restart_count=0))
        for i in range(25):
            j.append(StepObserved(step=i, loss=1.0 + i / 10, grad_norm=0.3))
        j.close()
    mem = open_views([run], use_cache=False, keys=[s.public])[0]
    pq = open_views([run], use_cache=False, keys=[s.public], cold=load_journals)[0]
    for view in ("events", "runs", "steps", "timeline"):
        assert _all(mem, view) == _all(pq, view)
    (run / "rank-00002.jsonl").unlink()
    with pytest.raises(IntegrityError, match="rank 2"):
        open_views([run], use_cache=False, keys=[s.public], cold=load_journals)
    con, src = open_views([run], use_cache=False, keys=[s.public], cold=load_journals, partial=True)
    assert list(src.missing.values()) == [[2]]
    assert con.execute("SELECT count(DISTINCT rank) FROM steps").fetchone() == (2,)
    f = run / "rank-00001.jsonl"
    f.write_bytes(f.read_bytes().replace(b'"step":3,', b'"step":4,', 1))
    with pytest.raises(IntegrityError, match="rank 1") as e:
        open_views([run], use_cache=False, keys=[s.public], cold=load_journals, partial=True)
    assert e.value.seq is not None


def test_the_lockdown_holds_over_the_parquet_form(tmp_path):
    p, keys = [str(GOLDEN / "every_kind_v1_3.jsonl")], [load_public_key(GOLDEN / "every_kind_v1_3.pub")]
    con, _ = open_views(p, use_cache=False, keys=keys, cold=load_journals)
    outside = tmp_path / "secret.csv"
    outside.write_text("a\n1\n")
    for sql in (f"SELECT * FROM read_csv('{outside}')", f"COPY (SELECT 1) TO '{tmp_path / 'x.csv'}'",
                "SET allowed_directories = ['/']", "SET enable_external_access = true"):
        with pytest.raises(duckdb.Error):
            con.execute(sql)
    assert not (tmp_path / "x.csv").exists()
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] > 0


def test_the_cache_is_built_from_the_parquet_form_and_answers_warm(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TRAINLEDGER_CACHE_DIR", str(tmp_path / "cache"))
    p, pub = str(GOLDEN / "scaling_ladder_v1_2.jsonl"), str(GOLDEN / "scaling_ladder_v1_2.pub")
    build_cache([p], cold=load_journals, keys=[load_public_key(pub)])
    con, src = open_views([p], keys=[load_public_key(pub)])
    assert src.origin == "cache"
    mem, _ = open_views([p], use_cache=False, keys=[load_public_key(pub)])
    for view in ("events", "steps", "runs", "verdicts"):
        assert _all(con, view) == _all(mem, view)
    # the command takes the Parquet form for large journals (here: any size)
    monkeypatch.setattr("trainledger.journal.views.query.CACHE_MIN_BYTES", 0)
    assert main(["query", p, "--pubkey", pub, "--no-cache", "--format", "csv",
                 "SELECT count(*) AS n FROM events"]) == 0
    n = mem.execute("SELECT count(*) FROM events").fetchone()[0]
    assert capsys.readouterr().out.splitlines() == ["n", str(n)]


def test_a_cold_query_leaves_its_parquet_files_for_the_next_one(tmp_path, monkeypatch, capsys):
    """The first query over a large journal keeps what its load wrote (renamed into the cache folder, a meta.json
    beside it): the next query answers from those files at once, every view as the in-memory load answers it; a
    journal touched since, a meta naming a file outside the folder, a file swapped for a link or a cache folder
    others may write are never used."""
    import os
    import shutil

    cache = tmp_path / "cache"
    monkeypatch.setenv("TRAINLEDGER_CACHE_DIR", str(cache))
    monkeypatch.setattr("trainledger.journal.views.query.CACHE_MIN_BYTES", 0)  # "large": any size here
    j = tmp_path / "ladder.jsonl"
    shutil.copy(GOLDEN / "scaling_ladder_v1_2.jsonl", j)
    pub = str(GOLDEN / "scaling_ladder_v1_2.pub")
    keys = [load_public_key(pub)]

    def ask(sql: str = "SELECT count(*) AS n FROM steps") -> str:
        assert main(["query", str(j), "--pubkey", pub, "--format", "csv", sql]) == 0
        return capsys.readouterr().out

    first = ask()
    kept = list(cache.glob("p-*"))
    assert len(kept) == 1 and (kept[0] / "meta.json").is_file() and not list(cache.glob("trainledger-*"))
    assert not (kept[0] / "spill").exists()
    # a load for one statement wrote the tables it reads and no other: it answers statements that read only those
    con, src = open_views([str(j)], keys=keys, sql="SELECT max(step) FROM step_observed")
    assert src.origin == "cache" and src.cache_path == kept[0]
    con.close()
    assert {p.parts[len(kept[0].parts) + 1] for p in kept[0].rglob("*.parquet")} == {"steps"}  # j0/TABLE/...
    for sql in ("SELECT count(*) FROM events", "SELECT * FROM runs", "SELECT * FROM steps, verdicts", None):
        con, src = open_views([str(j)], keys=keys, sql=sql)
        assert src.origin == "journals", sql
        con.close()
    # a statement whose reads cannot be told (a table function) loads every table, and that copy answers any
    assert ask("SELECT count(*) AS n FROM steps, range(1)") == first
    kept = list(cache.glob("p-*"))
    assert len(kept) == 1 and json.loads((kept[0] / "meta.json").read_text())["loaded"] is None
    con, src = open_views([str(j)], keys=keys)
    assert src.origin == "cache" and src.cache_path == kept[0]
    mem, _ = open_views([str(j)], use_cache=False, keys=keys)
    for view in ("events", "steps", "runs", "verdicts", "mfu", "timeline"):
        assert _all(con, view) == _all(mem, view), view
    con.close()
    assert ask() == first  # answered from the kept files
    # the lockdown holds over them: nothing outside the kept folder is read
    con, _ = open_views([str(j)], keys=keys)
    with pytest.raises(duckdb.Error):
        con.execute(f"SELECT * FROM read_csv('{j}')")
    con.close()
    os.utime(j)  # touched: its identity changed, so it is read and verified afresh
    assert open_views([str(j)], keys=keys)[1].origin == "journals"
    ask()  # and kept again
    meta = json.loads((kept[0] / "meta.json").read_text())
    meta["tables"]["steps"] = ["../../ladder.jsonl"]
    (kept[0] / "meta.json").write_text(json.dumps(meta))
    assert open_views([str(j)], keys=keys)[1].origin == "journals"
    ask("SELECT count(*) AS n FROM steps, range(1)")  # every table kept
    steps = next(kept[0].rglob("steps/*/*.parquet"))
    other = next(kept[0].rglob("events/*/*.parquet"))
    steps.unlink()
    steps.symlink_to(other)
    assert open_views([str(j)], keys=keys)[1].origin == "journals"
    shutil.rmtree(cache)
    cache.mkdir(mode=0o777)
    cache.chmod(0o777)  # others may write it: nothing is kept there, nothing read from it
    ask()
    assert not list(cache.glob("p-*"))


def _defined(con) -> set[str]:
    return {r[0] for r in con.execute("SELECT view_name FROM duckdb_views() WHERE NOT internal").fetchall()}


@pytest.mark.parametrize("cached", ["kept", "duckdb"])
def test_a_warm_query_defines_only_the_views_its_sql_reads(tmp_path, monkeypatch, cached):
    """Answered from a verified copy (the kept Parquet files, or the DuckDB cache file), a connection opened for
    one statement has the views that statement reads, with those they read in turn, and gives what the whole
    set gives; a statement that reads the catalog, a table function, a name that is no view or something DuckDB
    cannot parse gets every view (the error then names what is wrong as before)."""
    import shutil

    from trainledger.journal.views.query import _DERIVED, _DERIVED_READS, view_names

    monkeypatch.setenv("TRAINLEDGER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("trainledger.journal.views.query.CACHE_MIN_BYTES", 0)
    j = tmp_path / "ladder.jsonl"
    shutil.copy(GOLDEN / "scaling_ladder_v1_2.jsonl", j)
    keys = [load_public_key(GOLDEN / "scaling_ladder_v1_2.pub")]
    if cached == "kept":
        assert main(["query", str(j), "--pubkey", str(GOLDEN / "scaling_ladder_v1_2.pub"), "SELECT 1"]) == 0
    else:
        build_cache([str(j)], keys=keys)
    everything = {"events", *view_names()}
    full, src = open_views([str(j)], keys=keys)
    assert src.origin == "cache" and _defined(full) == everything
    # (the kept Parquet files hold a kind once, under one of its two names: a view of either needs both)
    pair = {"steps": "step_observed", "seals": "seal", "resumes": "run_resumed", "configs": "run_configured"}
    for sql, want in [
        ("SELECT count(*), avg(loss) FROM steps", {"steps"}),
        ("SELECT * FROM step_observed", {"step_observed"}),
        ('SELECT s.step FROM main."Steps" s WHERE s.seq IN (SELECT seq FROM seals)', {"steps", "seals"}),
        ("WITH t AS (SELECT * FROM timeline) SELECT count(*) FROM t", {"timeline", "steps", "resumes", "configs"}),
        ("SELECT count(*) FROM mfu", {"mfu", "steps", "configs"}),
        ("SELECT count(*) FROM events", set()),
        ("SHOW TABLES", everything), ("DESCRIBE steps", everything), ("SELECT 1", everything),
        ("SELECT * FROM duckdb_views()", everything), ("SELECT * FROM stepz", everything),
        ("SELECT * FROM information_schema.tables", everything), ("SELECT * FROM read_csv('x')", everything),
        ("SELECT 1; SELECT 2", everything), ("not sql at all", everything),
    ]:
        if want != everything:
            both = want | {pair.get(v) for v in want} | {k for k, v in pair.items() if v in want}
            want = {"events"} | (both - {None} if cached == "kept" else want)
        con, src = open_views([str(j)], keys=keys, sql=sql)
        assert src.origin == "cache" and _defined(con) == want, sql
        if want != everything and sql.startswith("SELECT"):
            assert con.execute(sql).fetchall() == full.execute(sql).fetchall(), sql
        con.close()
    parse = duckdb.connect()
    for name, reads in _DERIVED_READS.items():  # what each derived view reads, as DuckDB's parser has it
        tree = json.loads(parse.execute("SELECT json_serialize_sql(?)", [_DERIVED[name]]).fetchone()[0])
        assert set(reads) == set(_base_tables(tree)) - {"events"}, name


def _base_tables(x):
    if isinstance(x, dict):
        if x.get("type") == "BASE_TABLE":
            yield x["table_name"]
        x = list(x.values())
    if isinstance(x, list):
        for v in x:
            yield from _base_tables(v)
