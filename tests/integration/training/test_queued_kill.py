"""The loop's queued calls (``Recorder.step``, ``Recorder.log``, ``wandb.log``) reach the disk within the journal's
flush interval without any further call from the loop: a process SIGKILLed after that loses none of them, and its
journal verifies (open tail) and goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

CHILD = textwrap.dedent('''
    import sys, time
    import torch
    which, folder = sys.argv[1], sys.argv[2]
    if which == "recorder":
        from trainledger.training import Recorder
        model = torch.nn.Linear(2, 1)
        rec = Recorder(folder, model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        for step in range(50):
            rec.step(step, 1.0 / (step + 1), grad_norm=0.5, lr=0.1)
            rec.log({"acc": step / 50})
    else:
        import trainledger as wandb
        wandb.init(project="p", name="killed", dir=folder)
        for step in range(50):
            wandb.log({"loss": 1.0 / (step + 1), "acc": step / 50})
    print("LOGGED", flush=True)
    time.sleep(600)  # the loop is busy elsewhere (an eval, a data stall): nothing else touches the journal
''')


@pytest.mark.parametrize("which", ["recorder", "wandb"])
def test_queued_steps_and_rows_survive_a_kill_after_the_flush_interval(tmp_path, which):
    from trainledger.journal import load_public_key, read_events, verify

    env = {**os.environ, "TRAINLEDGER_KEY_DIR": str(tmp_path / "keys")}
    (tmp_path / "child.py").write_text(CHILD)
    folder = tmp_path / "run"
    p = subprocess.Popen([sys.executable, "child.py", which, str(folder)], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "LOGGED", p.stderr.read()
        journal = next(folder.rglob("journal.jsonl"))
        deadline = time.monotonic() + 120  # the flush interval is 1 s; a loaded machine may take longer, never fail
        while b'"step":49' not in journal.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        p.send_signal(signal.SIGKILL)
        p.communicate()
    key = load_public_key(journal.parent / "trainledger.pub")
    r = verify(journal, keys=[key], allow_unsealed=True)
    assert r.ok and r.tail == "open"
    events = list(read_events(journal))  # every line on disk: chained and checked by verify above
    rows = [e for e in events if type(e).__struct_config__.tag == "metrics_logged"]
    assert [e.metrics["acc"] for e in rows] == [s / 50 for s in range(50)]
    if which == "recorder":
        steps = [e.step for e in events if type(e).__struct_config__.tag == "step_observed"]
        assert steps == list(range(50))
