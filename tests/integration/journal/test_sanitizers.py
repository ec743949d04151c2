"""The C accelerators, one per layer (``journal/_fast.c``, ``journal/views/_fastcols.c``,
``training/health/_fastfolds.c``), built with AddressSanitizer and UndefinedBehaviorSanitizer
(``-fsanitize=address,undefined``, no recovery) and their property tests run against those builds in a child
process: the chain and block scan, the step-line template and its columns, the Merkle tree, the writer core and
the detectors' step, each held to its Python twin. A read past a buffer, a use after free, a signed overflow or a
misaligned load aborts the child, and this test fails with the sanitizer's report.

The sanitized extensions are put in front of the installed ones through a package view (the checkout linked file
by file, every built extension left out and the sanitized ones copied in), and the sanitizers' runtimes are
preloaded into the interpreter, which was not built with them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
GCC = shutil.which("gcc")
#: the tests that drive every C entry point against its Python twin
PROPERTY_TESTS = ["tests/unit/journal/test_accel.py", "tests/unit/journal/test_step_lines.py",
                  "tests/unit/journal/test_lines.py", "tests/unit/journal/test_export_columns.py",
                  "tests/unit/journal/test_tree_heads.py", "tests/unit/journal/test_chainbuffer.py",
                  "tests/unit/training/test_fold_steps.py"]

pytestmark = pytest.mark.skipif(GCC is None, reason="no C compiler")


def _runtime(name: str) -> str:
    p = subprocess.run([GCC, f"-print-file-name={name}"], capture_output=True, text=True, check=True).stdout.strip()
    if not os.path.isabs(p) or not Path(p).is_file():
        pytest.skip(f"gcc has no {name}")
    return p


#: each accelerator: its source, and where its build goes in the package
EXTENSIONS = {"journal/_fast.c": "journal/_fast", "journal/views/_fastcols.c": "journal/views/_fastcols",
              "training/health/_fastfolds.c": "training/health/_fastfolds"}


def _mirror(src: Path, dst: Path) -> None:
    """``dst`` as ``src`` with every file linked, but no compiled extension and no bytecode."""
    dst.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.name == "__pycache__" or item.suffix == ".so":
            continue
        if item.is_dir():
            _mirror(item, dst / item.name)
        else:
            (dst / item.name).symlink_to(item)


def _view(where: Path, built: dict[str, Path]) -> Path:
    """A folder whose ``trainledger`` is this checkout's, with the sanitized extensions as its accelerators."""
    pkg = where / "trainledger"
    _mirror(ROOT / "src" / "trainledger", pkg)
    for name in ("journal", "training", "ladder"):
        _mirror(ROOT / name, pkg / name)
    for src, ext in built.items():
        shutil.copy(ext, pkg / (EXTENSIONS[src] + sysconfig.get_config_var("EXT_SUFFIX")))
    return where


def test_the_accelerator_is_clean_under_address_and_undefined_behaviour_sanitizers(tmp_path):
    asan, ubsan = _runtime("libasan.so"), _runtime("libubsan.so")
    built = {}
    for src in EXTENSIONS:
        ext = built[src] = tmp_path / (Path(src).stem + ".so")
        build = subprocess.run(
            [GCC, "-shared", "-fPIC", "-O1", "-g", "-fno-omit-frame-pointer", "-ffp-contract=off",
             "-fsanitize=address,undefined", "-fno-sanitize-recover=all", f"-I{sysconfig.get_paths()['include']}",
             str(ROOT / src), "-o", str(ext), "-lcrypto", "-lm"],
            capture_output=True, text=True, timeout=300)
        assert build.returncode == 0, src + ": " + build.stderr[-3000:]
        symbols = subprocess.run(["nm", "-D", str(ext)], capture_output=True, text=True).stdout \
            if shutil.which("nm") else "__asan_report __ubsan_handle"
        assert "__asan_report" in symbols and "__ubsan_handle" in symbols, src  # the build is instrumented
    view = _view(tmp_path / "view", built)
    env = dict(os.environ, PYTHONPATH=str(view), LD_PRELOAD=f"{asan}:{ubsan}",
               # the interpreter's own allocations are not the extension's: leaks are not checked, errors abort
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1")
    env.pop("TRAINLEDGER_NO_ACCEL", None)
    check = ("import trainledger.journal.accel as a; "
             "mods = [a.load(m) for m in ('trainledger.journal._fast', 'trainledger.journal.views._fastcols', "
             "'trainledger.training.health._fastfolds')]; "
             "assert None not in mods, mods; print(*(m.__file__ for m in mods))")
    which = subprocess.run([sys.executable, "-c", check], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
    assert which.returncode == 0 and which.stdout.count(str(view)) == 3, which.stdout + which.stderr[-3000:]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *PROPERTY_TESTS],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    out = run.stdout + run.stderr
    assert run.returncode == 0 and " passed" in run.stdout, out[-6000:]
    assert "runtime error:" not in out and "ERROR: AddressSanitizer" not in out, out[-6000:]
