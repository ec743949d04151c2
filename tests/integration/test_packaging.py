"""The package installs as trainledger.*: no bare `import journal`, tests from any folder, a wheel that works
beside a user's own journal/ and training/ folders."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BARE = re.compile(r"^\s*(from|import)\s+(journal|training|ladder)\b|-m\s*\"?,?\s*\"?(journal|training|ladder)\.", re.M)


def test_no_bare_imports_of_the_project_folders():
    """The lint rule: every import names trainledger.journal / .training / .ladder (or is relative)."""
    offenders = []
    for folder in ("src", "journal", "training", "ladder", "tests", "tools"):
        for p in (ROOT / folder).rglob("*.py"):
            for m in BARE.finditer(p.read_text()):
                offenders.append(f"{p.relative_to(ROOT)}:{p.read_text()[:m.start()].count(chr(10)) + 1}")
    assert offenders == []


def _shadows(d: Path) -> None:
    """A user's own journal/ and training/ packages, which break loudly if anything imports them."""
    for name in ("journal", "training", "ladder"):
        (d / name).mkdir()
        (d / name / "__init__.py").write_text(f"raise ImportError('the user\\'s own {name}/ was imported')\n")


def test_the_suite_runs_from_another_folder(tmp_path):
    _shadows(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "unit" / "journal" / "test_codec.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


DOC_EXAMPLES = textwrap.dedent(r"""
    import os, re, sys, tempfile
    import trainledger
    assert trainledger.Journal.__module__ == "trainledger.journal.writer", trainledger.Journal.__module__
    assert "site-packages" in trainledger.__file__ and os.environ["TL_ROOT"] not in trainledger.__file__
    from trainledger import Journal, StepObserved, keygen, load_signer, verify
    d = tempfile.mkdtemp()
    keygen(os.path.join(d, "keys"))
    signer = load_signer(os.path.join(d, "keys", "trainledger.key"))
    with Journal.create(os.path.join(d, "j.jsonl"), signer=signer, meta={"model": "gpt-tiny"}) as journal:
        for step in range(10):
            journal.append(StepObserved(step=step, loss=3.0 - step * 0.1, grad_norm=1.0, tokens=64))
    assert verify(os.path.join(d, "j.jsonl"), keys=[signer.public], require_closed=True).events == 14
    text = open(os.path.join(os.environ["TL_ROOT"], "docs", "monitor.md")).read()
    block = re.search(r"<!-- example:monitor -->\s*```python\n(.*?)```", text, re.S).group(1)
    scope = {}
    exec(compile(block, "docs/monitor.md (monitor example)", "exec"), scope)
    assert scope["monitor"].report()["steps"] == 5
    print("DOC EXAMPLES OK")
""")


def test_wheel_works_beside_folders_named_journal_and_training(tmp_path):
    dist = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(ROOT)], check=True, capture_output=True, timeout=600)
    wheel = next(dist.glob("trainledger-*.whl"))
    venv = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True, timeout=300)
    work = tmp_path / "project"
    work.mkdir()
    _shadows(work)
    # The dependencies (msgspec, cryptography, duckdb, torch, ...) come from this environment's site-packages,
    # put on the path as a plain folder: its editable-install hook is not run, so trainledger is the wheel's.
    env = dict(os.environ, PYTHONPATH=sysconfig.get_paths()["purelib"], TL_ROOT=str(ROOT))
    proc = subprocess.run([str(py), "-c", DOC_EXAMPLES], cwd=work, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "DOC EXAMPLES OK" in proc.stdout, proc.stderr[-3000:]
    cli = subprocess.run([str(venv / "bin" / "trainledger"), "demo", "--out", str(work / "run"), "--steps", "50"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0 and "OK" in cli.stdout, cli.stderr[-3000:]
    # From the repository root, nothing shadows the installed package (the face lives in src/): the wheel's
    # trainledger imports there, and the tests run there against a plain (not editable) install.
    here = subprocess.run([str(py), "-c", "import trainledger, trainledger.journal.writer; print(trainledger.__file__)"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert here.returncode == 0 and str(venv) in here.stdout, here.stderr[-3000:]
    tests = subprocess.run([str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "tests/unit/journal/test_codec.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=300)
    assert tests.returncode == 0 and " passed" in tests.stdout, tests.stdout[-2000:] + tests.stderr[-2000:]


def test_every_error_trainledger_raises_has_one_root():
    """One root, TrainledgerError, for the three packages; each class knows its exit code (1 or 2)."""
    import importlib
    import pkgutil

    import trainledger
    from trainledger import TrainledgerError

    for sub in ("journal", "training", "ladder"):
        pkg = importlib.import_module(f"trainledger.{sub}")
        for info in pkgutil.iter_modules(pkg.__path__):
            if not info.name.startswith("_fast"):  # the accelerators (C), each optional
                importlib.import_module(f"trainledger.{sub}.{info.name}")

    def walk(cls):
        for c in cls.__subclasses__():
            yield c
            yield from walk(c)

    ours = {c for c in walk(Exception) if c.__module__.startswith("trainledger.")}
    assert len(ours) > 20
    strays = sorted(c.__qualname__ for c in ours if not issubclass(c, TrainledgerError))
    assert strays == []
    assert {c.exit_code for c in ours} <= {1, 2}
    assert trainledger.TrainledgerError is TrainledgerError
