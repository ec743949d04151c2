"""The monitor page's example (docs/monitor.md) runs as written and reproduces the seed document's shape receipts."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[3] / "docs" / "monitor.md"


def test_monitor_example_runs():
    text = PAGE.read_text()
    block = re.search(r"<!-- example:monitor -->\s*```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(block, "docs/monitor.md (monitor example)", "exec"), scope)  # noqa: S102 - our own docs
    report = scope["monitor"].report()
    assert report["steps"] == 5 and report["mfu"]["count"] == 5 and report["mfu"]["mean"] > 0
    assert scope["cfg"].n_params == 7104 and scope["cfg"].flops_per_iter(4) == 1_462_272
