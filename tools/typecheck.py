"""mypy over trainledger, with the settings in pyproject.toml ([tool.mypy]).

mypy resolves ``trainledger.journal`` by looking for a folder of that name, which the repository does not have
(setuptools' package-dir installs ``journal/`` under ``trainledger``): this builds that folder as links in a
temporary directory and runs mypy there, reporting paths as the repository has them.

    .venv/bin/python tools/typecheck.py           # the format core (journal/*.py): exit 1 on any error
    .venv/bin/python tools/typecheck.py --all     # every package; the ignore list in pyproject.toml applies
    .venv/bin/python tools/typecheck.py --all --count   # errors per file with the ignore list lifted (its size)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _view(where: Path) -> Path:
    """``where/trainledger``: the face's files, with ``journal``, ``training`` and ``ladder`` linked in."""
    pkg = where / "trainledger"
    pkg.mkdir()
    for item in (ROOT / "src" / "trainledger").iterdir():
        if item.name != "__pycache__":
            (pkg / item.name).symlink_to(item)
    for name in ("journal", "training", "ladder"):
        (pkg / name).symlink_to(ROOT / name)
    return where


def core_modules() -> list[str]:
    """The format core: the journal package's own files."""
    return ["trainledger.journal"] + sorted(f"trainledger.journal.{p.stem}" for p in (ROOT / "journal").glob("*.py")
                                            if p.stem != "__init__")


def run(all_packages: bool = False, count: bool = False) -> tuple[int, str]:
    """mypy's exit status and its output, paths as in the repository."""
    with tempfile.TemporaryDirectory(prefix="tl-mypy-") as d:
        view = _view(Path(d))
        args = [sys.executable, "-m", "mypy", "--cache-dir", str(Path(d) / "cache"), "--show-error-codes"]
        if count:  # pyproject's settings but not its ignore list: what the list hides
            args += ["--config-file", os.devnull, "--ignore-missing-imports", "--follow-imports=silent",
                     "--python-version", "3.11"]
        else:
            args += ["--config-file", str(ROOT / "pyproject.toml")]
        if all_packages:
            args += ["-p", "trainledger"]
        else:
            for m in core_modules():
                args += ["-m", m]
        p = subprocess.run(args, cwd=view, capture_output=True, text=True)
    out = p.stdout.replace("trainledger/journal/", "journal/").replace("trainledger/training/", "training/") \
        .replace("trainledger/ladder/", "ladder/")
    return p.returncode, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="every package (the ignore list in pyproject.toml applies)")
    ap.add_argument("--count", action="store_true", help="with --all: errors per file, the ignore list lifted")
    args = ap.parse_args(argv)
    code, out = run(args.all, args.count)
    if args.count:
        per: dict[str, int] = {}
        for line in out.splitlines():
            if ": error:" in line:
                f = line.split(":", 1)[0]
                per[f] = per.get(f, 0) + 1
        for f, n in sorted(per.items(), key=lambda kv: -kv[1]):
            print(f"{n:5}  {f}")
        print(f"{sum(per.values())} errors in {len(per)} files with the ignore list lifted")
        return 0
    sys.stdout.write(out)
    return code


if __name__ == "__main__":
    sys.exit(main())
