"""Build hook for the optional C accelerators, one per layer that pays for one (journal/accel.py loads them):

- ``journal/_fast.c``: the format core's hash chain, block scan, step-line check, Merkle tree and writer's append;
- ``journal/views/_fastcols.c``: the views' Arrow column builders;
- ``training/health/_fastfolds.c``: the health detectors' common step.

Metadata lives in pyproject.toml. The core's links OpenSSL's libcrypto (Debian: libssl-dev). Each is optional:
where one cannot be built, the install still succeeds and its layer uses its Python lines (same bytes, slower).
No fused multiply-add anywhere: the detectors' and MFU's arithmetic must round as Python's does.
"""

from setuptools import Extension, setup

_FLAGS = ["-ffp-contract=off"]

setup(
    ext_modules=[
        Extension("trainledger.journal._fast", ["journal/_fast.c"],
                  depends=["journal/_slots.h", "journal/_steplines.h"], libraries=["crypto", "m"], optional=True, extra_compile_args=_FLAGS),
        Extension("trainledger.journal.views._fastcols", ["journal/views/_fastcols.c"],
                  depends=["journal/_slots.h", "journal/_steplines.h"], libraries=["m"], optional=True,
                  extra_compile_args=_FLAGS),
        Extension("trainledger.training.health._fastfolds", ["training/health/_fastfolds.c"],
                  depends=["journal/_slots.h"], libraries=["m"], optional=True, extra_compile_args=_FLAGS),
    ]
)
