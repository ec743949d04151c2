"""Proof bundles: :func:`prove` writes chosen lines with their inclusion proofs against one seal's signed
checkpoint, :func:`consistency` the proof that an older tree is a prefix of it, and :func:`verify_bundle` checks a
bundle offline with no journal (the checkpoint's signature under a pinned key, every proof, optionally a quorum of
witnesses' cosignatures). docs/proofs.md states the trust model."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from trainledger.journal import codec
from trainledger.journal.chain import has_tree, is_hash_hex, seal_checkpoint
from trainledger.journal.errors import (
    CheckpointMismatch,
    IntegrityError,
    SchemaError,
    SealInvalid,
    UntrustedKey,
    UsageError,
)
from trainledger.journal.keys import PublicKey
from trainledger.journal.scan import MAX_LINE
from trainledger.journal.merkle import ProofError, leaf_hash, verify_consistency, verify_inclusion
from trainledger.journal.note import (
    NoteError,
    Verifier,
    b64_hash,
    check_cosignatures,
    parse_checkpoint,
)
from trainledger.journal.proofs.checkpoint import checkpoint_note, head_extension, open_checkpoint
from trainledger.journal.proofs.index import IndexMismatch, TreeIndex, TreeView, build_index, index_path_for, load_index, read_seal, save_index
from trainledger.journal.trust import TrustPolicy
from trainledger.journal.verify import open_checked, read_opening, resolve_signing

__all__ = ["BUNDLE_FORMAT", "MAX_BUNDLE_BYTES", "MAX_ENTRIES", "ProveResult", "BundleResult", "prove", "consistency",
           "parse_bundle", "bundle_head", "decode_document", "verify_bundle", "MAX_CLOSING_LINES", "closing_seqs", "proven_to_close"]


BUNDLE_FORMAT = "trainledger-proof/v1"


#: A bundle bigger than this is refused before it is parsed.
MAX_BUNDLE_BYTES = 64 << 20
MAX_ENTRIES = 100_000
_MAX_PROOF = 64  # hashes: a tree of 2**64 lines
#: the most lines a bundle proves between a figure and the ``run_closed`` after it (what a close writes between
#: them: seals, a distributed run's anchors); past it the figure is proven without being shown the last
MAX_CLOSING_LINES = 4096


def closing_seqs(seq: int, closed: int | None) -> list[int]:
    """The seqs a bundle proves to show the line at ``seq`` is the last of its kind before the run's close: every
    line from it to the ``run_closed`` at ``closed`` (a closed journal takes no line after it but its closing seal,
    so nothing outside these lines can follow it). Empty when the journal is not closed or the gap is past
    :data:`MAX_CLOSING_LINES`."""
    if closed is None or closed < seq or closed - seq > MAX_CLOSING_LINES:
        return []
    return list(range(seq, closed + 1))


def proven_to_close(events: Any, seq: int) -> bool:
    """Whether a bundle's proven ``events`` hold every line from ``seq`` to a ``run_closed``, adjacent seqs: the
    line at ``seq`` is then shown to be followed by nothing but what those lines are (whoever holds no key cannot
    make a bundle of an earlier figure that reaches the close)."""
    by_seq = {e.seq: e for e in events}
    s = seq
    while s in by_seq:
        if type(by_seq[s]).__struct_config__.tag == "run_closed":
            return True
        s += 1
    return False


# ------------------------------------------------------------------ prove


@dataclasses.dataclass
class ProveResult:
    bundle: dict[str, Any]
    index_built: bool
    index_saved: bool
    tile_reads: int
    #: what was wrong with the index found at its name (a link, a FIFO, ...): ignored, and rebuilt
    notes: list[str] = dataclasses.field(default_factory=list)


def _open_for_proof(journal: Path, keys: Sequence[PublicKey],
                    trust_embedded: bool) -> tuple[Any, int, dict[str, bytes], dict[str, int]]:
    """The journal's opening, size, the keys its seals may be signed by (key id -> raw), and for a journal whose
    rank keys are certified the seq of each key's certificate (key id -> seq), every one checked."""
    size = open_checked(journal)
    opened, opened_len = read_opening(journal, size)
    if not has_tree(opened.format_version):
        raise UsageError(f"{journal}: format {opened.format_version} journals have no tree heads in their seals; "
                         "proofs need format 1.3 or later")
    if opened.key_id is None:
        raise UsageError(f"{journal}: the journal is unsigned: there is no signed checkpoint to prove against")
    signing = resolve_signing(journal, size, opened, opened_len, keys=keys, trust_embedded=trust_embedded)
    if signing.certified is not None:
        return opened, size, {k: raw for k, (raw, _) in signing.certified.items()}, signing.certificates
    return opened, size, {opened.key_id: signing.raw}, {}


def _check_seal_signature(opened: Any, seal: Any, signing: dict[str, bytes]) -> bytes:
    root_hex = seal.tree_root
    if seal.tree_size != seal.seq or not is_hash_hex(root_hex) or not is_hash_hex(seal.sealed_hash):
        raise SealInvalid(f"seal at seq {seal.seq} names no tree of the lines before it, or no chain head",
                          seq=seal.seq)
    root = bytes.fromhex(root_hex)
    try:
        sig = base64.b64decode(seal.sig or "", validate=True)
    except (binascii.Error, ValueError):
        sig = b""
    text = seal_checkpoint(opened.run_id, seal.seq, root, seal.seq - 1, bytes.fromhex(seal.sealed_hash))
    raw = signing.get(seal.key_id)
    if raw is None or not PublicKey(raw).verify(sig, text.encode()):
        raise SealInvalid(f"seal at seq {seal.seq}: its signature does not verify under key {seal.key_id}",
                          seq=seal.seq)
    return sig


def _view(journal: Path, need: int, index: Path | None, rebuild: bool,
          progress: Callable[[int, int], None] | None,
          notes: list[str] | None = None, keep: bool = True) -> tuple[TreeView, bool, bool, TreeIndex]:
    ip = index or index_path_for(journal)
    idx = None if rebuild else load_index(journal, ip, notes=notes)
    built = saved = False
    if idx is None or idx.leaves < need:
        idx = build_index(journal, reuse=idx, progress=progress)
        built = True
        saved = save_index(idx, ip) if keep else False
    if idx.leaves < need:
        raise UsageError(f"{journal}: {idx.leaves} complete lines, fewer than the {need} the checkpoint needs")
    return TreeView(journal, idx, need, fresh=built), built, saved, idx


def _against_seal(journal: str | os.PathLike, keys: Sequence[PublicKey], trust_embedded: bool, tree_size: int | None,
                  index: str | os.PathLike | None, progress: Callable[[int, int], None] | None,
                  body: Callable[[TreeView, bytes], dict[str, Any]], keep_index: bool = True) -> ProveResult:
    """A bundle against the latest seal (or the seal at seq ``tree_size``): its signature checked, ``body(view,
    root)`` adding the proofs (each verified against the signed root, raising :class:`IndexMismatch` otherwise). An
    index that disagrees with the journal is rebuilt once; a journal that disagrees with its own seal raises
    :class:`IntegrityError`."""
    p = Path(journal)
    opened, size, signing, certs = _open_for_proof(p, keys, trust_embedded)
    ip = Path(index) if index is not None else None
    notes: list[str] = []
    for rebuild in (False, True):
        try:
            if tree_size is not None:
                view, built, saved, idx = _view(p, tree_size + 1, ip, rebuild, progress, notes, keep_index)
                seal, _ = read_seal(p, size, tree_size=tree_size, view=view)
            else:
                seal, _ = read_seal(p, size)
                view, built, saved, idx = _view(p, seal.seq, ip, rebuild, progress, notes, keep_index)
            sig = _check_seal_signature(opened, seal, signing)
            if view.size != seal.seq:  # the seal's own line was read through a view one line longer
                view = TreeView(p, idx, seal.seq, fresh=built)
            root = bytes.fromhex(seal.tree_root)
            bundle = {"format": BUNDLE_FORMAT, "run_id": opened.run_id, "key_id": seal.key_id,
                      "checkpoint": checkpoint_note(opened.run_id, seal.seq, root, bytes.fromhex(seal.sealed_hash),
                                                    sig, signing[seal.key_id]),
                      **body(view, root)}
            if certs:  # the seal's key is a rank key: its certificate, proven against the same root
                bundle["certificate"] = _proven_line(view, certs[seal.key_id], root)
            notes += _past_the_seal(p, idx, seal.seq, size)
            return ProveResult(bundle, built, saved, view.reads, notes)
        except IndexMismatch:
            if rebuild:
                raise IntegrityError(f"{p}: the journal's lines do not hash to the tree its seal signed "
                                     "(changed after it was sealed)", seq=None) from None
    raise AssertionError("unreachable")  # pragma: no cover


def _proven_line(view: TreeView, s: int, root: bytes) -> dict[str, Any]:
    """Line ``s`` of the tree ``view`` and its inclusion proof, checked against ``root``."""
    line = view.line(s)
    proof = view.inclusion(s)
    try:
        verify_inclusion(leaf_hash(line), s, view.size, proof, root)
    except ProofError:
        raise IndexMismatch(f"the proof of line {s} does not reach the signed root") from None
    return {"seq": s, "line": line.decode(), "proof": [base64.b64encode(h).decode() for h in proof]}


def _past_the_seal(p: Path, idx: Any, sealed: int, size: int) -> list[str]:
    """What a bundle against the seal at seq ``sealed`` leaves out, said (never silently): the lines after that
    seal (none is covered by its checkpoint), a line among them over the journal's line cap (which verify refuses),
    and torn bytes after the last complete line."""
    out = []
    after = idx.leaves - sealed - 1
    if after > 0:
        past = TreeView(p, idx, idx.leaves)
        longest, at = max((len(past.line(s)), s) for s in range(sealed + 1, idx.leaves))
        out.append(f"{after:,} line(s) after the seal at seq {sealed} are not covered by its checkpoint: not proven")
        if longest > MAX_LINE:
            out.append(f"refused: line {at} is {longest:,} bytes, over the {MAX_LINE:,}-byte cap on a journal line: "
                       "the journal does not verify past its seal (trainledger verify names it)")
    if idx.covered < size:
        out.append(f"{size - idx.covered:,} bytes after the last complete line (a torn line) were not read")
    return out


def prove(journal: str | os.PathLike, seqs: Sequence[int], *, trust: TrustPolicy | None = None,
          tree_size: int | None = None, index: str | os.PathLike | None = None,
          progress: Callable[[int, int], None] | None = None,
          select: Callable[[Path, int], list[int]] | None = None, keep_index: bool = True,
          **trust_options: Any) -> ProveResult:
    """A proof bundle for the lines ``seqs`` (and those ``select(journal, tree_size)`` names) against the latest seal
    (or the seal at seq ``tree_size``). ``keep_index=False``: a tree index built here is not written beside the
    journal (a reader that must leave the run folder as it found it). Every proof is verified against the seal's signed root before it is
    returned; an index that disagrees with the journal is rebuilt once, and a journal that disagrees with its own
    seal raises :class:`IntegrityError`. ``trust``: whose seal counts (a :class:`TrustPolicy`, or its fields as
    keywords: ``keys=``, ``trust_embedded=``)."""
    p = Path(journal)
    t = TrustPolicy.of(trust, **trust_options)

    def entries(view: TreeView, root: bytes) -> dict[str, Any]:
        n = view.size
        want = list(seqs)
        if select is not None:
            want += [s for s in select(p, n) if s not in want]
        if not want:
            raise UsageError("nothing to prove: give --seq N (or a helper: --checkpoint, --gate, --compute)")
        out = []
        for s in want:
            if not 0 <= s < n:
                raise UsageError(f"seq {s} is not in the tree of {n} lines the checkpoint covers (seqs 0 to {n - 1})")
            line = view.line(s)
            if len(line) > MAX_LINE:  # the rule verify holds every line to: no bundle for a line it refuses
                raise SchemaError(f"line {s} is {len(line):,} bytes, over the {MAX_LINE:,}-byte cap on a journal line",
                                  seq=s)
            try:
                rec = codec.decode_line(line, seq_hint=s)
            except IntegrityError:
                raise IndexMismatch(f"line {s} does not decode") from None
            if rec.seq != s:
                raise IndexMismatch(f"line {s} holds seq {rec.seq}")
            proof = view.inclusion(s)
            try:
                verify_inclusion(leaf_hash(line), s, n, proof, root)
            except ProofError:
                raise IndexMismatch(f"the proof of line {s} does not reach the signed root") from None
            out.append({"seq": s, "line": line.decode(), "proof": [base64.b64encode(h).decode() for h in proof]})
        return {"entries": out}

    return _against_seal(p, t.keys, t.trust_embedded, tree_size, index, progress, entries, keep_index)


def consistency(journal: str | os.PathLike, from_size: int, *, trust: TrustPolicy | None = None,
                tree_size: int | None = None, index: str | os.PathLike | None = None,
                progress: Callable[[int, int], None] | None = None, **trust_options: Any) -> ProveResult:
    """A consistency bundle: the latest (or the seal at ``tree_size``'s) signed checkpoint, and the proof that the
    tree of the first ``from_size`` lines is a prefix of it (RFC 9162 2.1.4), with that tree's root."""
    p = Path(journal)
    t = TrustPolicy.of(trust, **trust_options)

    def prefix(view: TreeView, root: bytes) -> dict[str, Any]:
        n = view.size
        if not 0 < from_size <= n:
            raise UsageError(f"--from {from_size}: a consistency proof runs from a size between 1 and the "
                             f"checkpoint's {n}")
        proof = view.consistency(from_size)
        old = TreeView(p, view.idx, from_size, fresh=view.fresh).root()
        try:
            verify_consistency(from_size, n, old, root, proof)
        except ProofError:
            raise IndexMismatch("the consistency proof does not reach the signed root") from None
        return {"entries": [], "consistency": {"from_size": from_size, "from_root": base64.b64encode(old).decode(),
                                               "proof": [base64.b64encode(h).decode() for h in proof]}}

    return _against_seal(p, t.keys, t.trust_embedded, tree_size, index, progress, prefix)


# ------------------------------------------------------------------ verify a bundle


class _Entry(msgspec.Struct, forbid_unknown_fields=True):
    seq: int
    line: str
    proof: list[str]


class _Consistency(msgspec.Struct, forbid_unknown_fields=True):
    from_size: int
    from_root: str
    proof: list[str]


class _Bundle(msgspec.Struct, forbid_unknown_fields=True):
    format: str
    run_id: str
    key_id: str
    checkpoint: str
    entries: list[_Entry]
    consistency: _Consistency | None = None
    #: a journal whose rank keys are certified (format 1.7): the key_certified line of the checkpoint's key
    certificate: _Entry | None = None


@dataclasses.dataclass
class BundleResult:
    """What a bundle established."""

    run_id: str
    key_id: str
    tree_size: int
    root: str  # base64
    head: str  # SEQ:HASH
    events: list[Any]  # the proven lines' records, in the bundle's order
    witnesses: list[tuple[str, int]]  # (name, timestamp) of every pinned witness whose cosignature verified
    consistent_from: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ok": True, "run_id": self.run_id, "key_id": self.key_id, "tree_size": self.tree_size,
                "root": self.root, "head": self.head,
                "entries": [msgspec.to_builtins(e) for e in self.events],
                "witnesses": [{"name": n, "timestamp": t} for n, t in self.witnesses],
                "consistent_from": self.consistent_from}


def _b64_hashes(items: list[str], what: str) -> list[bytes]:
    if len(items) > _MAX_PROOF:
        raise ProofError(f"{what}: {len(items)} hashes, more than any tree needs")
    out = []
    for x in items:
        h = b64_hash(x) if isinstance(x, str) else None
        if h is None:
            raise ProofError(f"{what}: a hash that is not base64 of 32 bytes")
        out.append(h)
    return out


def decode_document(data: bytes, type_: Any, fmt: str, *, what: str, short: str, limit: int) -> Any:
    """A JSON document of trainledger's (a bundle, a compute statement, a proof pack) decoded into ``type_``, its
    ``format`` field checked against ``fmt``: :class:`UsageError` past ``limit`` bytes, :class:`SchemaError` (one
    line) for anything that is not one. ``what`` names it in "not a ...", ``short`` in "... format X, not Y"."""
    if len(data) > limit:
        raise UsageError(f"a {short} of {len(data):,} bytes: more than {limit:,}")
    try:
        doc = msgspec.json.decode(data, type=type_)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError) as e:
        raise SchemaError(f"not a {what}: {e}", seq=None) from None
    if doc.format != fmt:
        raise SchemaError(f"{short} format {doc.format[:40]!r}, not {fmt}", seq=None)
    return doc


def bundle_head(bundle: dict[str, Any]) -> str:
    """The chain head (``SEQ:HASH``) a bundle's checkpoint names, read, not checked: for a bundle :func:`prove`
    just made and verified; :func:`verify_bundle` reads a received one's the same way, after checking it."""
    note = bundle["checkpoint"]
    seq, head = head_extension(parse_checkpoint(note[:note.rfind("\n\n") + 1]))
    return f"{seq}:{head}"


def parse_bundle(data: bytes) -> Any:
    b = decode_document(data, _Bundle, BUNDLE_FORMAT, what="proof bundle", short="bundle", limit=MAX_BUNDLE_BYTES)
    if len(b.entries) > MAX_ENTRIES:
        raise SchemaError(f"{len(b.entries):,} entries: more than {MAX_ENTRIES:,}", seq=None)
    return b


def _certified_key(b: Any, keys: Sequence[PublicKey]) -> PublicKey:
    """The checkpoint's key of a bundle whose key is a certified rank key (format 1.7): its certificate's line
    checked against the pinned keys (issuer, signature, the key in the roster, this run and rank), and the key it
    certifies must be the bundle's. The line's inclusion in the signed tree is checked once the checkpoint is
    open (:func:`_holds_certificate`)."""
    from trainledger.journal.roster import split_run_id
    from trainledger.journal.certify import check_certificate
    from trainledger.journal.events import KeyCertified

    c = b.certificate
    try:
        rec = codec.decode_line(c.line.encode(), seq_hint=c.seq)
    except IntegrityError as err:
        raise ProofError(f"the certificate (seq {c.seq}) is not a journal event: {err}") from None
    if not isinstance(rec, KeyCertified) or rec.seq != c.seq:
        raise ProofError(f"the certificate (seq {c.seq}) is not a key_certified line of that seq")
    split = split_run_id(b.run_id)
    run, rank = split if split is not None else (b.run_id, 0)
    got = check_certificate(rec, run=run, rank=rank, issuers=list(keys))
    if got.key_id != b.key_id:
        raise ProofError(f"the certificate certifies key {got.key_id}, not the bundle's key {b.key_id[:16]}")
    return PublicKey(got.raw, source=f"certified by key {got.issuer_id}")


def _holds_certificate(c: Any, cp: Any) -> None:
    """The certificate's line is a line of the signed tree (before the checkpoint)."""
    line = c.line.encode()
    if not 0 <= c.seq < cp.size:
        raise ProofError(f"the certificate's seq {c.seq} is outside the checkpoint's tree of {cp.size} lines")
    try:
        verify_inclusion(leaf_hash(line), c.seq, cp.size, _b64_hashes(c.proof, "the certificate"), cp.root)
    except ProofError as err:
        raise ProofError(f"the certificate (seq {c.seq}): {err}") from None


def verify_bundle(data: bytes, keys: Sequence[PublicKey], *, witnesses: Sequence[Verifier] = (),
                  quorum: int = 0, expect_checkpoint: str | None = None) -> BundleResult:
    """Check a proof bundle offline. Raises :class:`IntegrityError` (:class:`ProofError`, :class:`NoteError`,
    :class:`UntrustedKey`...; exit 1) when it does not hold, :class:`UsageError` when no key is pinned."""
    b = parse_bundle(data)
    if not keys:
        raise UsageError("no key pinned: pass --pubkey FILE (or set TRAINLEDGER_TRUSTED_KEYS)")
    pinned = [k for k in keys if k.key_id == b.key_id]
    certified = not pinned and b.certificate is not None
    if certified:
        pinned = [_certified_key(b, keys)]
    if not pinned:
        raise UntrustedKey(f"the bundle is signed by key {b.key_id[:16]}, which is not pinned "
                           f"(pinned: {', '.join(k.key_id for k in keys)})", seq=None)
    cp, _ = open_checkpoint(b.checkpoint, b.run_id, pinned)
    if certified:
        _holds_certificate(b.certificate, cp)
    seq, head = head_extension(cp)
    if quorum > 0:
        if not witnesses:
            raise UsageError("--witness-quorum needs --witness-key")
    got = check_cosignatures(b.checkpoint, list(witnesses)) if witnesses else []
    if len(got) < quorum:
        raise NoteError(f"{len(got)} valid cosignature(s) from pinned witnesses, fewer than the quorum of {quorum}: "
                        "the checkpoint is not published")
    events = []
    seen = set()
    for e in b.entries:
        if not 0 <= e.seq < cp.size:
            raise ProofError(f"entry seq {e.seq} is outside the checkpoint's tree of {cp.size} lines")
        if e.seq in seen:
            raise ProofError(f"seq {e.seq} appears twice")
        seen.add(e.seq)
        line = e.line.encode()
        if len(line) > MAX_LINE:
            raise ProofError(f"entry seq {e.seq}: its line is {len(line):,} bytes, over the {MAX_LINE:,}-byte cap "
                             "verify holds every journal line to")
        try:
            rec = codec.decode_line(line, seq_hint=e.seq)
        except IntegrityError as err:
            raise ProofError(f"entry seq {e.seq}: the line is not a journal event: {err}") from None
        if rec.seq != e.seq:
            raise ProofError(f"entry seq {e.seq}: the line says seq {rec.seq}")
        try:
            verify_inclusion(leaf_hash(line), e.seq, cp.size, _b64_hashes(e.proof, f"seq {e.seq}"), cp.root)
        except ProofError as err:
            raise ProofError(f"entry seq {e.seq}: {err}") from None
        events.append(rec)
    consistent_from = None
    if b.consistency is not None:
        c = b.consistency
        old_root = _b64_hashes([c.from_root], "from_root")[0]
        verify_consistency(c.from_size, cp.size, old_root, cp.root, _b64_hashes(c.proof, "consistency"))
        consistent_from = c.from_size
        if expect_checkpoint is not None:
            old, _ = open_checkpoint(expect_checkpoint, b.run_id, pinned)
            if (old.size, old.root) != (c.from_size, old_root):
                raise CheckpointMismatch(f"the bundle proves consistency from size {c.from_size}, not from the "
                                         f"expected checkpoint (size {old.size})", seq=None)
    elif expect_checkpoint is not None:
        raise UsageError("--expect-checkpoint needs a consistency bundle (trainledger consistency)")
    if not events and consistent_from is None:
        raise ProofError("the bundle proves nothing: no entries and no consistency proof")
    return BundleResult(b.run_id, b.key_id, cp.size, base64.b64encode(cp.root).decode(), f"{seq}:{head}", events,
                        [(v.name, t) for v, t in got], consistent_from)
