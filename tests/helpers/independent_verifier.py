"""An independent journal verifier, written from docs/FORMAT.md alone.

It imports nothing from trainledger: only hashlib, json, base64 and
cryptography. It checks what establishes integrity and authenticity: line
structure, seq, the hash chain, run binding and every seal under a pinned
key; from format 1.3 also the Merkle tree each seal names (RFC 6962, kept
here as the stack of its perfect subtrees) and the checkpoint text it signs; from format 1.7 keys certified by the
pinned key (section 4.2) and seals signed late (section 4.3). (Canonical form is the reference reader's extra guarantee; this one
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


def _inclusion_root(leaf: bytes, index: int, size: int, proof: list[bytes]) -> bytes:
    """RFC 9162 section 2.1.3.2: the root ``proof`` leads to from ``leaf`` (a leaf hash) at ``index`` of ``size``."""
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            raise Bad("inclusion proof too long")
        if fn % 2 == 1 or fn == sn:
            r = hashlib.sha256(b"\x01" + p + r).digest()
            while fn % 2 == 0 and fn != 0:
                fn //= 2
                sn //= 2
        else:
            r = hashlib.sha256(b"\x01" + r + p).digest()
        fn //= 2
        sn //= 2
    if sn != 0:
        raise Bad("inclusion proof too short")
    return r


def _certified_key(obj: dict, run_id: str, issuer: Ed25519PublicKey, issuer_raw: bytes) -> tuple[str, bytes, int]:
    """A key_certified line's key (id, raw, not-after ns), checked as section 4.2 says."""
    run, rank = run_id, 0
    if len(run_id) > 7 and run_id[-7:-5] == ".r" and run_id[-5:].isdigit():
        run, rank = run_id[:-7], int(run_id[-5:])
    if obj["run"] != run or obj["rank"] != rank:
        raise Bad("a certificate for another run or rank")
    if base64.b64decode(obj["issuer"], validate=True) != issuer_raw:
        raise Bad("a certificate signed by another key than the pinned one")
    key = base64.b64decode(obj["key"], validate=True)
    leaf = hashlib.sha256(b"\x00" + f"{rank} {obj['key']}".encode()).digest()
    root = _inclusion_root(leaf, rank, obj["world_size"], [bytes.fromhex(h) for h in obj["proof"]])
    if root.hex() != obj["keys_root"]:
        raise Bad("the rank's key is not in the certified roster")
    statement = (f"trainledger/v1/rank-keys\nrun {obj['run']}\nround {obj['round']}\nworld {obj['world_size']}\n"
                 f"keys {obj['keys_root']}\nissued {obj['issued_ns']}\nnot-after {obj['not_after_ns']}\n").encode()
    try:
        issuer.verify(base64.b64decode(obj["sig"], validate=True), statement)
    except (InvalidSignature, ValueError):
        raise Bad("the roster's signature does not verify") from None
    return hashlib.sha256(key).hexdigest()[:16], key, obj["not_after_ns"]


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
    certified = False
    seal_key, seal_id, not_after = key, pinned_id, None  # what signs the seals now
    rounds: list[int] = []
    pending = None  # a seal signed late (section 4.3): its fields and checkpoint text
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
            certified = lines[1].startswith(b'{"kind":"key_certified",') if len(lines) > 1 else False
            if obj["key_id"] != pinned_id and not certified:
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
        if kind == "key_certified":
            if not certified:
                raise Bad(f"line {n}: a certificate in a journal its pinned key signs")
            kid, raw, not_after = _certified_key(obj, run_id, key, pinned_public)
            if (n == 1 and kid != json.loads(lines[0])["key_id"]) or (rounds and obj["round"] <= rounds[-1]):
                raise Bad(f"line {n}: a certificate of another key or an earlier round")
            rounds.append(obj["round"])
            seal_key, seal_id = Ed25519PublicKey.from_public_bytes(raw), kid
        if kind in ("seal", "seal_signed") and (obj["key_id"] != seal_id or
                                               (not_after is not None and obj["ts"] > not_after)):
            raise Bad(f"line {n}: a seal by another key than the one signing here, or past its validity")
        if kind == "seal_signed":
            if pending is None or [obj[k] for k in ("seal_seq", "sealed_seq", "sealed_hash", "tree_size",
                                                     "tree_root", "key_id")] != pending[0]:
                raise Bad(f"line {n}: a late signature of a seal that is not waiting for one")
            try:
                seal_key.verify(base64.b64decode(obj["sig"], validate=True), pending[1])
            except (InvalidSignature, ValueError):
                raise Bad(f"line {n}: bad late signature") from None
            last_sealed, pending = obj["seal_seq"] - 1, None
        if kind == "seal":
            if obj["sealed_seq"] != n - 1 or obj["sealed_hash"] != prev.hex():
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
            if obj.get("sig") is None and tree:  # pending: its signature comes in a seal_signed line, if at all
                pending = ([n, n - 1, prev.hex(), n, obj["tree_root"], obj["key_id"]], msg)
            else:
                try:
                    seal_key.verify(base64.b64decode(obj["sig"], validate=True), msg)
                except (InvalidSignature, ValueError):
                    raise Bad(f"line {n}: bad signature") from None
                last_sealed, pending = n - 1, None
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
