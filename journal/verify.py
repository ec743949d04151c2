"""Offline verification of a journal against pinned keys.

:func:`verify` returns a :class:`VerifyReport` when every event present
checks out, and raises a typed :class:`~trainledger.journal.errors.IntegrityError` (with
the partial report attached as ``.report``) when one does not. It never
returns a bare bool. Memory stays flat in journal size: the file is read in
blocks, and large files are split into byte ranges checked by worker
processes (see ``journal/scan.py`` for why ranges are independent).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import stat
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainledger.journal import codec
from trainledger.journal.scan import MAX_LINE, RangeResult, ScanContext, _scan_range_star, cpu_count, scan_consuming, \
    scan_range, tree_mode, worker_ignores_ctrl_c
from trainledger.journal.roster import Roster, split_run_id
from trainledger.journal.chain import RUN_ID_RE, genesis
from trainledger.journal.errors import (
    CheckpointMismatch,
    HeadMismatch,
    IntegrityError,
    JournalIOError,
    NotClosed,
    RunMismatch,
    SchemaError,
    SealInvalid,
    TrainledgerError,
    UnsealedEvents,
    UnsignedJournal,
    UnsupportedFormat,
    UntrustedKey,
    UsageError,
)
from trainledger.journal.events import FORMAT_VERSION, RunOpened
from trainledger.journal.keys import PublicKey, key_id_of
from trainledger.journal.trust import TrustPolicy, parse_head

__all__ = ["VerifyReport", "verify", "verify_with", "Verification", "verify_copy", "resolve_key", "resolve_signing", "Signing", "parse_head",
           "PARALLEL_MIN_BYTES"]

#: Files smaller than this are checked in-process; process start-up would cost more than it saves.
PARALLEL_MIN_BYTES = 16 * 1024 * 1024

_ERRORS = {cls.__name__: cls for cls in IntegrityError.__subclasses__()}
_ERRORS["IntegrityError"] = IntegrityError


#: ``bytes``, as the report's annotations name it below its own field called ``bytes``
_Bytes = bytes


@dataclasses.dataclass
class VerifyReport:
    """What verification established about one journal file."""

    ok: bool
    path: str
    events: int = 0
    run_id: str | None = None
    key_id: str | None = None
    #: "pinned" (a key the caller trusts), "embedded" (the journal's own key:
    #: authenticity not established), "unsigned", or "unchecked" (signatures skipped).
    trust: str | None = None
    format_version: str | None = None
    created_ns: int | None = None
    #: "closed" (run_closed then its seal, nothing after), "open", or "torn"
    #: (bytes after the last complete line).
    tail: str | None = None
    last_seq: int | None = None
    last_hash: str | None = None
    seals: int = 0
    last_sealed_seq: int | None = None
    last_sealed_hash: str | None = None
    #: events after the last seal: nothing signs them (counted, never called verified)
    unsealed_events: int = 0
    #: bytes of the signed prefix: the file up to and including the last seal's line (None: no seal)
    sealed_bytes: int | None = None
    #: chain hash of the last seal's own line (where a writer continues after cutting an unsealed tail)
    seal_line_hash: str | None = None
    torn_offset: int | None = None
    torn_bytes: int = 0
    kinds: dict[str, int] = dataclasses.field(default_factory=dict)
    unknown_events: int = 0
    bytes: int = 0
    first_bad_seq: int | None = None
    error: str | None = None
    error_kind: str | None = None
    error_offset: int | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    #: run_opened.meta["imported"]: a journal written by `trainledger import` from another tool's files
    imported: dict[str, Any] | None = None
    #: format 1.3: the last seal's tree root (hex) and signature (base64): its checkpoint (trainledger.journal.proofs.checkpoint)
    last_tree_root: str | None = None
    last_seal_sig: str | None = None
    #: format 1.3: the Merkle tree of every complete line, and of the lines through the last seal (compact ranges)
    tree: Any = dataclasses.field(default=None, repr=False)
    sealed_tree: Any = dataclasses.field(default=None, repr=False)
    #: verify_run_dir's: (offset, line) of the anchor kinds, seq -> chain hash of seals and wanted seqs
    collected: list[tuple[int, _Bytes]] = dataclasses.field(default_factory=list, repr=False)
    hashes: dict[int, str] = dataclasses.field(default_factory=dict, repr=False)
    #: the keys seals were checked under: the journal's own, or (format 1.7) the keys its certificates certify,
    #: ``key_id`` being then the certifying key
    signing_keys: list[str] = dataclasses.field(default_factory=list)

    @property
    def head(self) -> str | None:
        """The latest sealed head as ``SEQ:HASH``, the string to publish elsewhere."""
        if self.last_sealed_seq is None:
            return None
        return f"{self.last_sealed_seq}:{self.last_sealed_hash}"

    @property
    def trusted_bytes(self) -> int:
        """How many leading bytes every conclusion may rest on: in a signed journal the signed prefix (through
        the last seal), otherwise every complete line."""
        if self.trust in ("pinned", "embedded") and self.sealed_bytes is not None:
            return self.sealed_bytes
        return self.torn_offset if self.torn_offset is not None else self.bytes

    @property
    def trusted_last_seq(self) -> int | None:
        """The seq of the last event inside :attr:`trusted_bytes`."""
        if self.trust in ("pinned", "embedded") and self.last_sealed_seq is not None:
            return self.last_sealed_seq + 1
        return self.last_seq

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        del d["collected"], d["hashes"], d["tree"], d["sealed_tree"], d["last_seal_sig"]
        d["head"] = self.head
        d["trusted_bytes"] = self.trusted_bytes
        return d


def open_checked(path: Path) -> int:
    try:
        st = path.stat()
    except FileNotFoundError:
        raise JournalIOError(f"{path}: no such file") from None
    except OSError as e:
        raise JournalIOError(f"{path}: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise JournalIOError(f"{path}: is a directory, not a journal file")
    if not stat.S_ISREG(st.st_mode):
        raise JournalIOError(f"{path}: not a regular file")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        raise JournalIOError(f"{path}: {e.strerror}") from None
    return st.st_size


def _first_line(path: Path, size: int, source: Any = None) -> bytes:
    if source is not None:  # a stream of whole lines (see verify's _source): its first block holds the first
        data = source.prefix(1)
        size = len(data)
        cut = data.find(b"\n")
    else:
        with open(path, "rb") as f:
            data = f.read(min(size, 1 << 20))
            cut = data.find(b"\n")
            if cut < 0 and len(data) < size:
                data += f.read(MAX_LINE + 1 - len(data))
                cut = data.find(b"\n")
    if cut < 0:
        if size == 0:
            raise SchemaError("empty file: not a journal (no run_opened)", seq=0, offset=0)
        if len(data) > MAX_LINE:
            raise SchemaError(f"not a journal: first line is longer than {MAX_LINE} bytes", seq=0, offset=0)
        raise SchemaError("not a journal: no complete first line", seq=0, offset=0)
    return data[:cut]


def read_opening(path: Path, size: int, *, _source: Any = None) -> tuple[Any, int]:
    line = _first_line(path, size, _source)
    try:
        rec = codec.decode_line(line, seq_hint=0)
    except IntegrityError as e:
        # A newer major version is a usage problem, not tampering: say so first.
        _check_version_loose(line)
        e.offset = 0
        raise
    if not isinstance(rec, RunOpened):
        _check_version_loose(line)
        raise SchemaError(f"not a journal: first event is {getattr(rec, 'kind', type(rec).__name__)!r}, not run_opened", seq=0, offset=0)
    _check_version(rec.format_version)
    if not RUN_ID_RE.match(rec.run_id):
        raise SchemaError("run_opened: run id is not 1-128 characters of A-Z a-z 0-9 . _ : -", seq=0, offset=0)
    if rec.key_id is not None and (len(rec.key_id) != 16 or rec.key_id.strip("0123456789abcdef")):
        raise SchemaError("run_opened: key_id is not 16 lowercase hex digits", seq=0, offset=0)
    seq = getattr(rec, "seq", None)  # a decoded record's (the event class itself has no seq)
    if seq != 0:
        raise SchemaError(f"first event has seq {seq}, not 0", seq=0, offset=0)
    return rec, len(line)


def _check_version(version: str) -> None:
    major = version.split(".", 1)[0]
    if not major.isdigit():
        raise SchemaError(f"run_opened: bad format_version {version!r}", seq=0, offset=0)
    if int(major) > int(FORMAT_VERSION.split(".")[0]):
        raise UnsupportedFormat(
            f"journal format {version} is newer than this trainledger understands ({FORMAT_VERSION}); upgrade trainledger"
        )


def _check_version_loose(line: bytes) -> None:
    import msgspec

    try:
        obj = msgspec.json.decode(line)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return
    if isinstance(obj, dict) and obj.get("kind") == "run_opened" and isinstance(obj.get("format_version"), str):
        major = obj["format_version"].split(".", 1)[0]
        if major.isdigit() and int(major) > int(FORMAT_VERSION.split(".")[0]):
            _check_version(obj["format_version"])


def _boundaries(path: Path, size: int, first_end: int, parts: int) -> list[tuple[int, int, bytes]]:
    """Cut points at line starts, each with the seq and hash of the line just before it."""
    cuts: list[tuple[int, int, bytes]] = []
    window = 1 << 16
    with open(path, "rb") as f:
        for k in range(1, parts):
            target = size * k // parts
            if target <= first_end or (cuts and target <= cuts[-1][0]):
                continue
            f.seek(target)
            nl = f.read(window).find(b"\n")
            if nl < 0:
                continue
            cut = target + nl + 1
            if cut >= size:
                continue
            back = max(0, cut - 1 - window)
            f.seek(back)
            before = f.read(cut - 1 - back)
            start = before.rfind(b"\n")
            if start < 0:
                continue
            prev_line = before[start + 1:]
            try:
                import msgspec

                obj = msgspec.json.decode(prev_line)
                prev_seq, prev_h = obj["seq"], bytes.fromhex(obj["h"])
                if type(prev_seq) is not int or len(prev_h) != 32:
                    continue
            except (msgspec.DecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError, RecursionError):
                continue  # a bad line: leave it inside one range, whose scan reports it
            if cuts and cut <= cuts[-1][0]:
                continue
            cuts.append((cut, prev_seq, prev_h))
    return cuts


@dataclasses.dataclass
class Verification:
    """What the project's own readers ask of a verification beyond its report (:func:`verify_with`): internal API,
    named hooks instead of private keywords of :func:`verify`.

    ``consume``: each checked event handed on in the same pass (replay's fold, an export's writer), in this
    process; ``with_lines``: with each event's line; ``collect``: (kinds, seqs) whose lines and chain hashes the
    pass gathers (run folders' anchors); ``alongside``: started once the workers exist (a query's load beside the
    check); ``pool``: workers shared across journals (a run folder's ranks); ``source``: the journal's bytes as a
    stream of blocks of whole lines instead of the file the path names (which names it in messages): ``prefix(n)``
    (the first blocks, at least n bytes of them where there are, kept for ``blocks()``), ``blocks()`` ((block,
    offset) from the first byte on), ``offset`` (bytes handed on so far, the size once they are all read),
    ``certificates()`` (the key_certified lines, :func:`certify.find_certificates`'s); a stream is checked in one
    pass, with ``consume``."""

    consume: Callable[..., None] | None = None
    with_lines: bool = False
    collect: tuple[frozenset[str], frozenset[int]] | None = None
    alongside: Callable[[], None] | None = None
    pool: SharedWorkers | None = None
    source: Any = None


def verify(
    path: str | os.PathLike,
    *,
    trust: TrustPolicy | None = None,
    check_signatures: bool = True,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    **trust_options: Any,
) -> VerifyReport:
    """Verify a journal file and return what was established.

    Checks canonical form, seq continuity, every chain hash, run binding, every
    seal (the head it names and its Ed25519 signature under a pinned key) and
    the tail state, under ``trust`` (a :class:`~trainledger.journal.trust.TrustPolicy`; its fields may be given
    as keywords instead, or on top: ``verify(path, keys=[pub], require_closed=True)``).

    ``keys`` are the pinned public keys; the journal's key must be one of them.
    ``trust_embedded`` checks against the key embedded in ``run_opened``
    instead (the report says authenticity is not established).
    ``check_signatures=False`` checks everything but signatures (``trainledger show``).
    ``allow_unsealed`` accepts a signed journal whose last events no seal covers (a live run, a crash): the
    report then stands for the signed prefix alone (``sealed_bytes``, ``head``) and counts the rest in
    ``unsealed_events``; without it such a journal raises :class:`UnsealedEvents`. A signed journal with no
    valid seal at all never verifies.

    ``expect_checkpoint``: a checkpoint published earlier (a :class:`trainledger.journal.note.Checkpoint`, already opened under
    a pinned key; see :func:`trainledger.journal.proofs.checkpoint.open_checkpoint`): the journal must extend it, the root of its
    first ``size`` lines being the checkpoint's (recomputed in the same pass), else :class:`CheckpointMismatch`.

    Raises :class:`IntegrityError` subclasses when the journal does not verify
    (``err.report`` holds the partial report), :class:`UsageError` when no key
    is pinned, :class:`JournalIOError` when the file cannot be read and
    :class:`UnsupportedFormat` for a newer major format version.
    """
    return verify_with(path, Verification(), trust=trust, check_signatures=check_signatures, workers=workers,
                       progress=progress, **trust_options)


def verify_with(path: str | os.PathLike, hooks: Verification, *, trust: TrustPolicy | None = None,
                check_signatures: bool = True, workers: int | None = None,
                progress: Callable[[int, int], None] | None = None, **trust_options: Any) -> VerifyReport:
    """:func:`verify`, with the project's own readers' ``hooks`` (:class:`Verification`): internal API."""
    _alongside, _collect, _pool = hooks.alongside, hooks.collect, hooks.pool
    _consume, _with_lines, _source = hooks.consume, hooks.with_lines, hooks.source
    policy = TrustPolicy.of(trust, **trust_options)
    keys, trust_embedded = policy.keys, policy.trust_embedded
    allow_unsigned, allow_unsealed, require_closed = policy.allow_unsigned, policy.allow_unsealed, policy.require_closed
    head_req, expect_checkpoint = policy.expect_head, policy.expect_checkpoint
    p = Path(path)
    size = open_checked(p) if _source is None else 0
    report = VerifyReport(ok=False, path=str(p), bytes=size)
    try:
        opened, opened_len = read_opening(p, size, _source=_source)
    except IntegrityError as e:
        _fail(report, e)
        raise

    report.run_id = opened.run_id
    imported = (opened.meta or {}).get("imported") if isinstance(opened.meta, dict) else None
    report.imported = imported if isinstance(imported, dict) else None
    report.key_id = opened.key_id
    report.format_version = opened.format_version
    report.created_ns = opened.ts
    try:
        signing = resolve_signing(p, size, opened, opened_len, keys=keys, trust_embedded=trust_embedded,
                                  check_signatures=check_signatures, _source=_source)
        report.trust, report.key_id, report.signing_keys = signing.trust, signing.key_id, signing.signing_keys
        report.notes += signing.notes
        if policy.roster is not None:
            _hold_to_roster(policy.roster, opened, p, signing.key_id)
    except IntegrityError as e:
        _fail(report, e)
        raise

    ctx = ScanContext(opened.run_id, opened.key_id, signing.raw, check_signatures, head_req,
                      *(_collect or (frozenset(), frozenset())), tree=tree_mode(opened.format_version),
                      tree_at=expect_checkpoint.size if expect_checkpoint is not None else None,
                      certified=signing.certified)
    if expect_checkpoint is not None and not ctx.tree:
        err = UsageError(f"{p}: a format {opened.format_version} journal has no tree heads: --expect-checkpoint "
                         "needs format 1.3 or later")
        raise err
    if _consume is not None:  # replay's fold: one pass in this process, each checked event handed on
        results = [scan_consuming(str(p), size, ctx, _consume, progress=progress, with_lines=_with_lines,
                                  signed=report.trust in ("pinned", "embedded"),
                                  blocks=_source.blocks() if _source is not None else None,
                                  columns=getattr(_consume, "step_columns", None))]
        if _source is not None:  # its size known now, every line read
            report.bytes = results[0].end = _source.offset
    elif _source is not None:  # pragma: no cover - a hook for the export's check alone
        raise UsageError("verify: a stream of lines is checked in one pass, with Verification.consume")
    else:
        results = _scan(p, size, opened_len + 1, ctx, workers, progress, _alongside, _pool)
    if _collect is not None:  # verify_run_dir: lines and hashes gathered by the same pass that checked them
        report.collected = [x for r in results for x in r.collected]
        report.hashes = {k: v for r in results for k, v in r.hashes.items()}

    try:
        _carry_late_signatures(results)
    except IntegrityError as e:
        _fail(report, e)
        raise
    for res in results:
        report.events += res.count
        for k, n in res.kinds.items():
            report.kinds[k] = report.kinds.get(k, 0) + n
        report.unknown_events += res.unknown
        report.seals += res.seals
        if res.last_seq is not None:
            report.last_seq, report.last_hash = res.last_seq, res.last_hash
        if res.last_seal_seq is not None:
            report.last_sealed_seq = res.last_seal_seq - 1
            report.last_sealed_hash = res.last_sealed_hash
            report.sealed_bytes = res.last_seal_end
            report.seal_line_hash = res.last_seal_h
            report.last_tree_root, report.last_seal_sig = res.last_seal_root, res.last_seal_sig
        if res.torn_offset is not None:
            report.torn_offset, report.torn_bytes = res.torn_offset, res.torn_bytes
        if res.error is not None:
            name, msg, seq, off = res.error
            err_cls = _ERRORS.get(name)
            failed = err_cls(msg, seq=seq, offset=off) if err_cls else JournalIOError(msg)
            if isinstance(failed, IntegrityError):
                _fail(report, failed)
            raise failed
    if ctx.certified is not None:
        try:
            _hold_seal_keys(opened, results)
        except IntegrityError as e:
            _fail(report, e)
            raise
    if ctx.tree:
        try:
            at = _merge_trees(report, results, ctx.tree_at)
            if expect_checkpoint is not None:
                _check_extends(report, expect_checkpoint, at)
        except IntegrityError as e:
            _fail(report, e)
            raise
    _finish(report, results, head_req, require_closed, allow_unsigned, allow_unsealed, ctx)
    return report


def _check_extends(report: VerifyReport, cp: Any, root_at: bytes | None) -> None:
    if cp.origin != "trainledger/" + (report.run_id or ""):
        raise CheckpointMismatch(f"the expected checkpoint is of {cp.origin[:80]!r}, not of this run", seq=0)
    if root_at is None:
        n = report.tree.end if report.tree is not None else 0
        raise CheckpointMismatch(f"the expected checkpoint is of a tree of {cp.size:,} lines; the journal holds "
                                 f"{n:,}: truncated", seq=n)
    if root_at != cp.root:
        raise CheckpointMismatch(f"the journal's first {cp.size:,} lines do not hash to the expected checkpoint's "
                                 "root: rewritten since it was published (a fork)", seq=cp.size - 1)
    report.notes.append(f"extends the expected checkpoint (tree of {cp.size:,} lines)")


def _merge_trees(report: VerifyReport, results: list[RangeResult], tree_at: int | None = None) -> bytes | None:
    """Join the ranges' trees in file order, checking the root each seal names against every line before it (a
    range that begins past leaf 0 could not: it lacked the lines before it). Returns the root of the first
    ``tree_at`` lines when asked and the journal holds that many."""
    from trainledger.journal.merkle import CompactRange

    whole = CompactRange(0)
    sealed = None
    root_at = None
    waiting = None  # the tree through a seal left waiting for its signature (format 1.7)
    for res in results:
        if res.tree_at is not None and root_at is None:
            t = whole.copy()
            t.merge(res.tree_at)
            root_at = t.root()
        for seq, offset, claimed, leaves in res.seal_roots:
            t = whole.copy()
            t.merge(leaves)
            if t.root() != claimed:
                raise SealInvalid(f"seal at seq {seq}: its tree root is not the root of the {seq:,} lines before it",
                                  seq=seq, offset=offset)
        if res.carried and res.seal_tree is None and waiting is not None:
            sealed = waiting  # its signature came in this range: the signed lines end at that seal's line
        if res.seal_tree is not None:
            sealed = whole.copy()
            sealed.merge(res.seal_tree)
        if res.pending_open is not None and res.pending_tree is not None:
            waiting = whole.copy()
            waiting.merge(res.pending_tree)
        elif res.touched:
            waiting = None
        if res.tree is not None:
            whole.merge(res.tree)
    report.tree, report.sealed_tree = whole, sealed
    return root_at


def verify_copy(path: str | os.PathLike, copies: Any, trust: TrustPolicy | None = None,
                **options: Any) -> tuple[VerifyReport, Path]:
    """Copy ``path`` into ``copies`` (a :class:`~trainledger.journal.copies.PrivateCopies`), verify the copy under
    ``trust``, and return the report (naming ``path``) and the copy, which is what the caller must read from then
    on. ``options``: :func:`verify`'s other keywords, or the policy's fields."""
    copy = copies.copy(path)
    try:
        report = verify(copy, trust=trust, **options)
    except IntegrityError as e:
        if e.report is not None:
            e.report.path = str(path)
        raise
    report.path = str(path)
    return report, copy


def _hold_to_roster(roster: Roster, opened: RunOpened, p: Path, key_id: str | None) -> None:
    """A rank journal (run id ``RUN.rNNNNN``) is signed by the key the roster binds to its rank (for a journal
    whose keys are certified: certified by it)."""
    split = split_run_id(opened.run_id)
    if split is None:
        raise UsageError(f"{p}: a roster binds the ranks of a run folder, and this journal's run id "
                         f"{opened.run_id!r} is not a rank journal's (RUN.rNNNNN)")
    roster.hold(split[1], key_id)


def _carry_late_signatures(results: list[RangeResult]) -> None:
    """Format 1.7, seals signed late: a range's first seal_signed may sign the seal an earlier range left waiting;
    it must be that one, and the signed prefix then ends at that seal's line (in the earlier range)."""
    waiting = None  # (seq, end offset, line hash, fields) of the seal left waiting by the ranges so far
    for res in results:
        if res.error is not None:
            return  # the loop that reads the results raises it
        if res.carry_resolution is not None:
            if waiting is None or waiting[3] != res.carry_resolution:
                raise SealInvalid(f"a seal_signed after seq {res.first_seq} names seal {res.carry_resolution[0]}, "
                                  "which is not the seal waiting for a signature", seq=res.carry_resolution[0])
            if res.carried:
                res.last_seal_end, res.last_seal_h = waiting[1], waiting[2]
        if res.touched:
            waiting = res.pending_open


def _hold_seal_keys(opened: Any, results: list[RangeResult]) -> None:
    """A certified journal's seals, across ranges: each range's seals before its first certificate are by the key
    certified last before the range (run_opened's, before any)."""
    governing = opened.key_id
    for res in results:
        if res.lead_key is not None and res.lead_key != governing:
            raise SealInvalid(f"a seal after seq {res.first_seq} is by key {res.lead_key}, but the key certified "
                              f"last before it is {governing} (a seal of another round's key)", seq=res.first_seq)
        if res.last_cert_key is not None:
            governing = res.last_cert_key


@dataclasses.dataclass
class Signing:
    """How a journal's seals are checked (:func:`resolve_signing`): the one key's raw bytes, or the keys its
    certificates certify (``certified``, a :class:`ScanContext` table); the trust label; the key that stands for
    the journal (its own, or the certifying key); notes for the report."""

    raw: bytes | None
    trust: str
    key_id: str | None
    notes: list[str]
    certified: dict[str, tuple[bytes | None, int]] | None = None
    signing_keys: list[str] = dataclasses.field(default_factory=list)
    #: certified keys only: key id -> the seq of the key_certified line that certifies it
    certificates: dict[str, int] = dataclasses.field(default_factory=dict)


def resolve_signing(p: Path, size: int, opened: Any, opened_len: int, *, keys: Sequence[PublicKey] = (),
                    trust_embedded: bool = False, check_signatures: bool = True, _source: Any = None) -> Signing:
    """:func:`resolve_key`, and for a journal whose keys are certified (format 1.7, journal.certify) the keys
    its certificates certify under a pinned key: every certificate checked here, before the scan, which then
    holds each seal to the key certified last before it."""
    from trainledger.journal.certify import certified_keys, opens_certified
    from trainledger.journal.scan import ANY_KEY

    if opened.key_id is None or not opens_certified(p, opened_len, _source=_source):
        raw, trust, notes = resolve_key(opened, keys=keys, trust_embedded=trust_embedded,
                                        check_signatures=check_signatures)
        return Signing(raw, trust, opened.key_id, notes, signing_keys=[opened.key_id] if opened.key_id else [])
    _embedded_key(opened)
    if not check_signatures:
        return Signing(None, "unchecked", opened.key_id, [], ANY_KEY)
    if not keys and not trust_embedded:
        raise UsageError("no key pinned: pass --pubkey FILE (the key that certifies the rank keys) or set "
                         "TRAINLEDGER_TRUSTED_KEYS; --trust-embedded checks integrity only")
    cert = certified_keys(p, size, opened, keys=keys, trust_embedded=trust_embedded, _source=_source)
    if cert is None:  # pragma: no cover - opens_certified saw one at line 1
        raise SealInvalid("the journal's certificate could not be read", seq=1)
    first = cert.keys.get(opened.key_id)
    if first is None:
        raise SealInvalid(f"run_opened's key {opened.key_id} is not the key its certificate certifies", seq=1)
    issuer = first.issuer_id
    trust = "pinned" if keys else "embedded"
    pinned = next((k.source for k in keys if k.key_id == issuer), None)
    notes = [f"rank keys certified by key {issuer}" + (f", pinned by {pinned}" if pinned else
                                                       " (embedded: authenticity not established)")
             + f"; {len(cert.keys)} key{'s' if len(cert.keys) > 1 else ''} (round{'s' if len(cert.rounds) > 1 else ''}"
             f" {', '.join(map(str, cert.rounds))})"]
    return Signing(None, trust, issuer, notes, cert.table(), list(cert.keys),
                   {k: c.seq for k, c in cert.keys.items()})


def resolve_key(opened: Any, *, keys: Sequence[PublicKey] = (), trust_embedded: bool = False,
                check_signatures: bool = True) -> tuple[bytes | None, str, list[str]]:
    """The public key a journal's seals are checked against: (raw key or None, trust, notes).

    Trust is "pinned", "embedded", "unsigned" or "unchecked" (as in :class:`VerifyReport`). Raises
    :class:`UntrustedKey` when keys are pinned but not the journal's, :class:`UsageError` when none is pinned
    and the embedded key is not accepted, :class:`RunMismatch` for an inconsistent embedded key. Whether an
    unsigned journal is acceptable is the caller's decision (``allow_unsigned``).
    """
    if opened.key_id is None:
        if opened.public_key is not None:
            raise RunMismatch("run_opened embeds a public key but no key id", seq=0, offset=0)
        return None, "unsigned", []
    embedded = _embedded_key(opened)
    if not check_signatures:
        return None, "unchecked", []
    pinned = [k for k in keys if k.key_id == opened.key_id]
    if pinned:
        return pinned[0].raw, "pinned", [f"key {opened.key_id} pinned by {pinned[0].source}"]
    if keys:
        raise UntrustedKey(
            f"journal is signed by key {opened.key_id}, which is not pinned "
            f"(pinned: {', '.join(k.key_id for k in keys)})",
            seq=0, offset=0,
        )
    if trust_embedded:
        return embedded, "embedded", ["checked against the key embedded in the journal: authenticity not established"]
    raise UsageError(
        "no key pinned: pass --pubkey FILE (or set TRAINLEDGER_TRUSTED_KEYS); --trust-embedded checks integrity only"
    )


def _embedded_key(opened: Any) -> bytes:
    try:
        raw = base64.b64decode(opened.public_key or "", validate=True)
    except (binascii.Error, ValueError):
        raise RunMismatch("run_opened: public key is not base64", seq=0, offset=0) from None
    if len(raw) != 32 or key_id_of(raw) != opened.key_id:
        raise RunMismatch("run_opened: embedded public key does not match its key id", seq=0, offset=0)
    return raw


def _scan(p: Path, size: int, first_end: int, ctx: ScanContext, workers: int | None,
          progress: Callable[[int, int], None] | None,
          alongside: Callable[[], None] | None = None, shared: SharedWorkers | None = None) -> list[RangeResult]:
    """Check the file; ``alongside`` (other work that releases the GIL, e.g. a DuckDB load) runs in a thread
    meanwhile, started only after any worker processes exist, so that nothing forks with it running. With
    ``shared``, the ranges go to its workers."""
    if shared is not None and shared.pool is not None and size >= PARALLEL_MIN_BYTES:
        return _in_workers(shared, p, size, first_end, ctx, None)
    with _Alongside(alongside) as start:
        return _scan_ranges(p, size, first_end, ctx, workers, progress, start)


class Cancelled(TrainledgerError):
    """A verification sharing workers stopped because another gave up (:class:`SharedWorkers`); never reaches a
    caller: the one that gave up raises its own error."""


class SharedWorkers:
    """Worker processes that several verifications running at once share (:func:`trainledger.journal.audit.rundir.verify_run_dir`
    verifies its ranks side by side): every journal's ranges queue for the same workers, which so never wait
    between journals. Used as a context manager (workers forked, or from a fork server beside threads); where it
    cannot start them (one CPU, no fork or fork server, or the start fails for want of processes or memory) or
    the files are small (``total_bytes``), it starts none, and each verification checks its file alone."""

    def __init__(self, workers: int | None = None, total_bytes: int = 0):
        self.n = cpu_count() if workers is None else max(1, workers)
        self.total = total_bytes
        self.pool: Any = None  # a multiprocessing Pool, started when the work is worth one
        #: set by the thread that gives up (Ctrl-C, an error): every verification waiting on the workers stops
        #: rather than wait for results nobody will read (or that never come: see run)
        self.cancelled = threading.Event()

    def run(self, tasks: list[tuple], progress: Callable[[int, int], None] | None = None,
            size: int = 0) -> list[RangeResult]:
        """Check the ranges ``tasks`` on the workers, in order (``progress(bytes done, size)`` as they come).

        Raises :class:`Cancelled` once :attr:`cancelled` is set, and :class:`JournalIOError` when a worker died (the
        kernel's OOM killer, a stray ``kill -9``): a pool replaces a dead worker, but the range it held never
        comes back, and waiting for it would hang for ever.
        """
        from multiprocessing import TimeoutError as WaitedOut  # loaded with the pool

        pending = [self.pool.apply_async(_scan_range_star, (t,)) for t in tasks]
        out = []
        done = 0
        for r, task in zip(pending, tasks):
            while True:
                if self.cancelled.is_set():
                    raise Cancelled("verification cancelled")
                try:
                    res = r.get(timeout=0.05)
                    break
                except WaitedOut:
                    if self._lost_worker():
                        raise JournalIOError(f"{task[0]}: a process checking it died (killed, or out of memory?) "
                                             "before it finished: nothing was concluded") from None
            out.append(res)
            done += res.end - res.start
            if progress is not None:
                progress(done, size)
        return out

    def _lost_worker(self) -> bool:
        procs = getattr(self.pool, "_pool", None)  # multiprocessing.Pool's own list of its worker processes
        if procs is None:  # pragma: no cover - a Python whose Pool keeps them elsewhere: nothing to look at
            return False
        return any(w.exitcode is not None for w in procs) or {w.pid for w in procs} != self._pids

    def __enter__(self) -> SharedWorkers:
        if self.n > 1 and self.total >= PARALLEL_MIN_BYTES:
            ctx = _worker_context()
            if ctx is None:
                return self
            if ctx.get_start_method() == "fork":
                # built once here: inherited by every worker (rather than built again in each), and ready before
                # any thread of verify_run_dir's reads
                codec._decoders()
            try:
                self.pool = ctx.Pool(self.n, initializer=worker_ignores_ctrl_c)
            except OSError:  # no process to spare (EAGAIN, ENOMEM): Pool stopped the ones it started; check alone
                return self
            self._pids = {w.pid for w in getattr(self.pool, "_pool", ())}
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancelled.set()
        if self.pool is not None:
            self.pool.terminate()
            self.pool.join()
            self.pool = None


def _worker_context() -> Any:
    """How to start worker processes here. ``fork`` from a process with no other thread (the fastest: the workers
    inherit what is imported); from one with threads (a training script's, a test runner's, verify_run_dir's own),
    forking could copy a lock another thread holds, so ``forkserver``: workers forked from a clean server process
    (started once per process, with the scanner imported) that never had those threads. None where neither
    exists (then the file is checked in this process)."""
    import multiprocessing  # here: a verify on one core (most) never starts a worker

    methods = multiprocessing.get_all_start_methods()
    if threading.active_count() == 1 and "fork" in methods:
        return multiprocessing.get_context("fork")
    if "forkserver" in methods:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["trainledger.journal.scan"])
        return ctx
    return None


class _Alongside:
    def __init__(self, fn: Callable[[], None] | None):
        self.fn = fn
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def __enter__(self) -> Callable[[], None]:
        return self.start

    def start(self) -> None:
        if self.fn is not None and self.thread is None:
            self.thread = threading.Thread(target=self._run, name="trainledger-alongside", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        assert self.fn is not None  # start() runs it only then
        try:
            self.fn()
        except BaseException as e:  # handed back to the caller's thread
            self.error = e

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.start()
        if self.thread is not None:
            self.thread.join()
        if self.error is not None and exc[0] is None:
            raise self.error


def _scan_ranges(p: Path, size: int, first_end: int, ctx: ScanContext, workers: int | None,
                 progress: Callable[[int, int], None] | None, start_alongside: Callable[[], None]
                 ) -> list[RangeResult]:
    g = genesis(ctx.run_id)
    # Workers for a big file: forked, or from a fork server when this process has other threads (_worker_context).
    with SharedWorkers(workers, size) as shared:
        start_alongside()  # any workers exist now
        if shared.pool is not None:
            return _in_workers(shared, p, size, first_end, ctx, progress)
    if progress is None:
        return [scan_range(str(p), 0, size, -1, g, ctx, True)]
    # Still in pieces, so that a progress bar moves.
    n_parts = max(1, min(64, size // (4 << 20)))
    cuts = _boundaries(p, size, first_end, n_parts)
    return _run_serial(p, size, g, ctx, cuts, progress)


def _in_workers(shared: SharedWorkers, p: Path, size: int, first_end: int, ctx: ScanContext,
                progress: Callable[[int, int], None] | None) -> list[RangeResult]:
    """The file cut into four ranges a worker, checked on ``shared``'s workers."""
    cuts = _boundaries(p, size, first_end, shared.n * 4)
    return shared.run(_tasks(p, size, genesis(ctx.run_id), ctx, cuts), progress, size)


def _tasks(p: Path, size: int, g: bytes, ctx: ScanContext, cuts: list[tuple[int, int, bytes]]) -> list[tuple]:
    starts = [(0, -1, g)] + cuts
    tasks = []
    for i, (start, prev_seq, prev_h) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else size
        tasks.append((str(p), start, end, prev_seq, prev_h, ctx, i == len(starts) - 1))
    return tasks


def _run_serial(p, size, g, ctx, cuts, progress) -> list[RangeResult]:
    out = []
    for args in _tasks(p, size, g, ctx, cuts):
        res = _scan_range_star(args)
        out.append(res)
        progress(res.end, size)
        if res.error is not None:
            break
    return out


def _fail(report: VerifyReport, err: IntegrityError) -> None:
    report.ok = False
    report.first_bad_seq = err.seq
    report.error = str(err)
    report.error_kind = err.reason
    report.error_offset = err.offset
    err.report = report


def _finish(report: VerifyReport, results: list[RangeResult], head_req, require_closed: bool,
            allow_unsigned: bool, allow_unsealed: bool, ctx: ScanContext) -> None:
    last = results[-1]
    closed_seqs = [s for r in results for s in r.closed_seqs]
    last_seq = report.last_seq if report.last_seq is not None else -1
    seal_line = report.last_sealed_seq + 1 if report.last_sealed_seq is not None else None
    try:
        if len(closed_seqs) > 1:
            raise RunMismatch(f"run_closed appears {len(closed_seqs)} times (seq {closed_seqs[1]})", seq=closed_seqs[1])
        if closed_seqs and last_seq > closed_seqs[0] + 1:
            raise RunMismatch(f"events after run_closed (seq {closed_seqs[0]})", seq=closed_seqs[0] + 1)
        if closed_seqs and last_seq == closed_seqs[0] + 1 and seal_line != last_seq:
            raise RunMismatch("the event after run_closed is not its seal", seq=last_seq)
        report.unsealed_events = last_seq - seal_line if seal_line is not None else report.events
        if last.torn_offset is not None:
            report.tail = "torn"
            report.notes.append(f"torn tail: {report.torn_bytes} bytes after the last complete line (a crash mid-write)")
        elif closed_seqs and seal_line == last_seq:
            report.tail = "closed"
        else:
            report.tail = "open"
        if head_req is not None:
            found = next((r.head_found for r in results if r.head_found is not None), None)
            if found is None:
                raise HeadMismatch(
                    f"expected head {head_req[0]}:{head_req[1][:16]}... is beyond the end of the journal "
                    f"(last seq {last_seq}): truncated",
                    seq=last_seq + 1,
                )
            if not found:
                raise HeadMismatch(f"event {head_req[0]} does not have the expected hash", seq=head_req[0])
        if require_closed and report.tail != "closed":
            raise NotClosed(f"journal is not closed and sealed (tail: {report.tail})", seq=last_seq + 1)
        signed = ctx.key_id is not None and report.trust in ("pinned", "embedded")
        if signed and seal_line is None:
            raise UnsealedEvents(f"no seal in the journal: none of its {report.events:,} events is signed", seq=1)
        if report.unsealed_events:
            if signed and not allow_unsealed:
                assert seal_line is not None  # a signed journal without a seal was refused above
                raise UnsealedEvents(
                    f"{report.unsealed_events:,} events after seq {seal_line} are not signed (the last seal covers "
                    f"seq {report.last_sealed_seq}); --allow-unsealed accepts the signed prefix alone",
                    seq=seal_line + 1)
            report.notes.append(f"{report.unsealed_events:,} events after seq {seal_line} are NOT signed: "
                                "not verified, left out of every conclusion")
        if ctx.key_id is None and not allow_unsigned:
            raise UnsignedJournal("journal is unsigned (no key): pass --allow-unsigned to accept integrity without authenticity", seq=0)
    except IntegrityError as e:
        _fail(report, e)
        raise
    if ctx.key_id is None:
        report.notes.append("unsigned journal: the chain shows accidental corruption, not tampering")
    report.notes.append("truncation is only visible against a head or checkpoint recorded elsewhere (trainledger head, "
                        "trainledger tree-head)")
    report.ok = True
