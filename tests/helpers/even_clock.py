"""A journal writer whose clock ticks evenly: for tests whose answer depends on how events spread over wall time
(a curve drawn per pixel of time), which a loaded machine would otherwise bunch at a stall."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from unittest import mock

from trainledger.journal import writer


@contextlib.contextmanager
def even_clock(start_ns: int = 10**18, tick_ns: int = 10**6) -> Iterator[None]:
    """Every reading of the writer's clock (an event's ``ts``) ``tick_ns`` after the last, whatever the real time."""
    ticks = itertools.count(start_ns, tick_ns)
    with mock.patch.object(writer, "_now", lambda: next(ticks)):
        yield
