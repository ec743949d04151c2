"""Making journal strings safe to print.

A journal is data its writer chose, and so is a manifest: a run id, a rung name, a reason, a path or a key
id can hold a newline (a fake line below it), a carriage return, an ANSI escape (rewrite the screen: turn
a FAIL into an OK) or a bidirectional override (reorder what is shown). Every human-readable output passes
such values through :func:`safe`; CSV cells pass through :func:`csv_cell`, which also keeps a spreadsheet
from reading a cell as a formula. A refusal names what it refuses: :func:`first_difference` says where two JSON
documents part.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

__all__ = ["safe", "csv_cell", "trainer_step_note", "first_difference", "did_you_mean", "missing_path_note"]


def first_difference(got: Any, want: Any, same: Callable[[Any, Any], bool], where: str = "") -> str | None:
    """Where ``got`` first differs from ``want`` (JSON values: objects by sorted key, arrays item by item), as a path
    for a refusal to name (``predicate.buildDefinition.internalParameters.step``, ``energy.total_j``,
    ``runs[0]``); None when they are the same. ``same(a, b)`` compares two values that are not both objects or
    both arrays of one length; an object key on one side only, or arrays of other lengths, differ there."""
    if isinstance(want, dict) and isinstance(got, dict):
        for k in sorted(set(want) | set(got), key=str):
            if k not in got or k not in want:
                return f"{where}.{k}".lstrip(".")
            d = first_difference(got[k], want[k], same, f"{where}.{k}")
            if d is not None:
                return d
        return None
    if isinstance(want, list) and isinstance(got, list) and len(got) == len(want):
        for i, (a, b) in enumerate(zip(got, want)):
            d = first_difference(a, b, same, f"{where}[{i}]")
            if d is not None:
                return d
        return None
    if isinstance(want, list) and isinstance(got, list):  # of other lengths
        return where.lstrip(".") or "."
    return None if same(got, want) else (where.lstrip(".") or ".")


def trainer_step_note(path: str | None, step: int | None) -> str:
    """Where a checkpoint a Trainer named ``checkpoint-N`` (Hugging Face's ``global_step`` N: N optimizer steps done)
    is recorded at trainledger's step N - 1 (steps are numbered from 0: the last step done), the sentence that says
    so; else ``""``."""
    import re

    m = re.search(r"(?:^|/)checkpoint-(\d+)/?$", path or "")
    if m is None or step is None or int(m.group(1)) != step + 1:
        return ""
    return (f" (the Trainer's checkpoint-{step + 1}: trainledger numbers steps from 0, so its step {step} is the "
            f"Trainer's global_step {step + 1})")

# C0 controls (newline and tab included: a value never spans lines), DEL, C1 controls, and the Unicode
# format characters that reorder or hide text (bidi embeddings, overrides and isolates, zero-width marks).
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]")


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def safe(value: Any) -> str:
    """``str(value)`` with every control and text-reordering character written as a visible escape."""
    s = value if isinstance(value, str) else str(value)
    return _UNSAFE.sub(_escape, s) if _UNSAFE.search(s) else s


_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> Any:
    """A CSV cell: strings that a spreadsheet would run as a formula get a leading ``'`` (OWASP's advice);
    numbers, NULLs and other strings pass unchanged."""
    if isinstance(value, str) and value.startswith(_FORMULA):
        return "'" + value
    return value


def did_you_mean(path: Any) -> str:
    """`` (did you mean A or B?)`` naming the names in ``path``'s folder nearest its own (a misspelt path), or ""."""
    import difflib
    from pathlib import Path

    p = Path(path)
    try:
        # bounded: a folder of a million files is not read whole for a hint
        names = [e.name for _, e in zip(range(10_000), p.parent.iterdir())]
    except OSError:
        names = []
    near = difflib.get_close_matches(p.name, names, n=2, cutoff=0.6)
    return f" (did you mean {' or '.join(safe(str(p.parent / n)) for n in near)}?)" if near else ""


def missing_path_note(path: Any, *, asked: bool) -> str:
    """The one line ``watch`` and ``serve`` print before they wait for a journal at ``path`` that does not exist
    yet: that it does not exist, the nearest names in its folder (a misspelt path is seen at once), and, when the
    wait was not asked for with ``--wait``, that waiting without it is deprecated."""
    hint = did_you_mean(path)
    if asked:
        return f"waiting for {safe(str(path))} to hold a journal{hint} (Ctrl-C to stop)"
    return (f"{safe(str(path))} does not exist{hint}: waiting for it to be written (Ctrl-C to stop). Pass --wait to "
            "wait on purpose: without it, waiting for a missing path is deprecated and a later release will stop "
            "here with exit 2")
