"""Paths recorded in a journal resolve inside the run folder, or are refused.

A checkpoint's ``path``, an evaluation's file, a manifest's data ref: anything a journal (or a manifest) names
is relative to a root the caller chose, and nothing it says may make a command read, write or delete a file
outside that root: absolute paths, ``..`` and links that lead out are all refused.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from .errors import UnsafePath

__all__ = ["confined"]


def confined(root: str | os.PathLike, rel: str, *, what: str = "path") -> Path:
    """``root / rel`` when that stays inside ``root`` (links followed); raise :class:`UnsafePath` otherwise."""
    if not isinstance(rel, str) or not rel or "\0" in rel or "\\" in rel:
        raise UnsafePath(f"{what} {rel!r}: not a plain relative path")
    pure = PurePosixPath(rel)
    if pure.is_absolute() or ".." in pure.parts:
        raise UnsafePath(f"{what} {rel!r}: leads outside {root}")
    base = Path(root).resolve()
    target = (base / pure).resolve()
    if target != base and base not in target.parents:
        raise UnsafePath(f"{what} {rel!r}: resolves to {target}, outside {base}")
    return target
