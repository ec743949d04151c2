"""The optional C accelerators, one per layer that pays for one, or None.

Each is built at install time where a C compiler and OpenSSL's headers are there (setup.py marks them optional):
the format core's (``journal/_fast.c``: the hash chain, the verifier's block scan and step-line check, the Merkle
tree, the writer's append), the views' (``journal/views/_fastcols.c``: Arrow columns) and the health folds'
(``training/health/_fastfolds.c``: the detectors' common step). Without one, or with ``TRAINLEDGER_NO_ACCEL=1``
in the environment, its layer uses its Python lines: the same bytes and the same scores, more slowly.
``tests/unit/journal/test_accel.py`` and its siblings hold each C function to its Python twin.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from trainledger.journal import chain

__all__ = ["fast", "link", "load", "describe"]


def load(name: str) -> ModuleType | None:
    """The accelerator module ``name`` (a layer's ``_fast*`` extension), or None where it was not built or
    ``TRAINLEDGER_NO_ACCEL`` is set. Each layer loads its own; the core imports none of the others."""
    if os.environ.get("TRAINLEDGER_NO_ACCEL"):
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


#: the format core's accelerator, or None
fast = load("trainledger.journal._fast")

#: h[n] from h[n-1] (32 raw bytes) and P[n].
link = fast.line_hash if fast is not None else chain.link


def describe() -> str:
    """One line for benchmarks and bug reports: which hashing path is in use."""
    if fast is None:
        return "hashlib (pure Python path)"
    lanes = getattr(fast, "sha_ni", lambda: False)()
    return "C accelerator (OpenSSL SHA-256" + ("; verify's batches in 4 lanes of the x86 SHA extensions)" if lanes
                                               else ")")
