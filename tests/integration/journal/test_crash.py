"""Crash tests: a writer process killed with SIGKILL at random moments, then reopened.

After every kill: verify reports no tampering (the tail is open or torn), every
head that a durable seal returned before the kill is still in the journal,
and the next writer's ``open_append`` repairs a torn tail and continues the
chain. Some trials also cut the file at a random byte after the last durable
seal, standing in for a machine that lost its page cache.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from trainledger.journal import IntegrityError, Journal, read_events, verify


CHILD = r"""
import sys, os, time
from trainledger.journal import Journal, StepObserved, load_signer
path, key, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
signer = load_signer(key)
if first:
    j = Journal.create(path, signer=signer, run_id="crash", seal_every=37, flush_interval_s=0.002)
else:
    j = Journal.open_append(path, signer=signer, seal_every=37, flush_interval_s=0.002)
print("READY", flush=True)
i = 0
while True:
    j.append(StepObserved(step=i, loss=1.0 / (i + 1), grad_norm=0.5, lr=3e-4, tokens=1024))
    i += 1
    if i % 10 == 0:
        time.sleep(0.0005)  # a few thousand events a second: the journal stays small across trials
    if i % 97 == 0:
        seq, h = j.seal(durable=True) or j.head
        print(f"DURABLE {seq}:{h} {os.path.getsize(path)}", flush=True)
"""


@pytest.mark.parametrize("trials", [10, pytest.param(50, marks=pytest.mark.slow)])
def test_sigkill_at_random_moments(tmp_path, keypair, rng, trials):
    _, priv, _ = keypair
    pub = keypair[0].public
    path = tmp_path / "crash.jsonl"
    heads: list[str] = []
    cuts = 0
    for trial in range(trials):
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path), str(priv), "1" if trial == 0 else "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = proc.stdout.readline()
        assert ready.startswith("READY"), proc.stderr.read()
        seen = []
        if trial % 2 == 0:
            # Every other trial is killed only after the child said a seal is durable (a handshake, not a sleep:
            # a loaded machine slows the child, never this), at a random moment after that.
            line = proc.stdout.readline()
            assert line.startswith("DURABLE"), (line, proc.stderr.read() if not line else "")
            seen.append(line)
        time.sleep(rng.uniform(0.0, 0.08))
        proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == -signal.SIGKILL, err
        durable = [line.split() for line in [*seen, *out.splitlines()] if line.startswith("DURABLE")]
        if durable:
            heads.append(durable[-1][1])
        # Sometimes lose the unsynced tail too, as a power cut would, tearing a line.
        if durable and rng.random() < 0.3:
            synced = int(durable[-1][2])
            size = path.stat().st_size
            if size > synced + 1:
                os.truncate(path, rng.randrange(synced + 1, size))
                cuts += 1
        try:
            r = verify(path, keys=[pub], allow_unsealed=True)
        except IntegrityError as e:  # a crash must never look like tampering
            pytest.fail(f"trial {trial}: verify reported {type(e).__name__}: {e}")
        assert r.tail in ("open", "torn")
        for h in heads[-3:]:  # every durable head survives (older ones are checked at the end)
            verify(path, keys=[pub], expect_head=h, allow_unsealed=True)

    with Journal.open_append(path, signer=keypair[0], background=False) as j:
        j.append(read_last_step_like())
    final = verify(path, keys=[pub], require_closed=True)
    for h in heads:
        verify(path, keys=[pub], expect_head=h)
    repaired = sum(1 for e in read_events(path) if type(e).__struct_config__.tag == "tail_repaired")
    assert len(heads) >= trials // 2  # every other trial waited for a durable seal before the kill
    assert final.tail == "closed"
    assert repaired >= cuts  # every cut that tore a line was moved aside and recorded
    print(f"trials={trials} durable_heads={len(heads)} cuts={cuts} tail_repaired={repaired} events={final.events}")


def read_last_step_like():
    from conftest import step

    return step(0)
