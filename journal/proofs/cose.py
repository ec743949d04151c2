"""Receipts others can check: RFC 9942 COSE Receipts of inclusion, and checkpoints as COSE_Sign1 statements
(docs/cose.md is the profile).

- A **receipt** is a COSE_Sign1 (tag 18) whose protected header names the algorithm (1), the key (4) and the
  verifiable data structure (395: 1, ``RFC9162_SHA256``, the tree every seal and the team log already build), whose
  unprotected header carries the proof (396: {-1: [bstr .cbor [tree size, leaf index, [path hashes]]]}), and whose
  payload is detached: the signature is over the Merkle root the proof reconstructs from the entry. A verifier hashes
  the entry (``SHA-256(0x00 || entry)``), walks the path to a root, and checks the signature with that root as the
  payload: a changed entry, hash or size gives another root, and the signature fails.
- A **statement** is a COSE_Sign1 whose payload is a checkpoint note, content type ``text/plain``.

Signatures: EdDSA (-8) under an Ed25519 key (a run's or a log's), ES256 (-7, raw r || s) under a P-256 key (a
release key). The CBOR is written deterministically (RFC 8949 core deterministic encoding) by a small encoder of its
own, and read back by a decoder with every length checked, so the core install needs nothing more.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any

from trainledger.journal.errors import IntegrityError
from trainledger.journal.merkle import leaf_hash, node_hash

__all__ = ["CoseError", "cbor_encode", "cbor_decode", "receipt", "verify_receipt", "statement", "verify_statement",
           "load_key",
           "VDS", "VDP", "RFC9162_SHA256", "EDDSA", "ES256"]

EDDSA, ES256 = -8, -7
#: the header labels of COSE Receipts (RFC 9942): verifiable data structure, verifiable data proofs
VDS, VDP = 395, 396
RFC9162_SHA256 = 1
_INCLUSION = -1
_MAX = 1 << 20


class CoseError(IntegrityError):
    """A receipt or statement that does not parse or whose signature fails (the message says which)."""

    reason = "cose-invalid"


# ------------------------------------------------------------------ CBOR


def _head(major: int, n: int) -> bytes:
    if n < 24:
        return bytes([major << 5 | n])
    for add, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
        if n < 1 << (8 * struct.calcsize(fmt)):
            return bytes([major << 5 | add]) + struct.pack(fmt, n)
    raise ValueError("a CBOR length past 2^64")


class Tagged:
    """A CBOR tag around a value."""

    def __init__(self, tag: int, value: Any):
        self.tag, self.value = tag, value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tagged) and (self.tag, self.value) == (other.tag, other.value)


def cbor_encode(v: Any) -> bytes:
    """Deterministic CBOR: shortest heads, map keys in the bytewise order of their encodings."""
    if v is None:
        return b"\xf6"
    if v is True or v is False:
        return b"\xf5" if v else b"\xf4"
    if isinstance(v, int):
        return _head(0, v) if v >= 0 else _head(1, -1 - v)
    if isinstance(v, (bytes, bytearray)):
        return _head(2, len(v)) + bytes(v)
    if isinstance(v, str):
        b = v.encode()
        return _head(3, len(b)) + b
    if isinstance(v, (list, tuple)):
        return _head(4, len(v)) + b"".join(cbor_encode(x) for x in v)
    if isinstance(v, dict):
        items = sorted((cbor_encode(k), cbor_encode(x)) for k, x in v.items())
        return _head(5, len(items)) + b"".join(k + x for k, x in items)
    if isinstance(v, Tagged):
        return _head(6, v.tag) + cbor_encode(v.value)
    raise TypeError(f"no CBOR for {type(v).__name__}")


def cbor_decode(data: bytes) -> Any:
    """One CBOR item filling ``data`` (definite lengths; ints, strings, arrays, maps, tags, null and booleans)."""
    if len(data) > _MAX:
        raise CoseError(f"larger than {_MAX} bytes", seq=None)
    v, i = _item(data, 0, 0)
    if i != len(data):
        raise CoseError("bytes after the CBOR item", seq=None)
    return v


def _item(d: bytes, i: int, depth: int) -> tuple[Any, int]:
    if depth > 16 or i >= len(d):
        raise CoseError("CBOR too deep or truncated", seq=None)
    major, add = d[i] >> 5, d[i] & 31
    i += 1
    if major == 7:
        if add in (20, 21, 22):
            return {20: False, 21: True, 22: None}[add], i
        raise CoseError("CBOR: a simple value or float this reader does not take", seq=None)
    if add < 24:
        n = add
    elif add in (24, 25, 26, 27):
        k = 1 << (add - 24)
        if i + k > len(d):
            raise CoseError("CBOR truncated", seq=None)
        n = int.from_bytes(d[i:i + k], "big")
        i += k
    else:
        raise CoseError("CBOR: an indefinite length or a value this reader does not take", seq=None)
    if major == 0:
        return n, i
    if major == 1:
        return -1 - n, i
    if major in (2, 3):
        if i + n > len(d):
            raise CoseError("CBOR: a string runs past the end", seq=None)
        raw = d[i:i + n]
        try:
            return (raw if major == 2 else raw.decode("utf-8")), i + n
        except UnicodeDecodeError:
            raise CoseError("CBOR: a text string that is not UTF-8", seq=None) from None
    if major == 4:
        if n > len(d):
            raise CoseError("CBOR: an array longer than the data", seq=None)
        out = []
        for _ in range(n):
            x, i = _item(d, i, depth + 1)
            out.append(x)
        return out, i
    if major == 5:
        if n > len(d):
            raise CoseError("CBOR: a map longer than the data", seq=None)
        m = {}
        for _ in range(n):
            k, i = _item(d, i, depth + 1)
            x, i = _item(d, i, depth + 1)
            if not isinstance(k, (int, str)) or k in m:
                raise CoseError("CBOR: a map key that is not an int or text, or one given twice", seq=None)
            m[k] = x
        return m, i
    if major == 6:
        x, i = _item(d, i, depth + 1)
        return Tagged(n, x), i
    raise CoseError("CBOR: a value this reader does not take", seq=None)


# ------------------------------------------------------------------ COSE_Sign1


def _alg_of(signer: Any) -> int:
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    key = getattr(signer, "public", None)
    if key is not None and hasattr(key, "raw"):  # a trainledger Signer: Ed25519
        return EDDSA
    if isinstance(signer, ed25519.Ed25519PrivateKey):
        return EDDSA
    if isinstance(signer, ec.EllipticCurvePrivateKey) and signer.curve.name == "secp256r1":
        return ES256
    raise ValueError("a COSE signature needs an Ed25519 key (EdDSA) or a P-256 key (ES256)")


def _sign(signer: Any, alg: int, msg: bytes) -> bytes:
    if alg == EDDSA:
        return bytes(signer.sign(msg))
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    r, s = decode_dss_signature(signer.sign(msg, ec.ECDSA(hashes.SHA256())))
    return r.to_bytes(32, "big") + s.to_bytes(32, "big")


def _verify(public: Any, alg: int, sig: bytes, msg: bytes) -> None:
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    try:
        if alg == EDDSA and isinstance(public, ed25519.Ed25519PublicKey):
            public.verify(sig, msg)
        elif alg == ES256 and isinstance(public, ec.EllipticCurvePublicKey) and len(sig) == 64:
            public.verify(encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big")),
                          msg, ec.ECDSA(hashes.SHA256()))
        else:
            raise CoseError(f"algorithm {alg} does not go with this key", seq=None)
    except InvalidSignature:
        raise CoseError("the COSE signature does not verify", seq=None) from None


def _sign1(protected: dict, unprotected: dict, payload: bytes | None, signer: Any, alg: int,
           detached: bytes | None = None) -> bytes:
    prot = cbor_encode(protected)
    body = payload if payload is not None else detached
    assert body is not None
    sig = _sign(signer, alg, cbor_encode(["Signature1", prot, b"", body]))
    return cbor_encode(Tagged(18, [prot, unprotected, payload, sig]))


def _open1(data: bytes) -> tuple[bytes, dict, dict, bytes | None, bytes]:
    msg = cbor_decode(data)
    if isinstance(msg, Tagged):
        if msg.tag != 18:
            raise CoseError(f"CBOR tag {msg.tag}, not COSE_Sign1 (18)", seq=None)
        msg = msg.value
    if not (isinstance(msg, list) and len(msg) == 4 and isinstance(msg[0], bytes) and isinstance(msg[1], dict)
            and (msg[2] is None or isinstance(msg[2], bytes)) and isinstance(msg[3], bytes)):
        raise CoseError("not a COSE_Sign1 array", seq=None)
    prot = cbor_decode(msg[0]) if msg[0] else {}
    if not isinstance(prot, dict):
        raise CoseError("the protected header is not a map", seq=None)
    return msg[0], prot, msg[1], msg[2], msg[3]


def _kid(signer: Any) -> bytes:
    pub = signer.public.raw if hasattr(signer, "public") and hasattr(signer.public, "raw") else None
    if pub is None:
        from cryptography.hazmat.primitives import serialization

        pub = signer.public_key().public_bytes(serialization.Encoding.DER,
                                                serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pub).digest()[:8]


def receipt(index: int, size: int, path: Sequence[bytes], root: bytes, signer: Any) -> bytes:
    """An RFC 9942 inclusion receipt: entry ``index`` of the tree of ``size`` (its audit ``path``, leaf's sibling
    first), the signature over ``root`` (the detached payload) by ``signer``."""
    alg = _alg_of(signer)
    proof = cbor_encode([size, index, list(path)])
    return _sign1({1: alg, 4: _kid(signer), VDS: RFC9162_SHA256}, {VDP: {_INCLUSION: [proof]}}, None, signer, alg,
                  detached=root)


def _root_from(index: int, size: int, leaf: bytes, path: Sequence[bytes]) -> bytes:
    """RFC 9162 2.1.3.2: the root an inclusion path gives (CoseError when its shape does not fit the tree)."""
    if not 0 <= index < size:
        raise CoseError(f"leaf index {index} is not in a tree of {size}", seq=None)
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            raise CoseError("an inclusion path longer than the tree", seq=None)
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    if sn != 0:
        raise CoseError("an inclusion path shorter than the tree", seq=None)
    return r


def verify_receipt(data: bytes, entry: bytes, public: Any) -> tuple[int, int, bytes]:
    """Check a receipt for ``entry`` (the logged bytes) under ``public`` (a ``cryptography`` public key); returns
    (leaf index, tree size, root). :class:`CoseError` when it does not hold."""
    prot_raw, prot, unprot, payload, sig = _open1(data)
    if prot.get(VDS) != RFC9162_SHA256:
        raise CoseError("the receipt's verifiable data structure is not RFC9162_SHA256 (395: 1)", seq=None)
    if payload is not None:
        raise CoseError("a receipt's payload is detached (nil)", seq=None)
    proofs = unprot.get(VDP, {}).get(_INCLUSION) if isinstance(unprot.get(VDP), dict) else None
    if not isinstance(proofs, list) or len(proofs) != 1 or not isinstance(proofs[0], bytes):
        raise CoseError("the receipt carries no single inclusion proof (396: {-1: [bstr]})", seq=None)
    p = cbor_decode(proofs[0])
    if not (isinstance(p, list) and len(p) == 3 and isinstance(p[0], int) and isinstance(p[1], int)
            and isinstance(p[2], list) and all(isinstance(h, bytes) and len(h) == 32 for h in p[2])):
        raise CoseError("the inclusion proof is not [tree size, leaf index, [hashes]]", seq=None)
    size, index, path = p
    r = _root_from(index, size, leaf_hash(entry), path)
    _verify(public, prot.get(1), sig, cbor_encode(["Signature1", prot_raw, b"", r]))
    return index, size, r


def statement(note: str, signer: Any) -> bytes:
    """A checkpoint note as a COSE_Sign1 statement (payload the note, content type text/plain)."""
    alg = _alg_of(signer)
    return _sign1({1: alg, 3: "text/plain", 4: _kid(signer)}, {}, note.encode(), signer, alg)


def verify_statement(data: bytes, public: Any) -> str:
    """A statement's note, its signature checked under ``public``."""
    prot_raw, prot, _, payload, sig = _open1(data)
    if payload is None:
        raise CoseError("a statement carries its payload", seq=None)
    _verify(public, prot.get(1), sig, cbor_encode(["Signature1", prot_raw, b"", payload]))
    return payload.decode("utf-8", "replace")


def load_key(path: Any) -> Any:
    """A COSE signing key from a file: a trainledger Ed25519 key file (EdDSA, with the key file's own checks), or an
    unencrypted P-256 private key PEM, a release key (ES256)."""
    from pathlib import Path

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    from trainledger.journal.errors import UsageError
    from trainledger.journal.keys import load_signer, read_small_file

    data = read_small_file(Path(path), "private key")
    try:
        key = serialization.load_pem_private_key(data, None)
    except (ValueError, TypeError) as e:
        raise UsageError(f"{path}: not an unencrypted private key PEM ({e})") from None
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return load_signer(path)
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name == "secp256r1":
        return key
    raise UsageError(f"{path}: a COSE signature here needs an Ed25519 key (EdDSA) or a P-256 key (ES256)")
