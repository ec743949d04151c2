"""The text the detection benchmark's language models train on (tools/bench_detection.py and
tools/bench_detection_ddp.py): this repository's docs/*.md as they were at ``CORPUS_COMMIT``, read from git, so that
the benchmark's curves, and the README's table made from them, do not move each time the docs are edited (they did:
the Trainer's epochs end on a partial batch at a step that depends on the corpus's length). Needs a git checkout
(a fresh clone is one); it says so otherwise."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the docs the curves in docs/bench/detection.txt were trained on (405,905 bytes, 20 files)
CORPUS_COMMIT = "dd3e6d89337df1f872de63fe5a2fd5aaba039cd5"


def _git(*args: str) -> bytes:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise SystemExit(f"bench corpus: cannot read docs/*.md at {CORPUS_COMMIT[:12]} from git ({e}); the "
                         "benchmark's language models train on that text and need a git checkout") from None


def corpus_bytes() -> bytes:
    """docs/*.md at ``CORPUS_COMMIT``, in the order of their names, concatenated."""
    names = sorted(n for n in _git("ls-tree", "--name-only", CORPUS_COMMIT, "docs/").decode().splitlines()
                   if n.endswith(".md"))
    return b"".join(_git("show", f"{CORPUS_COMMIT}:{n}") for n in names)
