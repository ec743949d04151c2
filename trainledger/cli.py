"""The ``trainledger`` command: the journal's commands plus the training side's and the ladder's, each package
registering its own (``register(sub)`` in ``journal/cli.py``, ``training/cli.py``, ``ladder/cli.py``). Nothing here
imports torch: the torch-side commands import it when they run.
"""

from __future__ import annotations

import os
import signal
import sys


def _interrupted_at_startup(*_: object) -> None:
    """Ctrl-C before a command has started: nothing to clean up, one line, exit 130 (never a traceback)."""
    sys.stderr.write("trainledger: interrupted\n")
    sys.stderr.flush()
    os._exit(130)


if os.path.basename(sys.argv[0]) in ("trainledger", "__main__.py"):  # the console script, python -m trainledger
    signal.signal(signal.SIGINT, _interrupted_at_startup)

import argparse  # noqa: E402
from collections.abc import Sequence  # noqa: E402

from trainledger.journal import cli as _journal_cli  # noqa: E402
from trainledger.ladder import cli as _ladder_cli  # noqa: E402
from trainledger.training import cli as _training_cli  # noqa: E402

__all__ = ["build_parser", "main", "entry"]


def build_parser() -> argparse.ArgumentParser:
    parser, sub = _journal_cli.new_parser()
    for package in (_journal_cli, _training_cli, _ladder_cli):
        package.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``trainledger`` command; return its exit code (0 ok, 1 integrity, 2 usage or I/O, 130 Ctrl-C)."""
    return _journal_cli.main(argv, parser=build_parser())


def entry() -> None:
    """The console script: from here on Ctrl-C is a KeyboardInterrupt that each command handles."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _journal_cli.entry(main)
