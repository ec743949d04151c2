"""Memory that stays flat as a run grows: replay of a journal 6x longer peaks at the same resident size (one pass,
no private copy, bounded detector histories), and the live monitor's detectors hold their window plus the resume
horizon however many steps it has seen."""

from __future__ import annotations

import json
import random
import subprocess
import sys

from trainledger.journal import Journal
from trainledger.training.health.detectors import RESUME_HORIZON
from trainledger.training.health.monitor import TrainingHealthMonitor

_REPLAY = r"""
import json, re, sys
from trainledger.audit import replay
from trainledger.journal import load_public_key
rec = replay(sys.argv[1], keys=[load_public_key(sys.argv[2])])
assert rec.ok
hwm = int(re.search(r"VmHWM:\s+(\d+)", open("/proc/self/status").read()).group(1))
wchar = int(re.search(r"wchar:\s+(\d+)", open("/proc/self/io").read()).group(1))
print(json.dumps({"steps": rec.health["steps"], "hwm_kb": hwm, "wchar": wchar}))
"""


def _journal(path, signer, n):
    rng = random.Random(0)
    with Journal.create(path, signer=signer, background=False) as j:
        m = TrainingHealthMonitor(journal=j, peak_flops_per_sec=1e12)
        for i in range(n):
            m.observe_step(i, 2.0 + 3.0 * (1 + i / 50) ** -0.5 + rng.gauss(0, 0.02),
                           grad_norm=0.8 + abs(rng.gauss(0, 0.05)), step_time_s=0.25, tokens=4096)
    return m


def test_replay_and_the_monitor_hold_their_memory_flat_as_the_run_grows(tmp_path, signer):
    pub = tmp_path / "k.pub"
    pub.write_text(signer.public.line() + "\n")
    got = {}
    for n in (20_000, 120_000):
        p = tmp_path / f"j{n}.jsonl"
        m = _journal(p, signer, n)
        for det in (m._proj._loss, m._proj._grad):  # the live monitor: window + horizon, never every value
            assert len(det.base._values) <= det.base.trim_at and len(det.base._steps) == len(det.base._values)
        if n > 2 * RESUME_HORIZON:
            assert len(m._proj._loss.base._values) < 2 * RESUME_HORIZON < n
        out = subprocess.run([sys.executable, "-c", _REPLAY, str(p), str(pub)], capture_output=True, text=True,
                             check=True)
        got[n] = json.loads(out.stdout)
        assert got[n]["steps"] == n
        assert got[n]["wchar"] < 1 << 20  # no private copy of the journal: what it writes is its one line of output
    grew = got[120_000]["hwm_kb"] - got[20_000]["hwm_kb"]
    # 100,000 more steps: before, about 12 MB more (every value kept, ~121 bytes a step) and a full copy written
    assert grew < 3 * 1024, got
