"""Trust round 3: an attacker who can write an export folder (or the working folder, or run a Ray cluster on the
machine) but holds no key, against ``verify OUT``, ``query OUT`` and the query lockdown. Each test is named after
its attack; each export here is real (``export parquet`` of real signed run folders), each change is one an
attacker without the key can make, and the listing is re-hashed after it (they can rewrite that too)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from test_parquet_export import _relist  # noqa: E402  (the listing re-hashed, as an attacker would)
from test_run_folder_keys import _folder  # noqa: E402  (a run folder anchored as anchor_ranks does)

from trainledger.cli import main
from trainledger.journal import Signer, StepObserved
from trainledger.journal.roster import RosterMismatch, load_roster
from trainledger.journal.audit.rundir import AnchorMismatch, verify_run_dir
from trainledger.journal.errors import IntegrityError
from trainledger.journal.views.parquet import LISTING, export_parquet
from trainledger.journal.views.parquet.check import ExportMismatch, verify_export
from trainledger.journal.views.parquet.read import connect_exports
from trainledger.journal.trust import TrustPolicy
from trainledger.training.distributed.ranks import RankInfo, open_rank_journal

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

GOLDEN = Path(__file__).resolve().parents[2] / "assets" / "golden"


def _drop_journal(out: Path, run_id: str) -> None:
    """A journal's files and its listing entries removed, the rest re-hashed: what an attacker does to hide a rank."""
    listing = json.loads((out / LISTING).read_text())
    for x in [x for x in listing["files"] if x["run_id"] == run_id]:
        (out / x["path"]).unlink()
        (out / x["path"]).parent.rmdir()
    listing["files"] = [x for x in listing["files"] if x["run_id"] != run_id]
    listing["journals"] = [rc for rc in listing["journals"] if rc["run_id"] != run_id]
    listing.pop("partial", None)
    (out / LISTING).write_text(json.dumps(listing))


def _graft(out: Path, other: Path, run_id: str) -> None:
    """Another export's journal (files, entries, receipt) put into ``out``."""
    theirs = json.loads((other / LISTING).read_text())
    listing = json.loads((out / LISTING).read_text())
    for x in theirs["files"]:
        if x["run_id"] == run_id:
            (out / x["path"]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(other / x["path"], out / x["path"])
            listing["files"].append(x)
    listing["journals"] += [rc for rc in theirs["journals"] if rc["run_id"] == run_id]
    (out / LISTING).write_text(json.dumps(listing))
    _relist(out)


@pytest.fixture(scope="module")
def run4(tmp_path_factory):
    """A 4-rank run folder signed by one key, its rank 1 as it was after the first round, its export (lines)."""
    base = tmp_path_factory.mktemp("run4")
    s = Signer.generate()
    early = base / "rank1-early.jsonl"
    d = _folder(base / "run", [s] * 4, run="runX", snapshot={1: early})
    out = base / "out"
    export_parquet([d], out, lines=True, keys=[s.public])
    pub = base / "k.pub"
    pub.write_text(s.public.line() + "\n")
    return d, out, s, early, pub


def _copy(out: Path, tmp_path: Path) -> Path:
    d = tmp_path / "copy"
    shutil.copytree(out, d)
    return d


# -- High 1: verify OUT holds a run folder's export whole ------------------------------------------------------


def test_a_rank_dropped_from_a_run_folders_export_fails_verify_out_and_query_out(run4, tmp_path, capsys):
    d, out, s, _, pub = run4
    bad = _copy(out, tmp_path)
    _drop_journal(bad, "runX.r00002")
    _relist(bad)
    with pytest.raises(AnchorMismatch, match=r"rank 2 of 4: no journal"):
        verify_export(bad, keys=[s.public])
    assert main(["verify", str(bad), "--pubkey", str(pub)]) == 1
    assert "rank 2 of 4" in capsys.readouterr().out
    assert main(["query", str(bad), "--pubkey", str(pub), "SELECT count(*) FROM steps"]) == 1
    assert "rank 2" in capsys.readouterr().err


def test_a_partial_view_of_such_an_export_is_labelled_partial(run4, tmp_path, capsys):
    d, out, s, _, pub = run4
    bad = _copy(out, tmp_path)
    _drop_journal(bad, "runX.r00002")
    _relist(bad)
    r = verify_export(bad, keys=[s.public], partial=True)
    assert r.partial and list(r.missing.values()) == [[2]]
    assert main(["verify", str(bad), "--pubkey", str(pub), "--partial"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"PARTIAL: {bad} (run runX) lacks rank(s) 2;") and "\nOK    " in printed
    assert main(["query", str(bad), "--pubkey", str(pub), "--partial", "--format", "csv",
                 "SELECT count(DISTINCT rank) AS n FROM steps"]) == 0
    got = capsys.readouterr()
    assert got.out.splitlines() == ["n", "3"] and "PARTIAL: " in got.err and "lacks rank(s) 2" in got.err
    # remembered as partial: a later query without --partial still fails
    assert main(["query", str(bad), "--pubkey", str(pub), "SELECT 1"]) == 1
    assert "--partial" in capsys.readouterr().err


def test_the_exporters_own_partial_label_is_neither_needed_nor_trusted(run4, tmp_path, capsys):
    """A --partial export: verify OUT recomputes which ranks are missing; the listing's word is never read."""
    d, out, s, _, pub = run4
    part = tmp_path / "part"
    shutil.copytree(d, part)
    (part / "rank-00003.jsonl").unlink()
    ex = tmp_path / "ex"
    export_parquet([part], ex, lines=True, keys=[s.public], partial=True)
    listing = json.loads((ex / LISTING).read_text())
    listing["partial"] = {}  # the exporter's record, erased
    (ex / LISTING).write_text(json.dumps(listing))
    with pytest.raises(AnchorMismatch, match="rank 3 of 4"):
        verify_export(ex, keys=[s.public])
    assert verify_export(ex, keys=[s.public], partial=True).missing == {f"{ex} (run runX)": [3]}


def test_a_rank_rolled_back_before_rank_0s_anchor_fails_verify_out(run4, tmp_path, capsys):
    d, out, s, early, pub = run4
    assert verify_run_dir(d, keys=[s.public]).ok
    lone = tmp_path / "lone"
    export_parquet([early], lone, lines=True, keys=[s.public])  # rank 1 as it was, exported alone
    bad = _copy(out, tmp_path)
    _drop_journal(bad, "runX.r00001")
    _graft(bad, lone, "runX.r00001")
    with pytest.raises(AnchorMismatch, match=r"rank 1: its signed journal ends at seq \d+, but rank 0 anchored"):
        verify_export(bad, keys=[s.public])
    assert main(["verify", str(bad), "--pubkey", str(pub)]) == 1
    assert "truncated or rolled back" in capsys.readouterr().out


def test_another_runs_rank_swapped_into_an_export_fails(run4, tmp_path):
    d, out, s, _, pub = run4
    other = _folder(tmp_path / "other", [s] * 4, run="runY")
    ex = tmp_path / "ex"
    export_parquet([other / "rank-00001.jsonl"], ex, lines=True, keys=[s.public])
    bad = _copy(out, tmp_path)
    _drop_journal(bad, "runX.r00001")
    _graft(bad, ex, "runY.r00001")
    with pytest.raises(AnchorMismatch, match=r"rank (1 of 4|0 of 4): no journal"):
        verify_export(bad, keys=[s.public])


def test_a_two_key_folders_export_needs_the_roster(tmp_path):
    keys = [Signer.generate() for _ in range(2)]
    d = _folder(tmp_path / "run", keys, rounds=0, run="runX")  # no anchor: nothing binds a rank to its key
    out = tmp_path / "out"
    roster = tmp_path / "roster.txt"
    roster.write_text("".join(f"{r} {k.public.line()}\n" for r, k in enumerate(keys)))
    export_parquet([d], out, lines=True, trust=TrustPolicy(roster=load_roster(roster)))
    with pytest.raises(RosterMismatch, match="signed by 2 keys and nothing binds rank"):
        verify_export(out, keys=[k.public for k in keys])
    assert verify_export(out, trust=TrustPolicy(roster=load_roster(roster))).runs == {"runX": 2}
    # the roster holds each rank to its key: rank 1 signed by rank 0's key fails
    swapped = tmp_path / "swapped.txt"
    swapped.write_text(f"0 {keys[0].public.line()}\n1 {keys[0].public.line()}\n* {keys[1].public.line()}\n")
    with pytest.raises(RosterMismatch):
        verify_export(out, trust=TrustPolicy(roster=load_roster(swapped)))


def test_a_rank_at_or_past_its_rounds_world_size_is_refused(tmp_path, signer):
    for r, world in ((0, 2), (2, 2)):
        info = RankInfo(run="runW", rank=r, world_size=world, local_rank=0, node="n", restart_count=0)
        with open_rank_journal(tmp_path / "w", signer, info=info) as j:
            j.append(StepObserved(step=0, loss=1.0))
    with pytest.raises(AnchorMismatch, match="rank 2: joined restart round 0 as rank 2 of a world of 2"):
        verify_run_dir(tmp_path / "w", keys=[signer.public], partial=True)


# -- High 2: query OUT's views come from verified paths, never the listing's labels -----------------------------


def test_relabelled_listing_tables_do_not_change_what_query_out_answers(run4, tmp_path):
    d, out, s, _, pub = run4
    want = connect_exports([out], keys=[s.public]).execute("SELECT count(*) FROM steps").fetchone()[0]
    bad = _copy(out, tmp_path)
    listing = json.loads((bad / LISTING).read_text())
    for x in listing["files"]:
        if x["path"].startswith("steps/"):
            x["table"] = "anomalies"
    (bad / LISTING).write_text(json.dumps(listing))
    with pytest.raises(ExportMismatch, match="listed as table 'anomalies', but its path is steps's"):
        verify_export(bad, keys=[s.public])
    with pytest.raises(ExportMismatch, match="listed as table"):
        connect_exports([bad], keys=[s.public])
    with pytest.raises(ExportMismatch, match="listed as table"):  # the folder's shape is held even unchecked
        connect_exports([bad], verify_first=False)
    # the labels are not what the views are built from: without any, every table is still its path's
    for x in listing["files"]:
        del x["table"]
    (bad / LISTING).write_text(json.dumps(listing))
    con = connect_exports([bad], keys=[s.public])
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == want == 40
    assert con.execute("SELECT count(*) FROM anomalies").fetchone()[0] == 0


def test_an_entry_naming_another_run_or_rank_than_its_path_is_refused(run4, tmp_path):
    d, out, s, _, pub = run4
    for field, value in (("run_id", "runX.r00003"), ("rank", 3), ("rows", 999)):
        bad = tmp_path / f"bad-{field}"
        shutil.copytree(out, bad)
        listing = json.loads((bad / LISTING).read_text())
        x = next(x for x in listing["files"] if x["path"].startswith("steps/run-runX.r00001/"))
        x[field] = value
        (bad / LISTING).write_text(json.dumps(listing))
        with pytest.raises(ExportMismatch, match="steps/run-runX.r00001"):
            verify_export(bad, keys=[s.public])


# -- High 3 and Low: nothing but listed regular files and their folders ------------------------------------------


def _forged_rows(where: Path) -> None:
    where.mkdir(parents=True)
    pq.write_table(pa.table({"run_id": ["forged"], "seq": [0]}), where / "forged.parquet")


@pytest.mark.parametrize("plant", ["folder link", "file link", "dangling link", "fifo", "socket", "extra folder",
                                   "linked listing"])
def test_anything_planted_in_out_but_a_listed_file_is_refused_by_verify_and_query(run4, tmp_path, plant, capsys):
    d, out, s, _, pub = run4
    bad = _copy(out, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    _forged_rows(elsewhere)
    if plant == "folder link":  # pyarrow's dataset reader follows it: pq.read_table('OUT/steps') reads the forgery
        os.symlink(elsewhere, bad / "steps" / "run-zz")
        assert pq.read_table(bad / "steps").num_rows > 40
    elif plant == "file link":
        os.symlink(elsewhere / "forged.parquet", bad / "steps" / "run-runX.r00000" / "more.parquet")
    elif plant == "dangling link":
        os.symlink(tmp_path / "nowhere", bad / "steps" / "gone")
    elif plant == "fifo":
        os.mkfifo(bad / "steps" / "pipe")
    elif plant == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(bad / "sock"))
        sock.close()
    elif plant == "extra folder":
        (bad / "steps" / "run-empty").mkdir()
    elif plant == "linked listing":
        shutil.move(bad / LISTING, tmp_path / "listing.json")
        os.symlink(tmp_path / "listing.json", bad / LISTING)
    with pytest.raises((ExportMismatch, IntegrityError, Exception)) as e:
        verify_export(bad, keys=[s.public])
    assert type(e.value).__name__ in ("ExportMismatch", "JournalIOError", "SchemaError")
    assert main(["verify", str(bad), "--pubkey", str(pub)]) in (1, 2)
    said = capsys.readouterr()
    assert "Traceback" not in said.out + said.err
    assert main(["query", str(bad), "--pubkey", str(pub), "SELECT 1"]) in (1, 2)
    said = capsys.readouterr()
    assert "Traceback" not in said.out + said.err and said.err.strip()
    first = said.err.strip().splitlines()[0]
    assert ("link" in first or "not a regular file" in first or "planted" in first or "not in the listing" in first)


def _rewrite(path: Path, table, receipt: dict, *, dictionary: bool = True) -> None:
    """A file written anew as the exporter writes one, its footer holding ``receipt`` (``dictionary=False``: no
    column stored with a dictionary, as the exporter writes an events file's lines)."""
    path.unlink()
    w = pq.ParquetWriter(path, table.schema, use_dictionary=dictionary)
    w.write_table(table)
    w.add_key_value_metadata({"trainledger_receipt": json.dumps(receipt, sort_keys=True, separators=(",", ":"))})
    w.close()


# -- Medium ---------------------------------------------------------------------------------------------------------


def test_a_footer_receipt_claiming_another_tree_is_refused(run4, tmp_path):
    d, out, s, _, pub = run4
    bad = _copy(out, tmp_path)
    rel = "steps/run-runX.r00000/rank-00000.parquet"
    rc = json.loads(pq.read_metadata(bad / rel).metadata[b"trainledger_receipt"])
    rc["tree_size"] = 3
    rc["tree_root"] = "00" * 32
    _rewrite(bad / rel, pq.read_table(bad / rel), rc)
    _relist(bad)
    with pytest.raises(ExportMismatch, match=f"{rel}: its footer's receipt is not the listed one"):
        verify_export(bad, keys=[s.public])


def test_verify_out_prints_the_trust_it_ran_under_not_the_receipts(run4, capsys):
    d, out, s, _, pub = run4
    assert main(["verify", str(out), "--trust-embedded"]) == 0
    printed = capsys.readouterr().out
    assert "re-verified from their lines (embedded)" in printed and "(pinned)" not in printed
    assert verify_export(out, trust_embedded=True).trust == "embedded"


#: Writes a bomb's events table (argv: path, run id, rows, "dictionary" or "plain") in a process of its own: the
#: parquet writer holds a row group's column uncompressed, twice over, whatever the input, and this test process
#: already holds torch; apart, the suite's peak stays that of its ordinary tests. The plain line column is 600
#: views of one 1 MiB buffer (nothing of 600 MiB is built in Python), written as plain strings (no Arrow schema).
_BOMB_WRITER = """
import struct, sys
import pyarrow as pa, pyarrow.parquet as pq
path, run_id, n, kind = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
L = 1 << 20
if kind == "dictionary":
    line = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array(["a" * L]))
else:
    line = pa.Array.from_buffers(pa.string_view(), n, [None, pa.py_buffer(struct.pack("<i4sii", L, b"aaaa", 0, 0) * n),
                                                         pa.py_buffer(b"a" * L)])
pq.write_table(pa.table({"run_id": [run_id] * n, "rank": pa.nulls(n, pa.int32()), "seq": pa.array(range(n), pa.int64()),
                         "kind": ["step_observed"] * n, "ts": pa.array([0] * n, pa.int64()), "h": ["0" * 64] * n,
                         "line": line}),
               path, compression="zstd", use_dictionary=kind == "dictionary", store_schema=False)
"""


def _bomb(export: Path, dest: Path, *, dictionary: bool, n: int = 600) -> Path:
    """The events file replaced by ``n`` rows of one 1 MiB line: a dictionary of one value (a 4 KiB file), or
    plain (zstd makes it about 30 KiB), the receipt's count made to match and the listing re-hashed."""
    shutil.copytree(export, dest)
    listing = json.loads((dest / LISTING).read_text())
    (rc,) = listing["journals"]
    p = dest / next(x["path"] for x in listing["files"] if x["path"].startswith("events/"))
    w = subprocess.run([sys.executable, "-c", _BOMB_WRITER, str(p), rc["run_id"], str(n),
                        "dictionary" if dictionary else "plain"], capture_output=True, text=True, timeout=300)
    assert w.returncode == 0, w.stderr[-3000:]
    assert pq.read_metadata(p).num_rows == n and pq.read_schema(p).field("line").type == pa.string()
    rc["events"] = n
    (dest / LISTING).write_text(json.dumps(listing))
    _relist(dest)
    return dest


@pytest.mark.parametrize("dictionary", [True, False], ids=["dictionary", "plain"])
def test_a_decompression_bomb_fails_at_once_within_bounded_memory_and_disk(tmp_path, dictionary):
    ex = tmp_path / "ex"
    pub = GOLDEN / "every_kind_v1_3.pub"
    assert main(["export", "parquet", str(GOLDEN / "every_kind_v1_3.jsonl"), str(ex), "--lines",
                 "--pubkey", str(pub)]) == 0
    bomb = _bomb(ex, tmp_path / "bomb", dictionary=dictionary)
    assert sum(f.stat().st_size for f in bomb.rglob("*") if f.is_file()) < 256_000  # (600 MiB once decoded)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # the peak from /proc (VmHWM starts anew at exec; ru_maxrss would count the forked test process's)
    code = ("import re, sys; from trainledger.cli import main; rc = main(sys.argv[1:]); "
            "print('peak', re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)); "
            "sys.exit(rc)")
    for cmd in (["verify", str(bomb), "--pubkey", str(pub)], ["query", str(bomb), "--pubkey", str(pub), "SELECT 1"]):
        p = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "TMPDIR": str(tmp)})
        assert p.returncode == 1, p.stdout + p.stderr
        said = p.stdout + p.stderr
        assert "Traceback" not in said
        assert ("dictionary" in said) if dictionary else ("more memory than a check may use" in said), said
        peak_kib = int(said.split("peak ")[1].split()[0])
        assert peak_kib < 600 * 1024, said  # the 600 MiB the lines decode to is never held
        assert not any(tmp.iterdir())  # and nothing left in the temp folder


def test_the_query_lockdown_keeps_the_working_folders_tmp_out(run4, tmp_path, monkeypatch, capsys):
    """DuckDB's temp folder is always readable and writable by SQL; its default is ./.tmp of the working folder,
    where a planted link leads anywhere."""
    d, out, s, _, pub = run4
    work = tmp_path / "work"
    work.mkdir()
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key.csv").write_text("a\nthe secret\n")
    os.symlink(secret, work / ".tmp")
    monkeypatch.chdir(work)
    for path in (str(out), str(d)):
        assert main(["query", path, "--pubkey", str(pub), "--no-cache", "SELECT * FROM read_csv('.tmp/key.csv')"]) \
            == 2, path
        said = capsys.readouterr()
        assert "the secret" not in said.out and "Permission" in said.err
        assert main(["query", path, "--pubkey", str(pub), "--no-cache",
                     "COPY (SELECT 1) TO '.tmp/written.csv'"]) == 2
        capsys.readouterr()
        assert not (secret / "written.csv").exists()
    con = connect_exports([out], keys=[s.public])
    assert con.execute("SELECT current_setting('temp_directory')").fetchone()[0].endswith("spill")


def test_a_typed_column_retyped_through_an_implicit_cast_is_refused(run4, tmp_path):
    d, out, s, _, pub = run4
    bad = _copy(out, tmp_path)
    rel = "steps/run-runX.r00000/rank-00000.parquet"
    t = pq.read_table(bad / rel)
    i = t.schema.get_field_index("step")
    t = t.set_column(i, pa.field("step", pa.float64()), t.column(i).cast(pa.float64()))
    _rewrite(bad / rel, t, json.loads(pq.read_metadata(bad / rel).metadata[b"trainledger_receipt"]))
    _relist(bad)
    with pytest.raises(ExportMismatch, match=rf"{rel}: column step is DOUBLE, the lines give step DECIMAL\(38,0\)"):
        verify_export(bad, keys=[s.public])


def test_verify_out_require_closed_fails_an_open_runs_export(tmp_path, signer, keypair, capsys):
    info = RankInfo(run="open", rank=0, world_size=1, local_rank=0, node="n", restart_count=0)
    j = open_rank_journal(tmp_path / "run", signer, info=info)
    j.append(StepObserved(step=0, loss=1.0))
    j.seal()  # never closed
    out = tmp_path / "out"
    export_parquet([tmp_path / "run"], out, lines=True, keys=[signer.public])
    assert main(["verify", str(out), "--pubkey", str(keypair[2])]) == 0
    capsys.readouterr()
    assert main(["verify", str(out), "--pubkey", str(keypair[2]), "--require-closed"]) == 1
    assert "closed" in capsys.readouterr().out


def test_a_killed_query_out_leaves_its_private_copy_for_the_next_to_sweep(run4, tmp_path):
    d, out, s, _, pub = run4
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    code = ("import os, sys; from trainledger.journal.views.parquet.read import connect_exports; "
            "from trainledger.journal import trusted_keys; "
            "connect_exports([sys.argv[1]], keys=trusted_keys([sys.argv[2]])); os._exit(9)")
    p = subprocess.run([sys.executable, "-c", code, str(out), str(pub)], env=env, timeout=120)
    assert p.returncode == 9
    left = [x.name for x in tmp.iterdir()]
    assert any(x.startswith("trainledger-query-out-") for x in left), left
    p = subprocess.run([sys.executable, "-m", "trainledger", "query", str(out), "--pubkey", str(pub),
                        "SELECT 1"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert not [x for x in tmp.iterdir() if x.name.startswith("trainledger-query-out-")]


def test_verify_out_holds_a_runs_journal_to_its_published_checkpoint_and_head(run4, tmp_path, capsys):
    d, out, s, early, pub = run4
    assert main(["tree-head", str(d / "rank-00002.jsonl"), "--pubkey", str(pub)]) == 0
    note = tmp_path / "rank2.note"
    note.write_text(capsys.readouterr().out)
    assert main(["verify", str(out), "--pubkey", str(pub), "--expect-checkpoint", str(note)]) == 0
    capsys.readouterr()
    other = tmp_path / "other.note"
    other.write_text(note.read_text().replace("runX.r00002", "runZ.r00002"))
    assert main(["verify", str(out), "--pubkey", str(pub), "--expect-checkpoint", str(other)]) == 1
    assert "FAIL" in capsys.readouterr().out
    # --expect-head: an export of one journal
    lone = tmp_path / "lone"
    export_parquet([d / "rank-00002.jsonl"], lone, lines=True, keys=[s.public])
    assert main(["head", str(d / "rank-00002.jsonl"), "--pubkey", str(pub)]) == 0
    head = capsys.readouterr().out.strip()
    assert main(["verify", str(lone), "--pubkey", str(pub), "--partial", "--expect-head", head]) == 0
    capsys.readouterr()
    seq, _, h = head.partition(":")
    assert main(["verify", str(lone), "--pubkey", str(pub), "--partial", "--expect-head",
                 f"{int(seq) + 50}:{h}"]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert main(["verify", str(out), "--pubkey", str(pub), "--expect-head", head]) == 2
    assert "names one journal's head" in capsys.readouterr().err


def _stream_of(export: Path, tmp_path: Path, **knobs: int) -> Any:
    """The export's (one journal's) events file as the check streams it, ``per``/``share`` set as given."""
    from trainledger.journal.views.parquet.check import _LineStream, _connection

    (ev,) = sorted((export / "events").rglob("*.parquet"))
    rows = pq.read_metadata(ev).num_rows
    con = _connection(tmp_path)
    stream = _LineStream(con, f"read_parquet('{ev}')", export, str(ev.relative_to(export)), rows=rows,
                         claimed=rows * 300)
    for k, v in knobs.items():
        setattr(stream, k, v)
    return stream, con


@pytest.mark.parametrize("knobs, again", [({}, 4), ({"per": 7, "share": 200}, 10**9), ({"per": 7, "share": 200}, 2)],
                         ids=["as built", "long lines read again", "many long lines: sized by the longest"])
def test_the_stream_hands_on_the_journals_own_bytes_in_whole_lines(tmp_path, monkeypatch, knobs, again):
    """What the check verifies is the journal's bytes exactly, whatever the batches: blocks of whole lines, each
    at the offset the bytes before it end, a line longer than a batch's share read again in its place (rows of at
    most 200 bytes a batch of 7 here, pieces of at most 1,000 bytes, blocks of about 512), or, past ``again``
    pieces read again, the rest read in batches sized by the longest line, from the row where it stopped."""
    from trainledger.journal import scan
    from trainledger.journal.views.parquet import check

    src = GOLDEN / "every_kind_v1_3.jsonl"
    ex = tmp_path / "ex"
    assert main(["export", "parquet", str(src), str(ex), "--lines", "--pubkey",
                 str(GOLDEN / "every_kind_v1_3.pub")]) == 0
    monkeypatch.setattr(scan, "BLOCK", 512)
    monkeypatch.setattr(check, "AGAIN", again)
    if knobs:
        monkeypatch.setattr(check, "BATCH_BYTES", 1000)
    stream, con = _stream_of(ex, tmp_path, **knobs)
    try:
        head = stream.prefix(1)
        got, at = [], 0
        for block, off in stream.blocks():
            assert off == at and block.endswith(b"\n")
            got.append(block)
            at += len(block)
    finally:
        con.close()
    data = src.read_bytes()
    assert b"".join(got) == data and data.startswith(head) and stream.offset == len(data)
    assert len(got) > 10 and stream.want == data.count(b"\n")
    if knobs:
        assert max(map(len, data.split(b"\n"))) > 200  # some were long
        assert stream.sized == (again == 2) and stream.again == min(again, stream.again) > 0


@pytest.mark.parametrize("accel", [True, False], ids=["C", "hashlib"])
def test_a_streamed_export_verifies_with_and_without_the_block_scanner(tmp_path, monkeypatch, accel):
    from trainledger.journal import scan

    if accel and scan._scan_block is None:
        pytest.skip("the C accelerator is not built here")
    if not accel:
        monkeypatch.setattr(scan, "_scan_block", None)
    ex = tmp_path / "ex"
    pub = GOLDEN / "every_kind_v1_3.pub"
    assert main(["export", "parquet", str(GOLDEN / "every_kind_v1_3.jsonl"), str(ex), "--lines", "--pubkey",
                 str(pub)]) == 0
    from trainledger.journal.keys import load_public_key
    from trainledger.journal.verify import verify

    rep = verify(GOLDEN / "every_kind_v1_3.jsonl", keys=[load_public_key(pub)])
    got = verify_export(ex, keys=[load_public_key(pub)])
    assert got.events == rep.events and got.receipts[0]["head"] == f"{rep.last_seq}:{rep.last_hash}"


def test_a_certified_journals_certificates_come_from_its_exported_lines(tmp_path):
    """A journal whose keys a run key certifies: the stream finds the certificates a byte search of the journal
    finds, and the export verifies under the run key."""
    from trainledger.journal.certify import find_certificates
    from trainledger.journal.keys import load_public_key

    src, pub = GOLDEN / "rank_keys_v1_7.jsonl", GOLDEN / "rank_keys_v1_7.pub"
    ex = tmp_path / "ex"
    assert main(["export", "parquet", str(src), str(ex), "--lines", "--pubkey", str(pub)]) == 0
    stream, con = _stream_of(ex, tmp_path)
    try:
        mine = stream.certificates()
    finally:
        con.close()
    theirs = find_certificates(src, src.stat().st_size)
    assert len(theirs) == 2 and [c.seq for c in mine] == [c.seq for c in theirs] and mine == theirs
    assert verify_export(ex, keys=[load_public_key(pub)], partial=True).events == 59


def test_a_certificate_line_too_long_is_refused_without_reading_it(tmp_path):
    """A line that opens as a key_certified does but runs past a certificate's 64 KiB: refused at its seq, as the
    byte search refuses it in a file, from its length (the line itself never handed over)."""
    src, pub = GOLDEN / "rank_keys_v1_7.jsonl", GOLDEN / "rank_keys_v1_7.pub"
    ex = tmp_path / "ex"
    assert main(["export", "parquet", str(src), str(ex), "--lines", "--pubkey", str(pub)]) == 0
    (rel,) = [p.relative_to(ex) for p in (ex / "events").rglob("*.parquet")]
    t = pq.read_table(ex / rel)
    lines = t.column("line").to_pylist()
    # its cells and its ending kept, as a forger would, so that only its length is wrong
    lines[5] = '{"kind":"key_certified",' + "a" * 70_000 + lines[5][lines[5].rfind(',"seq":'):]
    kinds = t.column("kind").to_pylist()
    kinds[5] = "key_certified"
    for name, col in (("line", lines), ("kind", kinds)):
        t = t.set_column(t.schema.get_field_index(name), t.schema.field(name), pa.array(col, t.schema.field(name).type))
    _rewrite(ex / rel, t, json.loads(pq.read_metadata(ex / rel).metadata[b"trainledger_receipt"]), dictionary=False)
    _relist(ex)
    from trainledger.journal.keys import load_public_key

    with pytest.raises(IntegrityError, match="key_certified line at seq 5 is over 65,536 bytes") as e:
        verify_export(ex, keys=[load_public_key(pub)], partial=True)
    assert e.value.seq == 5


@pytest.mark.parametrize("how", ["shuffled", "no line", "a seq twice"])
def test_events_rows_out_of_seq_order_or_without_a_line_are_refused_at_that_seq(run4, tmp_path, how):
    """Seqs from 0 to n - 1 and n rows, so the whole-file counts hold; but the rows are not in seq order (or one has
    no line, or one seq comes twice, another never): refused naming the first row that is not the next one, before
    its lines reach the verifier."""
    import pyarrow as pa

    d, out, s, _, pub = run4
    bad = _copy(out, tmp_path)
    rel = "events/run-runX.r00000/rank-00000.parquet"
    rc = json.loads(pq.read_metadata(bad / rel).metadata[b"trainledger_receipt"])
    t = pq.read_table(bad / rel)
    if how == "shuffled":
        order = list(range(t.num_rows))
        order[7], order[8] = order[8], order[7]
        t = t.take(pa.array(order))
    elif how == "a seq twice":
        order = list(range(t.num_rows))
        order[7] = 6  # row 6 again where row 7 was: the count, min and max of the seqs unchanged
        t = t.take(pa.array(order))
    else:
        i = t.schema.get_field_index("line")
        lines = t.column("line").to_pylist()
        lines[7] = None
        t = t.set_column(i, t.schema.field("line"), pa.array(lines, t.schema.field("line").type))
    _rewrite(bad / rel, t, rc, dictionary=False)
    _relist(bad)
    with pytest.raises(ExportMismatch, match=f"{rel}: the row at seq 7 is out of order or has no line"):
        verify_export(bad, keys=[s.public])


def test_an_events_line_longer_than_a_journals_line_is_refused_at_its_seq(run4, tmp_path, monkeypatch):
    """A line longer than a journal's line may be (the limit lowered here to just above the export's longest) is
    refused before any line is written out, naming its seq; the seqs' own check and the length's are one pass
    over the file, the longest line's seq looked up only then."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from trainledger.journal import scan

    d, out, s, _, pub = run4
    bad = _copy(out, tmp_path)
    rel = "events/run-runX.r00000/rank-00000.parquet"
    t = pq.read_table(bad / rel)
    lines = t.column("line").to_pylist()
    longest = max(map(len, lines))
    monkeypatch.setattr(scan, "MAX_LINE", longest + 10)
    assert verify_export(out, keys=[s.public]).events  # within the lowered limit
    lines[5] = "x" * (longest + 20)
    t = t.set_column(t.schema.get_field_index("line"), t.schema.field("line"), pa.array(lines, pa.string()))
    _rewrite(bad / rel, t, json.loads(pq.read_metadata(bad / rel).metadata[b"trainledger_receipt"]), dictionary=False)
    _relist(bad)
    with pytest.raises(ExportMismatch, match=f"{rel}: the line at seq 5 is {longest + 20:,} bytes, longer than"):
        verify_export(bad, keys=[s.public])
