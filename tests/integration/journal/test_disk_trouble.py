"""The operator's worst moments: the disk fills mid-run, and a script dies outside a ``with`` block."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from trainledger.journal import load_public_key, read_events, verify

DISK_FULL = textwrap.dedent(r"""
    import os, resource, signal, sys, time
    from trainledger.journal import Journal, JournalIOError, StepObserved, load_signer
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
    path, key = sys.argv[1], sys.argv[2]
    j = Journal.create(path, signer=load_signer(key), flush_interval_s=0.02, seal_interval_s=0.05)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(path) + 3000, hard))  # "the disk is full"
    appended, refused = [], 0
    for i in range(400):
        try:
            j.append(StepObserved(step=i, loss=1.0, grad_norm=1.0))
            appended.append(i)
        except JournalIOError as e:
            refused += 1
            msg = str(e)
        time.sleep(0.001)
    assert j._ticker.is_alive(), "the background thread died"
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space is back
    time.sleep(0.3)
    for i in range(400, 410):
        j.append(StepObserved(step=i, loss=1.0, grad_norm=1.0))
        appended.append(i)
    j.close()
    print("APPENDED", ",".join(map(str, appended)))
    print("REFUSED", refused)
    print("MESSAGE", msg)
""")


def test_disk_full_then_space_returns_loses_nothing_appended(tmp_path, keypair):
    signer, priv, pub = keypair
    p = tmp_path / "j.jsonl"
    proc = subprocess.run([sys.executable, "-c", DISK_FULL, str(p), str(priv)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    appended = [int(x) for x in out["APPENDED"].split(",")]
    assert int(out["REFUSED"]) >= 1, "the training thread was never told"
    assert "write failed" in out["MESSAGE"] and "kept in memory" in out["MESSAGE"]
    r = verify(p, keys=[load_public_key(pub)], require_closed=True)
    steps = [e.step for e in read_events(p) if type(e).__struct_config__.tag == "step_observed"]
    assert steps == appended and r.unsealed_events == 0  # every accepted event reached the disk, in order


def test_suspend_on_a_full_disk_releases_the_lock(tmp_path, keypair):
    signer, priv, _ = keypair
    script = textwrap.dedent(r"""
        import os, resource, signal, sys
        from trainledger.journal import Journal, JournalIOError, JournalLocked, StepObserved, load_signer
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        s = load_signer(sys.argv[2])
        j = Journal.create(sys.argv[1], signer=s, background=False)
        resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(sys.argv[1]), resource.RLIM_INFINITY))
        for i in range(5):
            j.append(StepObserved(step=i, loss=1.0))
        try:
            j.suspend()
        except JournalIOError as e:
            print("SUSPEND", e)
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        j2 = Journal.open_append(sys.argv[1], signer=s)  # not JournalLocked: the lock was released
        j2.close()
        print("REOPENED")
    """)
    p = tmp_path / "j.jsonl"
    proc = subprocess.run([sys.executable, "-c", script, str(p), str(priv)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "could not be written" in proc.stdout and "REOPENED" in proc.stdout


@pytest.mark.parametrize("how", ["exception", "plain-exit"])
def test_events_reach_the_disk_when_a_script_dies_outside_with(tmp_path, keypair, how):
    """50 steps appended, then the module raises (or just ends) without close(): none may be lost."""
    signer, priv, pub = keypair
    end = "raise RuntimeError('boom')" if how == "exception" else "pass"
    script = textwrap.dedent(f"""
        import sys
        from trainledger.journal import Journal, StepObserved, load_signer
        j = Journal.create(sys.argv[1], signer=load_signer(sys.argv[2]))
        for i in range(50):
            j.append(StepObserved(step=i, loss=1.0))
        {end}
    """)
    p = tmp_path / "j.jsonl"
    proc = subprocess.run([sys.executable, "-c", script, str(p), str(priv)], capture_output=True, text=True,
                          timeout=60)
    assert (proc.returncode != 0) == (how == "exception")
    r = verify(p, keys=[load_public_key(pub)])  # sealed at exit: no --allow-unsealed needed
    assert r.kinds["step_observed"] == 50 and r.tail == "open" and r.unsealed_events == 0
