"""RFC 3161 trusted time for seals (docs/publishing.md): a time-stamping authority's signed statement that a seal's
checkpoint note existed by a given time, which a trainer's own clock is not.

- :func:`request` asks an authority (an HTTP endpoint, ``application/timestamp-query``) for a token over the
  SHA-256 of a note, with a fresh nonce and the authority's certificate asked for;
- :func:`verify_token` checks a token offline against the authority's certificate (pinned, or the CA that issued
  it): the TSTInfo's message imprint is the note's SHA-256, the signer's signed attributes carry the content type and
  the digest of the TSTInfo, the signature over them verifies under the signer certificate's key (RSA PKCS#1 v1.5,
  ECDSA or Ed25519), that certificate is the pinned one or issued by it, is marked for time stamping (extended key
  usage id-kp-timeStamping) and was valid at the stated time. It returns that time.

The DER is read by a small parser of its own (definite lengths only, every length checked against its container),
so the core install needs nothing beyond ``cryptography``.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import warnings
from collections.abc import Sequence
from typing import Any

from trainledger.journal.errors import IntegrityError, UsageError

__all__ = ["TimestampError", "request", "verify_token", "Token", "request_body", "MAX_TOKEN", "seal_notes",
           "stamp", "check_journal", "list_tokens", "sidecar", "Stamped", "load_certificates", "token_time",
           "stamp_record", "append_sidecar", "MAX_SIDECAR"]

#: the largest token read or accepted (an authority's chain of certificates included)
MAX_TOKEN = 1 << 16

_SHA256 = "2.16.840.1.101.3.4.2.1"
_HASHES = {_SHA256: hashlib.sha256, "2.16.840.1.101.3.4.2.2": hashlib.sha384, "2.16.840.1.101.3.4.2.3": hashlib.sha512}
_SIGNED_DATA = "1.2.840.113549.1.7.2"
_TST_INFO = "1.2.840.113549.1.9.16.1.4"
_CONTENT_TYPE = "1.2.840.113549.1.9.3"
_MESSAGE_DIGEST = "1.2.840.113549.1.9.4"
_TIME_STAMPING = "1.3.6.1.5.5.7.3.8"


class TimestampError(IntegrityError):
    """A token that does not parse, is not over this note, or does not verify under the pinned authority (the
    message says which)."""

    reason = "timestamp-invalid"


# ------------------------------------------------------------------ DER


def _tlv(data: bytes, i: int, end: int) -> tuple[int, int, int]:
    """(tag, start of content, end of content) of the element at ``i``; every length held inside ``end``."""
    if i + 2 > end:
        raise TimestampError("DER: truncated", seq=None)
    tag, n = data[i], data[i + 1]
    if tag & 0x1F == 0x1F:
        raise TimestampError("DER: a multi-byte tag", seq=None)
    i += 2
    if n & 0x80:
        k = n & 0x7F
        if k == 0 or k > 4 or i + k > end:
            raise TimestampError("DER: an indefinite or oversized length", seq=None)
        n = int.from_bytes(data[i:i + k], "big")
        i += k
    if i + n > end:
        raise TimestampError("DER: an element runs past its container", seq=None)
    return tag, i, i + n


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """The elements inside [start, end): (tag, content start, content end, element start)."""
    out, i = [], start
    while i < end:
        tag, s, e = _tlv(data, i, end)
        out.append((tag, s, e, i))
        i = e
    return out


def _oid(body: bytes) -> str:
    if not body:
        raise TimestampError("DER: an empty object identifier", seq=None)
    parts, v = [], 0
    for b in body:
        v = (v << 7) | (b & 0x7F)
        if not b & 0x80:
            parts.append(v)
            v = 0
    first = min(parts[0] // 40, 2)
    return ".".join(map(str, [first, parts[0] - 40 * first, *parts[1:]]))


def _enc_len(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    b = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(b)]) + b


def _enc(tag: int, body: bytes) -> bytes:
    return bytes([tag]) + _enc_len(len(body)) + body


def _enc_oid(oid: str) -> bytes:
    a, b, *rest = map(int, oid.split("."))
    out = bytearray([40 * a + b])
    for v in rest:
        chunk = [v & 0x7F]
        v >>= 7
        while v:
            chunk.append(0x80 | (v & 0x7F))
            v >>= 7
        out += bytes(reversed(chunk))
    return _enc(0x06, bytes(out))


def _enc_int(v: int) -> bytes:
    return _enc(0x02, v.to_bytes(v.bit_length() // 8 + 1, "big", signed=True))


# ------------------------------------------------------------------ the request


def request_body(digest: bytes, nonce: int) -> bytes:
    """A DER TimeStampReq: version 1, the SHA-256 message imprint, the nonce, certReq true."""
    alg = _enc(0x30, _enc_oid(_SHA256) + _enc(0x05, b""))
    imprint = _enc(0x30, alg + _enc(0x04, digest))
    return _enc(0x30, _enc_int(1) + imprint + _enc_int(nonce) + _enc(0x01, b"\xff"))


def request(url: str, note: str, *, timeout: float = 10.0) -> bytes:
    """A token over ``note`` from the authority at ``url`` (its status checked: granted, with a token); raises
    :class:`TimestampError` for a refusal or a malformed answer, ``OSError`` when it cannot be reached."""
    import urllib.request

    digest = hashlib.sha256(note.encode()).digest()
    nonce = int.from_bytes(os.urandom(8), "big") >> 1
    req = urllib.request.Request(url, data=request_body(digest, nonce), method="POST",
                                 headers={"Content-Type": "application/timestamp-query"})
    with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 - the authority the user named
        resp = r.read(MAX_TOKEN + 1)
    if len(resp) > MAX_TOKEN:
        raise TimestampError(f"{url}: an answer larger than {MAX_TOKEN} bytes", seq=None)
    _, s, e = _tlv(resp, 0, len(resp))
    kids = _children(resp, s, e)
    if not kids or kids[0][0] != 0x30:
        raise TimestampError(f"{url}: not a TimeStampResp", seq=None)
    status = _children(resp, kids[0][1], kids[0][2])
    code = int.from_bytes(resp[status[0][1]:status[0][2]], "big") if status and status[0][0] == 0x02 else -1
    if code not in (0, 1) or len(kids) < 2:
        raise TimestampError(f"{url}: the authority did not grant a token (status {code})", seq=None)
    token = resp[kids[1][3]:kids[1][2]]
    t = _parse(token)
    if t.nonce != nonce or t.digest != digest:
        raise TimestampError(f"{url}: the token answers another request (its nonce or imprint differs)", seq=None)
    return token


# ------------------------------------------------------------------ the token


@dataclasses.dataclass(frozen=True)
class Token:
    """What a token states: ``time`` (its genTime, UTC), the imprint's ``digest``, its ``serial``, ``nonce``."""

    time: datetime.datetime
    digest: bytes
    serial: int
    nonce: int | None
    _signed: Any = dataclasses.field(repr=False, default=None)
    #: the subject of the certificate whose key verified the token (set by :func:`verify_token`; None when only read)
    signer: str | None = None


def _gentime(raw: bytes) -> datetime.datetime:
    s = raw.decode("ascii", "replace")
    if not s.endswith("Z"):
        raise TimestampError("genTime is not in UTC", seq=None)
    main, _, frac = s[:-1].partition(".")
    try:
        t = datetime.datetime.strptime(main, "%Y%m%d%H%M%S").replace(tzinfo=datetime.timezone.utc)
    except ValueError:
        raise TimestampError(f"genTime {s[:40]!r} does not parse", seq=None) from None
    if frac:
        if not frac.isdigit():
            raise TimestampError(f"genTime {s[:40]!r} does not parse", seq=None)
        t += datetime.timedelta(microseconds=int(frac[:6].ljust(6, "0")))
    return t


def _parse(token: bytes) -> Token:
    """A token's statement, read (not checked); :class:`TimestampError` for any token that does not parse."""
    try:
        return _read_token(token)
    except (IndexError, StopIteration, ValueError) as e:  # a structure shorter or other than a token's
        raise TimestampError(f"a malformed token ({type(e).__name__})", seq=None) from None


def _read_token(token: bytes) -> Token:
    if len(token) > MAX_TOKEN:
        raise TimestampError(f"a token larger than {MAX_TOKEN} bytes", seq=None)
    tag, s, e = _tlv(token, 0, len(token))
    if tag != 0x30 or e != len(token):
        raise TimestampError("not a DER ContentInfo", seq=None)
    ci = _children(token, s, e)
    if len(ci) != 2 or ci[0][0] != 0x06 or _oid(token[ci[0][1]:ci[0][2]]) != _SIGNED_DATA or ci[1][0] != 0xA0:
        raise TimestampError("not a CMS SignedData", seq=None)
    (sd,) = _children(token, ci[1][1], ci[1][2])
    parts = _children(token, sd[1], sd[2])
    if len(parts) < 4:
        raise TimestampError("a SignedData without its parts", seq=None)
    encap = _children(token, parts[2][1], parts[2][2])
    if len(encap) != 2 or _oid(token[encap[0][1]:encap[0][2]]) != _TST_INFO or encap[1][0] != 0xA0:
        raise TimestampError("the SignedData does not hold a TSTInfo", seq=None)
    (octets,) = _children(token, encap[1][1], encap[1][2])
    if octets[0] != 0x04:
        raise TimestampError("the TSTInfo is not an OCTET STRING", seq=None)
    tst = token[octets[1]:octets[2]]
    certs = next((p for p in parts[3:] if p[0] == 0xA0), None)
    signers = next((p for p in parts[3:] if p[0] == 0x31), None)
    if signers is None:
        raise TimestampError("the SignedData has no signer", seq=None)
    _, ts, te = _tlv(tst, 0, len(tst))
    f = _children(tst, ts, te)
    if len(f) < 5 or f[2][0] != 0x30 or f[4][0] != 0x18:
        raise TimestampError("a malformed TSTInfo", seq=None)
    mi = _children(tst, f[2][1], f[2][2])
    alg = _children(tst, mi[0][1], mi[0][2])
    if _oid(tst[alg[0][1]:alg[0][2]]) != _SHA256:
        raise TimestampError("the token's imprint is not SHA-256", seq=None)
    nonce = next((int.from_bytes(tst[x[1]:x[2]], "big") for x in f[5:] if x[0] == 0x02), None)
    return Token(_gentime(tst[f[4][1]:f[4][2]]), tst[mi[1][1]:mi[1][2]],
                 int.from_bytes(tst[f[3][1]:f[3][2]], "big", signed=True), nonce,
                 (token, tst, certs, signers))


def verify_token(token: bytes, note: str, trusted: Sequence[Any]) -> Token:
    """Check ``token`` (DER) over ``note`` against ``trusted`` (``cryptography`` X.509 certificates: the authority's
    own, or the CA that issued it); returns what it states. Raises :class:`TimestampError` naming what fails."""
    if not trusted:
        raise UsageError("no time-stamping authority certificate pinned (--tsa-cert FILE)")
    try:
        return _verify(token, note, trusted)
    except (TimestampError, UsageError):
        raise
    except Exception as e:  # noqa: BLE001 - the DER is anyone's: whatever a part of it fails on, it is no token
        raise TimestampError(f"a malformed token ({type(e).__name__})", seq=None) from None


def _verify(token: bytes, note: str, trusted: Sequence[Any]) -> Token:
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

    t = _parse(token)
    if t.digest != hashlib.sha256(note.encode()).digest():
        raise TimestampError("the token is over another note", seq=None)
    raw, tst, certs, signers = t._signed
    infos = _children(raw, signers[1], signers[2])
    if len(infos) != 1:
        raise TimestampError(f"a token with {len(infos)} signers (one expected)", seq=None)
    si = _children(raw, infos[0][1], infos[0][2])
    attrs = next((x for x in si if x[0] == 0xA0), None)
    if attrs is None:
        raise TimestampError("the signer has no signed attributes", seq=None)
    digest_alg = _oid(raw[_children(raw, si[2][1], si[2][2])[0][1]:_children(raw, si[2][1], si[2][2])[0][2]])
    h = _HASHES.get(digest_alg)
    if h is None:
        raise TimestampError(f"a signer digest algorithm this verifier does not take ({digest_alg})", seq=None)
    found: dict[str, bytes] = {}
    for a_tag, a_s, a_e, _ in _children(raw, attrs[1], attrs[2]):
        kids = _children(raw, a_s, a_e)
        vals = _children(raw, kids[1][1], kids[1][2])
        found[_oid(raw[kids[0][1]:kids[0][2]])] = raw[vals[0][1]:vals[0][2]] if vals else b""
    if found.get(_CONTENT_TYPE) is None or _oid(found[_CONTENT_TYPE]) != _TST_INFO:
        raise TimestampError("the signed content type is not a TSTInfo", seq=None)
    if found.get(_MESSAGE_DIGEST) != h(tst).digest():
        raise TimestampError("the signed digest is not the TSTInfo's", seq=None)
    signed = b"\x31" + raw[attrs[3] + 1:attrs[2]]  # the attributes as a SET OF, which is what is signed
    sig_i = next(i for i in range(len(si)) if si[i][3] > attrs[3] and si[i][0] == 0x04)
    signature = raw[si[sig_i][1]:si[sig_i][2]]
    sig_alg = _oid(raw[_children(raw, si[sig_i - 1][1], si[sig_i - 1][2])[0][1]:
                       _children(raw, si[sig_i - 1][1], si[sig_i - 1][2])[0][2]])
    pool = []
    if certs is not None:
        for _, _, _, at in _children(raw, certs[1], certs[2]):
            _, _, ce = _tlv(raw, at, certs[2])
            try:
                with warnings.catch_warnings():  # a malformed carried certificate says so once, as a refusal below
                    warnings.simplefilter("ignore")
                    pool.append(x509.load_der_x509_certificate(raw[at:ce]))
            except (ValueError, x509.InvalidVersion):
                continue
    pool += list(trusted)
    hash_obj = {hashlib.sha256: hashes.SHA256(), hashlib.sha384: hashes.SHA384(), hashlib.sha512: hashes.SHA512()}[h]
    signer = None
    for cert in pool:
        try:
            key = cert.public_key()
        except UnsupportedAlgorithm:  # a certificate the token carries, of a key type this verifier takes no part in
            continue
        try:
            if isinstance(key, rsa.RSAPublicKey):
                key.verify(signature, signed, padding.PKCS1v15(), hash_obj)
            elif isinstance(key, ec.EllipticCurvePublicKey):
                key.verify(signature, signed, ec.ECDSA(hash_obj))
            elif isinstance(key, ed25519.Ed25519PublicKey):
                key.verify(signature, signed)
            else:
                continue
        except (InvalidSignature, ValueError):
            continue
        signer = cert
        break
    if signer is None:
        raise TimestampError(f"the token's signature ({sig_alg}) verifies under no certificate it carries or that is "
                             "pinned", seq=None)
    if not any(signer == c or _issued_by(signer, c) for c in trusted):
        raise TimestampError(f"the token is signed by {signer.subject.rfc4514_string()[:120]}, which is neither the "
                             "pinned authority nor issued by it", seq=None)
    try:
        eku = signer.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        eku = None
    if eku is None or x509.ObjectIdentifier(_TIME_STAMPING) not in eku:
        raise TimestampError("the signing certificate is not one for time stamping (extended key usage)", seq=None)
    if not signer.not_valid_before_utc <= t.time <= signer.not_valid_after_utc:
        raise TimestampError(f"the token's time {t.time.isoformat()} is outside its certificate's validity", seq=None)
    return dataclasses.replace(t, signer=signer.subject.rfc4514_string()[:200])


def _issued_by(cert: Any, ca: Any) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
        return True
    except Exception:  # noqa: BLE001 - cryptography raises ValueError, TypeError or InvalidSignature
        return False


def load_certificates(data: bytes) -> list[Any]:
    """Every certificate in a PEM (or one DER) file."""
    from cryptography import x509

    if b"-----BEGIN CERTIFICATE-----" in data:
        return x509.load_pem_x509_certificates(data)
    return [x509.load_der_x509_certificate(data)]


# ------------------------------------------------------------------ a journal's seals


def sidecar(journal: Any) -> Any:
    """Where the tokens of a journal that can take no more lines (a closed run; ``trainledger timestamp`` on a
    journal already written) are kept: beside it, ``<name>.timestamps.jsonl``, a JSON object a line. A token needs no
    signature of the run's: the authority's signature and the note's digest are what make it."""
    from pathlib import Path

    from trainledger.journal.paths import TIMESTAMPS_SUFFIX

    p = Path(journal)
    return p.with_name(p.stem + TIMESTAMPS_SUFFIX)


def seal_notes(journal: Any, keys: Sequence[Any]) -> dict[int, tuple[str, int]]:
    """Every signed seal of a verified journal as its checkpoint note: {seal seq: (note, the seal's own clock in
    ns)}. Only format 1.3 seals are checkpoints."""
    import base64

    from trainledger.journal.events import RunOpened, Seal, SealSigned
    from trainledger.journal.proofs.checkpoint import checkpoint_note
    from trainledger.journal.reader import read_signed_events

    out: dict[int, tuple[str, int]] = {}
    run_id: str = ""
    when: dict[int, int] = {}
    by_id = {k.key_id: k for k in keys}
    for ev in read_signed_events(journal, keys):
        if isinstance(ev, RunOpened):
            run_id = ev.run_id
        elif isinstance(ev, (Seal, SealSigned)):
            seq = ev.seq if isinstance(ev, Seal) else ev.seal_seq
            if isinstance(ev, Seal):
                when[seq] = ev.ts
            pub = by_id.get(ev.key_id or "")
            if ev.tree_root is None or ev.tree_size is None or ev.sig is None or pub is None:
                continue  # unsigned yet (its seal_signed follows), before format 1.3, or a certified rank key's
            out[seq] = (checkpoint_note(run_id, ev.tree_size, bytes.fromhex(ev.tree_root),
                                        bytes.fromhex(ev.sealed_hash), base64.b64decode(ev.sig), pub),
                        when.get(seq, ev.ts))
    return out


@dataclasses.dataclass(frozen=True)
class Stamped:
    """One seal's token as found and checked: the seal's line, the tree it signs, the time the token states (or
    None), the seal's own clock (ns), the authority, and ``error`` where the token fails or none came."""

    seal_seq: int
    tree_size: int | None
    time: datetime.datetime | None
    own_ns: int | None
    tsa: str
    error: str | None
    where: str
    #: False where the token was read, not checked (``show``): its time is only what it says
    checked: bool = True
    #: the subject of the certificate that signed a checked token (the ``tsa`` URL is only where it was fetched)
    authority: str | None = None


def token_time(token: bytes) -> datetime.datetime:
    """The time a token states (its genTime, UTC), read without checking it (:func:`verify_token` checks)."""
    return _parse(token).time


def stamp_record(url: str, seal_seq: int, note: str, *, timeout: float = 10.0) -> dict[str, Any]:
    """A token over ``note`` from ``url`` as the record a journal or a sidecar keeps: ``seal_seq``, ``note_sha256``,
    ``tsa`` and ``token`` (base64) with ``time``; or, where the authority could not be reached or refused,
    ``error`` in one line instead (the run goes on without it)."""
    import base64

    rec: dict[str, Any] = {"seal_seq": seal_seq, "note_sha256": hashlib.sha256(note.encode()).hexdigest(), "tsa": url}
    try:
        token = request(url, note, timeout=timeout)
        rec.update(token=base64.b64encode(token).decode(), time=token_time(token).isoformat())
    except (OSError, TimestampError, ValueError) as e:
        rec["error"] = " ".join(f"{type(e).__name__}: {e}".split())[:300]
    return rec


#: the most a timestamps file beside a journal is read: a token is about 2 KB, so some 30,000 seals' worth
MAX_SIDECAR = 64 << 20


def _sidecar_lines(journal: Any) -> list[str]:
    """The lines of the journal's timestamps file, none when there is none: read as a regular file of at most
    :data:`MAX_SIDECAR` bytes (a link, a FIFO or a bigger file is refused in one line: whoever can write the run
    folder can put anything there)."""
    from trainledger.journal.paths import read_regular

    path = sidecar(journal)
    if not (path.is_file() or path.is_symlink()):
        return []
    return read_regular(path, MAX_SIDECAR, what="timestamps file").decode("utf-8", "replace").splitlines()


def append_sidecar(journal: Any, records: Sequence[dict[str, Any]]) -> None:
    """Add records (:func:`stamp_record`'s) to the journal's sidecar, the file rewritten whole."""
    import json

    from trainledger.journal.paths import write_atomically

    path = sidecar(journal)
    lines = _sidecar_lines(journal)
    lines += [json.dumps(r, sort_keys=True) for r in records]
    write_atomically(path, ("\n".join(x for x in lines if x.strip()) + "\n").encode())


def stamp(journal: Any, keys: Sequence[Any], url: str, *, all_seals: bool = False,
          timeout: float = 10.0) -> list[Stamped]:
    """Ask the authority at ``url`` for a token over the journal's last signed seal (``all_seals``: every seal the
    sidecar does not hold a token for yet) and keep each in the sidecar. Unreachable or refused: the seal is listed
    with the error, and nothing is written for it."""
    import json


    notes = seal_notes(journal, keys)
    if not notes:
        raise UsageError(f"{journal}: no signed format 1.3 seal to timestamp")
    path = sidecar(journal)

    have = set()
    for x in _sidecar_lines(journal):  # the seals with a token already; a line that is no record is not one
        try:
            d = json.loads(x)
        except ValueError:
            continue
        if isinstance(d, dict) and d.get("token") is not None:
            have.add(d.get("seal_seq"))
    todo = sorted(s for s in notes if s not in have) if all_seals else [max(notes)]
    out, keep = [], []
    for seq in todo:
        note, own = notes[seq]
        rec = stamp_record(url, seq, note, timeout=timeout)
        if "error" in rec:
            out.append(Stamped(seq, _size(note), None, own, url, f"no token: {rec['error']}", str(path)))
            continue
        keep.append(rec)
        out.append(Stamped(seq, _size(note), datetime.datetime.fromisoformat(rec["time"]), own, url, None,
                           str(path)))
    if keep:
        append_sidecar(journal, keep)
    return out


def _size(note: str) -> int | None:
    from trainledger.journal.note import parse_checkpoint

    try:
        return parse_checkpoint(note[:note.rfind("\n\n") + 1]).size
    except Exception:  # noqa: BLE001 - only for the listing
        return None


def _records(journal: Any, events: Any) -> list[tuple[int, str, str | None, str | None, str, str | None, str | None]]:
    """Every token record of a journal: its ``timestamp_recorded`` lines (from ``events``) and its sidecar's, as
    (seal, tsa, token, error, where, the note's digest, the time as recorded); a sidecar line that is no record is
    one with an error."""
    import json

    from trainledger.journal.kinds import TimestampRecorded

    found: list[tuple[int, str, str | None, str | None, str, str | None, str | None]] = []
    for ev in events:
        if isinstance(ev, TimestampRecorded):
            found.append((ev.seal_seq, ev.tsa, ev.token, ev.error, f"line {ev.seq}", ev.note_sha256, ev.time))
    name = sidecar(journal).name
    for n, line in enumerate(_sidecar_lines(journal), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            rec = (d["seal_seq"], d["tsa"], d.get("token"), d.get("error"), f"{name}:{n}", d.get("note_sha256"),
                   d.get("time"))
            if (type(rec[0]) is not int or not all(x is None or isinstance(x, str) for x in rec[1:])
                    or not isinstance(rec[1], str) or (rec[2] is None) == (rec[3] is None)):
                raise ValueError
            found.append(rec)
        except (ValueError, KeyError, TypeError, AttributeError):
            found.append((-1, "?", None, "a line that is not a timestamp record", f"{name}:{n}", None, None))
    return found


def list_tokens(journal: Any) -> list[Stamped]:
    """Every token a journal carries, read but NOT checked (``show``: no key, no authority pinned): each with the
    time it states, ``checked`` False; :func:`check_journal` is the check."""
    import base64

    from trainledger.journal.reader import read_events

    out = []
    for seq, tsa, token, error, where, _digest, _when in _records(journal, read_events(journal)):
        if error is None:
            try:
                out.append(Stamped(seq, None, token_time(base64.b64decode(token or "", validate=True)), None, tsa,
                                   None, where, checked=False))
                continue
            except (TimestampError, ValueError) as e:
                error = str(e) if isinstance(e, TimestampError) else "a token that is not base64"
            except Exception as e:  # noqa: BLE001 - the DER is anyone's: whatever part of it fails, it is no token
                error = f"a malformed token ({type(e).__name__})"
        out.append(Stamped(seq, None, None, None, tsa, error, where, checked=False))
    return out


def check_journal(journal: Any, keys: Sequence[Any], certs: Sequence[Any]) -> list[Stamped]:
    """Every token a verified journal carries (its ``timestamp_recorded`` lines, and its sidecar's), each checked
    against its seal's note and ``certs``; a recorded failure (no token came) is listed too."""
    import base64

    from trainledger.journal.reader import read_signed_events

    notes = seal_notes(journal, keys)
    found = _records(journal, read_signed_events(journal, keys))
    out = []
    for seq, tsa, token, error, where, digest, when in found:
        note, own = notes.get(seq, (None, None))
        if error is not None:
            out.append(Stamped(seq, None, None, own, tsa, error, where))
            continue
        if note is None:
            out.append(Stamped(seq, None, None, None, tsa, f"names line {seq}, which is no signed seal", where))
            continue
        try:
            t = verify_token(base64.b64decode(token or "", validate=True), note, certs)
        except (TimestampError, ValueError) as e:
            out.append(Stamped(seq, _size(note), None, own, tsa, str(e), where))
            continue
        if digest is not None and digest != hashlib.sha256(note.encode()).hexdigest():
            out.append(Stamped(seq, _size(note), None, own, tsa, "its recorded note_sha256 is not the seal's note's",
                               where))
            continue
        if when is not None and when != t.time.isoformat():
            out.append(Stamped(seq, _size(note), None, own, tsa, f"its recorded time {when[:40]!r} is not the token's "
                                                                  f"{t.time.isoformat()}", where))
            continue
        out.append(Stamped(seq, _size(note), t.time, own, tsa, None, where, authority=t.signer))
    return out
