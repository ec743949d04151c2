"""The frame every benchmark's output file shares: what was run, when, on how many cores and how busy the machine
was before; and after, the whole process's CPU time (its children's apart), peak memory and the load again. Run from
tools/ (``python tools/bench_x.py`` puts this folder on the path)."""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path


def header(tool: str) -> list[str]:
    """The two first lines: the command as run, the time, the cores and the load before."""
    return [f"# .venv/bin/python tools/{tool} {' '.join(sys.argv[1:])}",
            f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} cores, load "
            f"{os.getloadavg()[0]:.2f} before"]


def finish(lines: list[str], out: str | None, *, children: str = "children") -> int:
    """Append the whole-process line, print everything, write it to ``out`` if given; exit code 0."""
    ru, rc = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    lines.append(f"# whole process: CPU {ru.ru_utime + ru.ru_stime:.1f} s ({children} {rc.ru_utime + rc.ru_stime:.1f} "
                 f"s), peak RSS {ru.ru_maxrss / 1024:.0f} MiB; load {os.getloadavg()[0]:.2f} after")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if out:
        Path(out).write_text(text)
    return 0
