"""The journal's tests again in a subprocess with the C accelerator switched off (``TRAINLEDGER_NO_ACCEL=1``): the
pure-Python path writes and checks the same bytes."""

from __future__ import annotations

import os
import subprocess
import sys

from trainledger.journal import accel as _accel


def test_pure_python_path_passes_the_journal_tests():
    """The attack, property, tree, proof, health-reference and shared-worker tests again, with the accelerator
    switched off."""
    env = dict(os.environ, TRAINLEDGER_NO_ACCEL="1")
    code = "import trainledger.journal.accel as a; print(a.describe())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "pure Python" in out.stdout
    root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))  # tests/
    tests = [os.path.join(root, f) for f in ("adversarial/journal/test_attacks.py", "unit/journal/test_properties.py",
                                             "unit/journal/test_writer.py", "unit/journal/test_tree_heads.py",
                                             "unit/journal/test_proofs.py", "unit/journal/test_health_reference.py",
                                             "integration/journal/test_rundir_workers.py")]
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    assert _accel.fast is not None  # this process uses the accelerator
