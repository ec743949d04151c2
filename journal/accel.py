"""The optional C accelerator of the hash chain, the tree and the detectors' common step, or None.

``journal/_chainfast.c`` is built at install time when a C compiler and
OpenSSL's headers are there (setup.py marks it optional). Without it, or with
``TRAINLEDGER_NO_ACCEL=1`` in the environment, the writer and the verifier use
hashlib (the same bytes, more slowly) and the health detectors their Python
lines (the same scores). ``tests/unit/journal/test_accel.py`` holds the two paths
to the same results.
"""

from __future__ import annotations

import os

from trainledger.journal import chain

try:
    if os.environ.get("TRAINLEDGER_NO_ACCEL"):
        raise ImportError("disabled by TRAINLEDGER_NO_ACCEL")
    from trainledger.journal import _chainfast as fast
except ImportError:
    fast = None

#: h[n] from h[n-1] (32 raw bytes) and P[n].
link = fast.line_hash if fast is not None else chain.link


def describe() -> str:
    """One line for benchmarks and bug reports: which hashing path is in use."""
    if fast is None:
        return "hashlib (pure Python path)"
    lanes = getattr(fast, "sha_ni", lambda: False)()
    return "C accelerator (OpenSSL SHA-256" + ("; verify's batches in 4 lanes of the x86 SHA extensions)" if lanes
                                               else ")")
