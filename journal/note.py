"""C2SP signed notes, transparency-log checkpoints and cosignatures: the text formats a
seal will carry so that every seal is a checkpoint a standard witness can cosign.

- signed-note: a text ending in a newline, a blank line, then signature lines ``— <name> <base64(key hash ||
  signature)>`` (U+2014 and a space). Ed25519's key hash is the first 4 bytes of SHA-256(name || 0x0A || 0x01 ||
  public key); a verifier key is ``<name>+<hex key hash>+<base64(0x01 || public key)>``.
- tlog-checkpoint: the note text ``<origin>\\n<tree size>\\n<base64 root hash>\\n`` (and optional extension lines).
- tlog-cosignature/v1: a witness signs ``cosignature/v1\\ntime <unix seconds>\\n`` followed by the checkpoint text,
  with key hash type 0x04; its signature line carries key hash || timestamp (8 bytes, big-endian) || signature.
  The ML-DSA-44 type (key hash type 0x06, the 1312-byte public key) signs the binary ``subtree/v1`` message
  instead: a 12-byte label ``subtree/v1\\n\\0``, the cosigner's name and the origin each with a one-byte length,
  the timestamp, start (0 for a checkpoint) and end (the size) as big-endian u64, and the 32-byte root; extension
  lines are not covered. Its line carries key hash || timestamp || a 2420-byte signature.

Checked against the Go reference implementation's example (golang.org/x/mod/sumdb/note: the PeterNeumann key and
note) in tests/unit/journal/test_note.py.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import struct
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from trainledger.journal.errors import TrainledgerError

__all__ = ["NoteError", "Verifier", "key_hash", "verifier_key", "parse_verifier_key", "sign_note", "open_note",
           "checkpoint_text", "parse_checkpoint", "Checkpoint", "cosign", "verify_cosignature", "SIG_ED25519",
           "SIG_COSIGNATURE", "SIG_MLDSA44_COSIGNATURE", "cosigner_key", "note_signature_line", "check_cosignatures",
           "subtree_message", "note_text"]

SIG_ED25519 = 0x01
SIG_COSIGNATURE = 0x04
SIG_MLDSA44_COSIGNATURE = 0x06
#: the raw public key's length for each verifier key type
_KEY_LEN = {SIG_ED25519: 32, SIG_COSIGNATURE: 32, SIG_MLDSA44_COSIGNATURE: 1312}
_MLDSA44_SIG = 2420
_DASH = "\u2014 "
MAX_SIGNATURES = 100


class NoteError(TrainledgerError, ValueError):
    """A note, key or checkpoint that is malformed or does not verify (the message says which); exit 1."""

    exit_code = 1


def note_text(data: bytes, where: Any, what: str) -> str:
    """``data`` as the UTF-8 text a signed note or a verifier key is (C2SP signed-note); bytes that are not are
    refused as ``what`` (``"a signed note"``), naming ``where`` and the byte."""
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise NoteError(f"{where}: not {what} (not UTF-8 text at byte {e.start})") from None


def _valid_name(name: str) -> None:
    if not name or any(c.isspace() or c == "+" for c in name):
        raise NoteError(f"key name {name!r}: must be non-empty, without spaces or '+'")


def key_hash(name: str, public: bytes, sig_type: int = SIG_ED25519) -> int:
    """The 4-byte key hash (an int) binding a signature to (name, type, key)."""
    _valid_name(name)
    return int.from_bytes(hashlib.sha256(name.encode() + b"\n" + bytes([sig_type]) + public).digest()[:4], "big")


def verifier_key(name: str, public: bytes, sig_type: int = SIG_ED25519) -> str:
    """``<name>+<hex key hash>+<base64(type || public key)>``: what a verifier pins (type 0x01 for a log's Ed25519
    key, 0x04 for a witness's cosignature key)."""
    return (f"{name}+{key_hash(name, public, sig_type):08x}+"
            f"{base64.b64encode(bytes([sig_type]) + public).decode()}")


def cosigner_key(name: str, public: bytes) -> str:
    """A witness's verifier key: type 0x04 (an Ed25519 cosigner) for a 32-byte key, 0x06 (ML-DSA-44) for a
    1312-byte one."""
    return verifier_key(name, public, SIG_MLDSA44_COSIGNATURE if len(public) == 1312 else SIG_COSIGNATURE)


@dataclasses.dataclass(frozen=True)
class Verifier:
    name: str
    hash: int
    public: bytes
    sig_type: int = SIG_ED25519


def parse_verifier_key(vkey: str) -> Verifier:
    """A verifier key, checked: its hash must be the hash of its name and key."""
    name, _, rest = vkey.partition("+")  # the base64 key may hold '+' itself: split at the first two only
    h, _, k = rest.partition("+")
    if not name or len(h) != 8 or not k:
        raise NoteError(f"{vkey[:80]!r}: not a verifier key (name+hash+key)")
    # C2SP signed-note: a key name is well-formed UTF-8 with no Unicode space (a '+' ends it, above)
    if any(c.isspace() or 0xD800 <= ord(c) <= 0xDFFF for c in name):
        raise NoteError(f"{vkey[:80]!r}: a key name is UTF-8 text with no spaces")
    try:
        want = int(h, 16)
        raw = base64.b64decode(k, validate=True)
    except (ValueError, binascii.Error):
        raise NoteError(f"{vkey[:80]!r}: the hash or the key is not encoded properly") from None
    if not raw or _KEY_LEN.get(raw[0]) != len(raw) - 1:
        raise NoteError(f"{vkey[:80]!r}: not an Ed25519 (0x01), cosigner (0x04) or ML-DSA-44 cosigner (0x06) key")
    if key_hash(name, raw[1:], raw[0]) != want:
        raise NoteError(f"{vkey[:80]!r}: the key hash does not match the name and key")
    return Verifier(name, want, raw[1:], raw[0])


def _check_text(text: str) -> None:
    if not text.endswith("\n") or "\n\n" in text:
        raise NoteError("a note's text ends with a newline and holds no blank line")
    if any(ord(c) < 0x20 and c != "\n" for c in text):
        raise NoteError("a note's text holds no control characters but newlines")


def note_signature_line(name: str, public: bytes, sig: bytes) -> str:
    """The signature line ``— <name> <base64(key hash || signature)>`` of an Ed25519 signature on a note."""
    return f"{_DASH}{name} {base64.b64encode(struct.pack('>I', key_hash(name, public)) + sig).decode()}\n"


def check_cosignatures(msg: str, witnesses: list[Verifier]) -> list[tuple[Verifier, int]]:
    """The pinned witnesses (cosignature/v1 keys) whose cosignatures on the note ``msg`` verify, each with its
    timestamp. A pinned witness's cosignature that does not verify rejects the note; unpinned lines are
    ignored."""
    text, sigs = _split(msg)
    by = {(v.name, v.hash): v for v in witnesses if v.sig_type in (SIG_COSIGNATURE, SIG_MLDSA44_COSIGNATURE)}
    out: list[tuple[Verifier, int]] = []
    for name, raw in sigs:
        v = by.get((name, int.from_bytes(raw[:4], "big")))
        if v is None or any(v is w for w, _ in out):
            continue
        b64 = base64.b64encode(raw).decode()
        out.append((v, verify_cosignature(text, f"{_DASH}{name} {b64}\n", v.name, v.public)))
    return out


def sign_note(text: str, name: str, private: Ed25519PrivateKey) -> str:
    """The signed note: ``text``, a blank line, one signature line."""
    _check_text(text)
    pub = private.public_key().public_bytes_raw()
    sig = private.sign(text.encode())
    return f"{text}\n{_DASH}{name} {base64.b64encode(struct.pack('>I', key_hash(name, pub)) + sig).decode()}\n"


def _split(msg: str) -> tuple[str, list[tuple[str, bytes]]]:
    i = msg.rfind("\n\n")
    if i < 0 or not msg.endswith("\n"):
        raise NoteError("not a signed note: no blank line before the signatures, or no final newline")
    text, sigs = msg[:i + 1], msg[i + 2:]
    _check_text(text)
    out = []
    for line in sigs.split("\n")[:-1]:
        if not line.startswith(_DASH):
            raise NoteError(f"a signature line must start with an em dash and a space: {line[:60]!r}")
        name, sep, b64 = line[len(_DASH):].rpartition(" ")
        if not sep:
            raise NoteError(f"a malformed signature line: {line[:60]!r}")
        _valid_name(name)
        try:
            raw = base64.b64decode(b64, validate=True)
        except (ValueError, binascii.Error):
            raise NoteError(f"a signature that is not base64: {line[:60]!r}") from None
        if len(raw) < 5:
            raise NoteError("a signature too short to hold a key hash")
        out.append((name, raw))
    if not out:
        raise NoteError("a note without signatures")
    if len(out) > MAX_SIGNATURES:
        raise NoteError(f"more than {MAX_SIGNATURES} signatures")
    return text, out


def open_note(msg: str, verifiers: list[Verifier]) -> tuple[str, list[Verifier]]:
    """The note's text and the pinned verifiers whose signatures on it verify. Signature lines from keys not
    pinned are ignored; a pinned key's signature that does not verify rejects the note; no verified signature at
    all rejects it."""
    text, sigs = _split(msg)
    by = {(v.name, v.hash): v for v in verifiers if v.sig_type == SIG_ED25519}
    ok: list[Verifier] = []
    for name, raw in sigs:
        v = by.get((name, int.from_bytes(raw[:4], "big")))
        if v is None or v in ok:
            continue
        try:
            Ed25519PublicKey.from_public_bytes(v.public).verify(raw[4:], text.encode())
        except InvalidSignature:
            raise NoteError(f"the signature of {name} does not verify") from None
        ok.append(v)
    if not ok:
        raise NoteError("no signature by a pinned key")
    return text, ok


@dataclasses.dataclass(frozen=True)
class Checkpoint:
    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()


def checkpoint_text(origin: str, size: int, root: bytes, extensions: tuple[str, ...] = ()) -> str:
    if not origin or "\n" in origin or size < 0 or len(root) != 32:
        raise NoteError("a checkpoint needs an origin line, a size >= 0 and a 32-byte root")
    return "".join(f"{x}\n" for x in (origin, str(size), base64.b64encode(root).decode(), *extensions))


def decimal(text: str) -> int | None:
    """An ASCII decimal with no leading zero (``0`` itself allowed), as the C2SP formats write sizes and indexes;
    None for anything else."""
    if not text.isascii() or not text.isdigit() or (text != "0" and text.startswith("0")):
        return None
    return int(text)


def b64_hash(text: str) -> bytes | None:
    """A base64 SHA-256 hash (strict base64, 32 bytes), as the C2SP formats write roots and proof lines; None for
    anything else."""
    try:
        h = base64.b64decode(text, validate=True)
    except (ValueError, binascii.Error):
        return None
    return h if len(h) == 32 else None


def parse_checkpoint(text: str) -> Checkpoint:
    lines = text.split("\n")
    if len(lines) < 4 or lines[-1] != "":
        raise NoteError("a checkpoint is an origin, a size and a root hash, a line each")
    origin, size_s, root_s, *ext = lines[:-1]
    size = decimal(size_s)
    if size is None:
        raise NoteError(f"checkpoint size {size_s[:30]!r} is not a decimal number")
    root = b64_hash(root_s)
    if root is None:
        raise NoteError("the checkpoint's root is not a base64 32-byte hash")
    return Checkpoint(origin, size, root, tuple(ext))


def _cosigned_message(text: str, timestamp: int) -> bytes:
    return f"cosignature/v1\ntime {timestamp}\n".encode() + text.encode()


def subtree_message(name: str, timestamp: int, origin: str, start: int, end: int, root: bytes) -> bytes:
    """The ``subtree/v1`` message an ML-DSA-44 cosigner signs (tlog-cosignature): for a checkpoint, start 0 and end
    its size."""
    n, o = name.encode(), origin.encode()
    if not 1 <= len(n) <= 255 or not 1 <= len(o) <= 255 or len(root) != 32 or not 0 <= timestamp < 1 << 63:
        raise NoteError("a subtree/v1 message needs a name and an origin of 1-255 bytes, a 32-byte root and a "
                        "timestamp below 2^63")
    return (b"subtree/v1\n\0" + bytes([len(n)]) + n + struct.pack(">Q", timestamp) + bytes([len(o)]) + o
            + struct.pack(">QQ", start, end) + root)


def _is_mldsa(key: Any) -> bool:
    return type(key).__name__ == "MLDSA44PrivateKey"


def cosign(checkpoint: str, name: str, private: Any, timestamp: int) -> str:
    """A witness's cosignature line (tlog-cosignature) on a checkpoint's text. ``private``: an
    ``Ed25519PrivateKey`` or a :class:`~trainledger.journal.keys.Signer` (a key file, a token, a KMS key): the
    Ed25519 type (``cosignature/v1``); an ``MLDSA44PrivateKey``: the ML-DSA-44 type (``subtree/v1``)."""
    _check_text(checkpoint)
    if _is_mldsa(private):
        cp = parse_checkpoint(checkpoint)
        pub = private.public_key().public_bytes_raw()
        sig = private.sign(subtree_message(name, timestamp, cp.origin, 0, cp.size, cp.root))
        raw = struct.pack(">IQ", key_hash(name, pub, SIG_MLDSA44_COSIGNATURE), timestamp) + sig
        return f"{_DASH}{name} {base64.b64encode(raw).decode()}\n"
    if isinstance(private, Ed25519PrivateKey):
        pub = private.public_key().public_bytes_raw()
    else:
        pub = private.public.raw
    sig = private.sign(_cosigned_message(checkpoint, timestamp))
    raw = struct.pack(">IQ", key_hash(name, pub, SIG_COSIGNATURE), timestamp) + sig
    return f"{_DASH}{name} {base64.b64encode(raw).decode()}\n"


def verify_cosignature(checkpoint: str, line: str, name: str, public: bytes) -> int:
    """Check a witness's cosignature line on a checkpoint's text (an Ed25519 cosigner's for a 32-byte key, an
    ML-DSA-44 cosigner's for a 1312-byte one); returns its timestamp."""
    if not line.startswith(_DASH) or not line.endswith("\n"):
        raise NoteError("not a signature line")
    got, _, b64 = line[len(_DASH):-1].rpartition(" ")
    try:
        raw = base64.b64decode(b64, validate=True)
    except (ValueError, binascii.Error):
        raise NoteError("a cosignature that is not base64") from None
    mldsa = len(public) == 1312
    if got != name or len(raw) != 12 + (_MLDSA44_SIG if mldsa else 64):
        raise NoteError("not this witness's cosignature")
    h, ts = struct.unpack(">IQ", raw[:12])
    if h != key_hash(name, public, SIG_MLDSA44_COSIGNATURE if mldsa else SIG_COSIGNATURE):
        raise NoteError("the cosignature's key hash is not this witness's")
    if mldsa:
        if ts >= 1 << 63:
            raise NoteError("a cosignature timestamp at or past 2^63")
        try:
            from cryptography.hazmat.primitives.asymmetric.mldsa import MLDSA44PublicKey
        except ImportError:  # a cryptography without ML-DSA
            raise NoteError("ML-DSA-44 cosignatures need a cryptography with ML-DSA (47 or newer)") from None
        cp = parse_checkpoint(checkpoint)
        try:
            MLDSA44PublicKey.from_public_bytes(public).verify(raw[12:], subtree_message(name, ts, cp.origin, 0,
                                                                                        cp.size, cp.root))
        except (InvalidSignature, ValueError):
            raise NoteError(f"the cosignature of {name} does not verify") from None
        return ts
    try:
        Ed25519PublicKey.from_public_bytes(public).verify(raw[12:], _cosigned_message(checkpoint, ts))
    except InvalidSignature:
        raise NoteError(f"the cosignature of {name} does not verify") from None
    return ts
