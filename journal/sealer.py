"""The writer's second part: the sealer, which decides when a seal is due and gets its signature.

Its policy is a count and a clock (a seal every ``seal_every`` events or ``seal_interval_ns``, whichever comes
first). A key file signs in place (20 us); a key in a token or a service signs on a thread of the sealer's own
(format 1.7): the seal is written at once without its signature, the thread signs it, retrying with a growing pause,
and the signature follows as ``seal_signed`` the next time the journal takes it in (:meth:`Sealer.take_signed`).
The sealer never touches the file and never takes the journal's lock.
"""

from __future__ import annotations

import base64
import queue
import threading
import time

from trainledger.journal.chainbuffer import ChainBuffer
from trainledger.journal.errors import JournalIOError
from trainledger.journal.events import Seal, SealSigned
from trainledger.journal.keys import Signer

__all__ = ["Sealer", "DEFAULT_SIGN_WAIT_S"]

#: How long close(), suspend() and the seals that must be signed before they return (a journal's first, an anchor's)
#: wait for a key held in a token or a service to sign, by default
DEFAULT_SIGN_WAIT_S = 60.0
#: Retries of a failing signature: the first after this long, doubling up to the cap (never a busy loop)
_RETRY_FIRST_S, _RETRY_CAP_S = 0.05, 2.0

_now = time.time_ns


class _SignJob:
    """One message for the signing thread: ``fields`` those of the pending seal it signs (None: a caller waits for
    it, ``deadline`` its time.monotonic() limit); the result in ``sig``, ``attempts``, ``error``, then ``done``."""

    __slots__ = ("msg", "fields", "deadline", "posted_ns", "sig", "attempts", "error", "done")

    def __init__(self, msg: bytes, fields: tuple | None, deadline: float | None = None):
        self.msg, self.fields, self.deadline = msg, fields, deadline
        self.posted_ns = _now()
        self.sig: bytes | None = None
        self.attempts = 0
        self.error: str | None = None
        self.done = threading.Event()


class Sealer:
    """A journal's seal policy, its key and, for a key that signs slowly, the signing thread.

    ``since_seal`` counts the lines chained since the last seal and ``last_seal_ns`` is that seal's time: the
    journal moves both as it writes. ``kick`` is set when a signature comes back (it wakes the journal's thread).
    """

    def __init__(self, signer: Signer | None, run_id: str, *, seal_every: int, seal_interval_ns: int,
                 in_background: bool, sign_wait_s: float, kick: threading.Event, label: str, now: int):
        self.signer = signer
        self.label = label  # the journal's path, in messages
        self.key_id = signer.key_id if signer is not None else None
        self.run_id = run_id
        self.seal_every = seal_every
        self.seal_interval_ns = seal_interval_ns
        self.since_seal = 0
        self.last_seal_ns = now
        self.sign_wait_s = sign_wait_s
        self.in_background = bool(in_background and signer is not None)
        self.job: _SignJob | None = None  # the pending seal's signature, being made
        self.reseal = False  # a seal came due while one was pending: request the next when its signature is in
        self.sig_ready = False  # the signing thread finished self.job
        self._kick = kick
        self._stop = threading.Event()
        self._jobs: queue.SimpleQueue[_SignJob | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        if self.in_background:
            self.thread = threading.Thread(target=self._loop, name=f"trainledger-signer-{label.rsplit('/', 1)[-1]}", daemon=True)
            self.thread.start()

    def due(self, ts: int) -> bool:
        """Whether a seal is due at ``ts`` (ns): ``seal_every`` lines since the last, or its interval passed."""
        return self.since_seal >= self.seal_every or ts - self.last_seal_ns >= self.seal_interval_ns

    def sealed(self, ts: int) -> None:
        """A seal was chained at ``ts``."""
        self.since_seal = 0
        self.last_seal_ns = ts

    def seal(self, chain: ChainBuffer, *, sign: bool = True) -> Seal:
        """The seal of the chain's head. ``sign=False``: without its signature (a pending seal; :attr:`job` gets its
        message, for :meth:`post` once the seal is chained)."""
        sealed_seq, sealed_hex = chain.head
        msg, size, root = chain.seal_message(self.run_id)
        if self.signer is None:
            sig = None
        elif not sign:
            sig = None
            self.job = _SignJob(msg, (chain.seq, sealed_seq, sealed_hex, size, root, self.key_id))
        else:
            sig = base64.b64encode(self.sign_now(msg)).decode()
        return Seal(sealed_seq=sealed_seq, sealed_hash=sealed_hex, key_id=self.key_id, sig=sig, tree_size=size,
                    tree_root=root)

    def post(self, ts: int) -> None:
        """Hand the pending seal, chained at ``ts``, to the signing thread."""
        job = self.job
        assert job is not None  # seal(sign=False) made it
        job.posted_ns = ts
        self._jobs.put(job)

    def sign_now(self, msg: bytes) -> bytes:
        """A signature the caller waits for: in place, or through the signing thread for at most
        ``sign_wait_s`` (a token that stopped answering cannot hang close() or an anchor for ever)."""
        assert self.signer is not None  # a seal is signed only by a journal with a key
        if not self.in_background:
            return self.signer.sign(msg)
        job = _SignJob(msg, None, deadline=time.monotonic() + self.sign_wait_s)
        self._jobs.put(job)
        if not job.done.wait(self.sign_wait_s + 1.0) or job.sig is None:
            raise JournalIOError(f"{self.label}: key {self.key_id} gave no signature in {self.sign_wait_s:g} s"
                                 + (f" ({job.error})" if job.error else ""))
        return job.sig

    def _loop(self) -> None:
        """The signing thread: one signature at a time, each retried with a growing pause (bounded: 2 s at
        most between tries) until it succeeds, its deadline passes or the sealer stops."""
        signer = self.signer
        assert signer is not None  # the thread runs only for a journal with a key
        while True:
            job = self._jobs.get()
            if job is None:
                return
            pause = _RETRY_FIRST_S
            while True:
                job.attempts += 1
                try:
                    job.sig = bytes(signer.sign(job.msg))
                    break
                except Exception as e:  # noqa: BLE001 - any back end's failure: recorded in one line, retried
                    job.error = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                if (job.deadline is not None and time.monotonic() + pause > job.deadline) or self._stop.wait(pause):
                    break
                pause = min(pause * 2, _RETRY_CAP_S)
            job.done.set()
            if job.fields is not None:
                self.sig_ready = True
                self._kick.set()

    def take_signed(self) -> SealSigned | None:
        """The ``seal_signed`` of the pending seal once the signing thread has its signature (how late, after how
        many tries), or None: still waiting, nothing pending, or stopped while it failed."""
        job = self.job
        self.sig_ready = False
        if job is None or not job.done.is_set():
            return None
        self.job = None
        if job.sig is None:  # released while it was failing: nothing to record
            return None
        assert job.fields is not None  # a seal's job (a wait for a signature in place carries none)
        seal_seq, sealed_seq, sealed_hex, size, root, key_id = job.fields
        waited = max(0, (_now() - job.posted_ns) // 1_000_000)
        return SealSigned(seal_seq=seal_seq, sealed_seq=sealed_seq, sealed_hash=sealed_hex, tree_size=size,
                          tree_root=root, key_id=key_id, sig=base64.b64encode(job.sig).decode(), waited_ms=waited,
                          attempts=job.attempts, error=job.error if job.attempts > 1 else None)

    def drop_job(self) -> None:
        """Forget the pending seal's signature (a signed seal covers what it named): the signing thread stops
        retrying it after its current try."""
        if self.job is not None:
            self.job.deadline = time.monotonic()
        self.job, self.reseal, self.sig_ready = None, False, False

    def waited_ns(self, now: int) -> int:
        """How long the pending seal has waited for its signature (0 with none pending)."""
        return 0 if self.job is None else now - self.job.posted_ns

    def stop(self) -> None:
        """Stop the signing thread (after its current try)."""
        self._stop.set()
        if self.thread is not None:
            self._jobs.put(None)
