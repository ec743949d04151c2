"""The journal writer: append-only, hash-chained, sealed, one writer per file.

Crash model (docs/FORMAT.md states it for auditors):

- lines are buffered in memory and handed to the OS at least every
  ``flush_interval_s`` (and whenever 1 MiB is pending): a killed process loses
  at most the events appended since the last flush;
- every seal hands everything before it to the OS. Automatic seals (every
  ``seal_every`` events or ``seal_interval_s`` seconds) are then fsynced by
  the writer's background thread, so the training thread never waits for the
  disk; ``seal(durable=True)``, ``append(..., durable=True)`` and ``close()``
  fsync before they return. A lost machine loses at most what came after the
  last fsynced seal, and never anything that seal covered.
- reopening with :meth:`Journal.open_append` verifies the file, moves a torn
  last line (a crash mid-write) to a sidecar file, records ``tail_repaired``
  and continues the chain.
"""

from __future__ import annotations

import atexit
import base64
import enum
import os
import secrets
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from trainledger.journal import codec
from trainledger.journal.chain import check_run_id, genesis, has_tree
from trainledger.journal.chainbuffer import ChainBuffer, chain_step as _chain
from trainledger.journal.errors import IntegrityError, JournalClosed, JournalError, JournalIOError, UsageError
from trainledger.journal.events import FORMAT_VERSION, Event, KeyCertified, RunClosed, RunOpened, Seal, SealSigned
from trainledger.journal.keys import PublicKey, Signer
from trainledger.journal.merkle import CompactRange
from trainledger.journal.scan import MAX_LINE
from trainledger.journal.sealer import DEFAULT_SIGN_WAIT_S, Sealer
from trainledger.journal.sink import Sink, Ticker

__all__ = ["Journal", "DEFAULT_SEAL_EVERY", "DEFAULT_SEAL_INTERVAL_S", "DEFAULT_FLUSH_INTERVAL_S"]

#: Seal policy defaults, from tools/bench_journal.py: at 1,000 events a seal's
#: Ed25519 signature adds well under 0.1 us to the mean append, and a seal per
#: second bounds what a lost machine can take with it.
DEFAULT_SEAL_EVERY = 1000
DEFAULT_SEAL_INTERVAL_S = 1.0
#: Lines past the last seal are not part of the signed record after a crash (open_append moves them to a sidecar),
#: so flushing them more often than seals come buys little and costs the writer thread CPU in a training loop
#: (tools/bench_distributed.py reports that thread's time under DDP; docs/bench/distributed.txt, the figures).
DEFAULT_FLUSH_INTERVAL_S = 1.0
_FLUSH_BYTES = 1 << 20
#: an interval longer than this (146 years) is never reached: held here, so the clocks fit in 64 bits
_NEVER_NS = 1 << 62

_encode_event = codec.encode_event
_encoders: dict[type, Any] = {}  # event class -> its canonical encoder


_WRITER_OWNED = (RunOpened, Seal, RunClosed, KeyCertified, SealSigned)
#: While a disk refuses writes, appends are kept in memory up to this much; beyond it append refuses.
_MAX_BUFFER = 64 << 20
#: The largest encoded event append() takes: the line cap verify holds every line to, less room for seq, ts and h
_MAX_EVENT = MAX_LINE - 256
#: Journals open in this process: suspended (sealed, fsynced, left open for open_append) at interpreter exit.
_OPEN: weakref.WeakSet = weakref.WeakSet()


def suspend_all() -> None:
    """At interpreter exit (a normal end, or an exception nobody caught) no appended event is left in memory:
    every journal still open is sealed and fsynced. It stays open, not closed: an exit without close() is not
    a completed run, and open_append continues it."""
    for j in list(_OPEN):
        try:
            j.suspend()
        except JournalError:  # the disk refused: nothing more can be done at exit
            pass


atexit.register(suspend_all)


def _encode_new(event: Event) -> bytes:
    cls = event.__class__
    if cls in _WRITER_OWNED:
        raise UsageError(f"{cls.__struct_config__.tag} events are written by the journal itself "
                         "(Journal.create, seal(), close()), not appended")
    _encoders[cls] = codec.encoder_for(cls)  # TypeError for anything that is not an event class
    return _encoders[cls](event)


_now = time.time_ns

#: in a list an :meth:`Journal.append_later` build returns: seal and fsync the lines before it (a compute threshold's
#: receipt, on disk at once)
DURABLE = object()


class Fault(enum.Enum):
    """Why a journal takes no append now (``Journal.fault``); its one-line message is kept beside it. A write or
    fsync failure is reported once and retried; a missing signature holds until the signature comes."""

    WRITE = "write failed"
    FSYNC = "fsync failed"
    NO_SIGNATURE = "no signature"


def _software() -> dict[str, str]:
    import platform

    import cryptography

    from trainledger.journal import __version__

    return {
        "trainledger": __version__,
        "python": platform.python_version(),
        "msgspec": msgspec.__version__,
        "cryptography": cryptography.__version__,
        "platform": platform.platform(),
    }


def _default_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(4)


class Journal:
    """An open journal file. Create with :meth:`create` or :meth:`open_append`.

    Thread-safe: appends from several threads are serialized. Use as a context
    manager: a clean exit closes the run (``run_closed`` plus a durable seal);
    an exception leaves the run open (sealed and durable), so that it can be
    resumed with :meth:`open_append`.

    It is three parts under one lock: the chain and its buffer (:class:`~trainledger.journal.chainbuffer.ChainBuffer`:
    the lines, pure), the sealer (:class:`~trainledger.journal.sealer.Sealer`: when to seal, and the signature) and the
    sink (:class:`~trainledger.journal.sink.Sink`: the file, write and fsync, and the background thread). What it
    holds itself is the order of things (deferred events, the flush clock) and its state: open, stopped (``run_closed``
    chained), released, and a :class:`Fault` while appends are refused.
    """

    path: Path
    run_id: str
    key_id: str | None
    certifier: Signer | None
    _sink: Sink
    _chain: ChainBuffer
    _sealer: Sealer
    _ticker: Ticker | None
    _kick: threading.Event
    _lock: threading.Lock
    _pending: deque[tuple[Any, int]]
    _last: tuple[int, Event] | None
    _last_signed: tuple[int, int, str, str, str] | None
    _closed: bool
    _stopped: bool
    _close_head: tuple[int, str] | None
    _fault: Fault | None
    _io_error: str | None
    _flush_interval_ns: int
    _last_flush_ns: int
    _fsync_pending: bool
    _fail_closed_ns: int | None
    _certified_by: PublicKey | None

    def __init__(self, *_: Any, **__: Any):
        raise TypeError("use Journal.create(...) or Journal.open_append(...)")

    # ------------------------------------------------------------ construction

    @classmethod
    def _new(cls, path: Path, sink: Sink, signer: Signer | None, run_id: str, seq: int, prev: bytes,
             seal_every: int, seal_interval_s: float, flush_interval_s: float, background: bool,
             tree: CompactRange | None, sign_in_background: bool | None = None,
             fail_closed_after_s: float | None = None, sign_wait_s: float = DEFAULT_SIGN_WAIT_S) -> Journal:
        if not isinstance(seal_every, int) or seal_every < 1:
            raise UsageError(f"seal_every must be a positive integer, got {seal_every!r}")
        if not seal_interval_s > 0 or not flush_interval_s > 0:
            raise UsageError("seal_interval_s and flush_interval_s must be positive")
        if fail_closed_after_s is not None and not fail_closed_after_s > 0:
            raise UsageError(f"fail_closed_after_s must be positive seconds, got {fail_closed_after_s!r}")
        self = object.__new__(cls)
        self.path = path
        self._sink = sink
        self._certified_by = None  # the issuer's PublicKey of a journal whose keys are certified
        #: the key that certified this journal's key, where this process holds it (rank 0 of a run with certified
        #: rank keys): it countersigns the anchors (training.distributed.ranks.anchor_ranks)
        self.certifier = None
        self.run_id = run_id
        self.key_id = signer.key_id if signer is not None else None
        #: Format 1.3: the Merkle tree of every line written (None: an older journal continued, whose seals name
        #: no tree). Lines join it a batch at a time, when the buffer is flushed or sealed (off the append path).
        self._chain = ChainBuffer(seq, prev, tree)
        self._last = None  # (seq after it, event) of the last append()
        #: deferred appends, encoded and chained by the next drain: (event, time) or ((build, arg), time). A deque,
        #: appended to without the lock (atomic under the GIL) and taken from the left under it
        self._pending = deque()
        self._lock = threading.Lock()
        self._closed = False  # released: lock dropped, file closed
        self._stopped = False  # no more appends: released, or run_closed already chained by a close() that failed
        self._close_head = None  # the closing seal's head, once chained
        #: the newest signed seal: (its line, tree size, tree root hex, sealed hash hex, signature b64)
        self._last_signed = None
        self._fault = None
        self._io_error = None  # the fault's one-line message
        self._flush_interval_ns = min(int(flush_interval_s * 1e9), _NEVER_NS)
        now = _now()
        self._last_flush_ns = now
        self._fsync_pending = False
        self._kick = threading.Event()  # wakes the background thread early (a signature came back)
        #: Seals signed off the appending path (format 1.7): a seal is written without its signature, the signing
        #: thread signs it, and the signature follows as seal_signed. By default for a key that is not a plain
        #: in-process one (a pkcs11: token, a KMS): those take 0.2 ms to seconds and may stop answering.
        if sign_in_background is None:
            sign_in_background = signer is not None and type(signer) is not Signer
        if sign_in_background and tree is None:
            sign_in_background = False  # a journal of a format before tree heads: its seals are signed in place
        self._fail_closed_ns = int(fail_closed_after_s * 1e9) if fail_closed_after_s is not None else None
        self._sealer = Sealer(signer, run_id, seal_every=seal_every,
                              seal_interval_ns=min(int(seal_interval_s * 1e9), _NEVER_NS),
                              in_background=sign_in_background, sign_wait_s=sign_wait_s, kick=self._kick,
                              label=str(path), now=now)
        self._ticker = None
        if background:
            self._ticker = Ticker(f"trainledger-journal-{path.name}", self._turn, self._wake_in, self._kick)
        _OPEN.add(self)
        return self

    @classmethod
    def create(
        cls,
        path: str | os.PathLike,
        *,
        signer: Signer | None = None,
        run_id: str | None = None,
        meta: Mapping[str, Any] | None = None,
        seal_every: int = DEFAULT_SEAL_EVERY,
        seal_interval_s: float = DEFAULT_SEAL_INTERVAL_S,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        background: bool = True,
        manifest_id: str | None = None,
        manifest_label: str | None = None,
        certificate: KeyCertified | None = None,
        sign_in_background: bool | None = None,
        fail_closed_after_s: float | None = None,
    ) -> Journal:
        """Create a new journal at ``path`` and write ``run_opened`` (sealed, durable).

        ``signer=None`` writes an unsigned journal (verify then needs
        ``--allow-unsigned``). ``certificate``: the ``key_certified`` that certifies ``signer``'s key (an
        ephemeral rank key, :mod:`trainledger.journal.certify`), recorded right after ``run_opened``; the
        journal then verifies under the certifying key.

        ``sign_in_background``: seals are written at once and signed by a thread of their own, the signature
        following as ``seal_signed`` (format 1.7), so that a slow or unresponsive key never holds up ``append``;
        by default for a key in a token or a service (not for a key file, which signs in 20 us).
        ``fail_closed_after_s``: with it, once a seal has waited that long for its signature, ``append`` raises
        :class:`JournalIOError` instead of going on unsigned (the run fails closed). Raises :class:`UsageError`
        if the file exists and :class:`JournalIOError` if it cannot be created.
        """
        p = Path(path)
        rid = check_run_id(run_id if run_id is not None else _default_run_id())
        if signer is not None and not isinstance(signer, Signer):
            raise UsageError("signer must be a journal.keys.Signer (see load_signer / Signer.generate)")
        _check_certificate_use(certificate, signer, rid)
        meta_d = dict(meta or {})
        if p.exists():
            raise UsageError(f"{p}: already exists; use Journal.open_append to continue it")
        sink = Sink.create(p)
        self = cls._new(p, sink, signer, rid, 0, genesis(rid), seal_every, seal_interval_s, flush_interval_s,
                        background, CompactRange(0), sign_in_background, fail_closed_after_s)
        import socket  # here: a reader never loads it

        opened = RunOpened(
            format_version=FORMAT_VERSION,
            run_id=rid,
            key_id=self.key_id,
            public_key=signer.public.b64 if signer is not None else None,
            host=socket.gethostname(),
            pid=os.getpid(),
            software=_software(),
            meta=meta_d,
            manifest_id=manifest_id,
            manifest_label=manifest_label,
        )
        if certificate is not None:
            from trainledger.journal.certify import issuer_of

            self._certified_by = issuer_of(certificate)
        self._append_owned(opened, *([certificate] if certificate is not None else []))
        sink.sync_dir()
        if self._ticker is not None:
            self._ticker.start()
        return self

    @classmethod
    def open_append(
        cls,
        path: str | os.PathLike,
        *,
        signer: Signer | None = None,
        seal_every: int = DEFAULT_SEAL_EVERY,
        seal_interval_s: float = DEFAULT_SEAL_INTERVAL_S,
        flush_interval_s: float = DEFAULT_FLUSH_INTERVAL_S,
        background: bool = True,
        certificate: KeyCertified | None = None,
        sign_in_background: bool | None = None,
        fail_closed_after_s: float | None = None,
    ) -> Journal:
        """Reopen an existing journal to continue it after a stop or a crash.

        Takes the lock, verifies the whole file under ``signer``'s public key
        (an unsigned journal needs ``signer=None``), moves a torn last line to
        ``<path>.torn-<offset>-<digest>`` and records ``tail_repaired``.
        ``certificate``: a journal whose keys are certified continues under a new key (a restart's: the old one
        died with its process), certified by the same kind of ``key_certified`` as at its start; the file is
        then verified under the certificate's issuer, and the certificate is the first line written.
        Raises :class:`JournalLocked` if another writer holds the file,
        :class:`JournalClosed` if the run was closed, and the verifier's
        :class:`IntegrityError` if the existing content does not verify.
        """
        from trainledger.journal.verify import verify

        p = Path(path)
        if signer is not None and not isinstance(signer, Signer):
            raise UsageError("signer must be a journal.keys.Signer")
        pinned = [signer.public] if signer is not None else []
        if certificate is not None:
            from trainledger.journal.certify import issuer_of

            pinned = [issuer_of(certificate)]
        sink = Sink.reopen(p)
        try:
            try:
                report = verify(p, keys=pinned, allow_unsigned=True, allow_unsealed=True,
                                check_signatures=signer is not None, workers=1)
            except IntegrityError as e:
                raise type(e)(f"{p}: cannot append: {e}", seq=e.seq, offset=e.offset) from None
            if signer is None and report.key_id is not None:
                raise UsageError(f"{p}: journal is signed by key {report.key_id}; open_append needs that signer")
            if signer is not None and report.key_id is None:
                raise UsageError(f"{p}: journal is unsigned; open it with signer=None")
            if report.tail == "closed":
                raise JournalClosed(f"{p}: the run was closed at seq {report.last_seq}; start a new journal")
            if report.last_seq is None or report.last_hash is None or report.run_id is None:
                raise IntegrityError(f"{p}: cannot append: no complete event", seq=0)
            repair = None
            next_seq, prev = report.last_seq + 1, report.last_hash
            tree = report.tree
            if signer is not None and report.unsealed_events:
                # Nothing signs the events after the last seal: sealing over them would sign whatever anyone
                # appended. They go to the sidecar with any torn bytes, and the chain goes on from the seal.
                if report.sealed_bytes is None or report.seal_line_hash is None or report.last_sealed_seq is None:
                    # verify refuses that already
                    raise IntegrityError(f"{p}: cannot append: no seal", seq=1)
                repair = sink.move_tail(report.sealed_bytes, report.bytes - report.sealed_bytes,
                                    unsealed=report.unsealed_events)
                next_seq, prev = report.last_sealed_seq + 2, report.seal_line_hash
                tree = report.sealed_tree
            elif report.tail == "torn":
                repair = sink.move_tail(report.torn_offset, report.torn_bytes)
            if certificate is not None:
                _check_certificate_use(certificate, signer, report.run_id)
            if has_tree(report.format_version) and (tree is None or tree.end != next_seq):
                raise IntegrityError(f"{p}: cannot append: the tree of its lines does not end at seq {next_seq}",
                                     seq=next_seq)  # pragma: no cover - verify builds it over exactly those lines
            self = cls._new(p, sink, signer, report.run_id, next_seq, bytes.fromhex(prev),
                            seal_every, seal_interval_s, flush_interval_s, background,
                            tree if has_tree(report.format_version) else None, sign_in_background,
                            fail_closed_after_s)
        except BaseException:
            sink.close()
            raise
        if certificate is not None:  # the new key's certificate before anything it seals
            self._certified_by = pinned[0]
            self._append_owned(certificate)
        if repair is not None:  # sealed and signed before it returns: the prefix it cut back to stays signed
            self._append_owned(repair)
        if self._ticker is not None:
            self._ticker.start()
        return self

    # ------------------------------------------------------------ writing

    def append(self, event: Event, *, durable: bool = False) -> tuple[int, str]:
        """Append one event; return its ``(seq, hash_hex)``.

        ``durable=True`` seals right after it and fsyncs before returning (for
        checkpoints, verdicts and decisions). Raises :class:`JournalClosed`
        after close and ``TypeError`` for an object that is not an event.
        """
        enc = _encoders.get(event.__class__)
        body = enc(event) if enc is not None else _encode_new(event)
        if len(body) > _MAX_EVENT:  # verify refuses a line past MAX_LINE: never write one
            raise UsageError(f"{self.path}: a {type(event).__name__} of {len(body):,} bytes encoded is over the "
                             f"{_MAX_EVENT:,} an event may be (a journal line is at most {MAX_LINE:,} bytes)")
        with self._lock:
            chain = self._chain
            if self._stopped or self._fault is not None or len(chain.buf) >= _MAX_BUFFER:
                self._refuse_locked()
            if self._pending:
                self._drain_locked()
            ts = _now()
            # ChainBuffer.add inlined (a call is a tenth of the budget): the same chain step, the same state
            seq = chain.seq
            chain.prev, hx = _chain(chain.buf, body, chain.prev, seq, ts)
            chain.seq = seq + 1
            chain.head_hex = hx
            sealer = self._sealer
            sealer.since_seal += 1
            if durable:
                self._seal_locked(durable=True)  # a durable promise that fails raises here
            # the policy's test inlined (a method call is a tenth of the budget)
            elif sealer.since_seal >= sealer.seal_every or ts - sealer.last_seal_ns >= sealer.seal_interval_ns or \
                    ts - self._last_flush_ns >= self._flush_interval_ns or len(chain.buf) >= _FLUSH_BYTES or \
                    sealer.sig_ready:
                self._due_locked(ts)
            self._last = (chain.seq, event)
            return seq, hx.decode()

    def _due_locked(self, ts: int) -> None:
        """After an append: seal, flush or take a signature in when one is due. A write failure is kept for the next
        call: this event is chained and held in memory."""
        try:
            if self._sealer.due(ts):
                self._seal_locked(durable=False)
            elif ts - self._last_flush_ns >= self._flush_interval_ns or len(self._chain.buf) >= _FLUSH_BYTES:
                self._flush_locked(ts)
            elif self._sealer.sig_ready:
                self._resolve_locked()
        except JournalIOError:
            pass  # this event is chained and kept in memory; the failure is raised by the next call

    def append_deferred(self, event: Event) -> None:
        """Append an event whose fields already have their declared types, without encoding it now.

        For the training loop's hottest call (``TrainingHealthMonitor.observe_step``), and any caller that
        builds its events with the declared types itself: the event and its
        timestamp are queued in the training thread (well under a microsecond, without taking the journal's lock),
        and encoded, chained and written in order, in batches, by whatever touches the journal next: the background
        thread within ``flush_interval_s``, any other append, seal, flush, suspend or close. Batches run with warm
        caches, which is where the time goes inside a real loop. Nothing is validated here: a caller that is not
        sure of its types uses :meth:`append`. The crash model is the buffer's: at most a flush interval.
        """
        if self._stopped or self._fault is not None or len(self._chain.buf) >= _MAX_BUFFER:
            self._refused()
        pending = self._pending
        pending.append((event, _now()))
        if len(pending) >= self._sealer.seal_every or self._stopped:
            self._drain_or_refuse()

    def append_later(self, build: Callable[[Any], Any], arg: Any) -> None:
        """Queue ``build(arg)`` to be appended at the time of this call, as :meth:`append_deferred` queues an event:
        the event is made by the next drain (on the background thread or the next call that touches the journal),
        in order with every other deferred append. ``build`` returns an event whose fields have their declared
        types, a list of them (where :data:`DURABLE` seals and fsyncs what came before it), or None for nothing; it
        must not raise (it runs where nobody can catch it: a build that raises writes nothing) and must not touch
        the journal. For a logging call whose event costs more to make than to queue (``wandb.log``'s row, the
        monitor's fold of a step)."""
        if self._stopped or self._fault is not None or len(self._chain.buf) >= _MAX_BUFFER:
            self._refused()
        pending = self._pending
        pending.append(((build, arg), _now()))
        if len(pending) >= self._sealer.seal_every or self._stopped:
            self._drain_or_refuse()

    def drain(self) -> None:
        """Encode and chain every deferred append now (what :meth:`flush` does before writing)."""
        with self._lock:
            if self._pending and not self._stopped:
                self._drain_locked()

    def _chain_built_locked(self, ev: Any, ts: int) -> None:
        """One line of a build's list (:meth:`append_later`), or :data:`DURABLE`: a durable seal of what came before
        it (a failure is recorded and raised by the next call, as a drain's own seals are)."""
        sealer = self._sealer
        try:
            if ev is DURABLE:
                self._seal_locked(durable=True)
                return
            self._chain.add(codec.encode_trusted(ev), ts)
            sealer.since_seal += 1
            if sealer.since_seal >= sealer.seal_every:
                self._seal_locked(durable=False)
        except JournalIOError:
            pass  # recorded; the buffer is retried and the next call raises it

    def _refused(self) -> None:
        with self._lock:
            if self._stopped or self._fault is not None or len(self._chain.buf) >= _MAX_BUFFER:
                self._refuse_locked()

    def _drain_or_refuse(self) -> None:
        """A full queue drained; or, when the journal stopped while this call queued its event (a close on another
        thread), what no drain will take now is dropped and refused, never left behind silently."""
        with self._lock:
            if self._stopped:
                if self._pending:
                    self._pending.clear()
                    self._refuse_locked()
                return
            self._drain_locked()

    def _drain_locked(self) -> None:
        """Encode, chain and buffer every deferred append, in order, sealing every ``seal_every`` as append does."""
        queue = self._pending
        popleft = queue.popleft
        pending = [popleft() for _ in range(len(queue))]  # what is queued now; later appends wait for the next drain
        encode = codec.encode_trusted
        chain, sealer = self._chain, self._sealer
        buf, seal_every = chain.buf, sealer.seal_every
        # ChainBuffer.add inlined over the batch, its state in locals (written back before a seal reads it)
        seq, prev, hx, since = chain.seq, chain.prev, chain.head_hex, sealer.since_seal
        for ev, ts in pending:
            if type(ev) is tuple:  # append_later: made now
                try:
                    ev = ev[0](ev[1])
                except Exception:  # a broken build (its contract is not to raise) costs its own lines only
                    ev = None
                if ev is None:
                    continue
                if type(ev) is list:  # several lines, in order, each with the call's time
                    chain.seq, chain.prev, chain.head_hex, sealer.since_seal = seq, prev, hx, since
                    for x in ev:
                        self._chain_built_locked(x, ts)
                    seq, prev, hx, since = chain.seq, chain.prev, chain.head_hex, sealer.since_seal
                    continue
            prev, hx = _chain(buf, encode(ev), prev, seq, ts)  # with the time it was appended, not written
            seq += 1
            since += 1
            if since >= seal_every:
                chain.seq, chain.prev, chain.head_hex, sealer.since_seal = seq, prev, hx, since
                try:
                    self._seal_locked(durable=False)
                except JournalIOError:
                    pass  # recorded; the buffer is retried and the next call raises it
                seq, prev, hx, since = chain.seq, chain.prev, chain.head_hex, sealer.since_seal
        chain.seq, chain.prev, chain.head_hex, sealer.since_seal = seq, prev, hx, since

    def _refuse_locked(self) -> None:
        """Why ``append`` takes nothing now: closed, a write failure to report, or a full buffer (or a run failing
        closed for want of a signature: it goes on once the signature is in)."""
        if self._sealer.sig_ready and not self._stopped and self._fault is Fault.NO_SIGNATURE:
            self._resolve_locked()
            if self._fault is None and len(self._chain.buf) < _MAX_BUFFER:
                return
        if self._stopped:
            raise JournalClosed(f"{self.path}: journal is closed")
        if self._fault is Fault.NO_SIGNATURE:
            raise JournalIOError(f"{self.path}: {self._io_error}; this event was not appended (the run fails closed: "
                                 "fail_closed_after_s)")
        if self._fault is not None:
            err = self._io_error
            self._clear_fault()  # reported once; the writer keeps retrying
            raise JournalIOError(f"{self.path}: {err}; this event was not appended, {len(self._chain.buf):,} bytes "
                                 "of earlier events are kept in memory and written as soon as the disk takes them")
        raise JournalIOError(f"{self.path}: {len(self._chain.buf):,} bytes are waiting for the disk; this event was "
                             "not appended")

    @property
    def fault(self) -> Fault | None:
        """Why appends are refused now (a failure not yet reported, or a run failing closed), or None."""
        return self._fault

    def _set_fault(self, fault: Fault, message: str) -> None:
        self._fault, self._io_error = fault, message

    def _clear_fault(self, fault: Fault | None = None) -> None:
        """Forget the fault (only ``fault``, when given): reported, or what caused it is over."""
        if fault is None or self._fault is fault:
            self._fault = self._io_error = None

    def _chain_owned_locked(self, event: Event) -> int:
        """Chain a line the journal writes itself (run_opened, a seal, seal_signed, run_closed, ...); its time."""
        ts = _now()
        self._chain.add(_encode_event(event), ts)
        if isinstance(event, Seal) and event.sig is not None and event.tree_root is not None and event.tree_size:
            self._last_signed = (self._chain.head[0], event.tree_size, event.tree_root, event.sealed_hash, event.sig)
        elif isinstance(event, SealSigned):
            self._last_signed = (event.seal_seq, event.tree_size, event.tree_root, event.sealed_hash, event.sig)
        return ts

    def _append_owned(self, *events: Event) -> None:
        """Write events the journal owns (run_opened, key_certified) and seal them durably."""
        with self._lock:
            if self._pending:
                self._drain_locked()
            for event in events:
                self._chain_owned_locked(event)
                self._sealer.since_seal += 1
            self._seal_locked(durable=True, signed=True)

    def seal(self, *, durable: bool = False, signed: bool = False) -> tuple[int, str] | None:
        """Seal the current head now; return the sealed ``(seq, hash_hex)``.

        Returns ``None`` when nothing was appended since the last seal (the head
        is already sealed). ``durable=True`` fsyncs before returning. A journal that signs in the background
        writes the seal at once and its signature when the key returns it; ``signed=True`` waits for the
        signature (at most ``DEFAULT_SIGN_WAIT_S``, else :class:`JournalIOError`), for a head that others record
        (an anchor) and that must be signed when they do.
        """
        with self._lock:
            if self._stopped:
                raise JournalClosed(f"{self.path}: journal is closed")
            if self._pending:
                self._drain_locked()
            sealer = self._sealer
            if sealer.sig_ready:
                self._resolve_locked()
            if sealer.since_seal == 0 and not (signed and sealer.job is not None):
                if durable:
                    self._flush_locked(_now())
                    self._fsync()
                return None
            return self._seal_locked(durable=durable, signed=signed)

    def _resolve_locked(self) -> None:
        """Record the signature the signing thread made for the pending seal (``seal_signed``: the signed
        catch-up, how late and after how many tries), and request the next seal if one came due meanwhile."""
        sealer = self._sealer
        signed = sealer.take_signed()
        if signed is None:
            return
        self._chain_owned_locked(signed)
        sealer.since_seal += 1
        self._clear_fault(Fault.NO_SIGNATURE)  # the key answered: the run may go on
        if sealer.reseal:
            sealer.reseal = False
            self._seal_locked(durable=False)

    def _seal_locked(self, *, durable: bool, signed: bool = False) -> tuple[int, str]:
        sealer = self._sealer
        if sealer.in_background and not signed:
            return self._seal_pending_locked(durable)
        if signed and sealer.job is not None:  # this seal signs everything the pending one named, and more
            sealer.drop_job()
        seal = sealer.seal(self._chain)
        # Chained like any line, so the seal is itself part of the chain.
        sealer.sealed(self._chain_owned_locked(seal))
        self._write_out_locked(durable)
        return seal.sealed_seq, seal.sealed_hash

    def _write_out_locked(self, durable: bool) -> None:
        """After a seal: everything to the OS, and fsynced now (durable, or no background thread) or by the
        background thread next (even if this write fails: it fsyncs once it has written)."""
        background_fsync = not durable and self._ticker is not None
        if background_fsync:
            self._fsync_pending = True
        self._flush_locked(self._sealer.last_seal_ns)
        if not background_fsync:
            self._fsync()

    def _seal_pending_locked(self, durable: bool) -> tuple[int, str]:
        """A seal written now and signed by the signing thread (format 1.7). While one is pending, a seal that
        comes due is requested again once the signature is in (never two pending at once); a run that fails
        closed raises here once the pending one has waited ``fail_closed_after_s``."""
        now = _now()
        sealer = self._sealer
        if sealer.job is not None and sealer.job.done.is_set():
            sealer.reseal = False  # sealing now anyway
            self._resolve_locked()
        job = sealer.job
        if job is not None:
            sealer.reseal = True
            sealer.sealed(now)
            waited = sealer.waited_ns(now)
            if self._fail_closed_ns is not None and waited > self._fail_closed_ns:
                self._set_fault(Fault.NO_SIGNATURE, f"no signature from key {sealer.key_id} for {waited / 1e9:.1f} s"
                                + (f" (last error: {job.error})" if job.error else ""))
                raise JournalIOError(f"{self.path}: {self._io_error}")
            self._flush_locked(now)
            if durable:
                self._fsync()
            return self._chain.head
        seal = sealer.seal(self._chain, sign=False)
        ts = self._chain_owned_locked(seal)
        sealer.sealed(ts)
        sealer.post(ts)
        self._write_out_locked(durable)
        return seal.sealed_seq, seal.sealed_hash

    def _flush_locked(self, now: int) -> None:
        """Hand the buffer to the OS. On failure what was not written stays buffered (retried by the next
        flush), the failure is recorded for the caller, and :class:`JournalIOError` is raised."""
        self._last_flush_ns = now
        try:
            self._sink.write(self._chain)
        except OSError as e:
            self._set_fault(Fault.WRITE, f"write failed: {e.strerror or e}")
            raise JournalIOError(f"{self.path}: {self._io_error} ({len(self._chain.buf):,} bytes kept in memory)") \
                from None
        self._clear_fault(Fault.WRITE)  # everything held back is written now: nothing is left to report or lose

    def _fsync(self) -> None:
        self._fsync_pending = False
        try:
            self._sink.fsync()
        except OSError as e:
            self._set_fault(Fault.FSYNC, f"fsync failed: {e.strerror or e}")
            raise JournalIOError(f"{self.path}: {self._io_error}") from None

    def flush(self) -> None:
        """Hand buffered lines to the OS now (no fsync); raises :class:`JournalIOError` if the disk refuses."""
        with self._lock:
            if not self._closed:
                if self._pending:
                    self._drain_locked()
                self._flush_locked(_now())

    def _turn(self) -> bool:
        """One turn of the background thread: time-based seals and flushes, and the fsync of automatic seals
        (outside the lock). A failure never stops it: it is recorded (the training thread's next call raises it)
        and retried next turn. False once the journal is released."""
        fsync = False
        with self._lock:
            if self._closed:
                return False
            now = _now()
            sealer = self._sealer
            try:
                if self._pending:
                    self._drain_locked()
                if sealer.sig_ready:
                    self._resolve_locked()
                    self._fsync_pending = True
                if sealer.since_seal and not self._stopped and now - sealer.last_seal_ns >= sealer.seal_interval_ns:
                    self._seal_locked(durable=False)
                elif self._chain.buf:
                    self._flush_locked(now)
            except JournalIOError:
                return True  # recorded; the buffer is retried next turn
            fsync, self._fsync_pending = self._fsync_pending, False
            sink = self._sink
        if fsync:
            try:
                sink.fsync()
            except OSError as e:
                with self._lock:
                    if not self._closed:
                        self._set_fault(Fault.FSYNC, f"fsync failed: {e.strerror or e}")
                        self._fsync_pending = True
        return True

    def _wake_in(self) -> float:
        """Seconds until the background thread has something to do: the next flush of lines waiting, or the next
        seal of events appended since the last; with nothing waiting, a look every flush or seal interval (appends
        do not wake it)."""
        with self._lock:
            now = _now()
            sealer = self._sealer
            due = now + min(self._flush_interval_ns, sealer.seal_interval_ns)
            if self._chain.buf or self._pending:
                due = min(due, self._last_flush_ns + self._flush_interval_ns)
            if (sealer.since_seal or self._pending) and not self._stopped:
                due = min(due, sealer.last_seal_ns + sealer.seal_interval_ns)
        return max(0.001, (due - now) / 1e9 + 0.001)

    # ------------------------------------------------------------ state

    @property
    def seq(self) -> int:
        """The seq the next event will get."""
        with self._lock:
            if self._pending:
                self._drain_locked()
            return self._chain.seq

    def last_appended(self) -> Event | None:
        """The event the last :meth:`append` wrote, when nothing (no deferred step either) came after it; else
        None. Lets a caller tell whether the record it is about to write was just written by someone else."""
        with self._lock:
            if self._pending:
                self._drain_locked()
            last = self._last
            return last[1] if last is not None and last[0] == self._chain.seq else None

    @property
    def head(self) -> tuple[int, str]:
        """``(seq, hash_hex)`` of the last line written (sealed or not)."""
        with self._lock:
            if self._pending:
                self._drain_locked()
            return self._chain.head

    @property
    def public_key(self):
        """The key this journal verifies under: the signer's :class:`~trainledger.journal.keys.PublicKey`, or for a
        journal whose keys are certified the certifying key (``None`` for an unsigned journal)."""
        if self._certified_by is not None:
            return self._certified_by
        signer = self._sealer.signer
        return signer.public if signer is not None else None

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------ closing

    def last_seal_note(self) -> tuple[int, str] | None:
        """The newest signed seal as its C2SP checkpoint note (what a witness cosigns and a time-stamping authority
        stamps): (the seal's line, the note); None before a signed format 1.3 seal."""
        from trainledger.journal.chain import origin, seal_checkpoint
        from trainledger.journal.note import note_signature_line

        with self._lock:
            last, signer = self._last_signed, self._sealer.signer
        pub = signer.public if signer is not None else None
        if last is None or pub is None:
            return None
        seq, size, root, sealed_hash, sig = last
        text = seal_checkpoint(self.run_id, size, bytes.fromhex(root), size - 1, bytes.fromhex(sealed_hash))
        return seq, text + "\n" + note_signature_line(origin(self.run_id), pub.raw, base64.b64decode(sig))

    def close(self, status: str = "completed", reason: str | None = None) -> tuple[int, str]:
        """End the run: append ``run_closed``, seal, fsync, release the lock.

        Returns the final sealed head. A closed journal cannot be reopened for appending.
        """
        with self._lock:
            if self._closed:
                raise JournalClosed(f"{self.path}: journal is already closed")
            if not self._stopped:  # a close that failed to write has chained run_closed already: only retry it
                if self._pending:
                    self._drain_locked()
                self._stopped = True
                self._chain_owned_locked(RunClosed(status=status, reason=reason))
                self._sealer.since_seal += 1
            if self._close_head is None:  # raises JournalIOError when the key gives no signature: close() again
                self._close_head = self._seal_locked_chain_only()
            self._flush_locked(_now())  # raises JournalIOError: close() can be called again once there is room
            self._fsync()
            self._clear_fault()
            self._release()
        self._join_ticker()
        return self._close_head

    def _seal_locked_chain_only(self) -> tuple[int, str]:
        """Chain a seal of the current head without writing it (close writes and fsyncs it itself)."""
        sealer = self._sealer
        if sealer.job is not None:  # the closing seal signs everything the pending one named
            sealer.drop_job()
        seal = sealer.seal(self._chain)
        sealer.sealed(self._chain_owned_locked(seal))
        return seal.sealed_seq, seal.sealed_hash

    def _join_ticker(self) -> None:
        """Wait for the background thread to see the close (outside the lock it takes)."""
        if self._ticker is not None:
            self._ticker.join()

    def suspend(self) -> None:
        """Stop writing without ending the run: seal, fsync, release the lock.

        The journal stays open for :meth:`open_append` (a preempted job, a
        training loop that raised).
        """
        with self._lock:
            if self._closed:
                return
            sealer = self._sealer
            try:
                if self._pending:
                    self._drain_locked()
                if sealer.sig_ready:
                    self._resolve_locked()
                if (sealer.since_seal or sealer.job is not None) and not self._stopped:
                    self._seal_locked(durable=True, signed=True)
                else:
                    self._flush_locked(_now())
                    self._fsync()
            except JournalIOError as e:
                lost = len(self._chain.buf)
                self._release()  # the lock is never kept by a writer that is gone
                raise JournalIOError(f"{e}; suspended anyway: {lost:,} buffered bytes could not be written "
                                     "(the journal reopens at its last complete line)") from None
            self._release()
        self._join_ticker()

    def _release(self) -> None:
        self._closed = True
        self._stopped = True
        if self._ticker is not None:
            self._ticker.stop()
        self._sealer.stop()
        _OPEN.discard(self)
        self._sink.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._closed:
            return
        if exc_type is None:
            self.close()
        else:
            self.suspend()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"next seq {self._chain.seq}"
        return f"Journal({str(self.path)!r}, run_id={self.run_id!r}, key_id={self.key_id!r}, {state})"


def _check_certificate_use(certificate: KeyCertified | None, signer: Signer | None, run_id: str) -> None:
    """A certificate given to create/open_append certifies the signer's key, for this journal's run and rank."""
    if certificate is None:
        return
    from trainledger.journal.roster import split_run_id

    if not isinstance(certificate, KeyCertified):
        raise UsageError("certificate must be a KeyCertified (journal.certify.RankRoster.certificate)")
    if signer is None or certificate.key != signer.public.b64:
        raise UsageError(f"the certificate certifies another key than the signer's ({signer and signer.key_id})")
    split = split_run_id(run_id)
    run, rank = split if split is not None else (run_id, 0)
    if (certificate.run, certificate.rank) != (run, rank):
        raise UsageError(f"the certificate is for rank {certificate.rank} of run {certificate.run!r}, not rank {rank} "
                         f"of {run!r}")
