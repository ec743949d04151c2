"""``trainledger export parquet`` and ``trainledger verify OUT``: verified events as a Parquet dataset with
receipts that re-verifies alone. Real files, real DuckDB; the attacks are an export folder rewritten by someone
without the key (a line, a typed cell, a planted file, the listing), each named."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import duckdb
import pytest

from trainledger.cli import main
from trainledger.journal import IntegrityError, SchemaError, Signer, StepObserved
from trainledger.journal.views.parquet import LISTING, export_parquet
from trainledger.journal.views.parquet.check import ExportMismatch, NotVerifiable, verify_export
from trainledger.journal.views.parquet.read import connect_exports
from trainledger.journal.views.query import connect
from trainledger.training.distributed.ranks import RankInfo, open_rank_journal

GOLDEN = Path(__file__).resolve().parents[2] / "assets" / "golden"


def _pub(name: str) -> list[str]:
    return ["--pubkey", str(GOLDEN / f"{name}.pub")]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """The every-kind golden journal (format 1.3) exported with its lines."""
    out = tmp_path_factory.mktemp("ex") / "out"
    assert main(["export", "parquet", str(GOLDEN / "every_kind_v1_3.jsonl"), str(out), "--lines",
                 *_pub("every_kind_v1_3")]) == 0
    return out


def _copy(export, tmp_path) -> Path:
    d = tmp_path / "copy"
    shutil.copytree(export, d)
    return d


def _relist(d: Path) -> None:
    """What someone who can write the folder does after changing a file: the listing's SHA-256 made to match."""
    listing = json.loads((d / LISTING).read_text())
    for x in listing["files"]:
        x["sha256"] = hashlib.sha256((d / x["path"]).read_bytes()).hexdigest()
    (d / LISTING).write_text(json.dumps(listing))


def _rewrite(path: Path, sql: str) -> None:
    """Rewrite one Parquet file through DuckDB (``sql`` selects from ``t``), its footer's receipt kept."""
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t AS SELECT * FROM read_parquet('{path}')")
    meta = con.execute(f"SELECT key, value FROM parquet_kv_metadata('{path}')").fetchall()
    kv = ", ".join(f"'{k.decode()}': '{v.decode().replace(chr(39), chr(39) * 2)}'" for k, v in meta)
    path.unlink()
    con.execute(f"COPY ({sql}) TO '{path}' (FORMAT parquet, KV_METADATA {{{kv}}})")


def test_the_export_re_verifies_alone_and_says_what_it_holds(export, capsys):
    assert main(["verify", str(export), *_pub("every_kind_v1_3")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"OK    {export}: 1 journal(s)") and "re-verified from their lines (pinned)" in out
    listing = json.loads((export / LISTING).read_text())
    (rc,) = listing["journals"]
    assert rc["lines"] is True and rc["trust"] == "pinned" and rc["checkpoint"].startswith("trainledger/")
    # every file's footer holds its journal's receipt
    con = duckdb.connect()
    for x in listing["files"]:
        (meta,) = con.execute(f"SELECT value FROM parquet_kv_metadata('{export / x['path']}') "
                              "WHERE key = 'trainledger_receipt'").fetchall()
        assert json.loads(meta[0]) == rc


def test_duckdb_over_the_export_answers_what_query_answers_over_the_journal(export):
    q = connect([GOLDEN / "every_kind_v1_3.jsonl"], keys=[_key("every_kind_v1_3")], use_cache=False)
    con = duckdb.connect()
    for view in ("steps", "anomalies", "checkpoints", "verdicts", "decisions", "configs"):
        mine = q.execute(f"SELECT * FROM {view} ORDER BY seq").fetchall()
        theirs = con.execute(f"SELECT * FROM read_parquet('{export}/{view}/**/*.parquet') ORDER BY seq").fetchall()
        assert len(mine) == len(theirs) > 0, view
        assert [tuple(map(_plain, r)) for r in mine] == [tuple(map(_plain, r)) for r in theirs], view
    n = con.execute(f"SELECT count(*) FROM read_parquet('{export}/events/**/*.parquet')").fetchone()[0]
    assert n == q.execute("SELECT count(*) FROM events").fetchone()[0]


def _plain(v):
    """A value as both sides hold it (a wide int is a DECIMAL(38,0) in the export; NaN compared as itself)."""
    from decimal import Decimal

    if isinstance(v, float) and v != v:
        return "NaN"
    return int(v) if isinstance(v, Decimal) else v


def _key(name):
    from trainledger.journal import load_public_key

    return load_public_key(GOLDEN / f"{name}.pub")


def test_a_changed_line_is_named(export, tmp_path):
    d = _copy(export, tmp_path)
    ev = next((d / "events").rglob("*.parquet"))
    _rewrite(ev, "SELECT * REPLACE (CASE WHEN kind = 'step_observed' AND seq = (SELECT min(seq) FROM t WHERE kind = "
                 "'step_observed') THEN replace(line, '\"loss\":', '\"loss\":1') ELSE line END AS line) FROM t")
    _relist(d)
    with pytest.raises(IntegrityError, match=r"^events/run-[^/]+/journal.parquet: chain broken at seq 3") as e:
        verify_export(d, keys=[_key("every_kind_v1_3")])
    assert e.value.seq == 3


def test_a_changed_typed_cell_is_named(export, tmp_path):
    d = _copy(export, tmp_path)
    steps = next((d / "steps").rglob("*.parquet"))
    _rewrite(steps, "SELECT * REPLACE (CASE WHEN seq = (SELECT min(seq) FROM t) THEN loss * 0.5 ELSE loss END AS loss) "
                    "FROM t")
    _relist(d)
    with pytest.raises(ExportMismatch, match=r"steps/.*1 row\(s\) are not what the lines give \(first at seq"):
        verify_export(d, keys=[_key("every_kind_v1_3")])


_AT = "seq = 7"


@pytest.mark.parametrize("change", [
    "run_id || 'x' AS run_id", "coalesce(rank, -1) + 1 AS rank", "'seal' AS kind",
    """kind || '","step":1' AS kind""", "ts + 1 AS ts", "ts - 1 AS ts",
    "substr(h, 1, 63) || CASE WHEN right(h, 1) = '0' THEN '1' ELSE '0' END AS h", "upper(h) AS h",
    """'x' || h AS h""", "NULL AS ts", "NULL AS kind"],
    ids=["run", "rank", "kind", "kind reaching past its place", "ts+1", "ts-1", "h", "h upper", "h longer",
         "ts null", "kind null"])
def test_a_changed_events_cell_is_named_at_its_seq(export, tmp_path, change):
    """The events rows' own cells (run, rank, kind, seq, ts, h) are held to the verified line as they stream: a
    change to one row's cell, of the same type, is named at that seq."""
    d = _copy(export, tmp_path)
    ev = next((d / "events").rglob("*.parquet"))
    col = change.rsplit(" AS ", 1)[1]
    _rewrite(ev, f"SELECT * REPLACE (CASE WHEN {_AT} THEN CAST({change.rsplit(' AS ', 1)[0]} AS "
                 f"{dict(run_id='VARCHAR', rank='INTEGER', kind='VARCHAR', ts='BIGINT', h='VARCHAR')[col]}) "
                 f"ELSE {col} END AS {col}) FROM t ORDER BY seq")
    _relist(d)
    with pytest.raises(ExportMismatch, match=r"events/.*1 row\(s\) are not what the lines give \(first at seq 7\)"):
        verify_export(d, keys=[_key("every_kind_v1_3")])


def test_an_events_column_of_another_type_is_named(export, tmp_path):
    d = _copy(export, tmp_path)
    ev = next((d / "events").rglob("*.parquet"))
    _rewrite(ev, "SELECT * REPLACE (CAST(rank AS BIGINT) AS rank) FROM t ORDER BY seq")
    _relist(d)
    with pytest.raises(ExportMismatch, match=r"events/.*column rank is BIGINT, the lines give rank INTEGER"):
        verify_export(d, keys=[_key("every_kind_v1_3")])


@pytest.mark.parametrize("table", ["steps", "seals"])
def test_a_typed_file_that_is_no_parquet_is_named_in_one_line(export, tmp_path, capsys, table):
    """Someone who can write the folder swaps a typed file for bytes DuckDB cannot read and relists it: verify OUT
    names that file (its kind's rows are rebuilt from the lines, and the file is read to be held to them), exit 1,
    one line, no traceback."""
    d = _copy(export, tmp_path)
    f = next((d / table).rglob("*.parquet"))
    f.write_bytes(b"not parquet at all" * 10)
    _relist(d)
    with pytest.raises(ExportMismatch, match=rf"{table}/.*: not the table it should be"):
        verify_export(d, keys=[_key("every_kind_v1_3")])
    capsys.readouterr()
    assert main(["verify", str(d), *_pub("every_kind_v1_3")]) == 1
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out and len((out.out + out.err).strip().splitlines()) == 1


def test_a_file_changed_after_the_export_a_planted_file_and_a_missing_one_are_named(export, tmp_path, capsys):
    d = _copy(export, tmp_path)
    steps = next((d / "steps").rglob("*.parquet"))
    steps.write_bytes(steps.read_bytes() + b"\0")
    assert main(["verify", str(d), *_pub("every_kind_v1_3")]) == 1
    assert "its SHA-256 is not the listed one" in capsys.readouterr().out
    d2 = _copy(export, tmp_path / "b")
    (d2 / "steps" / "extra.parquet").write_bytes(steps.read_bytes())
    with pytest.raises(ExportMismatch, match="steps/extra.parquet: not in the listing"):
        verify_export(d2, keys=[_key("every_kind_v1_3")])
    d3 = _copy(export, tmp_path / "c")
    shutil.rmtree(d3 / "steps")
    with pytest.raises(ExportMismatch, match="listed but missing"):
        verify_export(d3, keys=[_key("every_kind_v1_3")])


def test_a_typed_file_left_out_of_a_relisted_export_is_named(export, tmp_path):
    d = _copy(export, tmp_path)
    shutil.rmtree(d / "anomalies")
    listing = json.loads((d / LISTING).read_text())
    listing["files"] = [x for x in listing["files"] if x["table"] != "anomalies"]
    (d / LISTING).write_text(json.dumps(listing))
    with pytest.raises(ExportMismatch, match="its lines have anomalies rows, and the export has no"):
        verify_export(d, keys=[_key("every_kind_v1_3")])


def test_a_listed_file_of_no_verified_journal_and_an_empty_listing_are_refused(export, tmp_path):
    """A file added with its hash to the listing, under a run the listing has no receipt for: every file must be
    held to some journal's lines, or a reader's glob picks up rows nothing checked."""
    d = _copy(export, tmp_path)
    src = next((d / "steps").rglob("*.parquet"))
    planted = d / "steps" / "run-other" / "journal.parquet"
    planted.parent.mkdir()
    shutil.copy(src, planted)
    listing = json.loads((d / LISTING).read_text())
    listing["files"].append({"path": "steps/run-other/journal.parquet", "table": "steps", "run_id": "other",
                             "rank": None, "rows": 1, "bytes": planted.stat().st_size,
                             "sha256": hashlib.sha256(planted.read_bytes()).hexdigest()})
    (d / LISTING).write_text(json.dumps(listing))
    with pytest.raises(ExportMismatch, match="steps/run-other/journal.parquet: listed, but of no journal"):
        verify_export(d, keys=[_key("every_kind_v1_3")])
    listing = {**listing, "journals": [], "files": []}
    d2 = tmp_path / "empty"
    d2.mkdir()
    (d2 / LISTING).write_text(json.dumps(listing))
    with pytest.raises(SchemaError, match="names no journal"):
        verify_export(d2, keys=[_key("every_kind_v1_3")])


def test_a_listed_path_outside_the_folder_is_refused(export, tmp_path):
    d = _copy(export, tmp_path)
    listing = json.loads((d / LISTING).read_text())
    listing["files"][0]["path"] = "../../etc/passwd"
    (d / LISTING).write_text(json.dumps(listing))
    with pytest.raises(ExportMismatch, match="leaves the export"):
        verify_export(d, keys=[_key("every_kind_v1_3")])


def test_a_typed_only_export_says_it_cannot_be_verified(tmp_path, capsys):
    out = tmp_path / "typed"
    assert main(["export", "parquet", str(GOLDEN / "every_kind_v1_3.jsonl"), str(out), *_pub("every_kind_v1_3")]) == 0
    assert "as trustworthy as whoever exported it" in capsys.readouterr().out
    assert main(["verify", str(out), *_pub("every_kind_v1_3")]) == 1
    assert "exported without --lines" in capsys.readouterr().out
    with pytest.raises(NotVerifiable):
        verify_export(out, keys=[_key("every_kind_v1_3")])


def test_a_bad_journal_or_an_existing_out_leaves_nothing_written(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    lines = (GOLDEN / "every_kind_v1_3.jsonl").read_bytes().splitlines(keepends=True)
    lines[5] = lines[5].replace(b'"seq":5', b'"seq":6')
    bad.write_bytes(b"".join(lines))
    out = tmp_path / "out"
    assert main(["export", "parquet", str(bad), str(out), *_pub("every_kind_v1_3")]) == 1
    assert capsys.readouterr().out.startswith("FAIL ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]
    out.mkdir()
    assert main(["export", "parquet", str(GOLDEN / "every_kind_v1_3.jsonl"), str(out), *_pub("every_kind_v1_3")]) == 2
    assert "exists" in capsys.readouterr().err


def test_a_run_folder_is_exported_whole_rank_by_rank(tmp_path):
    s = Signer.generate()
    run = tmp_path / "run"
    js = [open_rank_journal(run, s, info=RankInfo(run="r1", rank=r, world_size=2, local_rank=0, node="n",
                                                  restart_count=0)) for r in range(2)]
    for j in js:
        for i in range(20):
            j.append(StepObserved(step=i, loss=2.0 + i / 100, grad_norm=0.5))
        j.close()
    out = tmp_path / "out"
    rep = export_parquet([run], out, lines=True, keys=[s.public])
    assert rep.journals == 2
    assert sorted(p.relative_to(out).as_posix() for p in (out / "steps").rglob("*.parquet")) == \
        ["steps/run-r1.r00000/rank-00000.parquet", "steps/run-r1.r00001/rank-00001.parquet"]
    con = duckdb.connect()
    assert con.execute(f"SELECT rank, count(*) FROM read_parquet('{out}/steps/**/*.parquet') GROUP BY rank "
                       "ORDER BY rank").fetchall() == [(0, 20), (1, 20)]
    assert verify_export(out, keys=[s.public]).journals == 2
    (run / "rank-00001.jsonl").unlink()  # a missing rank: the folder is not whole
    with pytest.raises(Exception, match="rank 1"):
        export_parquet([run], tmp_path / "out2", keys=[s.public])
    assert not (tmp_path / "out2").exists()


def test_query_reads_an_export_as_it_reads_the_journal(export, capsys):
    """``query OUT``: the export's copy verified, then the views over its Parquet files: the same answers as
    over the journal, the derived views included."""
    q = connect([GOLDEN / "every_kind_v1_3.jsonl"], keys=[_key("every_kind_v1_3")], use_cache=False)
    x = connect_exports([export], keys=[_key("every_kind_v1_3")])
    for sql in ("SELECT count(*), sum(loss), max(grad_norm) FROM steps",
                "SELECT anomaly, count(*) FROM anomalies GROUP BY anomaly ORDER BY anomaly",
                "SELECT count(*) FROM timeline", "SELECT count(*), round(sum(mfu), 12) FROM mfu",
                "SELECT kind, count(*) FROM events GROUP BY kind ORDER BY kind",
                "SELECT count(*) FROM step_observed", "SELECT run_id, events, last_seq FROM runs"):
        assert [tuple(map(_plain, r)) for r in x.execute(sql).fetchall()] == \
            [tuple(map(_plain, r)) for r in q.execute(sql).fetchall()], sql
    assert main(["query", str(export), "SELECT count(*) AS n FROM steps", "--format", "csv",
                 *_pub("every_kind_v1_3")]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == str(q.execute("SELECT count(*) FROM steps").fetchone()[0])


def test_query_of_a_changed_or_typed_only_export_fails_unless_told_not_to_check(export, tmp_path, capsys):
    d = _copy(export, tmp_path)
    steps = next((d / "steps").rglob("*.parquet"))
    _rewrite(steps, "SELECT * REPLACE (loss * 2 AS loss) FROM t")
    _relist(d)
    assert main(["query", str(d), "SELECT count(*) FROM steps", *_pub("every_kind_v1_3")]) == 1
    assert "are not what the lines give" in capsys.readouterr().err
    typed = tmp_path / "typed"
    assert main(["export", "parquet", str(GOLDEN / "every_kind_v1_3.jsonl"), str(typed), *_pub("every_kind_v1_3")]) == 0
    capsys.readouterr()
    assert main(["query", str(typed), "SELECT count(*) FROM steps", *_pub("every_kind_v1_3")]) == 1
    assert "exported without --lines" in capsys.readouterr().err
    assert main(["query", str(typed), "SELECT count(*) FROM steps", "--no-verify", "--format", "csv"]) == 0
    cap = capsys.readouterr()
    assert "NOT checked" in cap.err and int(cap.out.strip().splitlines()[-1]) > 0


def test_a_listing_verified_before_is_remembered_and_a_change_still_caught(export, tmp_path, monkeypatch):
    """The user's cache remembers a listing verified whole under the same keys: a later query checks the files it
    copies against it only, and copies only the tables its statement reads. A file it reads changed under the same
    listing fails that check (one it does not read is not copied: verify OUT checks it); a re-listed change is a
    new listing, verified whole again."""
    import trainledger.journal.views.parquet.read as read
    from trainledger.journal.trust import TrustPolicy

    monkeypatch.setenv("TRAINLEDGER_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    real = read.verify_export
    monkeypatch.setattr(read, "verify_export", lambda *a, **k: calls.append("whole") or real(*a, **k))
    d = _copy(export, tmp_path)
    key = [_key("every_kind_v1_3")]
    n = connect_exports([d], keys=key).execute("SELECT count(*) FROM steps").fetchone()[0]
    assert connect_exports([d], keys=key).execute("SELECT count(*) FROM steps").fetchone()[0] == n
    assert calls == ["whole"]  # the second: its files held to the remembered listing, nothing re-verified
    steps = next((d / "steps").rglob("*.parquet"))
    good = steps.read_bytes()
    steps.write_bytes(good[:-1] + b"\1")
    with pytest.raises(ExportMismatch, match="its SHA-256 is not the listed one"):
        connect_exports([d], keys=key)
    trust = TrustPolicy.of(None, keys=key)
    with pytest.raises(ExportMismatch, match="steps/.*its SHA-256 is not the listed one"):
        read.open_exports([d], verify_first=True, trust=trust, sql="SELECT count(*) FROM mfu")  # reads steps
    con, _ = read.open_exports([d], verify_first=True, trust=trust, sql="SELECT count(*) FROM anomalies")
    assert con.execute("SELECT count(*) FROM anomalies").fetchone()[0] > 0  # the steps file neither copied nor read
    steps.write_bytes(good)
    _rewrite(steps, "SELECT * REPLACE (loss * 2 AS loss) FROM t")
    _relist(d)
    with pytest.raises(ExportMismatch, match="are not what the lines give"):
        connect_exports([d], keys=key)
    assert calls == ["whole", "whole"]  # the remembered queries between re-verified nothing; the re-listed one did


def test_a_receipt_that_is_not_what_the_lines_give_is_named(export, tmp_path):
    """The listing's receipt is held to the lines field by field (what verify prints and --json hands on)."""
    d = _copy(export, tmp_path)
    listing = json.loads((d / LISTING).read_text())
    listing["journals"][0]["tree_size"] += 1
    (d / LISTING).write_text(json.dumps(listing))
    with pytest.raises(ExportMismatch, match="its lines give tree_size"):
        verify_export(d, keys=[_key("every_kind_v1_3")])


def test_the_streaming_pass_keeps_every_value_across_row_groups_and_leaves_the_unsigned_tail_out(tmp_path,
                                                                                                 monkeypatch):
    """Row groups of 7 rows (the seals fall between them; the columns built a few events at a time and joined),
    values the fast column path does not take (an int
    past int64, NaN and infinities, an int where a float is expected, None), and a live run's tail that no seal
    covers: the export holds exactly the signed prefix, cell for cell what the lines say."""
    import trainledger.journal.views.parquet.export as ex
    from trainledger.journal import Journal

    monkeypatch.setattr(ex, "ROW_GROUP", 7)
    monkeypatch.setattr(ex, "BATCH", 3)  # columns built 3 events or so at a time, joined into row groups of 7
    s = Signer.generate()
    p = tmp_path / "live.jsonl"
    with Journal.create(p, signer=s, seal_every=10, background=False) as j:
        for i in range(95):
            j.append(StepObserved(step=i, loss=[float("nan"), float("inf"), 2.5, 3][i % 4],
                                  grad_norm=None if i % 3 else -float("inf"),
                                  tokens=2**64 - 1 if i == 41 else 4096 * i, examples=i))
    lines = p.read_bytes().splitlines(keepends=True)
    p.write_bytes(b"".join(lines[:-2]))  # run_closed and its seal dropped: the run looks live, its tail unsigned
    with pytest.raises(IntegrityError):
        export_parquet([p], tmp_path / "refused", lines=True, keys=[s.public])
    assert not (tmp_path / "refused").exists()
    out = tmp_path / "out"
    rep = export_parquet([p], out, lines=True, keys=[s.public], allow_unsealed=True)
    listing = json.loads((out / LISTING).read_text())
    (receipt,) = listing["journals"]
    assert rep.events == receipt["events"] == receipt["last_seq"] + 1 < len(lines) - 2
    assert verify_export(out, keys=[s.public], allow_unsealed=True).events == rep.events
    con = duckdb.connect()
    got = con.execute(f"SELECT step, loss, grad_norm, tokens, examples FROM read_parquet('{out}/steps/**/*.parquet') "
                      "ORDER BY seq").fetchall()
    want = connect([p], keys=[s.public], allow_unsealed=True).execute(
        "SELECT step, loss, grad_norm, tokens, examples FROM steps ORDER BY seq").fetchall()
    assert len(got) == len(want) > 80
    assert [tuple(map(_plain, g)) for g in got] == [tuple(map(_plain, w)) for w in want]
    assert int(got[41][3]) == 2**64 - 1 and got[1][1] == float("inf")
    for table in ("events", "steps"):  # whole row groups of 7 rows, but the last
        groups = [n for _, n in sorted(con.execute(
            f"SELECT DISTINCT row_group_id, row_group_num_rows FROM parquet_metadata('{out}/{table}/**/*.parquet')"
        ).fetchall())]
        assert len(groups) > 10 and set(groups[:-1]) == {7} and 1 <= groups[-1] <= 7, (table, groups)


_STEPS_SQL = ("SELECT seq, ts, step, loss, grad_norm, lr, step_time_s, examples, tokens, supervised_tokens, "
              "data_time_s, compute_time_s, batch_fingerprint FROM steps ORDER BY seq")


def _parquet_query(p: Path, s: Signer) -> list[tuple]:
    """The steps as ``trainledger query`` reads a large journal: through its Parquet load."""
    from trainledger.journal.views.parquet.journals import load_journals
    from trainledger.journal.views.query import open_views

    con, _ = open_views([p], keys=[s.public], allow_unsealed=True, use_cache=False, cold=load_journals,
                        sql=_STEPS_SQL)
    return con.execute(_STEPS_SQL).fetchall()


def test_the_steps_read_as_columns_give_the_tables_their_records_give(tmp_path, monkeypatch):
    """A block's step lines go into the tables as columns read off the lines (``step_columns``), their records
    never built; where a block does not fit that its records are built as before (here every third block, and
    every block the second time). Both ways give the same tables, cell for cell and type for type (an int past
    2^53 where a float is expected as the nearest double, as DuckDB casts it), through seals that cut blocks and a
    tail no seal covers; an export written either way verifies the other way; the query answers alike."""
    import pyarrow.parquet as pq

    import trainledger.journal.views.parquet.export as ex
    import trainledger.journal.scan as scan
    from trainledger.journal import Journal
    from trainledger.training.kinds import SpikeSuspected

    if ex._step_columns is None or not scan._STEP_LINES_OK:
        pytest.skip("the C accelerator is not built")
    s = Signer.generate()
    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=s, seal_every=7, background=False) as j:
        for i in range(3000):
            j.append(StepObserved(
                step=i, loss=[2.5, 3, 0.1 + 0.2, 1.2345678901234567][i % 4] if i != 1700 else 2**60,
                grad_norm=None if i % 3 else i / 7, lr=3e-4 if i % 5 else None, step_time_s=0.25,
                tokens=4096 * i if i % 2 else None, examples=-i, supervised_tokens=i % 7 or None,
                data_time_s=1e-7 * i if i % 11 else None, compute_time_s=17, batch_fingerprint=i * 1e15 + 0.5))
            if i % 250 == 0:
                j.append(SpikeSuspected(step=i, series="loss", value=9.0, baseline_median=2.0, mad=0.1, z_score=70.0,
                                         threshold=6.0, released_at=i + 1))
    lines = p.read_bytes().splitlines(keepends=True)
    p.write_bytes(b"".join(lines[:-2]))  # a live run: its tail unsigned
    built, calls = [], []
    real, real_cols = ex._JournalWriter._step_table, ex._step_columns
    monkeypatch.setattr(ex, "_step_columns", lambda block, ends: (
        calls.append(1), None if len(calls) % 3 == 0 else real_cols(block, ends))[1])
    monkeypatch.setattr(ex._JournalWriter, "_step_table", lambda self, spec, blocks: (
        built.append(len(blocks)), real(self, spec, blocks))[1])
    ex_cols = tmp_path / "cols"
    export_parquet([p], ex_cols, lines=True, keys=[s.public], allow_unsealed=True)
    assert built and len(calls) > 3  # not vacuous: both ways were taken
    q_cols = _parquet_query(p, s)
    monkeypatch.setattr(ex, "_step_columns", None)  # the records' way
    ex_recs = tmp_path / "recs"
    export_parquet([p], ex_recs, lines=True, keys=[s.public], allow_unsealed=True)
    q_recs = _parquet_query(p, s)
    q_mem = connect([p], keys=[s.public], allow_unsealed=True, use_cache=False).execute(_STEPS_SQL).fetchall()
    assert len(q_cols) == len(q_recs) == len(q_mem) > 2900
    assert [tuple(map(_plain, r)) for r in q_cols] == [tuple(map(_plain, r)) for r in q_recs] == \
        [tuple(map(_plain, r)) for r in q_mem]  # and as DuckDB types the lines in memory
    assert q_cols[1700][:4] == (q_cols[1700][0], q_cols[1700][1], 1700, float(2**60))
    files = sorted(x.relative_to(ex_cols) for x in ex_cols.rglob("*.parquet"))
    assert files == sorted(x.relative_to(ex_recs) for x in ex_recs.rglob("*.parquet")) and len(files) >= 4
    for f in files:
        a, b = pq.read_table(ex_cols / f), pq.read_table(ex_recs / f)
        assert a.schema == b.schema and a.equals(b), f
    assert verify_export(ex_cols, keys=[s.public], allow_unsealed=True).events == \
        json.loads((ex_cols / LISTING).read_text())["journals"][0]["events"]
    monkeypatch.undo()
    assert verify_export(ex_recs, keys=[s.public], allow_unsealed=True).events > 3000


def test_integers_are_typed_alike_however_the_journal_is_read(tmp_path, monkeypatch):
    """Query types an event's integers HUGEINT (up to 2**64 - 1) whether it loads the journal in memory, reads it
    through its private Parquet load (int64 there, where every value fits) or reads an export of it (DECIMAL(38,0)
    there): the same types and values every way. A journal with an integer past int64 is loaded wide instead,
    nothing of the narrow attempt left beside it."""
    import pyarrow.parquet as pq

    import trainledger.journal.views.parquet.export as ex
    from trainledger.journal.views.parquet.journals import load_journals
    from trainledger.journal.views.query import open_views

    passes = []
    real = ex._export_once
    monkeypatch.setattr(ex, "_export_once", lambda *a, narrow: (passes.append(narrow), real(*a, narrow=narrow))[1])
    s = Signer.generate()
    sql = "SELECT step, examples, tokens, supervised_tokens FROM steps ORDER BY seq"
    kinds = "SELECT column_name, column_type FROM (DESCRIBE " + sql + ")"
    for name, big in (("small", None), ("big", 2**64 - 1)):
        p = tmp_path / f"{name}.jsonl"
        with _journal(p, s) as j:
            for i in range(50):
                j.append(StepObserved(step=i, loss=1.0, examples=-2**63 if i == 3 else i,
                                      tokens=big if i == 7 and big else 2**63 - 1 if i == 8 else None,
                                      supervised_tokens=2**63 if i == 9 and big else i))
        mem = connect([p], keys=[s.public], use_cache=False)
        passes.clear()
        con, source = open_views([p], keys=[s.public], use_cache=False, cold=load_journals, sql=sql)
        assert passes == ([True, False] if big else [True])  # the narrow pass, then the wide one
        threads = "SELECT current_setting('threads')"  # the load's one thread is not the statement's
        assert con.execute(threads).fetchone() == duckdb.connect().execute(threads).fetchone()
        export_parquet([p], tmp_path / f"{name}.export", lines=True, keys=[s.public])
        out = connect_exports([tmp_path / f"{name}.export"], keys=[s.public])
        want = mem.execute(sql).fetchall()
        assert want[3][1] == -2**63 and want[8][2] == 2**63 - 1 and (want[7][2] == big if big else True)
        for c in (con, out):
            assert c.execute(sql).fetchall() == want, name
            assert c.execute(kinds).fetchall() == mem.execute(kinds).fetchall() == \
                [("step", "HUGEINT"), ("examples", "HUGEINT"), ("tokens", "HUGEINT"), ("supervised_tokens", "HUGEINT")]
        loaded = source.tables["steps"]
        assert len(loaded) == 1 and [f.name for f in Path(loaded[0]).parent.iterdir()] == [Path(loaded[0]).name]
        stored = str(pq.read_schema(loaded[0]).field("tokens").type)
        assert stored == ("decimal128(38, 0)" if big else "int64"), name


def _journal(p: Path, s: Signer):
    from trainledger.journal import Journal

    return Journal.create(p, signer=s, seal_every=10, background=False)


def test_query_of_an_export_defines_the_views_its_statement_reads(export):
    """``query OUT SQL`` defines only the views the statement reads (and those they read), as a query over
    journals does; a statement whose reads DuckDB's parse cannot tell gets every view."""
    from trainledger.journal.views.parquet.read import open_exports
    from trainledger.journal.trust import TrustPolicy

    trust = TrustPolicy.of(None, keys=[_key("every_kind_v1_3")])
    views = "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY view_name"
    con, _ = open_exports([export], verify_first=True, trust=trust, sql="SELECT count(*) FROM mfu")
    assert [v for v, in con.execute(views).fetchall()] == ["configs", "events", "mfu", "run_configured",
                                                            "step_observed", "steps"]
    assert con.execute("SELECT count(*) FROM mfu").fetchone()[0] > 0
    con, _ = open_exports([export], verify_first=True, trust=trust, sql="SELECT * FROM read_parquet('x')")
    assert len(con.execute(views).fetchall()) > 10
