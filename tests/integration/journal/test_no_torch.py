"""The journal package and its CLI work on an auditor's machine without torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

#: the first lines of each script: torch cannot be imported after them
BLOCK_TORCH = textwrap.dedent(r"""
    import importlib.abc, sys

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is not installed here (blocked by the test)")
            return None

    sys.meta_path.insert(0, NoTorch())
""")

SCRIPT = BLOCK_TORCH + textwrap.dedent(r"""
    import tempfile, os
    import trainledger.journal
    from trainledger.cli import main

    d = tempfile.mkdtemp()
    run = os.path.join(d, "run")
    assert main(["demo", run, "--steps", "50"]) == 0
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

    from manifest_fixtures import base, typed

    d = base()
    d["artifacts"]["config"] = typed(base()).artifacts.config
    env = dict(os.environ, TL_TEST_MANIFEST=json.dumps(d))
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "TORCH_MODULES []" in out.stdout


def test_importing_journal_does_not_import_torch_even_when_installed():
    code = "import sys, trainledger.journal, trainledger.cli.journal, trainledger.journal.verify; print(any(m.startswith('torch') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


#: the modules that train (or build what trains): the only ones that may import torch when imported
TRAINS = ["trainledger.ladder.pieces", "trainledger.ladder.runner", "trainledger.training.checkpoints.state",
          "trainledger.training.distributed.loop", "trainledger.training.experiment.loop",
          "trainledger.training.experiment.preflight", "trainledger.training.integrations.hf",
          "trainledger.training.integrations.lightning", "trainledger.training.recorder",
          "trainledger.training.reference.corpus", "trainledger.training.reference.loop",
          "trainledger.training.reference.model"]

EVERY_MODULE = BLOCK_TORCH + textwrap.dedent(r"""
    import importlib, pkgutil
    mods = ["trainledger", "trainledger.audit", "trainledger.cli", "trainledger.report"]

    def walk(name):
        pkg = importlib.import_module(name)
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.name.startswith("_fast"):  # the accelerators (C), each optional
                mods.append(f"{name}.{info.name}")
                if info.ispkg:
                    walk(f"{name}.{info.name}")

    for p in ("trainledger.journal", "trainledger.training", "trainledger.ladder"):
        walk(p)
    failed = []
    for m in mods:
        try:
            importlib.import_module(m)
        except ImportError:
            failed.append(m)
    print("MODULES", len(mods))
    print("NEED_TORCH", " ".join(sorted(failed)))
""")


def test_every_fold_and_reading_module_imports_without_torch():
    """Torch-free is a property of modules: with torch blocked, every module imports except the ones that train
    (every fold, every audit module, the report, watch, interop and the CLI among those that do)."""
    out = subprocess.run([sys.executable, "-c", EVERY_MODULE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    assert int(lines["MODULES"]) > 60
    assert lines["NEED_TORCH"].split() == sorted(TRAINS)
