"""Trust round 3, ``trainledger serve``: someone who can write the run folder while it is served (no key) edits a
line already shown, swaps a journal for a FIFO, rolls a rank back before another's anchor while it is still open,
asks for series past any step; and the operator stops it with SIGTERM or Ctrl-C mid-replay, or mistypes a path.
The page must say FAIL (never keep showing what no longer holds), never hang, never answer 500, and leave nothing
behind. Real journals, a real uvicorn, real signals."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from test_serve import serving  # noqa: E402  (tests/integration/training/test_serve.py)

from trainledger.journal import Journal, Signer, StepObserved, TrustPolicy  # noqa: E402
from trainledger.journal.errors import IntegrityError  # noqa: E402
from trainledger.serve.board import open_board  # noqa: E402
from trainledger.training.distributed.ranks import RankInfo, anchor_record, open_rank_journal  # noqa: E402
from tests.helpers.signals import with_sigint  # noqa: E402


def _journal(path: Path, s: Signer, n: int = 30, close: bool = True) -> Path:
    j = Journal.create(path, signer=s, run_id="served", seal_every=10)
    for i in range(n):
        j.append(StepObserved(step=i, loss=2.0 - i / 100))
    if close:
        j.close()
    else:
        j.seal()
    return path


def _get(url: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_series_asked_for_past_any_step_with_64_bit_extremes_is_answered(tmp_path):
    s = Signer.generate()
    p = _journal(tmp_path / "j.jsonl", s)
    with serving(p, [s.public]) as url:
        code, body = _get(f"{url}api/series?metric=loss&lo={-(1 << 63)}&hi={(1 << 63) - 1}")
        assert code == 200 and sum(len(x["x"]) for x in body["series"]) == 30
        code, body = _get(f"{url}api/series?metric=loss&lo={1 << 63}")
        assert code == 400 and "64-bit" in body["error"]
        code, body = _get(f"{url}api/series?metric=loss&lo=100&hi=50")
        assert code == 200 and body["series"] == []
        # the overlay route: bad runs, axes, bounds and too many runs are one-line 400s, never a traceback
        code, body = _get(f"{url}api/curves?metric=loss&lo={-(1 << 63)}&hi={(1 << 63) - 1}")
        assert code == 200 and sum(len(x["x"]) for x in body["runs"][0]["series"]) == 30
        for q, said in (("run=nope", "no such run"), ("x=bogus", "no such x axis"), ("x=time&lo=nan", "finite"),
                        ("metric=__import__", "no such curve"), ("&".join(["run=x"] * 300), "at most")):
            code, body = _get(f"{url}api/curves?{q}")
            assert code == 400 and said in body["error"] and "\n" not in body["error"], (q, body)


def test_a_line_edited_in_place_after_it_was_shown_turns_the_page_to_fail(tmp_path):
    s = Signer.generate()
    p = _journal(tmp_path / "j.jsonl", s)
    b = open_board(p, TrustPolicy(keys=[s.public]))
    try:
        data = p.read_bytes()
        i = data.index(b'"loss":1.95')
        seq = data[:i].count(b"\n")
        assert b.fail is None and b.event(None, seq)["seq"] == seq
        p.write_bytes(data[:i] + b'"loss":1.05' + data[i + 11:])  # same length: nothing looks cut or grown
        with pytest.raises(IntegrityError, match="not the one verified"):
            b.event(None, seq)
        assert b.fail is not None and f"seq {seq}" in b.fail
        assert b.state()["fail"] == b.fail and b.series("loss", 100)["series"] == []
    finally:
        b.close()


def test_a_journal_swapped_for_a_fifo_while_served_fails_and_never_hangs(tmp_path):
    s = Signer.generate()
    p = _journal(tmp_path / "j.jsonl", s, close=False)
    with serving(p, [s.public]) as url:
        assert _get(f"{url}api/state")[0] == 200
        p.unlink()
        os.mkfifo(p)
        t0 = time.monotonic()
        while True:
            code, st = _get(f"{url}api/state")
            assert code == 200 and time.monotonic() - t0 < 60  # a bound for a hang
            if st.get("fail"):
                break
            time.sleep(0.1)
        assert "not a regular file" in st["fail"]
        assert _get(f"{url}api/event?seq=3")[0] in (400, 409)


def test_a_rank_rolled_back_before_rank_0s_anchor_fails_the_page_while_it_is_still_open(tmp_path, signer):
    d = tmp_path / "run"
    js = [open_rank_journal(d, signer, info=RankInfo(run="live", rank=r, world_size=2, local_rank=0, node="n",
                                                     restart_count=0)) for r in range(2)]
    early = tmp_path / "early.jsonl"
    for k in range(2):
        for j in js:
            for i in range(5):
                j.append(StepObserved(step=5 * k + i, loss=1.0))
            j.seal()
        if k == 0:
            shutil.copy(d / "rank-00001.jsonl", early)
        heads = [("%d:%s" % j.head, j.key_id) for j in js]
        for r, j in enumerate(js):
            j.append(anchor_record(r, heads, step=5 * k + 4))
        for j in js:
            j.seal()
    for j in js:
        j.close()
    # rank 1 put back as it was after the first round: open, short of rank 0's second anchor
    shutil.copy(early, d / "rank-00001.jsonl")
    b = open_board(d, TrustPolicy(keys=[signer.public]))
    try:  # the anchored line was on disk before rank 0's anchor: once rank 1 is read whole again, it is short
        b.poll()
        assert b.fail is not None and not b.journals[1].closed and "truncated or rolled back" in b.fail, b.fail
    finally:
        b.close()
    # and grown again from there (an older attempt of that rank, its own lines sound): read past the anchor
    j1 = Journal.open_append(d / "rank-00001.jsonl", signer=signer, background=False)
    for i in range(20):
        j1.append(StepObserved(step=100 + i, loss=1.0))
    j1.seal()
    b = open_board(d, TrustPolicy(keys=[signer.public]))
    try:
        b.poll()
        assert b.fail is not None and "not the line rank 0 anchored" in b.fail, b.fail
    finally:
        b.close()
        j1.suspend()


def _serve(path: Path, pub: Path, tmp: Path, sigint: str = "SIG_DFL") -> subprocess.Popen:
    """``trainledger serve PATH``, SIGINT as from a terminal (or ``sigint="SIG_IGN"``: as under nohup)."""
    return subprocess.Popen(with_sigint(sigint, [sys.executable, "-m", "trainledger", "serve", str(path), "--pubkey",
                                                 str(pub), "--port", "0"]),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "TMPDIR": str(tmp)})


def _url(proc: subprocess.Popen) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if "http://" in line:
            return line[line.index("http://"):].split()[0]
        assert line or proc.poll() is None, "serve ended before it listened"
    raise AssertionError("serve never printed its URL")


def test_serve_stopped_by_sigterm_or_a_usage_error_leaves_nothing_in_the_temp_folder(tmp_path, keypair):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    two = tmp_path / "two"
    two.mkdir()
    (two / "a.jsonl").write_text("{}\n")
    (two / "b.jsonl").write_text("{}\n")
    p = subprocess.run([sys.executable, "-m", "trainledger", "serve", str(two), "--pubkey", str(keypair[2])],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "TMPDIR": str(tmp)})
    assert p.returncode == 2 and "a folder of 2 journals (a.jsonl, b.jsonl): name the one to read" in p.stderr
    assert not list(tmp.iterdir())
    proc = _serve(_journal(tmp_path / "j.jsonl", keypair[0]), keypair[2], tmp)
    try:
        _url(proc)
        assert [x for x in tmp.iterdir() if x.name.startswith("trainledger-serve-")]
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        proc.kill()
        proc.wait(30)
        proc.stdout.close()
    assert not [x for x in tmp.iterdir() if x.name.startswith("trainledger-serve-")]


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(d.name))
    return out


def test_serve_stopped_with_ctrl_c_during_replay_leaves_no_process_behind(tmp_path, keypair):
    j = Journal.create(tmp_path / "long.jsonl", signer=keypair[0], run_id="long")
    for i in range(150_000):  # a replay of a few seconds
        j.append(StepObserved(step=i, loss=2.0, grad_norm=0.5))
    j.close()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _serve(tmp_path / "long.jsonl", keypair[2], tmp)
    kids: set[int] = set()
    try:
        url = _url(proc)
        deadline = time.monotonic() + 60
        last: dict = {}
        while True:
            assert time.monotonic() < deadline, f"replay never started: {str(last)[:2000]}"
            kids |= set(_children(proc.pid))
            last = _get(f"{url}api/state")[1]
            last = {k: last.get(k) for k in ("replay", "server_error", "fail", "journals")}
            if last.get("replay", {}).get("state") == "running":
                # the state says running a moment before the worker process exists (a forkserver to start, under
                # load a slow one): watch for it without the round trips, for as long as the replay runs
                while not kids and time.monotonic() < deadline:
                    kids |= set(_children(proc.pid))
                    kids |= {k for c in list(kids) for k in _children(c)}
                    time.sleep(0.01)
                if kids:
                    break
            time.sleep(0.05)
        assert kids
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    finally:
        proc.kill()
        proc.wait(30)
        proc.stdout.close()
    time.sleep(1)
    alive = [k for k in kids if Path(f"/proc/{k}").exists() and "Z" not in (Path(f"/proc/{k}/stat").read_text()
                                                                          .rsplit(")", 1)[1].split()[0])]
    assert not alive, alive
    assert not [x for x in tmp.iterdir() if x.name.startswith("trainledger-serve-")]


def test_a_folder_of_runs_finds_run_folders_only_and_follows_no_link(tmp_path):
    """find_runs: run folders below a root (a one-journal folder, a rank folder) by their relative names; a loose
    journal beside them, a link to a run elsewhere and anything deeper than four levels are not runs."""
    from trainledger.serve.fleet import find_runs

    root = tmp_path / "runs"
    (root / "a").mkdir(parents=True)
    (root / "a" / "journal.jsonl").write_text("{}\n")
    (root / "group" / "b").mkdir(parents=True)
    (root / "group" / "b" / "rank-00000.jsonl").write_text("{}\n")
    (root / "loose.jsonl").write_text("{}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "journal.jsonl").write_text("{}\n")
    (root / "link").symlink_to(elsewhere)
    deep = root / "1" / "2" / "3" / "4" / "5"
    deep.mkdir(parents=True)
    (deep / "journal.jsonl").write_text("{}\n")
    assert find_runs([root]) == {"a": root / "a", "group/b": root / "group" / "b"}
    assert find_runs([root / "a"]) == {str(root / "a"): root / "a"}  # a root that is a run keeps its name


def test_serve_started_with_ctrl_c_ignored_keeps_serving_through_it(tmp_path, keypair):
    """Started under nohup (or ``serve &`` in a script), serve ignores SIGINT as the command does (uvicorn installs
    its own handler while it serves): the page still answers, and SIGTERM, not the Ctrl-C, ends it."""
    p = _journal(tmp_path / "j.jsonl", keypair[0])
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = _serve(p, keypair[2], tmp, sigint="SIG_IGN")
    try:
        url = _url(proc)
        proc.send_signal(signal.SIGINT)
        for _ in range(3):  # the loop that serves these also runs any handler the signal reached
            assert _get(f"{url}api/state")[0] == 200
            time.sleep(0.2)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
        proc.wait(30)
        proc.stdout.close()
    assert proc.returncode == 128 + signal.SIGTERM and "interrupted" not in out, (proc.returncode, out)
