"""The journal package and its CLI work on an auditor's machine without torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(r"""
    import importlib.abc, sys, tempfile, os

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is not installed here (blocked by the test)")
            return None

    sys.meta_path.insert(0, NoTorch())
    import trainledger.journal
    from trainledger.cli import main

    d = tempfile.mkdtemp()
    run = os.path.join(d, "run")
    assert main(["demo", "--out", run, "--steps", "50"]) == 0
    j, pub = os.path.join(run, "journal.jsonl"), os.path.join(run, "trainledger.pub")
    assert main(["keygen", os.path.join(d, "keys")]) == 0
    assert main(["verify", j, "--pubkey", pub, "--require-closed"]) == 0
    assert main(["head", j, "--pubkey", pub]) == 0
    assert main(["show", j]) == 0
    assert main(["replay", j, "--pubkey", pub]) == 0
    assert main(["query", "--pubkey", pub, j, "SELECT count(*) FROM steps"]) == 0
    # Manifests validate on an auditor's machine too (the example itself is written where torch is).
    man = os.path.join(d, "m.json")
    with open(man, "w") as f:
        f.write(os.environ["TL_TEST_MANIFEST"])
    assert main(["manifest", "validate", man]) == 0
    assert main(["manifest", "id", man]) == 0
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("the blocker did not work")
    loaded = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
    print("TORCH_MODULES", loaded)
    sys.exit(0 if not loaded else 3)
""")


def test_journal_and_cli_run_without_torch():
    import json
    import os

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "training"))
    from manifest_fixtures import base, typed

    d = base()
    d["artifacts"]["config"] = typed(base()).artifacts.config
    env = dict(os.environ, TL_TEST_MANIFEST=json.dumps(d))
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "TORCH_MODULES []" in out.stdout


def test_importing_journal_does_not_import_torch_even_when_installed():
    code = "import sys, journal, journal.cli, journal.verify; print(any(m.startswith('torch') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
