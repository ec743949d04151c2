"""How many intra-op threads the project's own tiny-model training uses: one.

The ladder's rungs, the reference loops, the demo and the tests train models of a few thousand to a few hundred
thousand parameters, whose matmuls are too small to split: a second intra-op thread only adds a hand-off per op.
On a machine whose cores are shared (other jobs, a CI runner, a test suite in parallel) torch's threads then spin
against each other at every op; measured on a 2-core machine with two CPU-burning processes beside it, the
``tiny`` preset took 36.5 s with two threads and 1.5 s with one. With one thread a busy machine slows the work in
proportion to the share of a core it gets (``tools/bench_suite.py --busy 2 --command ...``, docs/bench/suite.txt).

``TRAINLEDGER_THREADS=N`` overrides it. The user's own training (the Recorder, the callbacks) is never touched.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from trainledger.journal.errors import UsageError

__all__ = ["own_threads", "thread_count", "in_own_threads"]


def thread_count() -> int:
    """1, or ``TRAINLEDGER_THREADS``."""
    raw = os.environ.get("TRAINLEDGER_THREADS", "").strip()
    if not raw:
        return 1
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        raise UsageError(f"TRAINLEDGER_THREADS must be a positive integer, got {raw!r}")
    return n


@contextlib.contextmanager
def own_threads() -> Iterator[int]:
    """Run the block with :func:`thread_count` intra-op threads; the previous count is put back after it."""
    import torch

    before = torch.get_num_threads()
    n = thread_count()
    torch.set_num_threads(n)
    try:
        yield n
    finally:
        torch.set_num_threads(before)


def in_own_threads(fn):
    """Decorate a function that trains one of the project's own tiny models: it runs in :func:`own_threads`."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with own_threads():
            return fn(*args, **kwargs)

    return wrapper
