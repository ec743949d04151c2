"""The library calls the CLI is a thin layer over: :func:`trainledger.verify_path` checks whatever a path is (a
journal, a run folder, a Parquet export) and refuses options that do not apply to it; :func:`trainledger.open_query`
chooses how one query's tables are loaded (journals or exports, verified or not) and says what it chose."""

from __future__ import annotations

import pytest

from trainledger import open_query, verify_path
from trainledger.journal import IntegrityError, StepObserved, TrustPolicy
from trainledger.journal.errors import UsageError
from trainledger.journal.views import path_kind
from trainledger.training.distributed.ranks import RankInfo, open_rank_journal


def _run_dir(tmp_path, signer, ranks=2):
    d = tmp_path / "run"
    d.mkdir()
    for r in range(ranks):
        j = open_rank_journal(d, signer, info=RankInfo("t", r, ranks, r, "n0", 0), background=False)
        for i in range(5):
            j.append(StepObserved(step=i, loss=1.0))
        j.close()
    return d


def test_verify_path_checks_a_journal_a_run_folder_and_an_export_each_its_own_way(tmp_path, make_journal, signer,
                                                                                pubkey):
    trust = TrustPolicy(keys=(pubkey,))
    one = make_journal(20)
    assert path_kind(one) == "journal"
    rep = verify_path(one, trust, require_closed=True)
    assert rep.ok and rep.events == rep.kinds["step_observed"] + rep.kinds["seal"] + 2 and rep.trust == "pinned"
    run = _run_dir(tmp_path, signer)
    assert path_kind(run) == "run_dir"
    rr = verify_path(run, trust)
    assert sorted(rr.ranks) == [0, 1] and rr.world_size == 2 and rr.to_dict()["ok"]
    pytest.importorskip("pyarrow")
    from trainledger.journal.views.parquet import export_parquet

    out = tmp_path / "export"
    export_parquet([one], out, keys=[pubkey], lines=True)
    assert path_kind(out) == "export"
    ex = verify_path(out, trust)
    assert ex.journals == 1 and ex.events == rep.events


def test_verify_path_raises_what_the_check_finds_and_refuses_what_does_not_apply(tmp_path, make_journal, signer,
                                                                                pubkey):
    trust = TrustPolicy(keys=(pubkey,))
    one = make_journal(20)
    data = bytearray(one.read_bytes())
    at = data.index(b'"loss":') + 7
    data[at:at + 1] = b"9" if data[at:at + 1] != b"9" else b"8"
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(bytes(data))
    with pytest.raises(IntegrityError):
        verify_path(bad, trust)
    with pytest.raises(UsageError, match="--partial reads a run folder"):
        verify_path(one, trust, partial=True)
    with pytest.raises(UsageError, match="--ray verifies a run folder"):
        verify_path(one, trust, ray="")
    run = _run_dir(tmp_path, signer)
    with pytest.raises(UsageError, match="give that rank's file"):
        verify_path(run, trust, expect_head=(3, "0" * 64))


def test_open_query_says_what_it_loaded_and_refuses_exports_mixed_with_journals(tmp_path, make_journal, pubkey):
    trust = TrustPolicy(keys=(pubkey,))
    one = make_journal(30)
    with open_query([one], trust, "SELECT count(*) FROM steps") as q:
        assert q.con.execute("SELECT count(*) FROM steps").fetchone() == (30,)
        assert q.source.origin == "journals" and q.missing == {}
    with open_query([one], None, verify=False) as q:  # unchecked: the caller says so
        assert q.con.execute("SELECT max(step) FROM steps").fetchone() == (29,)
    with pytest.raises(UsageError, match="at least one"):
        open_query([], trust)
    pytest.importorskip("pyarrow")
    from trainledger.journal.views.parquet import export_parquet

    out = tmp_path / "export"
    export_parquet([one], out, keys=[pubkey], lines=True)
    with open_query([out], trust) as q:
        assert q.con.execute("SELECT count(*) FROM steps").fetchone() == (30,)
    with pytest.raises(UsageError, match="exports or journals, not both"):
        open_query([out, one], trust)
    two = make_journal(5)
    data = two.read_bytes().replace(b'"step":3,', b'"step":4,', 1)
    two.write_bytes(data)
    with pytest.raises(IntegrityError):
        open_query([two], trust)
