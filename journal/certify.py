"""Rank keys certified by one key: ephemeral signing keys for every rank, one signature of the pinned key a round.

A hardware key (a PKCS#11 token, a KMS) cannot sign every rank's seals: 16,000 ranks sealing once a second is
16,000 signatures a second. Instead each rank makes an Ed25519 key in memory at start (never written anywhere),
rank 0 gathers the public keys and has the pinned key sign one **roster statement** for the round::

    trainledger/v1/rank-keys
    run RUN
    round ROUND
    world WORLD_SIZE
    keys ROOT
    issued NS
    not-after NS

where ``ROOT`` is the RFC 6962 Merkle root (hex) over one leaf per rank, in rank order: ``"RANK KEY"`` with KEY the
rank's public key in base64. Every rank records ``key_certified`` (:class:`~trainledger.journal.events.KeyCertified`):
the statement's fields, its own key, the inclusion proof of its leaf and the signature, so that one rank's journal
carries what proves its own key and no more (a 16,000-rank roster would be 700 KB in every journal).

A verifier that pins the certifying key (the *issuer*) accepts a journal signed by a key it never saw when a
certificate in that journal binds the key to that journal's run and rank, and holds each seal to the key certified
last before it, until its ``not-after``. ``verify RUN_DIR`` also holds every rank of a round to the same statement
(:mod:`trainledger.journal.audit.rundir`). A torchrun restart is a new round: new keys, a new statement.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import mmap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainledger.journal.errors import IntegrityError, KeyFileError, RunMismatch, SchemaError, SealInvalid, UntrustedKey
from trainledger.journal.events import KeyCertified
from trainledger.journal.keys import PublicKey, Signer
from trainledger.journal.merkle import ProofError, inclusion_proof, leaf_hash, root, verify_inclusion

__all__ = ["RankRoster", "CertifiedKey", "Certified", "statement", "check_certificate", "find_certificates",
           "opens_certified", "issuer_of", "anchor_statement",
           "certified_keys", "DEFAULT_VALIDITY_S", "STATEMENT_TAG", "MAX_CERTIFICATES"]

STATEMENT_TAG = "trainledger/v1/rank-keys"
#: How long a round's keys may sign: a month (a round that runs longer is restarted, or given validity_s=)
DEFAULT_VALIDITY_S = 30 * 24 * 3600
#: certificates one journal may hold (one a restart round); more is not a journal this project wrote
MAX_CERTIFICATES = 100_000
_MAX_CERT_LINE = 64 * 1024
_PATTERN = b'\n{"kind":"key_certified",'


def statement(run: str, round: int, world_size: int, keys_root: str, issued_ns: int, not_after_ns: int) -> bytes:
    """The exact bytes the issuer signs for one round."""
    return (f"{STATEMENT_TAG}\nrun {run}\nround {round}\nworld {world_size}\nkeys {keys_root}\nissued {issued_ns}\n"
            f"not-after {not_after_ns}\n").encode()


def anchor_statement(run: str, step: int | None, heads: dict[str, str], keys: dict[str, str]) -> bytes:
    """The exact bytes the run key signs for an anchor of a run whose rank keys it certified (``ranks_anchored
    .cosig``): every rank's anchored head and key id, in rank order."""
    lines = "".join(f"{int(r)} {heads[r]} {keys.get(r, '-')}\n" for r in sorted(heads, key=int))
    return f"trainledger/v1/anchor\nrun {run}\nstep {'-' if step is None else step}\n{lines}".encode()


def _leaf(rank: int, key_b64: str) -> bytes:
    return leaf_hash(f"{rank} {key_b64}".encode())


@dataclasses.dataclass(frozen=True)
class RankRoster:
    """One round's signed roster: every rank's public key (base64, in rank order) and the issuer's signature."""

    run: str
    round: int
    keys: tuple[str, ...]
    issued_ns: int
    not_after_ns: int
    issuer: str
    sig: str

    @classmethod
    def sign(cls, issuer: Signer, *, run: str, round: int, keys: Sequence[PublicKey | str],
             validity_s: float = DEFAULT_VALIDITY_S) -> RankRoster:
        """The roster of ``keys`` (rank r's at index r) for ``round`` of ``run``, signed by ``issuer`` (one
        signature, whatever the world size: the hardware key's one call a round)."""
        b64 = tuple(k.b64 if isinstance(k, PublicKey) else PublicKey(base64.b64decode(k), "rank key").b64
                    for k in keys)
        if not b64:
            raise ValueError("a roster needs at least one rank's key")
        issued = time.time_ns()
        not_after = issued + int(validity_s * 1e9)
        body = statement(run, round, len(b64), _root_hex(b64), issued, not_after)
        sig = issuer.sign(body)
        if not issuer.public.verify(sig, body):  # a token or service that signs wrong must not certify anything
            raise KeyFileError(f"key {issuer.key_id}: its signature of the roster does not verify under its own "
                               "public key")
        return cls(run, round, b64, issued, not_after, issuer.public.b64, base64.b64encode(sig).decode())

    @property
    def keys_root(self) -> str:
        return _root_hex(self.keys)

    def certificate(self, rank: int) -> KeyCertified:
        """What ``rank``'s journal records: its key, its leaf's inclusion proof, the statement and signature."""
        leaves = [_leaf(r, k) for r, k in enumerate(self.keys)]
        return KeyCertified(run=self.run, round=self.round, world_size=len(self.keys), rank=rank,
                            key=self.keys[rank], keys_root=root(leaves).hex(),
                            proof=[h.hex() for h in inclusion_proof(leaves, rank)], issued_ns=self.issued_ns,
                            not_after_ns=self.not_after_ns, issuer=self.issuer, sig=self.sig)


def issuer_of(cert: Any) -> PublicKey:
    """The public key that signed a certificate's roster (as the certificate names it; a verifier pins it)."""
    return _b64_key(cert.issuer, "its issuer", getattr(cert, "seq", 0))


def _root_hex(keys: Sequence[str]) -> str:
    return root([_leaf(r, k) for r, k in enumerate(keys)]).hex()


@dataclasses.dataclass(frozen=True)
class CertifiedKey:
    """A key a certificate checked out for: ``key_id``, its 32 raw bytes, until when, by whom, which round."""

    key_id: str
    raw: bytes
    not_after_ns: int
    issuer_id: str
    round: int
    seq: int


def _b64_key(s: str, what: str, seq: int) -> PublicKey:
    try:
        raw = base64.b64decode(s, validate=True)
        return PublicKey(raw, what)
    except (binascii.Error, ValueError, KeyFileError):
        raise SchemaError(f"key_certified at seq {seq}: {what} is not a base64 Ed25519 public key", seq=seq) from None


def check_certificate(ev: Any, *, run: str, rank: int, issuers: Sequence[PublicKey] | None,
                      check_signature: bool = True) -> CertifiedKey:
    """The key ``ev`` (a decoded ``key_certified`` record) certifies for ``rank`` of ``run``. ``issuers``: the
    pinned keys one of which must have signed it (None: the certificate's own issuer is taken as is, for
    ``--trust-embedded``). Raises :class:`UntrustedKey` for an issuer not pinned, :class:`SealInvalid` for a
    signature or proof that does not check out, :class:`RunMismatch` for another run's or rank's certificate."""
    seq = ev.seq
    if ev.run != run or ev.rank != rank:
        raise RunMismatch(f"key_certified at seq {seq} certifies a key for rank {ev.rank} of run {ev.run!r}, not rank "
                          f"{rank} of {run!r}", seq=seq)
    key = _b64_key(ev.key, "its key", seq)
    issuer = _b64_key(ev.issuer, "its issuer", seq)
    if issuers is not None:
        pinned = {k.key_id: k for k in issuers}
        if issuer.key_id not in pinned:
            raise UntrustedKey(f"key_certified at seq {seq}: the rank key {key.key_id} is certified by key "
                               f"{issuer.key_id}, which is not pinned (pinned: {', '.join(pinned) or 'none'})",
                               seq=seq)
        issuer = pinned[issuer.key_id]
    if not (0 <= ev.rank < ev.world_size and ev.round >= 0 and ev.issued_ns <= ev.not_after_ns):
        raise SchemaError(f"key_certified at seq {seq}: rank {ev.rank} of a world of {ev.world_size}, round "
                          f"{ev.round}, valid {ev.issued_ns}..{ev.not_after_ns}: not a certificate", seq=seq)
    if check_signature:
        try:
            proof = [bytes.fromhex(h) for h in ev.proof]
            want = bytes.fromhex(ev.keys_root)
            verify_inclusion(_leaf(rank, key.b64), rank, ev.world_size, proof, want)
        except (ValueError, ProofError) as e:
            raise SealInvalid(f"key_certified at seq {seq}: rank {rank}'s key is not in the certified roster "
                              f"({e})", seq=seq) from None
        try:
            sig = base64.b64decode(ev.sig, validate=True)
        except (binascii.Error, ValueError):
            raise SealInvalid(f"key_certified at seq {seq}: the signature is not base64", seq=seq) from None
        body = statement(ev.run, ev.round, ev.world_size, ev.keys_root, ev.issued_ns, ev.not_after_ns)
        if not _roster_signed(issuer, sig, body):
            raise SealInvalid(f"key_certified at seq {seq}: the roster's signature does not verify under key "
                              f"{issuer.key_id}", seq=seq)
    return CertifiedKey(key.key_id, key.raw, ev.not_after_ns, issuer.key_id, ev.round, seq)


#: (issuer key, signature, roster statement) already verified: every rank of a round carries the same roster
#: signature, which a reader of many ranks (verify-proof of a compute statement) then checks once, not once a rank.
#: Only successes are kept (a pure function of the three); bounded.
_VERIFIED_ROSTERS: dict[tuple[bytes, bytes, bytes], bool] = {}


def _roster_signed(issuer: PublicKey, sig: bytes, body: bytes) -> bool:
    k = (issuer.raw, sig, body)
    if k in _VERIFIED_ROSTERS:
        return True
    if not issuer.verify(sig, body):
        return False
    if len(_VERIFIED_ROSTERS) >= 1024:
        _VERIFIED_ROSTERS.clear()
    _VERIFIED_ROSTERS[k] = True
    return True


def opens_certified(path: Path, opened_len: int, *, _source: Any = None) -> bool:
    """Whether the journal at ``path`` is one whose keys are certified: its second line (after ``run_opened``,
    ``opened_len`` bytes) is a ``key_certified``, as the writer puts it. A bounded read of a few bytes (``_source``:
    of a stream of lines, see :func:`~trainledger.journal.verify.verify`)."""
    if _source is not None:
        return _source.prefix(opened_len + len(_PATTERN))[opened_len:opened_len + len(_PATTERN)] == _PATTERN
    with open(path, "rb") as f:
        f.seek(opened_len)
        return f.read(len(_PATTERN)) == _PATTERN


def find_certificates(path: Path, size: int) -> list[Any]:
    """Every ``key_certified`` line of the first ``size`` bytes of ``path``, decoded (a search for its canonical
    opening, at the speed of a byte search; the full scan checks the same lines in order afterwards). Bounded:
    :data:`MAX_CERTIFICATES` lines of at most 64 KiB each."""
    out: list[Any] = []
    if size == 0:
        return out
    try:
        return _find_certificates(path, size, out)
    except (OSError, ValueError) as e:  # gone, cut to nothing, unreadable since it was opened
        from trainledger.journal.errors import JournalIOError

        raise JournalIOError(f"{path}: cannot read its certificates ({e})") from None


def _find_certificates(path: Path, size: int, out: list[Any]) -> list[Any]:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        end = min(size, len(mm))
        at = mm.find(_PATTERN, 0, end)
        while at >= 0:
            start = at + 1
            nl = mm.find(b"\n", start, min(end, start + _MAX_CERT_LINE))
            if nl < 0:
                if end - start >= _MAX_CERT_LINE:
                    raise SchemaError(f"a key_certified line at byte {start} is over {_MAX_CERT_LINE:,} bytes",
                                      offset=start)
                break  # a torn last line: the scan reports it
            take_certificate(mm[start:nl], out, offset=start)
            at = mm.find(_PATTERN, nl, end)
    return out


def take_certificate(line: bytes, out: list[Any], *, offset: int | None = None, seq: int | None = None,
                     length: int | None = None) -> None:
    """A line found opening as a ``key_certified`` does (by :func:`find_certificates`' byte search, or a query of a
    stream's lines), decoded onto ``out`` when it is one; ``offset``/``seq``: where it is, for the errors;
    ``length``: the line's length where the line itself was not read (too long to be one). Bounded as the search
    is: lines of at most 64 KiB, :data:`MAX_CERTIFICATES` of them."""
    from trainledger.journal import codec

    where = f"at byte {offset}" if offset is not None else f"at seq {seq}"
    if (len(line) if length is None else length) >= _MAX_CERT_LINE:
        raise SchemaError(f"a key_certified line {where} is over {_MAX_CERT_LINE:,} bytes", offset=offset, seq=seq)
    if len(out) >= MAX_CERTIFICATES:
        raise SchemaError(f"more than {MAX_CERTIFICATES:,} key_certified lines: not a journal this project wrote",
                          offset=offset, seq=seq)
    try:
        rec = codec.decode_line(line)
    except IntegrityError as e:
        e.offset = offset
        if seq is not None and e.seq is None:
            e.seq = seq
        raise
    if isinstance(rec, KeyCertified):
        out.append(rec)


@dataclasses.dataclass
class Certified:
    """The keys certificates in one journal certify (key id -> :class:`CertifiedKey`), and by whom."""

    keys: dict[str, CertifiedKey]
    issuers: list[str]
    rounds: list[int]

    def table(self) -> dict[str, tuple[bytes | None, int]]:
        """What the scan holds seals to: key id -> (raw public key, not-after ns)."""
        return {k: (c.raw, c.not_after_ns) for k, c in self.keys.items()}


def certified_keys(path: Path, size: int, opened: Any, *, keys: Sequence[PublicKey], trust_embedded: bool,
                   check_signatures: bool = True, _source: Any = None) -> Certified | None:
    """The certified keys of the journal at ``path`` whose ``run_opened`` is ``opened``; None when it holds no
    certificate. Every certificate must check out under a pinned key (or, with ``trust_embedded`` and no key
    pinned, its own issuer); rounds must rise."""
    from trainledger.journal.roster import split_run_id

    found = find_certificates(path, size) if _source is None else _source.certificates()
    if not found:
        return None
    split = split_run_id(opened.run_id)
    run, rank = split if split is not None else (opened.run_id, 0)
    issuers = None if (not check_signatures or (trust_embedded and not keys)) else list(keys)
    out: dict[str, CertifiedKey] = {}
    rounds: list[int] = []
    for ev in found:
        c = check_certificate(ev, run=run, rank=rank, issuers=issuers, check_signature=check_signatures)
        if rounds and c.round <= rounds[-1]:
            raise SealInvalid(f"key_certified at seq {ev.seq} certifies round {c.round} after round {rounds[-1]}: "
                              "a certificate replayed from an earlier round", seq=ev.seq)
        if c.key_id in out:
            raise SealInvalid(f"key_certified at seq {ev.seq}: key {c.key_id} is certified twice", seq=ev.seq)
        rounds.append(c.round)
        out[c.key_id] = c
    return Certified(out, sorted({c.issuer_id for c in out.values()}), rounds)
