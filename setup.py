"""Build hook for the optional C accelerator (journal/_chainfast.c: the hash chain, the tree, the detectors' step).

Metadata lives in pyproject.toml. The extension links OpenSSL's libcrypto
(Debian: libssl-dev). It is optional: where it cannot be built, the install
still succeeds and the journal uses hashlib (same bytes, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("trainledger.journal._chainfast", ["journal/_chainfast.c"], libraries=["crypto", "m"], optional=True,
                  # no fused multiply-add: the detectors' and MFU's arithmetic must round as Python's does
                  extra_compile_args=["-ffp-contract=off"]),
    ]
)
