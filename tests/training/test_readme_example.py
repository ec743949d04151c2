"""The README's monitor example runs as written and reproduces the seed document's shape receipts."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_monitor_example_runs():
    text = README.read_text()
    block = re.search(r"<!-- readme-example:monitor -->\s*```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(block, "README.md (monitor example)", "exec"), scope)  # noqa: S102 - our own README
    report = scope["monitor"].report()
    assert report["steps"] == 5 and report["mfu"]["count"] == 5 and report["mfu"]["mean"] > 0
    assert scope["cfg"].n_params == 7104 and scope["cfg"].flops_per_iter(4) == 1_462_272
