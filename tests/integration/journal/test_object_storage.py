"""Run folders and exports in object storage, against a real S3-compatible server started here (moto's server
mode, on 127.0.0.1; no network): a run folder verified and exported from ``s3://``, the export written to
``s3://``, verified and queried there, a changed object named, nothing left in the temporary folder."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")
moto_server = pytest.importorskip("moto.server")

from trainledger.cli import main  # noqa: E402
from trainledger.journal import Signer, StepObserved  # noqa: E402
from trainledger.journal.errors import UnsafePath  # noqa: E402
from trainledger.journal.backends.storage import _safe_parts  # noqa: E402
from trainledger.training.distributed.ranks import RankInfo, open_rank_journal  # noqa: E402


@pytest.fixture(scope="module")
def s3():
    """A moto S3 server on a free local port, the environment pointing at it, and a bucket."""
    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    with pytest.MonkeyPatch.context() as mp:
        for k, v in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
                     "AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_EC2_METADATA_DISABLED": "true"}.items():
            mp.setenv(k, v)
        import boto3

        client = boto3.client("s3")
        client.create_bucket(Bucket="runs")
        yield client
    srv.stop()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    d = tmp_path_factory.mktemp("s3run")
    s = Signer.generate()
    for r in range(2):
        j = open_rank_journal(d / "run", s, info=RankInfo(run="r1", rank=r, world_size=2, local_rank=0, node="n",
                                                          restart_count=0))
        for i in range(30):
            j.append(StepObserved(step=i, loss=3.0 - i / 20, grad_norm=0.5, tokens=512))
        j.close()
    pub = d / "r1.pub"
    pub.write_text(s.public.line() + "\n")
    return d / "run", str(pub)


def _upload(client, folder: Path, prefix: str) -> None:
    for p in sorted(folder.iterdir()):
        client.put_object(Bucket="runs", Key=f"{prefix}/{p.name}", Body=p.read_bytes())


def _leftovers() -> set[str]:
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith(("trainledger-fetch-", "trainledger-out-"))}


def test_a_run_folder_verified_exported_and_queried_in_s3(s3, run, capsys):
    folder, pub = run
    _upload(s3, folder, "a/run")
    before = _leftovers()
    assert main(["verify", "s3://runs/a/run", "--pubkey", pub]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK    s3://runs/a/run: 2 of 2 ranks verified") and tempfile.gettempdir() not in out
    assert main(["export", "parquet", "s3://runs/a/run", "s3://runs/a/export", "--lines", "--pubkey", pub]) == 0
    assert "to s3://runs/a/export:" in capsys.readouterr().out
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="runs", Prefix="a/export/")["Contents"]]
    assert "a/export/receipts.json" in keys and "a/export/steps/run-r1.r00001/rank-00001.parquet" in keys
    assert main(["verify", "s3://runs/a/export", "--pubkey", pub]) == 0
    assert capsys.readouterr().out.startswith("OK    s3://runs/a/export: 2 journal(s), 72 events re-verified")
    assert main(["query", "s3://runs/a/export", "--pubkey", pub, "--format", "csv",
                 "SELECT rank, count(*) AS n FROM steps GROUP BY rank ORDER BY rank"]) == 0
    assert capsys.readouterr().out.splitlines() == ["rank,n", "0,30", "1,30"]
    # an export writes a new prefix: an existing one is refused before anything is read
    assert main(["export", "parquet", str(folder), "s3://runs/a/export", "--pubkey", pub]) == 2
    assert "s3://runs/a/export: exists" in capsys.readouterr().err
    assert _leftovers() == before


def test_a_changed_object_and_a_missing_prefix_are_named(s3, run, capsys):
    folder, pub = run
    _upload(s3, folder, "b/run")
    body = (folder / "rank-00001.jsonl").read_bytes().replace(b'"step":7,', b'"step":8,', 1)
    s3.put_object(Bucket="runs", Key="b/run/rank-00001.jsonl", Body=body)
    assert main(["verify", "s3://runs/b/run", "--pubkey", pub]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL s3://runs/b/run: ") and "rank 1: chain broken" in out
    assert main(["verify", "s3://runs/nothing/here", "--pubkey", pub]) == 2
    assert "s3://runs/nothing/here: no such object" in capsys.readouterr().err
    assert main(["watch", "s3://runs/b/run"]) == 2
    assert "watch reads local files" in capsys.readouterr().err


def test_file_urls_read_the_same_way(run, capsys):
    folder, pub = run
    assert main(["verify", folder.as_uri(), "--pubkey", pub]) == 0
    assert capsys.readouterr().out.startswith(f"OK    {folder.as_uri()}: 2 of 2 ranks verified")
    assert main(["verify", (folder / "rank-00000.jsonl").as_uri(), "--pubkey", pub]) == 0


@pytest.mark.parametrize("key", ["a/../b", "a//b", "./a", "a\\b", ""])
def test_an_object_key_that_is_not_a_plain_path_is_refused(key):
    with pytest.raises(UnsafePath, match="not a plain path"):
        _safe_parts(key, "s3://x/y")


def test_copies_left_by_a_killed_command_are_removed_by_the_next(run, capsys):
    import subprocess
    import sys

    folder, pub = run
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = Path(tempfile.gettempdir()) / f"trainledger-fetch-{dead.stdout.strip()}-x"
    stale.mkdir()
    (stale / "rank-00000.jsonl").write_bytes(b"left behind")
    assert main(["verify", folder.as_uri(), "--pubkey", pub]) == 0
    assert not stale.exists()


def test_an_upload_that_fails_midway_leaves_nothing_behind(s3, tmp_path, run, capsys):
    """publish() over a real server, failing after some objects are up: a local file whose read fails with EIO (a
    link to /proc/self/mem, read from its start) between the data files and the listing. Every object uploaded is
    removed, the error names the URL, and verify finds nothing at the prefix (nothing to take for an export)."""
    from trainledger.journal.errors import JournalIOError
    from trainledger.journal.backends.storage import publish

    folder, pub = run
    assert main(["export", "parquet", str(folder), str(tmp_path / "ex"), "--lines", "--pubkey", pub]) == 0
    capsys.readouterr()
    (tmp_path / "ex" / "zz-unreadable.parquet").symlink_to("/proc/self/mem")
    with pytest.raises(JournalIOError, match=r"s3://runs/failed/ex: cannot be written: .*nothing uploaded was left"):
        publish(tmp_path / "ex", "s3://runs/failed/ex", last="receipts.json")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="runs", Prefix="failed/").get("Contents", [])]
    assert all(k.endswith("/") for k in keys), keys  # no object left; pyarrow's empty folder markers are no files
    assert main(["verify", "s3://runs/failed/ex", "--pubkey", pub]) == 2
    assert "no such object, and no objects below it" in capsys.readouterr().err


def test_errors_name_the_url_never_the_private_copy(s3, run, capsys):
    """Each way an object read from s3:// fails is named by its URL: the private folder it was copied into is the
    command's own business (and gone when it ends)."""
    folder, pub = run
    _upload(s3, folder, "e/run")
    assert main(["export", "parquet", "s3://runs/e/run", "s3://runs/e/ex", "--lines", "--pubkey", pub]) == 0
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket="runs", Prefix="e/ex/")["Contents"]]
    steps = next(k for k in keys if k.endswith(".parquet") and "/steps/" in k)
    body = s3.get_object(Bucket="runs", Key=steps)["Body"].read()
    s3.put_object(Bucket="runs", Key=steps, Body=body[:-8] + b"01234567")
    one = s3.get_object(Bucket="runs", Key="e/run/rank-00001.jsonl")["Body"].read()
    s3.put_object(Bucket="runs", Key="e/one/journal.jsonl", Body=one[: len(one) // 2])
    capsys.readouterr()
    for argv in (["verify", "s3://runs/e/ex"], ["query", "s3://runs/e/ex", "SELECT count(*) FROM steps"],
                 ["verify", "s3://runs/e/one/journal.jsonl"], ["replay", "s3://runs/e/one/journal.jsonl"]):
        code = main([*argv, "--pubkey", pub])
        out, err = capsys.readouterr()
        assert code in (1, 2) and argv[1] in out + err, (argv, out, err)
        assert tempfile.gettempdir() + "/" not in out + err and "Traceback" not in out + err, (argv, out, err)
