"""``trainledger serve``: the live dashboard, in headless Chromium through Playwright, against a real uvicorn.

The page draws the curves (counted in the chart's own data), a step sealed by a writer in another process appears
within 2 s, an unsigned tail is drawn apart and labelled, a changed byte leaves one FAIL banner and no curve, a run
folder shows every rank with the slow one outlined, a downloaded proof verifies, hostile strings stay text, and the
server answers only its loopback name (or the token). Waiting is done by polling ``page.evaluate`` (the page's
Content-Security-Policy forbids the string evaluation ``wait_for_function`` uses)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("pyarrow")

from trainledger.cli import main  # noqa: E402
from trainledger.journal import Journal, Signer, StepObserved, TrustPolicy  # noqa: E402
from trainledger.training.kinds import DeviceChanged, DeviceSampled, StragglerDetected
from trainledger.ladder.kinds import GateVerdict  # noqa: E402
from trainledger.training.distributed.ranks import RankInfo, open_rank_journal  # noqa: E402
from tests.helpers.even_clock import even_clock  # noqa: E402

GOLDEN = Path(__file__).resolve().parents[2] / "assets" / "golden"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


@contextlib.contextmanager
def _uvicorn(board, token: str | None = None):
    """A real uvicorn serving ``board`` (a Board or a Fleet) on a free loopback port, in a thread; yields the page's
    URL, and closes the board after."""
    import uvicorn

    from trainledger.serve.app import make_app

    server = uvicorn.Server(uvicorn.Config(make_app(board, token=token), host="127.0.0.1", port=0, log_level="error",
                                           lifespan="on"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/" + (f"?token={token}" if token else "")
    finally:
        server.should_exit = True
        t.join(10)
        board.close()


@contextlib.contextmanager
def serving(path: Path, keys, *, token: str | None = None):
    """The board of ``path``, served (:func:`_uvicorn`)."""
    from trainledger.serve.board import open_board

    with _uvicorn(open_board(path, TrustPolicy(keys=list(keys))), token) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.skip("chromium is not installed: bash tools/setup.sh --browser installs Debian's package")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


class Page:
    """A page of the dashboard, its console errors and every URL it asked for."""

    def __init__(self, browser, url: str, **ctx):
        self.context = browser.new_context(**{"viewport": {"width": 1300, "height": 1000}, **ctx})
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.goto(url)

    def js(self, expr: str):
        return self.page.evaluate(f"() => {expr}")

    def settled(self) -> None:
        """Wait until a closed run's replay has ended and the page has drawn it (not busy): a click on a listed
        event then lands on a button that no redraw replaces under it (the replay's end redraws the list)."""
        self.until("(() => { const t = window.__trainledger, s = t.state; if (!s || t.busy || !s.journals) "
                   "return false; const r = (s.replay || {}).state; return r !== 'running' && "
                   "(r !== 'waiting' || !s.journals.every(j => j.closed)); })()")

    def until(self, expr: str, timeout: float = 120.0) -> float:
        """Seconds until ``expr`` is true in the page. The bound only catches a page that never gets there: a
        loaded machine may take long, and a test here never fails for being slow (tools/bench_serve.py measures
        how fast the page follows)."""
        t0 = time.monotonic()
        while not self.js(expr):
            assert time.monotonic() - t0 < timeout, f"never true: {expr}"
            time.sleep(0.02)
        return time.monotonic() - t0

    def close(self):
        self.context.close()


def test_the_page_draws_a_ladder_journal_from_the_command(browser, tmp_path):
    """The command itself (a subprocess, port 0): the URL it prints, the curves of every rung, the verdicts."""
    proc = subprocess.Popen([sys.executable, "-m", "trainledger", "serve", str(GOLDEN / "scaling_ladder_v1_2.jsonl"),
                             "--pubkey", str(GOLDEN / "scaling_ladder_v1_2.pub"), "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving ") and " at http://127.0.0.1:" in line, line
        url = line.split(" at ", 1)[1].split()[0]
        p = Page(browser, url)
        p.until("window.__trainledger.drawn > 0")
        data = p.js("window.__trainledger.data")
        assert data["loss"]["series"] == 7 and data["loss"]["points"] > 2000 and data["loss"]["unsigned"] == 0
        assert data["grad_norm"]["points"] > 2000 and data["mfu"]["points"] > 1000
        assert p.js("document.querySelectorAll('#listed tr').length") > 20  # verdicts, decisions, the fit
        assert "GO: final loss" in p.js("document.getElementById('listed').textContent")
        # the scaling fit: six rungs, the size it chose, and the warning its E of 0 earns
        assert {k: data["fit"][k] for k in ("points", "chosen", "warnings")} == {"points": 6, "chosen": True,
                                                                                  "warnings": 1}
        assert "chosen d16" in p.js("document.getElementById('fit-legend').textContent")
        warned = p.js("document.getElementById('fit-warnings').textContent")
        assert warned.startswith("FIT WARNING: E = 0 is under 5% of the lowest loss measured (2.701)"), warned
        assert p.js("document.getElementById('fail').hidden") is True
        shot = p.page.screenshot(full_page=True)
        (tmp_path / "ladder.png").write_bytes(shot)
        assert p.errors == []
        assert [u for u in p.requests if not u.startswith(url.split("?")[0])] == []  # nothing from outside
        p.close()
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()
        _end_group(proc.pid)


def _end_group(pgid: int) -> None:
    """End what the command started beside itself (its verifier pool's forkserver, the resource tracker), which
    outlived it by seconds or for good: the test leaves no process behind."""
    import signal

    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_WRITER = textwrap.dedent("""
    import os, sys
    from trainledger.journal import Journal, StepObserved, load_signer
    path, key, phase, start = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    j = Journal.open_append(path, signer=load_signer(key), seal_every=10_000, seal_interval_s=3600,
                            flush_interval_s=0.01, background=False)
    for i in range(start, start + 5):
        j.append(StepObserved(step=i, loss=1.0 + 1.0 / (i + 1), grad_norm=0.4, step_time_s=0.1, tokens=256))
    if phase == "seal":
        j.seal(durable=True)
        j.suspend()
    else:
        j.flush()
        os._exit(0)  # a writer killed before its next seal: the lines are there, unsigned
""")


def test_a_step_sealed_by_another_process_appears_within_two_seconds_and_an_unsigned_tail_is_labelled(
        browser, tmp_path):
    from trainledger.journal import keygen

    priv, pub = keygen(tmp_path / "keys")
    from trainledger.journal import load_public_key, load_signer

    path = tmp_path / "live.jsonl"
    j = Journal.create(path, signer=load_signer(priv), seal_every=10_000, background=False)
    for i in range(20):
        j.append(StepObserved(step=i, loss=2.0 - i / 100, grad_norm=0.5, step_time_s=0.1, tokens=256))
    j.seal(durable=True)
    j.suspend()
    writer = tmp_path / "writer.py"
    writer.write_text(_WRITER)
    with serving(path, [load_public_key(pub)]) as url:
        p = Page(browser, url)
        p.until("window.__trainledger.drawn > 0")
        assert p.js("window.__trainledger.data.loss.points") == 20
        subprocess.run([sys.executable, str(writer), str(path), str(priv), "seal", "20"], check=True, timeout=60)
        p.until("window.__trainledger.data.loss.points === 25")  # how soon: tools/bench_serve.py measures it
        assert p.js("window.__trainledger.appended") >= 5  # each chart given the 5 new points, not fetched whole
        subprocess.run([sys.executable, str(writer), str(path), str(priv), "flush", "25"], check=True, timeout=60)
        p.until("window.__trainledger.data.loss.unsigned === 5")
        assert p.js("window.__trainledger.data.loss.points") == 30  # 25 signed, 5 drawn apart
        status = p.js("document.getElementById('status').textContent")
        assert "5 events not signed yet" in status
        assert "not signed yet" in p.js("document.getElementById('journals').textContent")
        assert p.errors == []
        p.close()


def test_a_changed_byte_shows_one_fail_banner_and_no_curve(browser, tmp_path):
    bad = tmp_path / "bad.jsonl"
    lines = (GOLDEN / "scaling_ladder_v1_2.jsonl").read_bytes().splitlines(keepends=True)
    lines[40] = lines[40].replace(b'"step":', b'"step":1', 1)
    bad.write_bytes(b"".join(lines))
    from trainledger.journal import load_public_key

    with serving(bad, [load_public_key(GOLDEN / "scaling_ladder_v1_2.pub")]) as url:
        p = Page(browser, url)
        p.until("window.__trainledger.drawn > 0")
        fail = p.js("document.getElementById('fail').textContent")
        assert fail.startswith("FAIL") and "seq 40" in fail
        assert p.js("document.getElementById('fail').hidden") is False
        assert p.js("document.getElementById('board').hidden") is True
        assert p.js("document.querySelectorAll('canvas.u-canvas, .uplot').length") == 0
        assert p.js("Object.keys(window.__trainledger.data).length") == 0
        p.close()


def _run_folder(d: Path, s: Signer) -> Path:
    with even_clock():  # the device readings drawn over time fall in pixels of their own whatever the load
        return _write_run_folder(d, s)


def _write_run_folder(d: Path, s: Signer) -> Path:
    js = [open_rank_journal(d, s, info=RankInfo(run="srv", rank=r, world_size=2, local_rank=0, node=f"n{r}",
                                                restart_count=0)) for r in range(2)]
    for i in range(40):
        for r, j in enumerate(js):
            j.append(StepObserved(step=i, loss=2.0 - i / 100 + r / 50, grad_norm=0.5, step_time_s=0.1 * (1 + 2 * r),
                                  tokens=512))
    js[0].append(StragglerDetected(rank=1, score=1 / 3, window_start=0, window_end=39, node="n1"))
    from trainledger.training.kinds import StateDiverged, StateFingerprinted

    for r, j in enumerate(js):  # step 20: the two replicas' states differ (no majority: both named)
        j.append(StateFingerprinted(step=20, root=("a" if r else "b") * 64, tensors=1, digests={"param:w": str(r) * 32}))
    js[0].append(StateDiverged(step=20, rank=0, ranks=[0, 1], replicas=2, tensor="param:w"))
    for k in range(5):
        js[1].append(DeviceSampled(device=0, temp_c=67.0 + k, temp_hbm_c=76.5 + k, power_w=297.0 + k,
                                   sm_clock_mhz=1410, clock_event_reasons=0, ecc={"volatile_uncorrected": 2}))
    js[1].append(DeviceChanged(device=0, change="xid", detail={"xid": 79}, step=39))
    for j in js:
        j.close()
    return d


def test_a_run_folder_shows_every_rank_and_the_slow_rank_outlined(browser, tmp_path):
    s = Signer.generate()
    d = _run_folder(tmp_path / "run", s)
    with serving(d, [s.public]) as url:
        p = Page(browser, url)
        p.until("window.__trainledger.drawn > 0")
        data = p.js("window.__trainledger.data")
        assert data["heatmap"]["ranks"] == [0, 1] and data["heatmap"]["stragglers"] == 1
        assert data["heatmap"]["divergences"] == 1
        assert data["loss"]["series"] == 2 and data["loss"]["points"] == 80
        legend = p.js("document.getElementById('heatmap-legend').textContent")
        assert "ranks 0, 1" in legend and "stragglers flagged (1)" in legend and "state divergences (1)" in legend
        marks = p.js("document.getElementById('marks').textContent")
        assert "straggler rank 1" in marks and "device 0: xid" in marks
        assert "state diverged: ranks 0, 1 (param:w)" in marks
        devices = p.js("[...document.querySelectorAll('#telemetry tr')].map(r => r.textContent)")
        assert len(devices) == 2 and "80.5" in devices[1] and "301" in devices[1] and devices[1].endswith("2")
        assert data["temp_c"] == {"points": 5, "series": 1} and data["power_w"]["points"] == 5
        (tmp_path / "run-folder.png").write_bytes(p.page.screenshot(full_page=True))
        assert p.errors == []
        p.close()


def test_a_downloaded_proof_verifies(browser, tmp_path, capsys):
    from trainledger.journal import keygen, load_public_key, load_signer

    priv, pub = keygen(tmp_path / "keys")
    path = tmp_path / "gated.jsonl"
    with Journal.create(path, signer=load_signer(priv), seal_every=16, background=False) as j:
        for i in range(50):
            j.append(StepObserved(step=i, loss=2.0 - i / 100, grad_norm=0.3))
        j.append(GateVerdict(rung="r1", passed=True, reason="final loss 1.51 <= 4.0", measured={"final_loss": 1.51},
                             bars={"max_final_loss": 4.0}, artifacts={}))
    with serving(path, [load_public_key(pub)]) as url:
        p = Page(browser, url, accept_downloads=True)
        p.until("window.__trainledger.drawn > 0")
        p.settled()
        p.page.click("#listed tr:nth-child(2) button")  # the verdict
        p.until("!document.getElementById('event').hidden")
        assert p.js("document.getElementById('event-title').textContent").startswith("gate_verdict at seq ")
        with p.page.expect_download() as dl:
            p.page.click("#event-proof")
        bundle = tmp_path / "proof.json"
        dl.value.save_as(bundle)
        p.close()
    assert main(["verify-proof", str(bundle), "--pubkey", str(pub)]) == 0
    assert "OK" in capsys.readouterr().out


def test_a_journal_without_tree_heads_says_it_has_no_proof(browser):
    from trainledger.journal import load_public_key

    with serving(GOLDEN / "scaling_ladder_v1_2.jsonl", [load_public_key(GOLDEN / "scaling_ladder_v1_2.pub")]) as url:
        p = Page(browser, url)
        p.until("window.__trainledger.drawn > 0")
        p.settled()
        p.page.click("#listed tr:nth-child(3) button")
        p.until("!document.getElementById('event').hidden")
        assert p.js("document.getElementById('event-proof').hidden") is True
        assert "format 1.2 journal has no tree heads" in p.js("document.getElementById('event-noproof').textContent")
        p.close()


def test_hostile_strings_stay_text(browser, tmp_path):
    s = Signer.generate()
    path = tmp_path / "hostile.jsonl"
    evil = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'
    with Journal.create(path, signer=s, background=False) as j:
        for i in range(10):
            j.append(StepObserved(step=i, loss=1.0, grad_norm=0.1))
        j.append(GateVerdict(rung=evil, passed=False, reason=evil, measured={evil: 1.0}, bars={}, artifacts={}))
    with serving(path, [s.public]) as url:
        p = Page(browser, url)
        p.until("window.__trainledger.drawn > 0")
        assert p.js("window.__pwned === undefined")
        assert p.js("document.querySelectorAll('img, script:not([src])').length") == 0
        assert evil in p.js("document.getElementById('listed').textContent")
        p.settled()
        p.page.click("#listed tr:nth-child(2) button")
        p.until("!document.getElementById('event').hidden")
        shown = json.loads(p.js("document.getElementById('event-fields').textContent"))
        assert shown["reason"] == evil and shown["ts"] > 2**53  # every integer as the line has it
        assert p.js("window.__pwned === undefined")
        p.close()


def test_only_the_loopback_name_or_the_token_is_answered(tmp_path):
    s = Signer.generate()
    path = tmp_path / "j.jsonl"
    with Journal.create(path, signer=s, background=False) as j:
        j.append(StepObserved(step=0, loss=1.0))

    def status(url: str, host: str | None = None) -> int:
        req = urllib.request.Request(url, headers={"Host": host} if host else {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    with serving(path, [s.public]) as url:
        assert status(url + "api/state") == 200
        assert status(url + "api/state", host="attacker.example:80") == 403  # a rebound name
    with serving(path, [s.public], token="t0ken") as url:
        base = url.split("?")[0]
        assert status(base + "api/state") == 403
        assert status(base + "api/state?token=wrong") == 403
        assert status(base + "api/state?token=t0ken") == 200
        assert status(base + "api/state?token=t0ken", host="anything.example") == 200


def test_a_replay_difference_is_shown_where_it_is(browser, tmp_path):
    """A signed anomaly the observations do not support: once the run has closed, replay's difference is listed
    with its seq (opening its event) and marked at its step on the curves."""
    from trainledger.training.kinds import AnomalyDetected

    s = Signer.generate()
    path = tmp_path / "claimed.jsonl"
    with Journal.create(path, signer=s, background=False) as j:
        for i in range(30):
            j.append(StepObserved(step=i, loss=2.0, grad_norm=0.5))
        j.append(AnomalyDetected(step=12, anomaly="loss_spike", value=9.0))
    with serving(path, [s.public]) as url:
        p = Page(browser, url)
        p.until("window.__trainledger.state && window.__trainledger.state.replay.state === 'differences'")
        p.until("document.querySelectorAll('#differences tr').length === 2")
        text = p.js("document.getElementById('differences').textContent")
        assert "recorded loss_spike at step 12" in text and "32" in text
        assert p.js("window.__trainledger.state.replay.differences[0].step") == 12  # the step it names
        assert "1 difference(s)" in p.js("document.getElementById('replay').textContent")
        p.page.click("#differences tr:nth-child(2) button")
        p.until("!document.getElementById('event').hidden")
        assert p.js("document.getElementById('event-title').textContent").startswith("anomaly_detected at seq 32")
        p.close()


def test_a_port_in_use_a_missing_key_and_a_bad_path_are_one_line_each(tmp_path, capsys):
    import socket

    s = Signer.generate()
    path = tmp_path / "j.jsonl"
    with Journal.create(path, signer=s, background=False) as j:
        j.append(StepObserved(step=0, loss=1.0))
    pub = tmp_path / "j.pub"
    pub.write_text(s.public.line() + "\n")
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    try:
        port = busy.getsockname()[1]
        assert main(["serve", str(path), "--pubkey", str(pub), "--port", str(port)]) == 2
        assert capsys.readouterr().err.strip() == (f"trainledger serve: error: cannot listen on 127.0.0.1:{port}: "
                                                   "Address already in use")
    finally:
        busy.close()
    assert main(["serve", str(path), "--port", "0"]) == 2
    assert "pass --pubkey" in capsys.readouterr().err
    # a journal not written yet is waited for (test_serve_started_before_the_training_waits_for_the_first_journal);
    # one in a folder that does not exist is a misspelt path, refused at once
    assert main(["serve", str(tmp_path / "nodir" / "none.jsonl"), "--pubkey", str(pub), "--port", "0"]) == 2
    assert "no such file or folder, and no folder" in capsys.readouterr().err
    assert main(["serve", str(path), "--pubkey", str(pub), "--port", "70000"]) == 2


def test_a_rank_swapped_for_another_runs_shows_the_fail_banner_once_the_run_has_closed(browser, tmp_path):
    """Each rank verifies on its own, with this folder's run id and key, but rank 1 is another run's: the anchors
    rank 0 recorded say so (held as soon as rank 1 is read past them, and by the whole-folder check once every rank
    has closed), and the page fails."""
    from trainledger.training.distributed.ranks import anchor_record

    s = Signer.generate()

    def folder(d: Path, loss0: float) -> Path:
        js = [open_rank_journal(d, s, info=RankInfo(run="swap", rank=r, world_size=2, local_rank=0, node="n",
                                                    restart_count=0)) for r in range(2)]
        for j in js:
            for i in range(20):
                j.append(StepObserved(step=i, loss=loss0 + i / 100, grad_norm=0.5))
            j.seal()
        heads = [("%d:%s" % j.head, j.key_id) for j in js]
        for r, j in enumerate(js):
            j.append(anchor_record(r, heads, step=19))
        for j in js:
            j.close()
        return d

    a, b = folder(tmp_path / "a", 2.0), folder(tmp_path / "b", 3.0)
    shutil.copyfile(b / "rank-00001.jsonl", a / "rank-00001.jsonl")
    with serving(a, [s.public]) as url:
        p = Page(browser, url)
        p.until("window.__trainledger.state && window.__trainledger.state.fail !== null")
        fail = p.js("document.getElementById('fail').textContent")
        assert fail.startswith("FAIL") and "rank 1" in fail and "anchored" in fail
        assert p.js("document.getElementById('board').hidden") is True
        p.close()


def test_the_board_follows_a_live_run_folder_a_late_rank_and_a_rewritten_journal(tmp_path):
    """No browser: the board itself. A rank that appears later is followed; a journal cut back and rewritten (an
    honest crash repaired) is read again from its first line, with a note; a rank of another run fails it."""
    from trainledger.serve.board import open_board

    s = Signer.generate()
    d = tmp_path / "run"
    j0 = open_rank_journal(d, s, info=RankInfo(run="live", rank=0, world_size=2, local_rank=0, node="n",
                                               restart_count=0))
    for i in range(10):
        j0.append(StepObserved(step=i, loss=1.0, grad_norm=0.1))
    j0.seal(durable=True)
    b = open_board(d, TrustPolicy(keys=[s.public]))
    try:
        assert [j["rank"] for j in b.state()["journals"]] == [0]
        j1 = open_rank_journal(d, s, info=RankInfo(run="live", rank=1, world_size=2, local_rank=0, node="n",
                                                   restart_count=0))
        for i in range(7):
            j1.append(StepObserved(step=i, loss=2.0, grad_norm=0.1))
        j1.seal(durable=True)
        assert b.poll()
        st = b.state()
        assert [j["rank"] for j in st["journals"]] == [0, 1] and st["steps"][0] == 17
        # rank 1 cut back to its first seal and written again with other steps: read again, noted
        j1.suspend()
        lines = (d / "rank-00001.jsonl").read_bytes().splitlines(keepends=True)
        keep = next(i for i, x in enumerate(lines) if b'"kind":"seal"' in x) + 1
        (d / "rank-00001.jsonl").write_bytes(b"".join(lines[:keep]))
        j1 = Journal.open_append(d / "rank-00001.jsonl", signer=s, background=False)
        for i in range(3):
            j1.append(StepObserved(step=i, loss=5.0, grad_norm=0.1))
        j1.seal(durable=True)
        assert b.poll()
        st = b.state()
        assert st["fail"] is None and any("rewritten" in n for n in st["notes"])
        assert b.con.execute("SELECT count(*), max(loss) FROM steps WHERE rank = 1").fetchall() == [(3, 5.0)]
        # a journal of another run dropped in as rank 2: the board fails, and shows nothing else
        other = open_rank_journal(tmp_path / "other", s, info=RankInfo(run="else", rank=2, world_size=3,
                                                                       local_rank=0, node="n", restart_count=0))
        other.close()
        shutil.copyfile(tmp_path / "other" / "rank-00002.jsonl", d / "rank-00002.jsonl")
        b.poll()
        st = b.state()
        assert st["fail"].startswith("FAIL") and "another run" in st["fail"] and "journals" not in st
        assert b.series("loss", 100)["series"] == []
    finally:
        b.close()
        j0.suspend()


def test_a_point_and_a_mark_on_the_curve_open_their_events(browser, tmp_path):
    from trainledger.training.kinds import CheckpointSaved

    s = Signer.generate()
    path = tmp_path / "marked.jsonl"
    with Journal.create(path, signer=s, background=False) as j:
        for i in range(100):
            j.append(StepObserved(step=i, loss=2.0 - i / 200, grad_norm=0.5))
            if i == 50:
                j.append(CheckpointSaved(step=50, path="ckpt/50", bytes=10, sha256="0" * 64, contents=["model"],
                                         duration_s=0.1))
    with serving(path, [s.public]) as url:
        p = Page(browser, url)
        # replay's end redraws the charts: clicked after it, the positions read are the ones clicked
        p.until("window.__trainledger.state && window.__trainledger.state.replay.state === 'consistent' && "
                "window.__trainledger.version === window.__trainledger.state.version")
        u = "window.__trainledger.charts.loss"
        box = p.js(f"(() => {{ const r = {u}.over.getBoundingClientRect(); return [r.width, r.height]; }})()")
        x_mark = p.js(f"{u}.valToPos(50, 'x')")
        p.page.mouse.move(0, 0)
        over = p.page.locator("#chart-loss .u-over")
        over.click(position={"x": x_mark, "y": box[1] / 2})
        p.until("!document.getElementById('event').hidden")
        assert p.js("document.getElementById('event-title').textContent").startswith("checkpoint_saved at seq ")
        before = p.js("window.__trainledger.drawn")
        p.page.click("#event-close")  # the page widens again: the charts are drawn again at its width
        p.until(f"window.__trainledger.drawn > {before} && !window.__trainledger.busy")
        x_point = p.js(f"{u}.valToPos(20, 'x')")
        over.click(position={"x": x_point, "y": box[1] / 2})
        p.until("!document.getElementById('event').hidden")
        title = p.js("document.getElementById('event-title').textContent")
        assert title.startswith("step_observed at seq ")
        assert '"step": 2' in p.js("document.getElementById('event-fields').textContent")  # near step 20
        assert p.errors == []
        p.close()


def test_the_first_read_reports_its_progress(tmp_path):
    from trainledger.serve.board import open_board

    s = Signer.generate()
    path = tmp_path / "p.jsonl"
    with Journal.create(path, signer=s, background=False) as j:
        for i in range(3000):
            j.append(StepObserved(step=i, loss=1.0, grad_norm=0.1))
    seen: list[tuple[int, int]] = []
    b = open_board(path, TrustPolicy(keys=[s.public]), progress=lambda done, total: seen.append((done, total)))
    try:
        size = path.stat().st_size
        assert len(seen) >= 2 and seen[-1] == (size, size) and all(d <= t for d, t in seen)
        assert b.progress is None  # only the first read: the live follower says nothing
    finally:
        b.close()


def test_serve_started_before_the_training_waits_for_the_first_journal(tmp_path):
    """Launched beside the run, on a folder with nothing in it yet: it says what it waits for, then serves the
    journal once one appears (here the main job's ladder.jsonl)."""
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "trainledger", "serve", str(run), "--pubkey",
                             str(GOLDEN / "scaling_ladder_v1_2.pub"), "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stderr.readline().startswith(f"waiting for {run} to hold a journal")
        time.sleep(1.0)
        assert proc.poll() is None                                  # still waiting, not refused
        shutil.copy(GOLDEN / "scaling_ladder_v1_2.jsonl", run / "ladder.jsonl")
        line = proc.stdout.readline()
        assert line.startswith(f"serving {run}") and "http://127.0.0.1:" in line, line
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stdout.close()
        proc.stderr.close()
        _end_group(proc.pid)


def test_serve_names_a_missing_key_before_a_taken_port(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "trainledger", "serve", str(GOLDEN / "scaling_ladder_v1_2.jsonl"),
                            "--port", str(taken)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "pass --pubkey" in p.stderr and str(taken) not in p.stderr
    q = subprocess.run([sys.executable, "-m", "trainledger", "serve", str(tmp_path / "no" / "such")],
                       capture_output=True, text=True, timeout=60)
    assert q.returncode == 2 and "no folder" in q.stderr


def test_readable_axes_smoothing_that_keeps_a_spike_and_no_horizontal_scroll(browser, tmp_path):
    """Every curve has an axis title with its unit and MFU is in percent; a smoothing slider draws the moving average
    over the raw curve, whose 50x spike stays in the data drawn; a log axis has 1-2-5 ticks labelled; the ladder's
    page (a scaling fit's long parameters folded into one line) fits 1,280 px without scrolling sideways."""
    signer = Signer.generate()
    path = tmp_path / "spike.jsonl"
    with Journal.create(path, signer=signer, seal_every=100) as j:
        for i in range(400):
            loss = 100.0 if i == 300 else 2.0 + 0.001 * (i % 7)  # one step 50x the rest
            j.append(StepObserved(step=i, loss=loss, grad_norm=0.5 + 0.01 * (i % 5), step_time_s=0.1, tokens=256))
    with serving(path, [signer.public]) as url:
        p = Page(browser, url)
        p.until("window.__trainledger.drawn > 0")
        titles = p.js("['loss', 'grad_norm', 'mfu', 'tokens_per_s'].map(m => window.__trainledger.charts[m])"
                      ".filter(u => u).map(u => [u.axes[0].label, u.axes[1].label])")  # drawn on the canvas
        assert titles == [["step", "loss (nats)"], ["step", "gradient norm (L2)"], ["step", "tokens / s"]]
        p.js("(() => { const s = document.getElementById('smoothing'); s.value = '0.9'; "
             "s.dispatchEvent(new Event('input')); })()")
        p.until("window.__trainledger.data.loss.smoothing === 0.9")
        loss = p.js("window.__trainledger.data.loss")
        assert loss["rawMax"] == 100.0  # the spike, drawn in the raw band under the average
        chart = p.js("(() => { const u = window.__trainledger.charts.loss; "
                     "return [u.series.length, Math.max(...u.data[1].filter(v => v !== null)), "
                     "Math.max(...u.data[2].filter(v => v !== null))]; })()")
        assert chart[0] == 3 and chart[1] == 100.0 and chart[2] < 50  # raw keeps it; the average alone would not
        p.js("(() => { const c = document.getElementById('log-grad_norm'); c.checked = true; "
             "c.dispatchEvent(new Event('change')); })()")
        p.until("window.__trainledger.data.grad_norm.log === true")
        labels = p.js("window.__trainledger.charts.grad_norm.axes[1]._values")
        assert len([v for v in labels if v]) >= 2, labels
        assert p.errors == []
        p.close()
    ladder = GOLDEN / "scaling_ladder_v1_2.jsonl"
    with serving(ladder, [_pub(ladder)]) as url:
        p = Page(browser, url, viewport={"width": 1280, "height": 900})
        p.until("window.__trainledger.drawn > 0")
        assert p.js("document.documentElement.scrollWidth") <= 1280
        assert p.js("document.querySelectorAll('#listed details').length") >= 1  # the fit's parameters, folded
        mfu = p.js("window.__trainledger.data.mfu")
        assert mfu["title"] == "MFU (%)" and 1 < mfu["rawMax"] <= 100  # percent, not a bare 0-1
        assert p.errors == []
        p.close()


def _pub(journal: Path):
    from trainledger.journal import load_public_key

    return load_public_key(journal.with_suffix(".pub"))


@contextlib.contextmanager
def serving_fleet(paths, keys):
    """Every run under ``paths`` (a :class:`Fleet`), served (:func:`_uvicorn`)."""
    from trainledger.serve.fleet import Fleet

    with _uvicorn(Fleet(list(paths), TrustPolicy(keys=list(keys)))) as url:
        yield url


def test_a_folder_of_runs_overlays_them_lists_a_fail_and_shows_a_new_run(browser, tmp_path):
    """serve DIR: a run table (a run that fails verification is a FAIL row and never a curve), the charts overlay
    the runs ticked, each run its own colour family named by run and rung, and a run copied in while it serves
    appears in the table."""
    runs = tmp_path / "runs"
    for name, golden in (("ladder", "scaling_ladder_v1_2"), ("halt", "ladder_halt_v1_1")):
        (runs / name).mkdir(parents=True)
        shutil.copy(GOLDEN / f"{golden}.jsonl", runs / name / "ladder.jsonl")
    bad = runs / "tampered"
    bad.mkdir()
    text = (GOLDEN / "ladder_halt_v1_1.jsonl").read_text()
    (bad / "ladder.jsonl").write_text(text.replace('"loss":', '"loss":1', 1))  # one changed byte in a step
    keys = [_pub(GOLDEN / "scaling_ladder_v1_2.jsonl"), _pub(GOLDEN / "ladder_halt_v1_1.jsonl"),
            _pub(GOLDEN / "resumed_rewound_v1_1.jsonl")]
    with serving_fleet([runs], keys) as url:
        p = Page(browser, url, viewport={"width": 1280, "height": 1000})
        p.until("window.__trainledger.drawn > 0 && window.__trainledger.data.loss && "
                "window.__trainledger.data.loss.runs === 2")
        rows = p.js("Array.from(document.querySelectorAll('#runs tr')).slice(1).map(r => r.textContent)")
        assert len(rows) == 3 and any(r.startswith("tampered") and "FAIL" in r for r in rows), rows
        names = p.js("window.__trainledger.charts.loss.series.slice(1).map(s => s.label)")
        assert "ladder rung_iv_headline" in names and any(n.startswith("halt ") for n in names)
        assert not any(n.startswith("tampered") for n in names)  # a FAIL run is never drawn
        assert p.js("document.documentElement.scrollWidth") <= 1280
        # untick one run: its curves leave the charts
        p.js("(() => { const t = document.querySelectorAll('#runs td input[type=checkbox]')[0]; t.checked = false; "
             "t.dispatchEvent(new Event('change')); })()")
        p.until("window.__trainledger.data.loss.runs === 1")
        assert not p.js("document.getElementById('runs-all').checked")
        p.page.click("#runs-all")  # tick every run that verifies (never the FAIL row)
        p.until("window.__trainledger.data.loss.runs === 2 && document.getElementById('runs-all').checked")
        # a run copied into the folder while it serves: a new row, within the rescan
        (runs / "late").mkdir()
        shutil.copy(GOLDEN / "resumed_rewound_v1_1.jsonl", runs / "late" / "journal.jsonl")
        p.until("document.querySelectorAll('#runs tr').length === 5")
        assert p.errors == []
        p.close()


def test_the_x_axis_by_tokens_or_wall_time(browser, tmp_path):
    """The curves against each rung's tokens processed and against seconds since the first step, fetched again."""
    ladder = GOLDEN / "scaling_ladder_v1_2.jsonl"
    with serving(ladder, [_pub(ladder)]) as url:
        p = Page(browser, url)
        p.until("window.__trainledger.drawn > 0")
        steps_max = p.js("Math.max(...window.__trainledger.charts.loss.data[0])")
        for x, title in (("tokens", "tokens processed"), ("time", "wall time (s)")):
            p.js(f"(() => {{ const s = document.getElementById('x-axis'); s.value = '{x}'; "
                 "s.dispatchEvent(new Event('change')); })()")
            p.until(f"window.__trainledger.data.loss && window.__trainledger.data.loss.x === '{x}'")
            u = p.js("(() => { const u = window.__trainledger.charts.loss; "
                     "return [u.axes[0].label, Math.max(...u.data[0]), u.series.length]; })()")
            assert u[0] == title and u[2] == 1 + 7 * 2, u  # seven rungs, each its own line and its average
            if x == "tokens":
                assert u[1] > 100 * steps_max  # hundreds of tokens a step
        assert p.errors == []
        p.close()


def test_a_dragged_range_is_fetched_again_at_full_resolution(browser, tmp_path):
    """20,000 steps drawn at most two points a pixel; a drag across 600 of them fetches every one of them again
    (the 50x spike at its exact value), every chart shows that range, and a double-click shows the whole run."""
    signer = Signer.generate()
    path = tmp_path / "long.jsonl"
    with Journal.create(path, signer=signer, seal_every=1000) as j:
        for i in range(20_000):
            loss = 100.0 if i == 12_345 else 2.0 + 0.001 * (i % 13)
            j.append(StepObserved(step=i, loss=loss, grad_norm=0.5, step_time_s=0.1, tokens=256))
    with serving(path, [signer.public]) as url:
        p = Page(browser, url, viewport={"width": 1280, "height": 900})
        # replay's redraw over (it marks the spike: no monitor recorded an anomaly for it), so that the positions
        # read are the ones dragged across
        p.until("window.__trainledger.state && window.__trainledger.state.replay.state === 'differences' && "
                "window.__trainledger.version === window.__trainledger.state.version && !window.__trainledger.busy",
                timeout=60)
        whole = p.js("window.__trainledger.data.loss.points")
        assert whole < 2 * 2000 and whole < 20_000  # the overview: at most two points a pixel
        u = "window.__trainledger.charts.loss"
        x0, x1 = p.js(f"[{u}.valToPos(12000, 'x'), {u}.valToPos(12600, 'x')]")
        r = p.js(f"(() => {{ const r = {u}.over.getBoundingClientRect(); return [r.left, r.top, r.height]; }})()")
        p.page.mouse.move(r[0] + x0, r[1] + r[2] / 2)
        p.page.mouse.down()
        p.page.mouse.move(r[0] + (x0 + x1) / 2, r[1] + r[2] / 2, steps=4)
        p.page.mouse.move(r[0] + x1, r[1] + r[2] / 2, steps=4)
        p.page.mouse.up()
        p.until("window.__trainledger.data.loss.zoom !== null && !window.__trainledger.busy")
        lo, hi = p.js("window.__trainledger.data.loss.zoom")
        assert 11_950 <= lo <= 12_050 and 12_550 <= hi <= 12_650, (lo, hi)
        xs = p.js(f"{u}.data[0]")
        assert xs == list(range(lo, hi + 1))  # every step in the range, none left out
        assert 100.0 in p.js(f"{u}.data[1]")  # the spike at its value
        scale = p.js(f"[{u}.scales.x.min, {u}.scales.x.max]")
        assert scale == [lo, hi]
        assert p.js("window.__trainledger.data.grad_norm.zoom") == [lo, hi]  # every chart, one range
        assert not p.js("document.getElementById('zoom-reset').hidden")
        assert p.js("document.getElementById('event').hidden")  # a drag opens no event
        p.page.locator("#chart-loss .u-over").dblclick()
        p.until("window.__trainledger.data.loss.zoom === null && !window.__trainledger.busy")
        assert p.js("window.__trainledger.data.loss.points") == whole
        assert p.errors == []
        p.close()


def test_the_event_panel_leaves_the_seq_buttons_in_view(browser):
    """The open event panel has its own column: the tables' seq buttons stay clickable beside it, at 1,280 px."""
    ladder = GOLDEN / "scaling_ladder_v1_2.jsonl"
    with serving(ladder, [_pub(ladder)]) as url:
        p = Page(browser, url, viewport={"width": 1280, "height": 900})
        p.until("window.__trainledger.drawn > 0")
        p.settled()
        p.page.click("#listed tr:nth-child(2) button")
        p.until("!document.getElementById('event').hidden && !window.__trainledger.busy")
        panel = p.js("document.getElementById('event').getBoundingClientRect().left")
        rights = p.js("Array.from(document.querySelectorAll('#listed button, #marks button'))"
                      ".map(b => b.getBoundingClientRect().right)")
        assert rights and max(rights) <= panel, (max(rights), panel)
        assert p.js("document.documentElement.scrollWidth") <= 1280
        first = p.js("document.getElementById('event-title').textContent")
        p.settled()
        p.page.click("#listed tr:nth-child(3) button")  # another event, opened with the panel open
        p.until(f"document.getElementById('event-title').textContent !== {json.dumps(first)}")
        p.page.keyboard.press("Escape")
        p.until("document.getElementById('event').hidden")
        assert p.errors == []
        p.close()


def test_the_fit_is_drawn_as_a_fit(browser):
    """The scaling fit: the law's curve (smooth, falling with compute, below the law's value at every rung: it is the
    lowest loss the law gives at each compute), every rung's measured loss, the chosen size at its predicted loss
    with its interval, and that run's measured loss said inside or outside it."""
    ladder = GOLDEN / "scaling_ladder_v1_2.jsonl"
    with serving(ladder, [_pub(ladder)]) as url:
        p = Page(browser, url, viewport={"width": 1280, "height": 900})
        p.until("window.__trainledger.drawn > 0 && window.__trainledger.charts.fit")
        fit = p.js("window.__trainledger.data.fit")
        data = p.js("window.__trainledger.charts.fit.data")
        legend = p.js("document.getElementById('fit-legend').textContent")
        xs, curve, rungs, at_rungs, predicted, measured = data
        drawn = [(x, y) for x, y in zip(xs, curve) if y is not None]
        assert fit["curve"] == len(drawn) >= 50
        assert all(b[1] < a[1] for a, b in zip(drawn, drawn[1:]))  # falls as compute grows
        for x, law in zip(xs, at_rungs):
            if law is None:
                continue
            above = min((d for d in drawn if d[0] >= x), default=None)  # the curve a little further on: lower still
            assert above is not None and law >= above[1] - 1e-9  # the curve is the law's least loss at that compute
        assert fit["points"] == sum(v is not None for v in rungs) >= 4
        assert fit["chosen"] and sum(v is not None for v in predicted) == 1
        assert fit["intervals"] >= 1  # at least the prediction's
        if fit["measured"] is not None:
            assert sum(v is not None for v in measured) == 1
            assert ("inside the interval" in legend) == fit["inside"]
        assert p.errors == []
        p.close()


def test_dozens_of_curves_get_a_compact_legend(browser, tmp_path):
    """Four ladders of seven rungs overlaid (28 curves): a compact legend of each run's colour and name, not 28
    entries under every chart."""
    runs = tmp_path / "runs"
    for k in range(4):
        (runs / f"ladder-{k}").mkdir(parents=True)
        shutil.copy(GOLDEN / "scaling_ladder_v1_2.jsonl", runs / f"ladder-{k}" / "ladder.jsonl")
    with serving_fleet([runs], [_pub(GOLDEN / "scaling_ladder_v1_2.jsonl")]) as url:
        p = Page(browser, url, viewport={"width": 1280, "height": 1000})
        p.until("window.__trainledger.drawn > 0 && window.__trainledger.data.loss && "
                "window.__trainledger.data.loss.runs === 4 && !window.__trainledger.busy")
        assert p.js("window.__trainledger.data.loss.legend") == "compact"
        entries = p.js("Array.from(document.querySelectorAll('#chart-loss .compact-legend .entry'))"
                       ".map(e => e.textContent)")
        assert entries == [f"ladder-{k} (7 lines)" for k in range(4)]
        assert p.js("document.querySelectorAll('#chart-loss .u-legend').length") == 0
        assert p.js("document.documentElement.scrollWidth") <= 1280
        assert p.errors == []
        p.close()


def test_a_curve_asked_again_is_the_one_computed_until_new_lines_are_read(tmp_path):
    """The board keeps each curve asked for (a refresh after another run's replay costs nothing) and drops them all
    when it reads new lines: a curve is never older than the lines read."""
    from trainledger.serve.board import Board

    s = Signer.generate()
    path = tmp_path / "c.jsonl"
    j = Journal.create(path, signer=s, seal_every=10, background=False)
    for i in range(30):
        j.append(StepObserved(step=i, loss=1.0 + i, grad_norm=0.1))
    j.seal(durable=True)
    b = Board(path, trust=TrustPolicy(keys=[s.public]))
    try:
        b.poll()
        first = b.series("loss", 300)
        assert b.series("loss", 300) is first and b.series("loss", 301) is not first
        assert max(first["series"][0]["x"]) == 29
        for i in range(30, 40):
            j.append(StepObserved(step=i, loss=1.0 + i, grad_norm=0.1))
        j.seal(durable=True)
        v = b.data_version
        assert b.poll() and b.data_version > v
        again = b.series("loss", 300)
        assert again is not first and max(again["series"][0]["x"]) == 39
    finally:
        j.close()
        b.close()


def test_a_cursor_gives_only_the_points_read_since(tmp_path):
    """Every curve names a cursor; asked again with since=CURSOR, the board gives only the points read after it (as
    they are: the page adds them to its curve), logged metrics too; the whole curve when as many as the width are
    new, or when the cursor is from before the journal was rewritten, or is none this board gave."""
    from trainledger.serve.board import Board
    from trainledger.training.kinds import MetricsLogged

    s = Signer.generate()
    path = tmp_path / "c.jsonl"
    j = Journal.create(path, signer=s, seal_every=10_000, background=False)
    for i in range(3000):
        j.append(StepObserved(step=i, loss=1.0 + i, grad_norm=0.1))
        j.append(MetricsLogged(step=i, metrics={"acc": i / 3000}, source="test"))
    j.seal(durable=True)
    b = Board(path, trust=TrustPolicy(keys=[s.public]))
    try:
        b.poll()
        whole = b.series("loss", 300)
        c = whole["cursor"]
        assert "append" not in whole and len(whole["series"][0]["x"]) <= 600  # the whole run, two points a pixel
        nothing = b.series("loss", 300, since=c)
        assert nothing["append"] and nothing["series"] == [] and nothing["cursor"] == c
        for i in range(3000, 3005):
            j.append(StepObserved(step=i, loss=1.0 + i, grad_norm=0.1))
            j.append(MetricsLogged(step=i, metrics={"acc": i / 3000}, source="test"))
        j.seal(durable=True)
        assert b.poll()
        new = b.series("loss", 300, since=c)
        assert new["append"] and new["cursor"] > c
        assert new["series"][0]["x"] == [3000, 3001, 3002, 3003, 3004]
        assert new["series"][0]["y"] == [3001.0, 3002.0, 3003.0, 3004.0, 3005.0]
        assert len(json.dumps(new)) < len(json.dumps(whole)) / 20  # what is new, not the whole curve again
        acc = b.series("acc", 300, logged=True, since=c)
        assert acc["append"] and acc["series"][0]["x"] == [3000, 3001, 3002, 3003, 3004]
        assert "append" not in b.series("loss", 4, since=c)  # as many new points as the width: the whole curve
        assert "append" not in b.series("loss", 300, since=new["cursor"] + 5)  # a cursor it never gave
        assert "append" not in b.series("loss", 300, lo=10, hi=20, since=c)  # a zoom: always the window
        j.suspend()
        lines = path.read_bytes().splitlines(keepends=True)  # cut back to the run's opening and written again
        keep = next(i for i, x in enumerate(lines) if b'"kind":"seal"' in x) + 1
        path.write_bytes(b"".join(lines[:keep]))
        j = Journal.open_append(path, signer=s, background=False)
        j.append(StepObserved(step=0, loss=9.0, grad_norm=0.1))
        j.seal(durable=True)
        assert b.poll()
        again = b.series("loss", 300, since=new["cursor"])
        assert "append" not in again and again["series"][0]["y"] == [9.0]
    finally:
        j.close()
        b.close()


def _logged_runs(root: Path, n: int, steps: int, spike: tuple[int, int] | None = None):
    """``n`` signed runs under ``root`` (run-000, ...), each with its steps, two logged metrics a step (train/acc,
    eval/loss every 10th) and a configuration whose lr differs by run; ``spike``: (run, step) whose loss is 100x."""
    from trainledger.training.kinds import ConfigLogged, MetricsLogged

    signer = Signer.generate()
    for r in range(n):
        (root / f"run-{r:03d}").mkdir(parents=True)
        with Journal.create(root / f"run-{r:03d}" / "journal.jsonl", signer=signer, seal_every=500) as j:
            j.append(ConfigLogged(config={"lr": 1e-3 * (1 + r % 5), "model": {"layers": 2}, "seed": 0}, source="test"))
            for i in range(steps):
                loss = 3.0 - i / steps + 0.01 * ((i * 7 + r) % 5)
                if spike == (r, i):
                    loss = 300.0
                j.append(StepObserved(step=i, loss=loss, grad_norm=0.5, lr=1e-3 * (1 + r % 5) * min(1.0, (i + 1) / 50)))
                metrics = {"train/acc": 0.5 + 0.4 * i / steps}
                if i % 10 == 0:
                    metrics["eval/loss"] = 3.2 - i / steps
                j.append(MetricsLogged(step=i, metrics=metrics, source="test"))
    return signer


def test_every_logged_metric_is_a_curve_of_its_own(tmp_path):
    """The board keeps each logged metric by name (NaN and infinities kept in the table, left out of the curve), a
    run's configuration as config_logged set it, and draws a logged metric per pixel as it draws the loss."""
    from trainledger.serve.board import Board
    from trainledger.training.kinds import ConfigLogged, MetricsLogged

    s = Signer.generate()
    path = tmp_path / "m.jsonl"
    # the steps' wall times evenly spread whatever the machine's load (a stall bunches them: fewer pixels hold one)
    with even_clock(), Journal.create(path, signer=s, seal_every=50, background=False) as j:
        j.append(ConfigLogged(config={"optimizer": {"name": "adamw", "betas": [0.9, 0.95]}, "lr": 3e-4}, source="t"))
        for i in range(200):
            j.append(StepObserved(step=i, loss=2.0, lr=1e-4 * i))
            j.append(MetricsLogged(step=i, metrics={"train/acc": i / 200, "ünïcode/naïve": float("nan") if i == 5
                                                    else float("inf") if i == 6 else 1.0}, source="log"))
    b = Board(path, trust=TrustPolicy(keys=[s.public]))
    try:
        b.poll()
        assert b.logged_names() == {"names": [["train/acc", 200], ["ünïcode/naïve", 200]], "left_out": 0}
        assert b.config() == {"optimizer.name": "adamw", "optimizer.betas": "[0.9, 0.95]", "lr": 3e-4}
        acc = b.series("train/acc", 50, logged=True)
        pts = [(x, y) for s_ in acc["series"] for x, y in zip(s_["x"], s_["y"])]
        assert len(pts) == 100 and pts[0] == (0, 0.0) and pts[-1] == (199, 199 / 200)  # two a pixel, ends kept
        odd = b.series("ünïcode/naïve", 400, logged=True)
        assert sum(len(s_["y"]) for s_ in odd["series"]) == 198  # NaN and inf are not drawn
        lr = b.series("lr", 400)
        assert max(y for s_ in lr["series"] for y in s_["y"]) == pytest.approx(1e-4 * 199)
        assert b.series("no such name", 100, logged=True)["series"] == []
        tok = b.series("train/acc", 50, x="time", logged=True)  # at its step's wall time
        ts = {e["step"]: e["ts"] for e in map(json.loads, path.read_bytes().splitlines())
              if e["kind"] == "step_observed"}
        pts = [(x, y) for s_ in tok["series"] for x, y in zip(s_["x"], s_["y"])]
        assert len(pts) >= 50 and pts[0] == (0.0, 0.0) and pts[-1][1] == 199 / 200
        assert all(x == pytest.approx((ts[round(y * 200)] - ts[0]) / 1e9) for x, y in pts)
    finally:
        b.close()


def test_a_hundred_runs_with_a_spike_first_view_zoom_hover_and_colours(browser, tmp_path):
    """A folder of 100 runs, one with a loss spike 100x the rest: at the first view the spike is drawn (at the
    chart's edge, marked, the y range robust to it) and after a zoom; axis labels do not overlap (linear and log);
    hover lists every run's value with smoothing on; colours stay the same across zoom and reload; each logged
    metric has its panel, grouped by prefix and found by the search box; the run table filters by regex and by a
    configuration value, and two runs ticked are compared."""
    runs = tmp_path / "runs"
    signer = _logged_runs(runs, 100, 300, spike=(3, 150))
    with serving_fleet([runs], [signer.public]) as url:
        p = Page(browser, url, viewport={"width": 1400, "height": 1000})
        p.until("window.__trainledger.drawn > 0 && window.__trainledger.data.loss && "
                "window.__trainledger.data.loss.runs === 8 && !window.__trainledger.busy", timeout=300)
        loss = p.js("window.__trainledger.data.loss")
        assert loss["smoothing"] == 0.6 and loss["rawMax"] == 300.0  # smoothing on by default; the spike drawn
        assert loss["range"][1] < 10 and loss["clipped"] >= 1  # the range leaves the spike out; it sits at the edge
        assert p.js("window.__trainledger.data['m:train/acc'].points") > 0
        groups = p.js("Array.from(document.querySelectorAll('#charts > h2')).map(h => h.textContent)")
        assert groups == ["Training", "eval/", "train/"], groups
        colours = dict(map(tuple, loss["colours"]))
        assert len(set(colours.values())) == 8  # eight runs, eight colours

        def no_overlap(chart: str) -> list[float]:
            return p.js("(() => { const u = window.__trainledger.charts[CHART]; const ys = u.axes[1]._splits"
                        ".map(v => u.valToPos(v, 'y')).sort((a, b) => a - b); const labels = u.axes[1]._values"
                        ".filter(v => v); return [Math.min(...ys.slice(1).map((y, i) => y - ys[i])), labels.length]; "
                        "})()".replace("CHART", repr(chart)))
        gap, labelled = no_overlap("loss")
        assert gap >= 14 and labelled >= 3, (gap, labelled)
        p.js("(() => { const c = document.getElementById('log-lr'); c.checked = true; "
             "c.dispatchEvent(new Event('change')); })()")
        p.until("window.__trainledger.data.lr.log === true")
        gap, labelled = no_overlap("lr")
        assert gap >= 14 and labelled >= 2, (gap, labelled)
        # hover: a value for every run ticked, with the average beside it
        p.js("(() => { const u = window.__trainledger.charts.loss; u.setCursor({left: u.bbox.width / devicePixelRatio"
             " / 2, top: 20}); })()")
        assert p.js("window.__trainledger.data.loss.hover") == 8
        assert "smoothed" in p.js("document.querySelector('#chart-loss').parentNode.querySelector('.hover')"
                                  ".textContent")
        # zoom around the spike: still drawn, colours kept
        p.js("window.__trainledger.zoom(140, 160)")
        p.until("JSON.stringify(window.__trainledger.data.loss.zoom) === '[140,160]' && !window.__trainledger.busy")
        assert p.js("window.__trainledger.data.loss.rawMax") == 300.0
        assert dict(map(tuple, p.js("window.__trainledger.data.loss.colours"))) == colours
        # the search box keeps the panels it names
        p.js("(() => { const s = document.getElementById('metric-search'); s.value = 'acc'; "
             "s.dispatchEvent(new Event('input')); })()")
        p.until("JSON.stringify(window.__trainledger.data.panels.keys) === '[\"m:train/acc\"]'")
        # the run table: a regex, then a configuration value
        p.js("(() => { const f = document.getElementById('runs-filter'); f.value = '/run-00[0-4]$/'; "
             "f.dispatchEvent(new Event('input')); })()")
        assert p.js("document.querySelectorAll('#runs tr:not(.filtered)').length") == 6  # the heading and 5 runs
        assert "config.lr" in p.js("document.querySelector('#runs tr').textContent")
        # nothing ticked by hand: the runs the filter keeps are the ones ticked, and compared side by side
        compare = p.js("window.__trainledger.data.compare")
        assert compare["runs"] == [f"run-00{k}" for k in range(5)] and compare["differ"] == ["config.lr"]
        p.js("(() => { const f = document.getElementById('runs-filter'); f.value = 'lr=0.002'; "
             "f.dispatchEvent(new Event('input')); })()")
        assert p.js("document.querySelectorAll('#runs tr:not(.filtered)').length") == 21  # runs 1, 6, ..., 96
        compare = p.js("window.__trainledger.data.compare")
        assert compare["runs"] == [f"run-{k:03d}" for k in range(1, 40, 5)] and compare["differ"] == []
        assert p.errors == []
        p.close()
        # a reload: the same colours
        p = Page(browser, url, viewport={"width": 1400, "height": 1000})
        p.until("window.__trainledger.data.loss && window.__trainledger.data.loss.runs === 8 && "
                "!window.__trainledger.busy", timeout=300)
        assert dict(map(tuple, p.js("window.__trainledger.data.loss.colours"))) == colours
        assert p.errors == []
        p.close()


def test_ten_thousand_metric_names_are_kept_listed_and_drawn(tmp_path):
    """Per-layer statistics under 10,000 distinct names, logged at five steps: the journal verifies, the query's
    metrics view holds every value, and the board lists every name with its points and draws any of them."""
    from trainledger.journal.views.query import connect
    from trainledger.serve.board import Board
    from trainledger.training.kinds import MetricsLogged, metric_values

    s = Signer.generate()
    path = tmp_path / "wide.jsonl"
    names = [f"layers/{k:05d}/grad_rms" for k in range(10_000)]
    with Journal.create(path, signer=s) as j:
        for step in range(5):
            j.append(StepObserved(step=step, loss=1.0))
            j.append(MetricsLogged(step=step, metrics=metric_values({n: step + k / 1e4 for k, n in enumerate(names)}),
                                   source="log"))
    con = connect([path], keys=[s.public])
    assert con.execute("SELECT count(*), count(DISTINCT name) FROM metrics").fetchone() == (50_000, 10_000)
    b = Board(path, trust=TrustPolicy(keys=[s.public]))
    try:
        b.poll()
        got = b.logged_names()
        assert len(got["names"]) == 10_000 and got["left_out"] == 0 and {n for _, n in got["names"]} == {5}
        one = b.series("layers/09999/grad_rms", 100, logged=True)
        assert [y for s_ in one["series"] for y in s_["y"]] == [step + 0.9999 for step in range(5)]
    finally:
        b.close()


def test_the_run_table_is_sent_whole_once_then_only_the_rows_that_changed(tmp_path):
    """No browser: the fleet's run table with a cursor. Asked again with it, only the rows of runs that read new
    lines come (with every run's name, to keep the order); a new run comes too; when the settings that differ
    between runs change (a new column), every row comes again."""
    from trainledger.serve.fleet import Fleet
    from trainledger.training.kinds import ConfigLogged

    s = Signer.generate()
    journals = {}
    for r in range(3):
        (tmp_path / f"run-{r}").mkdir()
        j = journals[r] = Journal.create(tmp_path / f"run-{r}" / "journal.jsonl", signer=s, background=False)
        j.append(ConfigLogged(config={"lr": 0.1}, source="test"))
        j.append(StepObserved(step=0, loss=1.0))
        j.seal(durable=True)
    f = Fleet([tmp_path], TrustPolicy(keys=[s.public]))
    try:
        whole = f.runs_since(None)
        assert not whole["partial"] and [r["name"] for r in whole["rows"]] == ["run-0", "run-1", "run-2"]
        c = whole["cursor"]
        assert f.runs_since(c)["rows"] == [] and f.runs_since(c)["partial"]
        journals[1].append(StepObserved(step=1, loss=0.5))
        journals[1].seal(durable=True)
        f.poll()
        got = f.runs_since(c)
        assert got["partial"] and [r["name"] for r in got["rows"]] == ["run-1"] and got["rows"][0]["steps"] == 2
        assert got["names"] == ["run-0", "run-1", "run-2"]
        journals[2].append(ConfigLogged(config={"lr": 0.3}, source="test"))  # lr now differs: a new column
        journals[2].seal(durable=True)
        f.poll()
        again = f.runs_since(got["cursor"])
        assert not again["partial"] and len(again["rows"]) == 3
        assert all("config.lr" in r["differs"] for r in again["rows"])
        assert f.runs_since(again["cursor"] + 1)["partial"] is False  # a cursor it never gave: the whole table
    finally:
        for j in journals.values():
            j.close()
        f.close()
