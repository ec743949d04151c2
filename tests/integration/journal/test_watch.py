"""trainledger watch follows a journal being written by another process and exits when the run closes."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time

import pytest


def test_watch_follows_a_live_run_until_it_closes(tmp_path):
    """The watcher starts before the file exists (like tail -F), shows the run while it goes, and exits 0 when it
    closes. The run waits on what the watcher printed (a handshake), so a slow machine cannot outrun it."""
    from trainledger.journal import Journal, Signer, StepObserved
    from trainledger.training.kinds import AnomalyDetected

    p = tmp_path / "live.jsonl"
    with subprocess.Popen([sys.executable, "-m", "trainledger", "watch", str(p), "--interval", "0.05",
                                "--timeout", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as watcher:
        printed: queue.Queue = queue.Queue()
        reader = threading.Thread(target=lambda: [printed.put(ln) for ln in watcher.stdout], daemon=True)
        reader.start()
        seen: list[str] = []

        def wait_for(text: str) -> None:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                try:
                    seen.append(printed.get(timeout=0.5))
                except queue.Empty:
                    assert watcher.poll() is None, watcher.stderr.read()
                    continue
                if text in seen[-1]:
                    return
            raise AssertionError(f"watch never printed {text!r}; last lines: {seen[-3:]}")

        with Journal.create(p, signer=Signer.generate(), flush_interval_s=0.02) as j:
            for i in range(10):
                j.append(StepObserved(step=i, loss=3.0 - i * 0.01, grad_norm=1.0, step_time_s=0.01, tokens=512))
            j.flush()
            wait_for("step 9")  # it follows the run while the run is still open
            for i in range(10, 30):
                j.append(StepObserved(step=i, loss=3.0 - i * 0.01, grad_norm=1.0, step_time_s=0.01, tokens=512))
                if i == 20:
                    j.append(AnomalyDetected(step=20, anomaly="loss_spike", value=9.0, z_score=42.0))
        assert watcher.wait(timeout=90) == 0, watcher.stderr.read()
        reader.join(30)
        while not printed.empty():
            seen.append(printed.get())
        last = seen[-1]
    assert "step 29" in last and "loss_spike at step 20" in last and "0 events after the last seal" in last


def test_watch_times_out_on_a_missing_file(tmp_path):
    r = subprocess.run([sys.executable, "-m", "trainledger", "watch", str(tmp_path / "nope.jsonl"), "--interval",
                        "0.05", "--timeout", "0.3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3


def test_a_misspelt_path_is_named_with_what_is_there(tmp_path, capsys):
    """A path that does not exist is said not to exist, with the nearest names in its folder; with --wait it is
    waited for on purpose, without it waited for with a deprecation note, and refused where waiting is off."""
    from trainledger.cli import main
    from trainledger.serve.app import _wait_for_journal
    from trainledger.journal.errors import UsageError
    from trainledger.training.watch import watch

    (tmp_path / "journal.jsonl").write_text("")
    typo = tmp_path / "jounral.jsonl"
    assert watch(typo, timeout=0.2, interval=0.05) == 3
    err = capsys.readouterr().err
    assert f"{typo} does not exist (did you mean {tmp_path / 'journal.jsonl'}?)" in err and "--wait" in err
    assert "deprecated" in err
    assert main(["watch", str(typo), "--wait", "--timeout", "0.2"]) == 3
    err = capsys.readouterr().err
    assert err.startswith(f"waiting for {typo} to hold a journal (did you mean") and "deprecated" not in err
    assert watch(typo, wait=False) == 2
    assert "no such file or folder (did you mean" in capsys.readouterr().out
    with pytest.raises(UsageError, match="no such file or folder .did you mean"):
        _wait_for_journal(typo, wait=False)


def test_watch_checks_signatures_under_a_pinned_key(tmp_path, signer, keypair):
    """With --pubkey every seal is checked as it is read; a journal re-signed by another key stops the view."""
    from trainledger.journal import Journal, Signer, StepObserved
    from trainledger.cli import main

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        for i in range(5):
            j.append(StepObserved(step=i, loss=1.0))
    r = subprocess.run([sys.executable, "-m", "trainledger", "watch", str(p), "--pubkey", str(keypair[2]),
                        "--timeout", "30"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "signatures checked: key" in r.stdout
    other = Signer.generate()
    q = tmp_path / "other.jsonl"
    with Journal.create(q, signer=other, background=False) as j:
        j.append(StepObserved(step=0, loss=1.0))
    assert main(["watch", str(q), "--pubkey", str(keypair[2]), "--timeout", "5"]) == 1  # not the pinned key
    # A step rewritten and the chain recomputed: only the signatures can tell.
    from journal_tools import read_lines, rechain, write_lines

    lines = read_lines(p)
    lines[3] = lines[3].replace(b'"loss":1.0', b'"loss":0.5')
    bad = tmp_path / "bad.jsonl"
    write_lines(bad, rechain(lines))
    first_seal = next(k for k, ln in enumerate(lines) if b'"kind":"seal"' in ln and k > 3)
    r = subprocess.run([sys.executable, "-m", "trainledger", "watch", str(bad), "--pubkey", str(keypair[2]),
                        "--timeout", "30"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "FAIL" in r.stdout and f"seq {first_seal}" in r.stdout
    # Without a key the chain is still checked and the view says signatures were not.
    r = subprocess.run([sys.executable, "-m", "trainledger", "watch", str(bad), "--timeout", "30"],
                       capture_output=True, text=True, timeout=60, env={**__import__("os").environ,
                                                                          "TRAINLEDGER_TRUSTED_KEYS": ""})
    assert r.returncode == 0 and "signatures NOT checked" in r.stdout


def _watch_in_thread(path, **kw):
    import io
    import threading

    from trainledger.training.watch import watch

    buf, result = io.StringIO(), {}
    t = threading.Thread(target=lambda: result.setdefault("code", watch(path, out=buf, **kw)), daemon=True)
    t.start()
    return t, buf, result


def test_watch_survives_an_honest_crash_and_repair(tmp_path, signer):
    """watch read a torn last line; open_append moves it aside and the run goes on: no FAIL."""
    from conftest import step

    from trainledger.journal import Journal

    p = tmp_path / "j.jsonl"
    j = Journal.create(p, signer=signer, background=False)
    for i in range(20):
        j.append(step(i))
    j.suspend()
    with open(p, "ab") as f:
        f.write(b'{"kind":"step_observed","step":20,"lo')  # the crash tore this line mid-write
    t, buf, result = _watch_in_thread(p, interval=0.05, timeout=30)
    deadline = time.monotonic() + 20  # handshake: watch has shown step 19, so it has read the torn bytes too
    while "step 19" not in buf.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "step 19" in buf.getvalue()
    with Journal.open_append(p, signer=signer, background=False) as j:
        for i in range(20, 25):
            j.append(step(i))
    t.join(30)
    assert result.get("code") == 0, buf.getvalue()
    assert "reading it again" in buf.getvalue() and "FAIL" not in buf.getvalue()


def test_watch_timeout_holds_during_a_long_interval(tmp_path, signer):
    from trainledger.journal import Journal

    p = tmp_path / "j.jsonl"
    Journal.create(p, signer=signer, background=False).suspend()  # a run that never closes
    t0 = time.monotonic()
    t, buf, result = _watch_in_thread(p, interval=600, timeout=0.5)
    t.join(60)
    assert result.get("code") == 3 and time.monotonic() - t0 < 60  # the timeout ended it, not the 600 s interval


def test_watch_memory_stays_flat_in_journal_size(tmp_path, signer):
    """Following a 36 MB journal must not hold it in memory (607 MB for 95 MB before: over 200 MB here)."""
    from conftest import step

    from trainledger.journal import Journal

    p = tmp_path / "big.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        for i in range(150_000):
            j.append(step(i))
    assert p.stat().st_size > 33e6
    # VmHWM, not ru_maxrss: on Linux ru_maxrss survives exec, so a child would report the test runner's peak.
    probe = ("import sys; from trainledger.training.watch import watch; import io; "
             "code = watch(sys.argv[1], out=io.StringIO(), interval=0.05, timeout=60); "
             "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM')); "
             "print(code, int(hwm.split()[1]) // 1024)")
    proc = subprocess.run([sys.executable, "-c", probe, str(p)], capture_output=True, text=True, timeout=120)
    code, peak_mb = map(int, proc.stdout.split())
    assert code == 0 and peak_mb < 120, (peak_mb, proc.stderr)


def test_watch_interval_must_be_finite(tmp_path, signer, capsys):
    from trainledger.journal import Journal
    from trainledger.cli import main

    p = tmp_path / "j.jsonl"
    Journal.create(p, signer=signer, background=False).close()
    for bad in ("inf", "nan", "0", "-1"):
        assert main(["watch", str(p), "--interval", bad]) == 2
        assert "--interval" in capsys.readouterr().err


def test_watch_json_prints_one_object_a_change_and_its_failure_as_json(tmp_path, signer, keypair, capsys):
    """``watch --json``: stdout holds JSON lines only (the view's fields as numbers, NaN spelt as the journal spells
    it), the last one the closed run's; a tampered journal ends with one object saying where it broke."""
    import json

    from journal_tools import read_lines, rechain, write_lines

    from trainledger.cli import main
    from trainledger.journal import Journal, StepObserved

    p = tmp_path / "j.jsonl"
    with Journal.create(p, signer=signer, background=False) as j:
        for i in range(5):
            j.append(StepObserved(step=i, loss=2.0 - i * 0.1, grad_norm=float("nan") if i == 4 else 1.0, tokens=64,
                                  step_time_s=0.01))
    assert main(["watch", str(p), "--pubkey", str(keypair[2]), "--json", "--timeout", "30", "--interval",
                 "0.05"]) == 0
    out, err = capsys.readouterr()
    objs = [json.loads(x) for x in out.splitlines()]
    assert objs and objs[-1]["closed"] is True and objs[-1]["step"] == 4 and objs[-1]["grad_norm"] == "NaN"
    assert objs[-1]["not_signed_yet"] == 0 and objs[-1]["path"] == str(p) and objs[-1]["tokens_per_s"] > 0
    assert "watching" in err and "signatures checked" in objs[-1]["trust"]
    lines = read_lines(p)
    lines[3] = lines[3].replace(b'"loss":1.9', b'"loss":0.5')
    assert b'"loss":0.5' in lines[3]
    bad = tmp_path / "bad.jsonl"
    write_lines(bad, rechain(lines))
    assert main(["watch", str(bad), "--pubkey", str(keypair[2]), "--json", "--timeout", "30"]) == 1
    last = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert last["ok"] is False and last["exit_code"] == 1 and last["first_bad_seq"] > 3 and last["path"] == str(bad)
