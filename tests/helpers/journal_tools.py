"""Test helpers that play the attacker: edit journal lines and re-chain them.

They use plain msgspec (generic JSON, which keeps key order and msgspec's
float spelling) and hashlib, not the project's writer, so an attack is
built the way an outsider would build it.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import msgspec

LINE_TAG = b"trainledger/v1/line\x00"
GENESIS_TAG = b"trainledger/v1/genesis\x00"


def read_lines(path: Path) -> list[bytes]:
    data = Path(path).read_bytes()
    assert data.endswith(b"\n")
    return data[:-1].split(b"\n")


def write_lines(path: Path, lines: list[bytes]) -> None:
    Path(path).write_bytes(b"\n".join(lines) + b"\n")


def parse(line: bytes) -> dict:
    return msgspec.json.decode(line)


def dump(obj: dict) -> bytes:
    return msgspec.json.encode(obj)


def tree_root(lines: list[bytes]) -> bytes:
    """RFC 6962's Merkle tree hash of these lines: pairs hashed level by level, an odd last node carried up."""
    level = [hashlib.sha256(b"\x00" + x).digest() for x in lines]
    if not level:
        return hashlib.sha256(b"").digest()
    while len(level) > 1:
        nxt = [hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
        level = nxt + level[len(level) - len(level) % 2:]
    return level[0]


def seal_signed_message(run_id: str, sealed_seq: int, sealed_hash: bytes, root: bytes | None) -> bytes:
    """What a seal signs, from docs/FORMAT.md: the 1.3 checkpoint text, or (root None) the 1.0-1.2 message."""
    if root is None:
        rid = run_id.encode()
        return (b"trainledger/v1/seal\x00" + len(rid).to_bytes(2, "big") + rid + sealed_seq.to_bytes(8, "big")
                + sealed_hash)
    return (f"trainledger/{run_id}\n{sealed_seq + 1}\n{base64.b64encode(root).decode()}\n"
            f"trainledger-head {sealed_seq}:{sealed_hash.hex()}\n").encode()


def has_tree(first: dict) -> bool:
    major, minor = (int(x) for x in first["format_version"].split(".")[:2])
    return (major, minor) >= (1, 3)


def rechain(lines: list[bytes], *, renumber: bool = True, fix_seal_heads: bool = True, resign=None,
            fix_trees: bool = True, keep_bytes: bool = False) -> list[bytes]:
    """Recompute seq, every chain hash and (optionally) each seal's named head (and, from format 1.3, its tree).

    Signatures are left alone (an attacker without the key cannot redo them)
    unless ``resign``, a signer (``.key_id``, ``.sign(message)``), is given: an attacker signing with a key of
    their own, or a test that means to sign a lie with the run's own key. ``keep_bytes``: every line but a seal
    keeps its bytes as they are (a non-canonical spelling too) and its seq; only its hash is recomputed.
    """
    first = parse(lines[0])
    prev = hashlib.sha256(GENESIS_TAG + first["run_id"].encode()).digest()
    tree = has_tree(first)
    out = []
    for seq, line in enumerate(lines):
        if keep_bytes and not line.startswith(b'{"kind":"seal"'):
            body = line[:line.rindex(b',"h":"')]
        else:
            obj = parse(line)
            obj.pop("h")
            if renumber:
                obj["seq"] = seq
            if fix_seal_heads and obj["kind"] == "seal":
                obj["sealed_seq"] = obj["seq"] - 1
                obj["sealed_hash"] = prev.hex()
                root = None
                if not fix_trees:
                    pass
                elif not tree:
                    obj.pop("tree_size", None)
                    obj.pop("tree_root", None)
                else:
                    root = tree_root(out)
                    rest = {k: obj.pop(k) for k in ("seq", "ts")}
                    obj["tree_size"], obj["tree_root"] = rest["seq"], root.hex()
                    obj.update(rest)
                if resign is not None:
                    msg = seal_signed_message(first["run_id"], obj["sealed_seq"], prev, root)
                    obj["key_id"], obj["sig"] = resign.key_id, base64.b64encode(resign.sign(msg)).decode()
            body = dump(obj)[:-1]
        d = hashlib.sha256(LINE_TAG + prev + body).digest()
        out.append(body + b',"h":"' + d.hex().encode() + b'"}')
        prev = d
    return out


def kinds(lines: list[bytes]) -> list[str]:
    return [parse(x)["kind"] for x in lines]
