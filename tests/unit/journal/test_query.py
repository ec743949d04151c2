"""trainledger query: views over real journals in real DuckDB, NaN/inf as DOUBLE, and a locked sandbox."""

from __future__ import annotations

import json
import math

import duckdb
import pytest

from trainledger.journal import Journal, StepObserved
from trainledger.cli import main
from trainledger.training.health.detectors import AnomalyDetected
from trainledger.journal.views.query import connect


def _journal(path, signer, n=20, run_id=None):
    with Journal.create(path, signer=signer, run_id=run_id, background=False) as j:
        for i in range(n):
            j.append(StepObserved(step=i, loss=[2.0, math.nan, math.inf, -math.inf][i % 4], tokens=100))
        j.append(AnomalyDetected(step=1, anomaly="nan_loss", value=math.nan))
    return path


def test_views_and_non_finite_values(tmp_path, signer):
    _journal(tmp_path / "a.jsonl", signer, run_id="run-a")
    _journal(tmp_path / "b" / "b.jsonl", signer, n=8, run_id="run-b")
    con = connect([tmp_path], keys=[signer.public])
    assert con.execute("SELECT run_id, count(*) FROM steps GROUP BY 1 ORDER BY 1").fetchall() == [
        ("run-a", 20), ("run-b", 8)]
    losses = [r[0] for r in con.execute("SELECT loss FROM steps WHERE run_id = 'run-a' ORDER BY step LIMIT 4").fetchall()]
    assert losses[0] == 2.0 and math.isnan(losses[1]) and losses[2] == math.inf and losses[3] == -math.inf
    assert con.execute("SELECT anomaly, step FROM anomalies WHERE run_id = 'run-b'").fetchall() == [("nan_loss", 1)]
    assert con.execute("SELECT count(*) FROM seals").fetchone()[0] >= 4
    assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 2


def test_the_events_view_and_table_have_a_rank_column_like_every_view(tmp_path, signer):
    _journal(tmp_path / "rank-00003.jsonl", signer, n=4, run_id="job.r00003")
    _journal(tmp_path / "plain.jsonl", signer, n=4, run_id="plain")
    con = connect([tmp_path], keys=[signer.public])
    for view in ("events", "events_t", "steps"):
        got = con.execute(f"SELECT run_id, rank FROM {view} GROUP BY ALL ORDER BY run_id").fetchall()
        assert got == [("job.r00003", 3), ("plain", None)], view


@pytest.mark.parametrize("sql", ["COPY (SELECT 1) TO '{out}'", "SELECT * FROM read_csv('/etc/passwd')",
                                 "SELECT * FROM read_json_objects('/etc/hostname')",
                                 "SET enable_external_access = true"])
def test_queries_cannot_touch_files(tmp_path, signer, sql):
    con = connect([_journal(tmp_path / "a.jsonl", signer)], keys=[signer.public])
    with pytest.raises(duckdb.Error):
        con.execute(sql.format(out=tmp_path / "stolen.csv"))
    assert not (tmp_path / "stolen.csv").exists()


def test_no_progress_bar_can_reach_stdout(tmp_path, signer):
    """DuckDB draws a progress bar on stdout once a statement has run two seconds (a cold load of a large journal,
    a slow query), which corrupted --format csv / json output: every connection here has it off, locked."""
    con = connect([_journal(tmp_path / "a.jsonl", signer)], keys=[signer.public])
    assert con.execute("SELECT current_setting('enable_progress_bar')").fetchone()[0] is False
    with pytest.raises(duckdb.Error):
        con.execute("SET enable_progress_bar = true")


def test_cli_formats_params_and_refusals(tmp_path, signer, keypair, capsys):
    p = _journal(tmp_path / "a.jsonl", signer)
    pub = str(keypair[2])
    assert main(["query", "--pubkey", pub, "--format", "json", "--param", "3", str(p),
                 "SELECT step, loss FROM steps WHERE step < ? ORDER BY step"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert main(["query", "--pubkey", pub, "--format", "csv", str(p), "SELECT count(*) AS n FROM steps"]) == 0
    assert capsys.readouterr().out.splitlines() == ["n", "20"]
    out = tmp_path / "r.parquet"
    assert main(["query", "--pubkey", pub, "--format", "parquet", "--out", str(out), str(p),
                 "SELECT step, loss FROM steps"]) == 0
    assert duckdb.connect().execute(f"SELECT count(*) FROM '{out}'").fetchone()[0] == 20
    assert main(["query", "--pubkey", pub, str(p), "COPY (SELECT 1) TO '/tmp/x.csv'"]) == 2
    assert "query failed" in capsys.readouterr().err
    assert main(["query", str(p), "SELECT 1"]) == 2  # no key pinned
    capsys.readouterr()
    assert main(["query", "--no-verify", str(p), "SELECT count(*) FROM events"]) == 0
    assert "NOT checked" in capsys.readouterr().err


def test_mfu_view_matches_the_monitor(tmp_path, signer):
    from trainledger.training.health.flops import FlopConfig
    from trainledger.training.health.monitor import TrainingHealthMonitor

    p = tmp_path / "m.jsonl"
    cfg = FlopConfig(n_params=7104, n_layer=2, n_head=2, head_dim=8, seq_len=8)
    with Journal.create(p, signer=signer, background=False) as j:
        m = TrainingHealthMonitor(journal=j, flop_config=cfg, peak_flops_per_sec=1e12)
        for i, dt in enumerate([0.1, 0.2, 0.05]):
            m.observe_step(i, 3.0, step_time_s=dt, batch_size=4)
    con = connect([p], keys=[signer.public])
    got = [r[0] for r in con.execute("SELECT mfu FROM mfu ORDER BY step").fetchall()]
    assert got == pytest.approx([cfg.flops_per_iter(4) / dt / 1e12 for dt in (0.1, 0.2, 0.05)])
    assert sum(got) / 3 == pytest.approx(m.report()["mfu"]["mean"])


def test_warm_copy_is_used_only_while_it_matches(tmp_path, signer):
    """The columnar copy answers while size, head and trust match; growth, another key or a rare option reads
    the journal again, and user SQL cannot write to the copy."""
    from trainledger.journal import Signer
    from trainledger.journal.errors import HeadMismatch
    from trainledger.journal.views.query import build_cache, open_views

    p = tmp_path / "a.jsonl"
    with Journal.create(p, signer=signer, run_id="run-w", background=False) as j:
        for i in range(30):
            j.append(StepObserved(step=i, loss=float(i), tokens=10))
        j.suspend()
    assert open_views([p], keys=[signer.public])[1].origin == "journals"
    build_cache([p], keys=[signer.public])
    con, src = open_views([p], keys=[signer.public])
    assert src.origin == "cache"
    assert con.execute("SELECT count(*), max(loss) FROM steps").fetchone() == (30, 29.0)
    for sql in ["CREATE TABLE cache.x (a INT)", "DELETE FROM cache.steps", "UPDATE cache.meta SET version = 0",
                f"ATTACH '{src.cache_path}' AS w", f"COPY cache.steps TO '{tmp_path / 'x.csv'}'"]:
        with pytest.raises(duckdb.Error):
            con.execute(sql)
    assert open_views([p], trust_embedded=True)[1].origin == "cache"
    assert open_views([p], keys=[signer.public, Signer.generate().public])[1].origin == "cache"
    # --expect-head is checked against the journal itself, never answered from the copy.
    with pytest.raises(HeadMismatch):
        open_views([p], keys=[signer.public], expect_head="5:" + "0" * 64)
    assert open_views([p], keys=[signer.public], use_cache=False)[1].origin == "journals"
    # The journal grows: a new head, the copy is stale.
    with Journal.open_append(p, signer=signer, background=False) as j:
        j.append(StepObserved(step=30, loss=30.0, tokens=10))
    con, src = open_views([p], keys=[signer.public])
    assert src.origin == "journals"
    assert con.execute("SELECT count(*), max(loss) FROM steps").fetchone() == (31, 30.0)


def test_warm_copy_refuses_a_key_it_was_not_verified_under(tmp_path, signer):
    from trainledger.journal import Signer
    from trainledger.journal.errors import UntrustedKey
    from trainledger.journal.views.query import build_cache, open_views

    p = _journal(tmp_path / "a.jsonl", signer)
    build_cache([p], keys=[signer.public])
    with pytest.raises(UntrustedKey):
        open_views([p], keys=[Signer.generate().public])
    with pytest.raises(Exception, match="no key pinned"):
        open_views([p])


def test_lines_a_live_writer_adds_after_verification_are_not_loaded(tmp_path, signer):
    """A torn tail and lines past the verified head stay out of the tables."""
    p = _journal(tmp_path / "a.jsonl", signer)
    with open(p, "ab") as f:
        f.write(b'{"kind":"step_observed","step":99,"loss":1.0,"seq":')
    con = connect([p], keys=[signer.public])
    assert con.execute("SELECT max(step) FROM steps").fetchone()[0] == 19
    assert con.execute("SELECT count(*) FROM events WHERE seq IS NULL").fetchone()[0] == 0


def test_an_error_in_a_folder_names_the_users_file_not_the_private_copy(tmp_path, signer, keypair, capsys):
    _, _, pub = keypair
    run = tmp_path / "run"
    _journal(run / "a.jsonl", signer, n=5)
    lines = (run / "a.jsonl").read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b'"step":', b'"step": ')  # a changed byte
    (run / "a.jsonl").write_bytes(b"".join(lines))
    assert main(["query", "--pubkey", str(pub), str(run), "SELECT 1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"FAIL {run / 'a.jsonl'}: seq ") and "trainledger-" not in err, err
    (run / "a.jsonl").unlink()
    (run / "b.jsonl").write_text("garbage\n")
    assert main(["query", "--pubkey", str(pub), str(run), "SELECT 1"]) == 1
    assert capsys.readouterr().err.startswith(f"FAIL {run / 'b.jsonl'}: ")


@pytest.mark.parametrize("sql", ["DROP VIEW steps", "CREATE TABLE t AS SELECT 1", "SET threads = 4",
                                 "SELECT 1; DROP VIEW events"])
def test_the_command_refuses_a_statement_that_changes_its_session(tmp_path, signer, keypair, capsys, sql):
    p = _journal(tmp_path / "a.jsonl", signer)
    assert main(["query", "--pubkey", str(keypair[2]), str(p), sql]) == 2
    err = capsys.readouterr().err
    assert "the session is read-only" in err and err.count("\n") == 1
    assert main(["query", "--pubkey", str(keypair[2]), str(p), "DESCRIBE steps"]) == 0


def test_a_folders_journals_leave_out_the_files_written_beside_them(tmp_path, signer, keypair, capsys):
    """Found in a review: 'trainledger timestamp' (and Recorder(tsa=)) writes <journal>.timestamps.jsonl beside a
    journal, and query over the folder read it as a journal and failed ("not an event line"). A documents journal
    ('trainledger bom', signed by whoever issued them) is no run of the folder either; named directly, it is read."""
    from trainledger.journal import Signer
    from trainledger.journal.paths import SIDECAR_SUFFIXES, is_sidecar
    from trainledger.journal.proofs.timestamp import sidecar
    from trainledger.journal.statements.bom.document import documents_journal

    _, _, pub = keypair
    run = tmp_path / "run"
    j = _journal(run / "journal.jsonl", signer, n=5, run_id="the-run")
    sidecar(j).write_text('{"seal_seq": 3, "tsa": "http://tsa.example/", "error": "unreachable"}\n')
    _journal(documents_journal(j), Signer.generate(), n=1, run_id="the-run.documents")  # another key's journal
    assert is_sidecar(sidecar(j)) and is_sidecar(documents_journal(j)) and not is_sidecar(j)
    assert {sidecar(j).name[len("journal"):], documents_journal(j).name[len("journal"):]} == set(SIDECAR_SUFFIXES)
    assert main(["query", "--pubkey", str(pub), str(run), "SELECT run_id, count(*) FROM steps GROUP BY 1"]) == 0
    assert "the-run" in capsys.readouterr().out
    from trainledger.journal.audit.rundir import run_journal

    loose = tmp_path / "loose"
    k = _journal(loose / "x.jsonl", signer, n=2)
    sidecar(k).write_text("{}\n")
    assert run_journal(loose) == k  # the folder's one journal, not "a folder of 2 journals"
