"""The front page's examples that need a slower tier than tests/unit/test_docs.py's: one kills its process with
SIGKILL and runs the page's script again, one imports the Trainers the page's callback lines name."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from readme_blocks import README, example


def test_the_readme_recorder_example_runs_again_after_a_crash(tmp_path, monkeypatch):
    """The case the page describes: the script dies at step 14 (after the step-9 checkpoint) and is run again as
    written: the key is kept (not refused, not replaced), the run continues from the checkpoint and closes."""
    monkeypatch.chdir(tmp_path)
    code = example("readme-recorder")
    crashing = code.replace("    rec.step(step,", "    if step == 14: os.kill(os.getpid(), 9)\n    rec.step(step,", 1)
    assert crashing != code
    (tmp_path / "killed.py").write_text("import os\n" + crashing)
    (tmp_path / "again.py").write_text(code)
    died = subprocess.run([sys.executable, "killed.py"], cwd=tmp_path, capture_output=True, timeout=120)
    assert died.returncode == -9
    key = (tmp_path / "keys" / "trainledger.key").read_bytes()
    again = subprocess.run([sys.executable, "again.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "keys" / "trainledger.key").read_bytes() == key
    from trainledger.journal import load_public_key, read_events, verify

    j = tmp_path / "runs" / "mine" / "journal.jsonl"
    assert verify(j, keys=[load_public_key(tmp_path / "keys" / "trainledger.pub")], require_closed=True).ok
    resumed = [e for e in read_events(j) if type(e).__struct_config__.tag == "run_resumed"]
    assert [r.from_step for r in resumed] == [9]


def test_the_readme_callback_lines_construct_their_callbacks(tmp_path):
    """The two lines each: the import and the callback with the arguments the page gives (the Trainers themselves
    are tested in tests/integration/training/)."""
    from trainledger import keygen

    keygen(tmp_path / "keys")
    key = str(tmp_path / "keys" / "trainledger.key")
    lines = [ln for ln in example("readme-callbacks").splitlines() if ln.startswith("from ")]
    assert len(lines) == 1  # the first of the two blocks is marked; the Lightning one follows it
    text = README.read_text()
    imports = re.findall(r"^from trainledger\.training\.integrations\.(\w+) import TrainledgerCallback", text, re.M)
    assert imports == ["hf", "lightning"]
    pytest.importorskip("transformers")
    from trainledger.training.integrations.hf import TrainledgerCallback as HF

    assert HF(key=key) is not None
    pytest.importorskip("lightning")
    from trainledger.training.integrations.lightning import TrainledgerCallback as PL

    assert PL(str(tmp_path / "runs" / "mine"), key=key) is not None
