"""The front page and its marked examples (``<!-- example:NAME -->`` before a fenced block), for the tests that run
them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def example(name: str) -> str:
    """The code of the README's example marked ``name``."""
    m = re.search(r"<!-- example:" + re.escape(name) + r" -->\s*```(?:python)?\n(.*?)```", README.read_text(), re.S)
    assert m, f"no example {name!r}"
    return m.group(1)
