"""A key that signs slowly, fails or stops answering, as a token or a KMS can: for the tests of seals signed off
the appending path (tests/unit/journal/test_background_signing.py)."""

from __future__ import annotations

import json
import threading
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from trainledger.journal import Signer


class Token(Signer):
    """A key that answers only while ``up`` is set (a token pulled out: a call that waits; ``fail``: one that
    errors at once), counting its signatures."""

    __slots__ = ("up", "fail", "calls", "delay")

    def __init__(self, delay: float = 0.0):
        super().__init__(Ed25519PrivateKey.generate())
        self.up = threading.Event()
        self.up.set()
        self.fail = False
        self.calls = 0
        self.delay = delay

    def sign(self, message: bytes) -> bytes:
        if self.fail:
            raise RuntimeError("CKR_DEVICE_REMOVED")
        self.up.wait()
        time.sleep(self.delay)
        self.calls += 1
        return super().sign(message)


def kinds(p) -> list[dict]:
    """The journal's complete lines, parsed (a line the signing thread is writing now is left for the next read)."""
    data = p.read_bytes()
    return [json.loads(line) for line in data[: data.rfind(b"\n") + 1].splitlines()]


def settled(j) -> bool:
    """No signature is being made for the journal (none asked, or the last one is back)."""
    job = j._sealer.job
    return job is None or job.done.is_set()


def wait_for(cond, timeout=120.0):  # generous: it returns as soon as cond holds
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)




def journal_signed_late(path, key: Token, steps: int, seal_every: int, *, settle_each: bool = True):
    """A journal whose seals ``key`` signs in the background, ``steps`` steps appended, each signature back before
    the next step (``settle_each``) or only at the end: a fixed shape for the tests. Left open."""
    from trainledger.journal import Journal, StepObserved

    j = Journal.create(path, signer=key, seal_every=seal_every, background=False, sign_in_background=True)
    for i in range(steps):
        j.append(StepObserved(step=i, loss=1.0))
        if settle_each:
            wait_for(lambda: settled(j))
    wait_for(lambda: settled(j))
    return j
