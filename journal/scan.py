"""The verifier's inner loop: check a byte range of a journal, a read block at a time.

Shared by :func:`trainledger.journal.verify.verify` (possibly in several processes, one
byte range each), the streaming reader and ``Journal.open_append``. A range
is checked given the seq and chain hash of the line just before it, so ranges
are independent and can be checked in parallel: every line's hash is
recomputed from the *stored* hash of the line before it, and since each of
those is itself checked, the whole chain holds when every range does. The same
holds within a block, whose lines the accelerator hashes side by side
(:meth:`Scanner.feed_block`); whatever the block pass does not settle is
checked line by line (:meth:`Scanner.feed`), which names the line.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import operator
import os
import typing
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgspec

from trainledger.journal import codec

from trainledger.journal import accel as _accel
from trainledger.journal.chain import LINE_TAG, genesis, is_hash_hex, seal_checkpoint, seal_message
from trainledger.journal.merkle import CompactRange, range_of_hashes, range_of_lines
from trainledger.journal.codec import HASH_SUFFIX_LEN, UnknownEvent
from trainledger.journal.errors import (
    ChainBroken,
    IntegrityError,
    JournalIOError,
    RunMismatch,
    SchemaError,
    SealInvalid,
    SequenceError,
)
from trainledger.journal.events import KeyCertified, RunClosed, RunOpened, Seal, SealSigned, StepObserved
from trainledger.journal.keys import PublicKey

#: Longest line accepted. The writer never produces one near this; a longer
#: "line" is garbage or an attack, and refusing it keeps memory bounded.
MAX_LINE = 16 * 1024 * 1024
#: Bytes read at a time; each block's complete lines are checked as one batch
#: (about 1,000 step events), small enough to stay in cache (tools/bench_journal.py).
BLOCK = 256 * 1024

_fast = _accel.fast
_scan_block: Any = getattr(_fast, "scan_block", None)
_step_lines: Any = getattr(_fast, "step_lines", None)
_step_records: Any = getattr(_fast, "step_records", None)
_join_lines: Any = getattr(_fast, "join_lines", None)
_link = _accel.link
_get_seq = operator.attrgetter("seq")
_get_h = operator.attrgetter("h")
_fromhex = bytes.fromhex
_LINE_BASE = hashlib.sha256(LINE_TAG)
_copy = type(_LINE_BASE).copy
_update = type(_LINE_BASE).update
_digest = type(_LINE_BASE).digest
_add = operator.add
_repeat = itertools.repeat
_strip_hash = operator.itemgetter(slice(None, -HASH_SUFFIX_LEN))


TREE_CHECK, TREE_FIELDS = 1, 2


def tree_mode(format_version: str | None, check: bool = True) -> int:
    """ScanContext.tree for a journal of this format version."""
    from trainledger.journal.chain import has_tree

    return (TREE_CHECK if check else TREE_FIELDS) if has_tree(format_version) else 0


class ScanContext:
    """What every range needs to know about the journal (picklable)."""

    __slots__ = ("run_id", "key_id", "public_raw", "check_signatures", "expect_head", "collect", "want_seqs", "tree",
                 "tree_at", "certified")

    def __init__(self, run_id: str, key_id: str | None, public_raw: bytes | None,
                 check_signatures: bool, expect_head: tuple[int, str] | None,
                 collect: frozenset[str] = frozenset(), want_seqs: frozenset[int] = frozenset(),
                 tree: int = 0, tree_at: int | None = None,
                 certified: dict[str, tuple[bytes | None, int]] | None = None):
        self.run_id = run_id
        self.key_id = key_id
        self.public_raw = public_raw
        self.check_signatures = check_signatures
        self.expect_head = expect_head
        #: kinds whose lines the scan hands back (with their offsets), and seqs whose chain hashes it hands back;
        #: the seals' heads are handed back whenever ``collect`` is set (verify_run_dir's anchors)
        self.collect = collect
        self.want_seqs = want_seqs
        #: format 1.3: every seal names the Merkle tree of the lines before it and signs its checkpoint text.
        #: 0: an older format (a seal naming a tree is refused); TREE_CHECK: the scan builds the tree and checks
        #: each seal's root; TREE_FIELDS: the fields are checked but not the roots (a fold after verification)
        self.tree = tree
        #: a tree size whose root the scan keeps (verify --expect-checkpoint): the range holding that leaf boundary
        #: hands back its leaves before it
        self.tree_at = tree_at
        #: format 1.7, a journal whose keys are certified (journal.certify): key id -> (raw public key, not-after
        #: ns) of every key its certificates certify (checked before the scan); each seal is then held to the key
        #: certified last before it. None: every seal is the journal's own key's (``key_id``)
        self.certified = certified

    def __getstate__(self):
        return tuple(getattr(self, s) for s in self.__slots__)

    def __setstate__(self, state):
        for s, v in zip(self.__slots__, state):
            setattr(self, s, v)


def _pending_fields(rec: Any) -> tuple:
    """What a seal signed late and its seal_signed both name: (seal seq, sealed seq and hash, tree size and root,
    key id)."""
    return (rec.seq, rec.sealed_seq, rec.sealed_hash, rec.tree_size, rec.tree_root, rec.key_id)


def _check_signature(pub: PublicKey, rec: Any, msg: bytes, what: str, which: str) -> None:
    """``rec.sig`` (base64) must be ``pub``'s signature of ``msg``; :class:`SealInvalid` naming ``what`` otherwise."""
    try:
        sig = base64.b64decode(rec.sig, validate=True)
    except (binascii.Error, ValueError):
        raise SealInvalid(f"{what}: signature is not base64", seq=rec.seq) from None
    if not pub.verify(sig, msg):
        raise SealInvalid(f"{what}: {which} does not verify under key {rec.key_id}", seq=rec.seq)


class _AnyKey(dict):
    """``ScanContext.certified`` for a certified journal read without checking signatures: any key, any time (the
    order of keys and certificates is still held)."""

    def get(self, key, default=None):
        return (None, 1 << 63)

    def __contains__(self, key) -> bool:
        return True


ANY_KEY = _AnyKey()


class RangeResult:
    """Facts gathered from one byte range; merged in file order by the verifier."""

    __slots__ = ("start", "end", "count", "kinds", "first_seq", "last_seq", "last_hash", "last_kind",
                 "seals", "last_seal_seq", "last_sealed_hash", "last_seal_end", "last_seal_h", "closed_seqs", "head_found", "torn_offset", "torn_bytes",
                 "unknown", "error", "collected", "hashes", "tree", "seal_tree", "seal_roots",
                 "last_seal_sig", "last_seal_root", "tree_at", "lead_key", "last_cert_key", "touched", "pending_open",
                 "pending_tree", "carry_resolution", "carried")

    def __init__(self, start: int, end: int):
        self.start = start
        self.end = end
        self.count = 0
        self.kinds: dict[str, int] = {}
        self.first_seq: int | None = None
        self.last_seq: int | None = None
        self.last_hash: str | None = None
        self.last_kind: str | None = None
        self.seals = 0
        self.last_seal_seq: int | None = None
        self.last_sealed_hash: str | None = None
        #: byte offset just past the newline of the last good seal line: the signed prefix ends there
        self.last_seal_end: int | None = None
        self.last_seal_h: str | None = None  # the seal line's own chain hash
        self.closed_seqs: list[int] = []
        self.head_found: bool | None = None
        self.torn_offset: int | None = None
        self.torn_bytes = 0
        self.unknown = 0
        self.error: tuple[str, str, int | None, int | None] | None = None
        self.collected: list[tuple[int, bytes]] = []  # (offset, line) of the kinds ScanContext.collect names
        self.hashes: dict[int, str] = {}  # seq -> chain hash: every seal's (when collecting) and ScanContext.want_seqs
        #: format 1.3: the range's lines as a compact range of leaves; the same through its last seal line; and
        #: (seal seq, offset, claimed root, the range's leaves before it) for each seal of a range not starting at
        #: leaf 0, whose root only the merge of the ranges before it can check
        self.tree: CompactRange | None = None
        self.seal_tree: CompactRange | None = None
        self.seal_roots: list[tuple[int, int, bytes, CompactRange]] = []
        self.last_seal_sig: str | None = None
        self.last_seal_root: str | None = None
        self.tree_at: CompactRange | None = None
        #: certified journals: the key of the range's seals before its first key_certified (the merge holds it to
        #: the key certified last before the range), and the key its last key_certified certifies
        self.lead_key: str | None = None
        self.last_cert_key: str | None = None
        #: format 1.7, seals signed late (a seal without its signature, then seal_signed): whether the range holds
        #: any seal line at all; the pending seal it ends with (seq, end offset, its line's hash, its fields) and the
        #: tree through it; the fields of a seal_signed that resolves a seal pending from before the range, and
        #: whether the range's signed point is that one (its end offset and hash then come from the merge)
        self.touched = False
        self.pending_open: tuple[int, int, str, tuple] | None = None
        self.pending_tree: CompactRange | None = None
        self.carry_resolution: tuple | None = None
        self.carried = False

    def __getstate__(self):
        return tuple(getattr(self, s) for s in self.__slots__)

    def __setstate__(self, state):
        for s, v in zip(self.__slots__, state):
            setattr(self, s, v)


class Scanner:
    """Checks consecutive lines: canonical form, seq, chain, seals, run binding."""

    def __init__(self, ctx: ScanContext, prev_seq: int, prev_hash: bytes, result: RangeResult):
        codec.refresh()
        self.ctx = ctx
        self.expect = prev_seq + 1
        self.prev = prev_hash
        self.res = result
        #: verify's scanner: the records it checks are not handed on, so step_observed lines need not be decoded
        #: (:meth:`_step_block`). Readers keep it False.
        self.steps_unread = False
        #: with ``steps_unread``: whether a block's step records may still be asked for (``records()``), so the
        #: numbers of its step lines are decoded once for them; False (verify alone) leaves every number the C check
        #: proves spelled as msgspec writes it undecoded
        self.numbers_kept = True
        #: with ``steps_unread``: the views' column builder (``step_columns``, journal/views/_fastcols.c), when a
        #: block's step lines are handed on as columns (:class:`StepBlock`), not records; None: records
        self.step_columns: Callable[[bytes, bytes], Any] | None = None
        self._pub = PublicKey(ctx.public_raw) if ctx.public_raw is not None else None
        self._type_counts: dict[type, int] = {}
        self._seal_t = codec.record_type(Seal)
        self._opened_t = codec.record_type(RunOpened)
        self._closed_t = codec.record_type(RunClosed)
        self._cert_t = codec.record_type(KeyCertified)
        self._signed_t = codec.record_type(SealSigned)
        #: the seal waiting for its signature (format 1.7), and the tree through its line
        self._pending: Any = None
        self._pending_tree: CompactRange | None = None
        #: the key the last key_certified of this range certifies (None: none yet in this range)
        self._cur_key: str | None = None
        self._pubs: dict[str, PublicKey] = {}
        # Kinds with no per-line rule beyond the chain: batches of them take the all-C path.
        self._plain = {t for c, t in ((c, codec.record_type(c)) for c in codec.known_kinds().values())
                       if c not in (Seal, RunOpened, RunClosed, KeyCertified, SealSigned)}
        self._plain_or_seal = self._plain | {self._seal_t}
        kinds = codec.known_kinds()
        self._collect = {codec.record_type(kinds[k]) for k in ctx.collect if k in kinds}
        self._want = ctx.want_seqs
        self._tree = CompactRange(prev_seq + 1) if ctx.tree == TREE_CHECK else None
        result.tree = self._tree

    # ------------------------------------------------------------ decoding

    def _decode(self, lines: list[bytes], offset: int, aligned: bool = False) -> list[Any]:
        recs = codec.decode_batch(lines, aligned=aligned)
        if recs is not None:
            return recs
        out = []
        seq = self.expect
        for line in lines:
            if not line:
                raise SchemaError("empty line", seq=seq, offset=offset)
            try:
                out.append(codec.decode_line(line, seq_hint=seq))
            except IntegrityError as e:
                e.offset = offset
                raise
            offset += len(line) + 1
            seq += 1
        return out

    # ------------------------------------------------------------ the loop

    def feed(self, lines: list[bytes], offset: int) -> list[Any]:
        """Check ``lines`` (no newlines) starting at byte ``offset``; return their records (and, in format 1.3,
        add them to the tree and check the root each seal names)."""
        recs = self._feed(lines, offset)
        if self._tree is not None and recs:
            self._grow(recs, list(map(type, recs)), offset, lambda a, b, begin: range_of_lines(begin, lines[a:b]),
                       lambda i: sum(map(len, lines[:i])) + i)
        return recs

    def feed_block(self, block: bytes, offset: int) -> list[Any]:
        """:meth:`feed` for a block of complete lines, each ending with a newline, as read at byte ``offset``.

        With the accelerator, the block is checked without splitting it into lines: the chain, the seqs and the
        tree's leaves in one C pass over it, then one decode and one re-encode of the whole block compared byte for
        byte (:func:`codec.decode_block`). Anything that pass does not settle (a failure to name, a rare kind, a
        head to find) goes to :meth:`feed`, which decides it line by line as before.
        """
        if _scan_block is None:
            return self.feed(lines_of(block), offset)
        tree = self._tree
        bad, ends_b, last, leaves = _scan_block(self.prev, block, self.expect, tree is not None)
        if bad < 0 and self.steps_unread:
            got = self._step_block(block, ends_b)
            if got is not None:
                # a block _settle turns away here (a rare kind, a seal to name, a head to find) it would turn away
                # decoded too: the same lines, the same types
                done = self._settle(block, offset, got[0], got[1], ends_b, last, leaves, got[2], got[3])
                return done if done is not None else self.feed(lines_of(block), offset)
        recs = codec.decode_block(block) if bad < 0 else None
        if not recs:
            return self.feed(lines_of(block), offset)
        done = self._settle(block, offset, recs, list(map(type, recs)), ends_b, last, leaves)
        return done if done is not None else self.feed(lines_of(block), offset)

    def _step_block(self, block: bytes, ends_b: bytes
                    ) -> tuple[_StepLines, list[type], dict[type, int], list[int]] | None:
        """verify's way through a block (``steps_unread``: its records are not handed on): its step_observed lines
        held to their canonical form in C without decoding them, their numbers' spelling proven there too where it
        can be (``number_proven``: fixed notation, up to 17 digits; their values read there when the records may
        be asked for: ``numbers_kept``), the rest by one msgspec decode and re-encode of them; its other lines
        decoded and re-encoded as :func:`codec.decode_block` does. Returns the block's records, their types, how
        many of each (:meth:`_settle`'s ``counts``) and where its seals and late signatures are (``marks``);
        ``None`` sends the block the ordinary way."""
        cols = _step_cols(self.step_columns, block, ends_b) if self.step_columns is not None else False
        if cols is None:  # a number not spelled as msgspec writes it: the ordinary way names it
            return None
        if isinstance(cols, _Columns):
            mask, values = cols.mask, None
        elif self.numbers_kept:
            got = _step_numbers(block, ends_b)
            if got is None:
                return None
            mask, values = got
        else:
            mask, numbers = _step_lines(block, ends_b, 0)  # a check alone: the numbers it proves are not read
            if len(numbers) > 2 and _numbers_canonical(numbers) is None:
                return None
            values = None  # records(), if ever asked for, reads them
        others: dict[int, Any] = {}
        i = mask.find(0)
        if i >= 0:
            ends = memoryview(ends_b).cast("I")
            where = []
            while i >= 0:
                where.append(i)
                i = mask.find(0, i + 1)
            recs = codec.decode_block(b"".join(block[ends[i - 1] + 1 if i else 0:ends[i] + 1] for i in where))
            if recs is None or len(recs) != len(where):
                return None
            others = dict(zip(where, recs))
        n = len(mask)
        types = [_STEP_T] * n
        counts = {_STEP_T: n - len(others)} if n > len(others) else {}
        for i, r in others.items():
            t = types[i] = type(r)
            counts[t] = counts.get(t, 0) + 1
        lines = _StepLines(self.expect, block, ends_b, others, n, mask, values)
        if isinstance(cols, _Columns):
            lines.cols = cols
        return lines, types, counts, \
            [i for i, t in zip(others, map(type, others.values())) if t is self._seal_t or t is self._signed_t]

    def _settle(self, block: bytes, offset: int, recs: Any, types: list[type], ends_b: bytes, last: bytes,
                leaves: Any, counts: dict[type, int] | None = None, marks: list[int] | None = None) -> Any:
        """The rest of :meth:`feed_block` for a block whose lines all hold their structure, chain and canonical form:
        seals, counts, collected lines, the tree. ``None`` when the block must go line by line instead. ``counts``
        (lines of each type) and ``marks`` (where the seals and late signatures are, in order) when the caller
        knows them."""
        tree = self._tree
        n = len(recs)
        ends = memoryview(ends_b).cast("I")
        if counts is None:
            counts = {t: types.count(t) for t in set(types)}
        kinds = counts.keys()
        if marks is None:
            marks = self._marks(types, kinds)
        expect = self.expect
        eh = self.ctx.expect_head
        if (eh is not None and expect <= eh[0] < expect + n) or \
                not self._rare_ok(kinds, types, recs, lambda i: ends[i] + 1, offset, marks):
            return None  # the same checks again, line by line: they name what fails
        total = self._type_counts
        for t, c in counts.items():
            total[t] = total.get(t, 0) + c
        if self._collect and not kinds.isdisjoint(self._collect):
            collected = self.res.collected
            for i, t in enumerate(types):
                if t in self._collect:
                    start = ends[i - 1] + 1 if i else 0
                    collected.append((offset + start, block[start:ends[i]]))
        self.expect = expect + n
        self.prev = last
        self._commit(recs)
        if tree is not None:
            view = memoryview(leaves)
            self._grow(recs, types, offset, lambda a, b, begin: range_of_hashes(begin, view[32 * a:32 * b]),
                       lambda i: ends[i - 1] + 1 if i else 0, marks)
        return recs

    def _add(self, part, a: int, b: int) -> None:
        """Add lines ``a..b`` of a batch to the tree (``part(a, b, begin)``: their range as leaves from ``begin``),
        keeping the tree at ``ctx.tree_at`` when that boundary falls among them."""
        tree = self._tree
        assert tree is not None  # called only for a journal with tree heads
        m = self.ctx.tree_at
        if m is not None and self.res.tree_at is None and tree.end <= m <= tree.end + b - a:
            k = m - tree.end
            if k:
                tree.merge(part(a, a + k, tree.end))
            self.res.tree_at = tree.copy()
            a += k
        if b > a:
            tree.merge(part(a, b, tree.end))

    def _marks(self, types: list[type], kinds) -> list[int]:
        """Where the seals and late signatures (rare) are among lines of these ``types``, in order (``kinds``: the
        types there are)."""
        seal_t, signed_t = self._seal_t, self._signed_t
        at: list[int] = []
        i = -1
        if seal_t in kinds:
            for _ in range(types.count(seal_t)):
                i = types.index(seal_t, i + 1)
                at.append(i)
        if signed_t in kinds:
            at = sorted(at + [j for j, t in enumerate(types) if t is signed_t])
        return at

    def _grow(self, recs: list[Any], types: list[type], offset: int, part, line_start,
              marks: list[int] | None = None) -> None:
        """Add a checked batch's lines to the tree, checking the root each of its seals names against the tree of
        the lines before it (``types``: the records' types; ``line_start(i)``: line i's offset in the batch, to name
        a seal that fails; ``marks``: :meth:`_marks` of them, when known)."""
        tree = self._tree
        assert tree is not None  # called only for a journal with tree heads
        start = 0
        signed_t = self._signed_t
        for i in self._marks(types, set(types)) if marks is None else marks:
            rec = recs[i]
            if types[i] is signed_t:  # a late signature: the signed point is its pending seal's line
                if self._pending_tree is not None and self._pending_tree.end == rec.seal_seq + 1:
                    self.res.seal_tree = self._pending_tree
                self._pending_tree = None
                continue
            if i > start:
                self._add(part, start, i)
            start = i
            claimed = _fromhex(rec.tree_root)  # _check_seal has held it to 64 hex digits
            if tree.begin == 0:
                if tree.root() != claimed:
                    raise SealInvalid(f"seal at seq {rec.seq}: its tree root is not the root of the {rec.seq:,} lines "
                                      "before it", seq=rec.seq, offset=offset + line_start(i))
            else:
                self.res.seal_roots.append((rec.seq, offset + line_start(i), claimed, tree.copy()))
            self._add(part, i, i + 1)
            start = i + 1
            if rec.sig is None and rec.key_id is not None:  # pending: signed later, if at all
                self._pending_tree = self.res.pending_tree = tree.copy()
            else:
                self._pending_tree = None
                self.res.seal_tree = tree.copy()
        if start < len(recs):
            self._add(part, start, len(recs))

    def _feed(self, lines: list[bytes], offset: int) -> list[Any]:
        """Check ``lines`` (no newlines) starting at byte ``offset``; return their records.

        The checks run over the whole batch at C level (the accelerator, or
        ``map`` pipelines over hashlib without it: no Python bytecode per line);
        only when a batch fails, or holds a rare kind, does a per-line loop
        find and name the line.
        """
        expect = self.expect
        if _fast is not None:
            # In C, per line: the seq, the hash suffix, one object per line, the chain hash.
            fast_ok = _fast.check_lines(self.prev, lines, expect) < 0
            recs = self._decode(lines, offset, aligned=fast_ok)
            if not fast_ok:
                self._slow(lines, recs, offset)  # names the line and the reason
                return recs
            n = len(recs)
            if not n:
                return recs
        else:
            recs = self._decode(lines, offset)
            n = len(recs)
            if not n:
                return recs
            # h[i] must equal SHA-256(tag || h[i-1] || P[i]), h[i-1] read from the line before.
            try:
                raw = list(map(_fromhex, map(_get_h, recs)))
            except ValueError:  # some h is not hex: the slow path names the line
                self._slow(lines, recs, offset)
                return recs
            prevs = [self.prev]
            prevs += raw[:-1]
            # Copying a hash object that has absorbed the tag is cheaper than building a
            # new one (OpenSSL 3 looks the algorithm up on every construction).
            hashers = list(map(_copy, _repeat(_LINE_BASE, n)))
            list(map(_update, hashers, map(_add, prevs, map(_strip_hash, lines))))
            if list(map(_digest, hashers)) != raw or list(map(_get_seq, recs)) != list(range(expect, expect + n)):
                self._slow(lines, recs, offset)
                return recs
        types = list(map(type, recs))
        kinds = set(types)
        eh = self.ctx.expect_head
        if (eh is not None and expect <= eh[0] < expect + n) or \
                not self._rare_ok(kinds, types, recs, lambda i: sum(map(len, lines[:i + 1])) + i + 1, offset):
            self._slow(lines, recs, offset)
            return recs
        counts = self._type_counts
        for t in kinds:
            counts[t] = counts.get(t, 0) + types.count(t)
        if self._collect and not kinds.isdisjoint(self._collect):
            collect = self._collect
            pos = offset
            for line, t in zip(lines, types):
                if t in collect:
                    self.res.collected.append((pos, line))
                pos += len(line) + 1
        self.expect = expect + n
        self.prev = _fromhex(recs[-1].h)
        self._commit(recs)
        return recs

    def _rare_ok(self, kinds, types: list[type], recs: list[Any], end_of, offset: int,
                 marks: list[int] | None = None) -> bool:
        """Check the seals in a batch that is otherwise clean (``end_of(i)``: the offset just past line i's newline
        in the batch; ``marks``: :meth:`_marks` of its types, when known); False sends it to the slow path."""
        if kinds <= self._plain:
            return True
        if not kinds <= self._plain_or_seal:
            return False  # run_opened, run_closed, unknown kinds: the slow path handles them
        res = self.res
        saved = (res.seals, res.last_seal_seq, res.last_sealed_hash, res.last_seal_end, res.last_seal_h, res.lead_key)
        i = -1
        try:
            for i in self._marks(types, kinds) if marks is None else marks:  # seals only: no late signature here
                if recs[i].sig is None and recs[i].key_id is not None:
                    # a seal signed late: the line-by-line path keeps its bookkeeping
                    res.seals, res.last_seal_seq, res.last_sealed_hash, res.last_seal_end, res.last_seal_h, \
                        res.lead_key = saved
                    return False
                self._check_seal(recs[i], _fromhex(recs[i - 1].h) if i else self.prev)
        except IntegrityError:
            res.seals, res.last_seal_seq, res.last_sealed_hash, res.last_seal_end, res.last_seal_h, res.lead_key = saved
            return False  # checked again, and named with full context, by the slow path
        if i >= 0:
            res.last_seal_end = offset + end_of(i)
        return True

    def _slow(self, lines: list[bytes], recs: list[Any], offset: int) -> None:
        """Line by line: rare kinds, ``expect_head``, and naming the first bad line."""
        expect = self.expect
        prev = self.prev
        counts = self._type_counts
        seal_t, opened_t, closed_t = self._seal_t, self._opened_t, self._closed_t
        eh = self.ctx.expect_head
        for i, (line, rec) in enumerate(zip(lines, recs)):
            try:
                if rec.seq != expect:
                    raise SequenceError(
                        f"seq {rec.seq} where {expect} was expected"
                        + (" (a line was deleted)" if rec.seq > expect else " (a line is repeated or out of order)"),
                        seq=expect,
                    )
                d = _link(prev, line[:-HASH_SUFFIX_LEN])
                if d.hex() != rec.h:
                    raise ChainBroken(f"chain broken at seq {expect}: hash mismatch", seq=expect)
                t = type(rec)
                if t is seal_t:
                    end = offset + sum(map(len, lines[:i + 1])) + i + 1
                    if self._check_seal(rec, prev):
                        self.res.last_seal_end = end
                    else:
                        self.res.pending_open = (rec.seq, end, rec.h, _pending_fields(rec))
                elif t is self._signed_t:
                    self._check_seal_signed(rec)
                elif t is opened_t:
                    if expect != 0:
                        raise RunMismatch(f"run_opened at seq {expect}: a second run's events were spliced in", seq=expect)
                    if rec.run_id != self.ctx.run_id:
                        raise RunMismatch("run_opened names another run", seq=expect)
                elif t is closed_t:
                    self.res.closed_seqs.append(expect)
                elif t is self._cert_t:
                    self._check_certificate(rec)
                if t in self._collect:
                    self.res.collected.append((offset + sum(map(len, lines[:i])) + i, line))
                if eh is not None and eh[0] == expect:
                    self.res.head_found = rec.h == eh[1]
            except IntegrityError as e:
                if e.offset is None:
                    e.offset = offset + sum(map(len, lines[:i])) + i
                self.expect = expect
                self.prev = prev
                self._commit(recs[:i])
                raise
            counts[t] = counts.get(t, 0) + 1
            prev = d
            expect += 1
        self.expect = expect
        self.prev = prev
        self._commit(recs)

    def _commit(self, recs: list[Any]) -> None:
        if recs:
            res = self.res
            want = self._want
            if want:
                first, last = recs[0].seq, recs[-1].seq
                for s in want:
                    if first <= s <= last:
                        res.hashes[s] = recs[s - first].h
            if res.first_seq is None:
                res.first_seq = recs[0].seq
            res.count += len(recs)
            last = recs[-1]
            res.last_seq = last.seq
            res.last_hash = last.h
            res.last_kind = last.kind if type(last) is UnknownEvent else type(last).__struct_config__.tag

    def _check_seal(self, rec: Any, prev: bytes) -> bool:
        seq = rec.seq
        ctx = self.ctx
        if rec.sealed_seq != seq - 1 or rec.sealed_hash != prev.hex():
            raise SealInvalid(
                f"seal at seq {seq} names head {rec.sealed_seq}:{rec.sealed_hash[:16]}, "
                f"but the head before it is {seq - 1}:{prev.hex()[:16]} (a moved or replayed seal)",
                seq=seq,
            )
        if ctx.tree:
            root = rec.tree_root
            if rec.tree_size != seq or not is_hash_hex(root):
                raise SealInvalid(f"seal at seq {seq} does not name the tree of the {seq:,} lines before it (a format "
                                  "1.3 seal carries tree_size and a 64-digit hex tree_root)", seq=seq)
        elif rec.tree_size is not None or rec.tree_root is not None:
            raise SealInvalid(f"seal at seq {seq} names a tree, which seals before format 1.3 do not",
                              seq=seq)
        if ctx.key_id is None:
            if rec.sig is not None or rec.key_id is not None:
                raise SealInvalid(f"seal at seq {seq} is signed but the journal declared no key", seq=seq)
        else:
            pub = self._seal_key(rec, f"seal at seq {seq}")
            if rec.sig is None:
                if not ctx.tree:
                    raise SealInvalid(f"seal at seq {seq} carries no signature", seq=seq)
                # format 1.7: a seal whose signature a later seal_signed carries (none may ever come: then it
                # signs nothing). It names its head and tree as any seal does (checked above and by the tree).
                self._pending = rec
                self.res.touched = True
                if ctx.collect:
                    self.res.hashes[seq] = rec.h
                return False
            if ctx.check_signatures and pub is not None:
                msg = (seal_checkpoint(ctx.run_id, seq, _fromhex(rec.tree_root), seq - 1, prev).encode() if ctx.tree
                       else seal_message(ctx.run_id, seq - 1, prev))
                _check_signature(pub, rec, msg, f"seal at seq {seq}", "signature")
        self.res.seals += 1
        if ctx.collect:
            self.res.hashes[seq] = rec.h
        self.res.last_seal_seq = seq
        self.res.last_sealed_hash = rec.sealed_hash
        self.res.last_seal_h = rec.h
        self.res.last_seal_sig = rec.sig
        self.res.last_seal_root = rec.tree_root
        self.res.touched = True
        self.res.carried = False
        self.res.pending_open = None
        self._pending = None  # a pending seal before it is superseded: it signs everything the pending one named
        return True

    def _check_seal_signed(self, rec: Any) -> None:
        """A late signature (format 1.7): it must name the seal waiting for one (in this range, or for the first in
        a range, the one the ranges before it left waiting: the merge checks that) and verify under the key that
        signs seals there. The signed prefix then ends at that seal's line."""
        seq, ctx, res = rec.seq, self.ctx, self.res
        p = self._pending
        fields = (rec.seal_seq, rec.sealed_seq, rec.sealed_hash, rec.tree_size, rec.tree_root, rec.key_id)
        if not ctx.tree or rec.sealed_seq != rec.seal_seq - 1 or rec.tree_size != rec.seal_seq or \
                not is_hash_hex(rec.tree_root) or not is_hash_hex(rec.sealed_hash) or ctx.key_id is None:
            raise SealInvalid(f"seal_signed at seq {seq} does not name a seal's head and tree", seq=seq)
        if p is not None:
            if _pending_fields(p) != fields:
                raise SealInvalid(f"seal_signed at seq {seq} names seal {rec.seal_seq}, not the seal waiting for its "
                                  f"signature (seq {p.seq})", seq=seq)
        elif res.touched:
            raise SealInvalid(f"seal_signed at seq {seq}: no seal is waiting for a signature (seal {rec.seal_seq} "
                              "was signed already, or never pending)", seq=seq)
        pub = self._seal_key(rec, f"seal_signed at seq {seq}")
        if ctx.check_signatures and pub is not None:
            msg = seal_checkpoint(ctx.run_id, rec.tree_size, _fromhex(rec.tree_root), rec.sealed_seq,
                                  _fromhex(rec.sealed_hash)).encode()
            _check_signature(pub, rec, msg, f"seal_signed at seq {seq}", f"the signature of seal {rec.seal_seq}")
        res.seals += 1
        res.last_seal_seq = rec.seal_seq
        res.last_sealed_hash = rec.sealed_hash
        res.last_seal_sig = rec.sig
        res.last_seal_root = rec.tree_root
        if p is not None:
            assert res.pending_open is not None  # set with _pending, in this range
            res.last_seal_end, res.last_seal_h = res.pending_open[1], p.h
            res.carried = False
        else:  # the seal it signs is in an earlier range: the merge fills in where its line ends
            res.carry_resolution = fields
            res.last_seal_end = res.last_seal_h = None
            res.carried = True
        res.pending_open = None
        res.touched = True
        self._pending = None

    def _seal_key(self, rec: Any, what: str) -> PublicKey | None:
        """The key a seal's (or a late signature's) signature is checked under: the journal's own, or in a
        certified journal the key certified last before it (None: signatures are not checked)."""
        ctx = self.ctx
        if ctx.certified is not None:
            return self._certified_key(rec)
        if rec.key_id != ctx.key_id:
            raise SealInvalid(f"{what} is by key {rec.key_id}, not the journal's key {ctx.key_id} (foreign-key seal)",
                              seq=rec.seq)
        return self._pub

    def _certified_key(self, rec: Any) -> PublicKey | None:
        """A certified journal's seal: its key must be certified, the one certified last before it (in this range;
        the merge checks a range's first seals against the ranges before it), and still valid at the seal's time."""
        seq, key = rec.seq, rec.key_id
        assert self.ctx.certified is not None  # asked only of a journal whose keys are certified
        got = self.ctx.certified.get(key)
        if got is None:
            raise SealInvalid(f"seal at seq {seq} is by key {key}, which no certificate in the journal certifies for "
                              "this rank (foreign-key seal)", seq=seq)
        if self._cur_key is not None:
            if key != self._cur_key:
                raise SealInvalid(f"seal at seq {seq} is by key {key}, but the key certified last before it is "
                                  f"{self._cur_key} (a seal of another round's key)", seq=seq)
        elif self.res.lead_key is None:
            self.res.lead_key = key
        elif key != self.res.lead_key:
            raise SealInvalid(f"seal at seq {seq} is by key {key} where the seals before it are by key "
                              f"{self.res.lead_key}, with no certificate between them", seq=seq)
        raw, not_after = got
        if rec.ts > not_after:
            raise SealInvalid(f"seal at seq {seq} is dated after its key {key} stopped being valid (its certificate's "
                              "not-after)", seq=seq)
        if raw is None:
            return None
        pub = self._pubs.get(key)
        if pub is None:
            pub = self._pubs[key] = PublicKey(raw)
        return pub

    def _check_certificate(self, rec: Any) -> None:
        """A key_certified line: from here on seals are its key's. Its content was checked before the scan
        (journal.certify.certified_keys); here it must be one of the certificates checked."""
        from trainledger.journal.keys import key_id_of

        seq = rec.seq
        if self.ctx.certified is None:
            raise SealInvalid(f"key_certified at seq {seq} in a journal whose seals are its own key's (certificates "
                              "are read only where the journal's key is not pinned)", seq=seq)
        try:
            key = key_id_of(base64.b64decode(rec.key, validate=True))
        except (binascii.Error, ValueError):
            key = None
        if key not in self.ctx.certified:
            raise SealInvalid(f"key_certified at seq {seq} was not among the certificates checked before the scan",
                              seq=seq)
        self._cur_key = key
        self.res.last_cert_key = key

    def finish(self) -> None:
        kinds = self.res.kinds
        for t, n in self._type_counts.items():
            kinds[_kind_name(t)] = kinds.get(_kind_name(t), 0) + n
        if UnknownEvent in self._type_counts:
            self.res.unknown += self._type_counts[UnknownEvent]


def _kind_name(t: Any) -> str:
    return "(unknown kinds)" if t is UnknownEvent else t.__struct_config__.tag


# ---------------------------------------------------------------- step lines, not decoded (verify)

#: The record of step_observed, and what the C check of its lines (``step_lines`` in journal/_fast.c) assumes
#: of it: its fields in this order, these ints and numbers, left out when None. If the record ever differs, the C
#: check is not used (every line is decoded and re-encoded instead).
_STEP_T: Any = codec.record_type(StepObserved)
_STEP_INTS = ("step", "examples", "tokens", "supervised_tokens", "seq", "ts")
_STEP_NUMBERS = ("loss", "grad_norm", "lr", "step_time_s", "data_time_s", "compute_time_s", "batch_fingerprint")


def _step_record_as_assumed() -> bool:
    cfg = _STEP_T.__struct_config__
    if _STEP_T.__struct_fields__ != ("step", "loss", "grad_norm", "lr", "step_time_s", "examples", "tokens",
                                     "supervised_tokens", "data_time_s", "compute_time_s", "batch_fingerprint", "seq",
                                     "ts", "h") or \
            not cfg.omit_defaults or cfg.tag != "step_observed" or cfg.tag_field != "kind" or cfg.array_like:
        return False
    hints = typing.get_type_hints(_STEP_T)
    number, optional = typing.Union[int, float], typing.Union[int, float, None]
    return (all(hints[f] in (int, int | None) for f in _STEP_INTS) and hints["loss"] == number and
            all(hints[f] == optional for f in _STEP_NUMBERS[1:]) and hints["h"] is str and
            _STEP_T.__struct_defaults__ == (None,) * 9 + (msgspec.NODEFAULT,) * 3)


_STEP_LINES_OK = _step_lines is not None and _step_record_as_assumed()
#: The numbers of step lines, as the record's number fields decode them (an int stays an int)
_numbers_decoder = msgspec.json.Decoder(list[typing.Union[int, float]])  # noqa: UP007


def _step_numbers(block: bytes, ends_b: bytes) -> tuple[bytes, list[Any]] | None:
    """``step_lines``' mask of a block and the values of its step lines' numbers in order: those the C check proves
    spelled as msgspec writes them, read there; the rest decoded by msgspec (and held to its spelling). None when
    one of those is not spelled so."""
    mask, left, values, at = _step_lines(block, ends_b, 2)
    if len(left) > 2:
        rest = _numbers_canonical(left)
        if rest is None:
            return None
        for i, v in zip(memoryview(at).cast("I"), rest):
            values[i] = v
    return mask, values


def _numbers_canonical(numbers: bytes) -> list[Any] | None:
    """The numbers of ``[n1,n2,...]`` if it is spelled as msgspec writes them (as the line's re-encode would),
    else None."""
    try:
        got = _numbers_decoder.decode(numbers)
    except msgspec.DecodeError:
        return None
    return got if codec._encoder.encode(got) == numbers else None  # the records' encoder


def _step_cols(step_columns: Callable[[bytes, bytes], Any], block: bytes, ends_b: bytes) -> _Columns | None | bool:
    """The views' column builder's (``step_columns``) check of a block and its step lines' fields as columns, the
    numbers it left to msgspec
    decoded (and held to its spelling) and written in (an int in a float field as the nearest double). None when
    one of those is not spelled so; False when a line does not fit columns (a ts past int64, an int past any
    double): its records are built instead."""
    got = step_columns(block, ends_b)
    if got is None:
        return False
    mask, left, at, data, valid, ts, h, k = got
    if len(left) > 2:
        rest = _numbers_canonical(left)
        if rest is None or len(rest) != len(at) // 4:
            return None
        cells = memoryview(data).cast("d")
        for slot, v in zip(memoryview(at).cast("I"), rest):
            try:
                cells[slot] = v  # an int in a float field: the nearest double, as the C side converts one
            except (OverflowError, ValueError):
                return False
    return _Columns(mask, data, valid, ts, h, k)


class _Columns:
    """``step_columns``' output for one block (see its comment in journal/views/_fastcols.c): the step lines' fields
    (``data``, ``valid``: 11 columns of ``len(mask)`` slots, the first ``k`` used), every line's ``ts`` and ``h``."""

    __slots__ = ("mask", "data", "valid", "ts", "h", "k")

    def __init__(self, mask: bytes, data: bytearray, valid: bytearray, ts: bytes, h: bytes, k: int):
        self.mask, self.data, self.valid, self.ts, self.h, self.k = mask, data, valid, ts, h, k


class StepBlock:
    """Checked events of one block, as :func:`scan_consuming` hands them to a reader that takes columns
    (``columns=``, the views' column builder): lines ``lo`` to ``hi - 1`` of the block, the first of which is
    event ``first + lo``; its step lines' fields as columns (``cols``, a :class:`_Columns`: step lines ``slo`` to
    ``shi - 1`` of it), every other line's record in ``others`` (by its index in the block). ``len()`` is its
    events; :meth:`take` cuts the first ones off (where a seal ends what may be handed on)."""

    __slots__ = ("first", "lo", "hi", "slo", "shi", "cols", "others")

    def __init__(self, first: int, lo: int, hi: int, slo: int, shi: int, cols: _Columns, others: dict[int, Any]):
        self.first, self.lo, self.hi, self.slo, self.shi, self.cols, self.others = first, lo, hi, slo, shi, cols, others

    def __len__(self) -> int:
        return self.hi - self.lo

    @property
    def seq(self) -> int:
        """The first event's seq."""
        return self.first + self.lo

    def take(self, k: int) -> StepBlock:
        """The first ``k`` events, cut off these."""
        cut = self.lo + k
        s = self.slo + self.cols.mask.count(1, self.lo, cut)
        head = StepBlock(self.first, self.lo, cut, self.slo, s, self.cols, self.others)
        self.lo, self.slo = cut, s
        return head

    def other_records(self) -> list[tuple[int, Any]]:
        """``(index in the block, record)`` of the lines here that are not step lines, in order."""
        lo, hi = self.lo, self.hi
        return [(i, r) for i, r in self.others.items() if lo <= i < hi]


class _StepLines:
    """A block's records for verify's fast path: the decoded records of its other lines, and for a step line only
    what the scanner asks of it (``seq``, ``h``, its kind), read off the line when asked."""

    __slots__ = ("first", "block", "ends", "others", "n", "ends_b", "mask", "numbers", "cols")

    def __init__(self, first: int, block: bytes, ends_b: bytes, others: dict[int, Any], n: int, mask: bytes,
                 numbers: list[Any] | None):
        self.first, self.block, self.ends, self.others, self.n = first, block, memoryview(ends_b).cast("I"), others, n
        self.ends_b, self.mask, self.numbers = ends_b, mask, numbers  # the step lines', for records()
        self.cols: _Columns | None = None  # the step lines as columns (Scanner.step_columns)

    def records(self) -> list[Any]:
        """Every line's record: the step lines' built in C from the lines and the numbers msgspec decoded for
        their check (``step_records``), else the block decoded once, unchecked (its lines are checked)."""
        numbers = self.numbers
        if numbers is None and _step_records is not None:  # checked without them (verify's scan): read them now
            got = _step_numbers(self.block, self.ends_b)
            numbers = got[1] if got is not None else None
        recs = _step_records(self.block, self.ends_b, self.mask, numbers, _STEP_T) \
            if _step_records is not None and numbers is not None else None
        if recs is None:
            return codec.decode_unchecked_block(self.block, self.n) or [codec.decode_line(x)
                                                                         for x in lines_of(self.block)]
        for i, rec in self.others.items():
            recs[i] = rec
        return recs

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        if i < 0:
            i += self.n
        rec = self.others.get(i)
        if rec is not None:
            return rec
        if not 0 <= i < self.n:
            raise IndexError(i)
        end = self.ends[i]
        return _StepLine(self.first + i, self.block[end - 66:end - 2].decode("ascii"))


class _StepLine:
    __slots__ = ("seq", "h")
    __struct_config__ = _STEP_T.__struct_config__  # its kind, for the scanner's last_kind

    def __init__(self, seq: int, h: str):
        self.seq, self.h = seq, h


def iter_blocks(f, start: int, end: int, result: RangeResult, *, is_last: bool):
    """Yield ``(block, offset)`` for the complete lines in ``[start, end)``, a read block at a time: each block is
    whole lines, each ending with its newline.

    A last partial line (no newline) is recorded as a torn tail when this is the file's last range. Raises
    :class:`SchemaError` for a line that runs past MAX_LINE bytes without a newline.
    """
    pos = start
    f.seek(start)
    carry = b""
    carry_off = start
    while pos < end:
        try:
            block = f.read(min(BLOCK, end - pos))
        except OSError as e:
            raise JournalIOError(f"read failed at byte {pos}: {e.strerror}") from None
        if not block:
            break
        pos += len(block)
        cut = block.rfind(b"\n") + 1
        if not cut:  # no newline in this block: the line goes on
            carry += block
        else:
            # one copy: the carried line's start and this block up to its last newline
            lines = b"".join((carry, memoryview(block)[:cut])) if carry else \
                block if cut == len(block) else block[:cut]
            off = carry_off
            carry = block[cut:]
            carry_off = pos - len(carry)
            yield lines, off
        if len(carry) > MAX_LINE:
            raise SchemaError(f"line at byte {carry_off} is longer than {MAX_LINE} bytes", offset=carry_off)
    if carry:
        if not is_last:  # pragma: no cover - ranges are cut at line boundaries
            raise SchemaError("range does not end at a line boundary", offset=carry_off)
        result.torn_offset = carry_off
        result.torn_bytes = len(carry)


def lines_of(block: bytes) -> list[bytes]:
    """The lines of a block of complete lines (:func:`iter_blocks`), without their newlines."""
    lines = block.split(b"\n")
    lines.pop()
    return lines


class Lines:
    """Lines of read blocks, each where it was read (no bytes object a line): segments ``(block, ends, i, j)``,
    lines ``i`` to ``j - 1`` of a block whose newlines are at ``ends`` (uint32 offsets, as the block scanner found
    them), or ``(None, lines, 0, n)`` for lines already split. What :func:`scan_consuming` hands on with its
    events (``with_lines``): ``len()``, ``[i:j]`` (a list of bytes), :meth:`take` of the first ones, and
    :meth:`binary` (one Arrow column of them all, built from the blocks)."""

    __slots__ = ("segs", "n")

    def __init__(self, segs: list[tuple[Any, Any, int, int]] | None = None):
        self.segs = segs if segs is not None else []
        self.n = sum(j - i for _, _, i, j in self.segs)

    def __len__(self) -> int:
        return self.n

    def extend(self, other: Lines | list[bytes]) -> None:
        if isinstance(other, Lines):
            self.segs += other.segs
            self.n += other.n
        elif other:
            self.segs.append((None, list(other), 0, len(other)))
            self.n += len(other)

    def take(self, k: int) -> Lines:
        """The first ``k`` lines, taken out of these."""
        out, segs = [], self.segs
        while k > 0 and segs:
            block, ends, i, j = segs[0]
            if j - i <= k:
                out.append(segs.pop(0))
                k -= j - i
                self.n -= j - i
            else:
                out.append((block, ends, i, i + k))
                segs[0] = (block, ends, i + k, j)
                self.n -= k
                k = 0
        return Lines(out)

    def __getitem__(self, sl: slice) -> list[bytes]:
        start, stop, _ = sl.indices(self.n)
        got: list[bytes] = []
        at = 0
        for block, ends, i, j in self.segs:
            a, b = max(start - at, 0) + i, min(stop - at, j - i) + i
            if a < b:
                if block is None:
                    got += ends[a:b]
                else:
                    got += [block[(ends[x - 1] + 1 if x else 0):ends[x]] for x in range(a, b)]
            at += j - i
            if at >= stop:
                break
        return got

    def binary(self, pa: Any) -> tuple[Any, bool]:
        """Every line as one Arrow binary column (its bytes copied once, its newlines left out; binary, or
        large_binary past 2 GiB), and whether they are all ASCII."""
        if _join_lines is not None:
            data, offsets, wide = _join_lines(self.segs)
            return pa.Array.from_buffers(pa.large_binary() if wide else pa.binary(), self.n,
                                         [None, pa.py_buffer(offsets), pa.py_buffer(data)]), data.isascii()
        import numpy as np

        datas, lens = [], []
        for block, ends, i, j in self.segs:
            if block is None:
                datas.append(b"".join(ends[i:j]))
                lens.append(np.fromiter(map(len, ends[i:j]), dtype=np.int64, count=j - i))
                continue
            e = np.frombuffer(ends, dtype=np.uint32).astype(np.int64)
            starts = np.concatenate(([0], e[:-1] + 1))[i:j]
            stops = e[i:j]
            lo, hi = int(starts[0]), int(stops[-1])
            buf = np.frombuffer(block, dtype=np.uint8, count=hi - lo, offset=lo)
            datas.append(np.delete(buf, stops[:-1] - lo).tobytes())  # the newlines between them
            lens.append(stops - starts)
        data = b"".join(datas)
        offsets = np.zeros(self.n + 1, dtype=np.int64)
        if self.n:
            np.cumsum(np.concatenate(lens), out=offsets[1:])
        arr = pa.Array.from_buffers(pa.large_binary(), self.n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])
        return arr, data.isascii()


class Appended:
    """What a file gained since the last read, as blocks of complete lines (a torn last line waits for its newline):
    for a reader that follows a journal as it is written (``watch``, ``serve``). It remembers where it stopped and
    the last bytes it read, so that a file cut back or rewritten under it is noticed (:meth:`cut_back`)."""

    def __init__(self) -> None:
        self.offset = 0  # bytes consumed as complete lines, plus the partial line held in carry
        self.carry = b""
        self.tail = b""  # the last bytes read: if they changed, the file was cut and rewritten under us

    def cut_back(self, f: Any, size: int) -> bool:
        """Whether what was read no longer stands (the file, open in ``f``, is shorter or its bytes changed)."""
        if not self.offset:
            return False
        f.seek(self.offset - len(self.tail))
        return size < self.offset or f.read(len(self.tail)) != self.tail

    def blocks(self, f: Any, size: int | None = None,
               progress: Callable[[int, int], None] | None = None) -> Iterator[tuple[bytes, int]]:
        """``(block, offset)``: every block of complete lines appended since the last read, each ending with a
        newline, and the byte it starts at. Raises :class:`SchemaError` for a line longer than ``MAX_LINE``."""
        f.seek(self.offset)
        while True:
            block = f.read(BLOCK)
            if not block:
                return
            if progress is not None and size is not None:
                progress(self.offset + len(block), size)
            start = self.offset - len(self.carry)
            self.offset += len(block)
            self.tail = (self.tail + block)[-64:]
            chunk = self.carry + block
            cut = chunk.rfind(b"\n")
            if cut < 0:
                self.carry = chunk
                if len(chunk) > MAX_LINE:
                    raise SchemaError(f"line at byte {start} is longer than {MAX_LINE} bytes", offset=start)
                continue
            self.carry = chunk[cut + 1:]
            yield chunk[:cut + 1], start


def new_scanner(ctx: ScanContext, prev_seq: int, prev_hash: bytes, res: RangeResult) -> Scanner:
    """A scanner for a reader that follows a file as it grows (``serve``): fed blocks of complete lines from where
    the last one ended (:meth:`Scanner.feed_block`), with the step lines' fast path on as :func:`scan_range` has it.
    A block's records may come back lazily: call ``records()`` on what has that method."""
    scanner = Scanner(ctx, prev_seq, prev_hash, res)
    scanner.steps_unread = _STEP_LINES_OK
    return scanner


def scan_range(path: str, start: int, end: int, prev_seq: int, prev_hash: bytes,
               ctx: ScanContext, is_last: bool, *,
               each: Callable[[bytes, Any, int, RangeResult], None] | None = None,
               blocks: Iterable[tuple[bytes, int]] | None = None,
               columns: Callable[[bytes, bytes], Any] | None = None) -> RangeResult:
    """Check ``[start, end)`` of the file; errors are returned in ``result.error``, not raised. ``each(block,
    records, offset, result)`` is called after each block has checked out (what it raises propagates).
    ``blocks``: ``(block, offset)`` of whole lines, each ending with its newline, instead of the file's (a stream's;
    what its iterator raises propagates). ``columns``: the views' column builder (``step_columns``): a block's
    step lines are read as columns where they can be (what ``each`` gets then has ``cols``)."""
    res = RangeResult(start, end)
    scanner = Scanner(ctx, prev_seq, prev_hash, res)
    scanner.steps_unread = _STEP_LINES_OK
    scanner.numbers_kept = each is not None
    scanner.step_columns = columns if each is not None else None
    f = None
    try:
        if blocks is None:
            f = open(path, "rb", buffering=0)
            blocks = iter_blocks(f, start, end, res, is_last=is_last)
        for block, off in blocks:
            recs = scanner.feed_block(block, off)
            if each is not None:
                each(block, recs, off, res)
    except IntegrityError as e:
        res.error = (type(e).__name__, str(e), e.seq if e.seq is not None else scanner.expect, e.offset)
    except OSError as e:
        res.error = ("JournalIOError", f"{path}: {e.strerror}", None, None)
    finally:
        if f is not None:
            f.close()
    scanner.finish()
    return res


def signed_prefix(pending: list[Any], res: RangeResult) -> list[Any]:
    """The events at the head of ``pending`` that a seal checked so far covers, taken out of it (what a reader of
    signed events may use); the rest wait for the next seal."""
    sealed = res.last_seal_seq
    if sealed is None or not pending or pending[0].seq > sealed:
        return []
    cut = sealed - pending[0].seq + 1
    out = pending[:cut]
    del pending[:cut]
    return out


def piece_seq(piece: Any) -> int:
    """The first event's seq of a piece :func:`scan_consuming` hands on (a StepBlock, or a list of records)."""
    return piece.seq if type(piece) is StepBlock else piece[0].seq


def _signed_pieces(pending: list[Any], res: RangeResult) -> list[Any]:
    """:func:`signed_prefix` for pending pieces (lists of records and StepBlock objects, in seq order): the
    pieces, the last one cut where the seal ends, that a seal checked so far covers, taken out of ``pending``."""
    sealed = res.last_seal_seq
    out: list[Any] = []
    while sealed is not None and pending:
        piece = pending[0]
        first = piece_seq(piece)
        if first > sealed:
            break
        k = sealed - first + 1
        if k >= len(piece):
            out.append(pending.pop(0))
            continue
        if type(piece) is StepBlock:
            out.append(piece.take(k))
        else:
            out.append(piece[:k])
            del piece[:k]
        break
    return out


def scan_consuming(path: str, size: int, ctx: ScanContext, consume: Callable[..., None], *, signed: bool,
                   progress: Callable[[int, int], None] | None = None, with_lines: bool = False,
                   blocks: Iterable[tuple[bytes, int]] | None = None,
               columns: Callable[[bytes, bytes], Any] | None = None) -> RangeResult:
    """Check the whole file in one pass, as :func:`scan_range` does, and hand every checked event on to
    ``consume`` (a list at a time, in order) from the same bytes: nothing is read twice and nothing unchecked is
    used, so a file changed under the reader is caught as it would be by verify. ``signed``: an event is handed on
    only once a seal that covers it has checked out (events after the last seal never are); otherwise as soon as
    its line has. ``with_lines``: ``consume(events, lines)`` (a :class:`Lines`), each event's line beside it (its exact bytes, no
    newline). ``columns`` (with ``with_lines``; the views' column builder): a block whose step lines were read as
    columns is handed on as a :class:`StepBlock` instead of a list (its records never built), one ``consume`` call each. Errors are returned
    in ``result.error``; what ``consume`` raises propagates (the caller throws away what it folded, as it does
    when the result carries an error)."""
    pending: list[Any] = []
    pending_lines = Lines()
    columns = columns if with_lines else None

    def hand_on(piece: Any, lines: Lines, res: RangeResult) -> None:  # a piece at a time, as its seal allows
        if not len(piece):
            return
        if not signed:
            consume(piece, lines)
            return
        pending.append(piece)
        pending_lines.extend(lines)
        for ready in _signed_pieces(pending, res):
            consume(ready, pending_lines.take(len(ready)))

    def each(block: bytes, recs: Any, off: int, res: RangeResult) -> None:
        ends = None
        if type(recs) is _StepLines:  # verify's fast path checked the step lines in C: decode the block once
            ends = recs.ends_b  # where the block scanner found its newlines
            recs = StepBlock(recs.first, 0, recs.n, 0, recs.cols.k, recs.cols, recs.others) \
                if recs.cols is not None else recs.records()
        if with_lines:
            if ends is not None:
                lines = Lines([(block, memoryview(ends).cast("I"), 0, len(ends) // 4)])
            else:
                split = lines_of(block)
                lines = Lines([(None, split, 0, len(split))])
            if len(lines) != len(recs):  # pragma: no cover - a block is whole lines, one event each
                raise AssertionError(f"{path}: {len(lines)} lines, {len(recs)} events in one block")
        if columns:
            hand_on(recs if type(recs) is StepBlock else list(recs), lines, res)
        elif with_lines:
            if not signed:
                consume(recs, lines)
            else:
                pending.extend(recs)
                pending_lines.extend(lines)
                ready = signed_prefix(pending, res)
                if ready:
                    consume(ready, pending_lines.take(len(ready)))
        elif not signed:
            consume(recs)
        else:
            pending.extend(recs)
            ready = signed_prefix(pending, res)
            if ready:
                consume(ready)
        if progress is not None:
            progress(off + len(block), size)

    return scan_range(path, 0, size, -1, genesis(ctx.run_id), ctx, True, each=each, blocks=blocks, columns=columns)


def _scan_range_star(args) -> RangeResult:
    return scan_range(*args)


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def worker_ignores_ctrl_c() -> None:
    """A worker pool's initializer: Ctrl-C reaches the whole process group, and the parent stops the workers (and
    says "interrupted"), so a worker ignores it rather than print a traceback of its own."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
