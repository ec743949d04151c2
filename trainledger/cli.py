"""The ``trainledger`` command: the journal's commands plus the training side's and the ladder's, each package
registering its own (``register(sub)`` in ``journal/cli.py``, ``training/cli.py``, ``ladder/cli.py``). Nothing here
imports torch: the torch-side commands import it when they run.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from trainledger.journal import cli as _journal_cli
from trainledger.ladder import cli as _ladder_cli
from trainledger.training import cli as _training_cli

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
    """The console script."""
    _journal_cli.entry(main)
