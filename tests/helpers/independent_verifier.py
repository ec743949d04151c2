"""An independent journal verifier, written from docs/FORMAT.md alone.

It imports nothing from trainledger: only hashlib, json, base64 and
cryptography. It checks what establishes integrity and authenticity: line
structure, seq, the hash chain, run binding and every seal under a pinned
key; from format 1.3 also the Merkle tree each seal names (RFC 6962, kept
here as the stack of its perfect subtrees) and the checkpoint text it signs. (Canonical form is the reference reader's extra guarantee; this one
only refuses duplicate keys, which would make the JSON ambiguous.)
"""

from __future__ import annotations

import base64
import hashlib
import json

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

HEX = set("0123456789abcdef")


class Bad(Exception):
    pass


def _no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise Bad("duplicate key")
    return dict(pairs)


def parse_pubkey(text: str) -> bytes:
    prefix, b64, *_ = text.split()
    if prefix != "trainledger-ed25519":
        raise Bad("not a trainledger public key")
    raw = base64.b64decode(b64, validate=True)
    if len(raw) != 32:
        raise Bad("public key is not 32 bytes")
    return raw


def _tree_root(stack: list[tuple[int, bytes]]) -> bytes:
    """The root of the tree whose perfect subtrees, largest first, are ``stack`` (size, hash)."""
    if not stack:
        return hashlib.sha256(b"").digest()
    root = stack[-1][1]
    for _, h in reversed(stack[:-1]):
        root = hashlib.sha256(b"\x01" + h + root).digest()
    return root


def _tree_add(stack: list[tuple[int, bytes]], line: bytes) -> None:
    size, h = 1, hashlib.sha256(b"\x00" + line).digest()
    while stack and stack[-1][0] == size:
        h = hashlib.sha256(b"\x01" + stack.pop()[1] + h).digest()
        size *= 2
    stack.append((size, h))


def verify(data: bytes, pinned_public: bytes) -> dict:
    """Return {'events', 'last_sealed_seq', 'tail'} or raise Bad naming the problem."""
    try:
        return _verify(data, pinned_public)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise Bad(f"malformed journal: {type(e).__name__}: {e}") from None


def _verify(data: bytes, pinned_public: bytes) -> dict:
    end = data.rfind(b"\n") + 1
    body, torn = data[:end], data[end:]
    lines = body.split(b"\n")[:-1]
    if not lines:
        raise Bad("no complete line")
    pinned_id = hashlib.sha256(pinned_public).hexdigest()[:16]
    key = Ed25519PublicKey.from_public_bytes(pinned_public)
    run_id = None
    prev = None
    last_sealed = None
    closed_at = None
    kind = None
    tree = False
    stack: list[tuple[int, bytes]] = []
    for n, line in enumerate(lines):
        suffix = line[-72:]
        if len(line) < 80 or not (suffix.startswith(b',"h":"') and suffix.endswith(b'"}')):
            raise Bad(f"line {n}: does not end with its hash member")
        stored = suffix[6:70].decode("ascii", "replace")
        if set(stored) - HEX:
            raise Bad(f"line {n}: hash is not lowercase hex")
        try:
            obj = json.loads(line.decode("utf-8"), object_pairs_hook=_no_duplicates)
        except (UnicodeDecodeError, ValueError) as e:
            raise Bad(f"line {n}: not JSON ({e})") from None
        keys = list(obj)
        if keys[0] != "kind" or keys[-3:] != ["seq", "ts", "h"] or obj["h"] != stored:
            raise Bad(f"line {n}: members out of order")
        kind = obj["kind"]
        if obj["seq"] != n:
            raise Bad(f"line {n}: seq {obj['seq']}")
        if n == 0:
            if kind != "run_opened":
                raise Bad("line 0 is not run_opened")
            if int(obj["format_version"].split(".")[0]) != 1:
                raise Bad("unsupported format version")
            run_id = obj["run_id"]
            tree = tuple(int(x) for x in obj["format_version"].split(".")[:2]) >= (1, 3)
            if obj["key_id"] != pinned_id:
                raise Bad("journal is not signed by the pinned key")
            if hashlib.sha256(base64.b64decode(obj["public_key"])).hexdigest()[:16] != obj["key_id"]:
                raise Bad("embedded key does not match its id")
            prev = hashlib.sha256(b"trainledger/v1/genesis\x00" + run_id.encode()).digest()
        elif kind == "run_opened":
            raise Bad(f"line {n}: a second run_opened")
        if closed_at is not None and not (n == closed_at + 1 and kind == "seal"):
            raise Bad(f"line {n}: event after run_closed")
        h = hashlib.sha256(b"trainledger/v1/line\x00" + prev + line[:-72]).digest()
        if h.hex() != stored:
            raise Bad(f"line {n}: chain hash mismatch")
        if kind == "seal":
            if obj["sealed_seq"] != n - 1 or obj["sealed_hash"] != prev.hex() or obj["key_id"] != pinned_id:
                raise Bad(f"line {n}: seal names the wrong head or key")
            if tree:
                root = _tree_root(stack)
                if obj["tree_size"] != n or obj["tree_root"] != root.hex():
                    raise Bad(f"line {n}: seal names another tree than the lines before it")
                msg = (f"trainledger/{run_id}\n{n}\n{base64.b64encode(root).decode()}\n"
                       f"trainledger-head {n - 1}:{prev.hex()}\n").encode()
            else:
                if "tree_size" in obj or "tree_root" in obj:
                    raise Bad(f"line {n}: a seal before format 1.3 names a tree")
                rid = run_id.encode()
                msg = (b"trainledger/v1/seal\x00" + len(rid).to_bytes(2, "big") + rid
                       + (n - 1).to_bytes(8, "big") + prev)
            try:
                key.verify(base64.b64decode(obj["sig"], validate=True), msg)
            except (InvalidSignature, ValueError):
                raise Bad(f"line {n}: bad signature") from None
            last_sealed = n - 1
        elif kind == "run_closed":
            closed_at = n
        prev = h
        if tree:
            _tree_add(stack, line)
    if torn:
        tail = "torn"
    elif closed_at is not None and kind == "seal":
        tail = "closed"
    else:
        tail = "open"
    return {"events": len(lines), "last_sealed_seq": last_sealed, "tail": tail}
