"""Test helpers that play the attacker: edit journal lines and re-chain them.

They use plain msgspec (generic JSON, which keeps key order and msgspec's
float spelling) and hashlib, not the project's writer, so an attack is
built the way an outsider would build it.
"""

from __future__ import annotations

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


def rechain(lines: list[bytes], *, renumber: bool = True, fix_seal_heads: bool = True, resign=None) -> list[bytes]:
    """Recompute seq, every chain hash and (optionally) each seal's named head.

    Signatures are left alone (an attacker without the key cannot redo them)
    unless ``resign(run_id, sealed_seq, sealed_hash_raw) -> (key_id, sig_b64)``
    is given: an attacker signing with a key of their own.
    """
    first = parse(lines[0])
    prev = hashlib.sha256(GENESIS_TAG + first["run_id"].encode()).digest()
    out = []
    for seq, line in enumerate(lines):
        obj = parse(line)
        obj.pop("h")
        if renumber:
            obj["seq"] = seq
        if fix_seal_heads and obj["kind"] == "seal":
            obj["sealed_seq"] = obj["seq"] - 1
            obj["sealed_hash"] = prev.hex()
            if resign is not None:
                obj["key_id"], obj["sig"] = resign(first["run_id"], obj["sealed_seq"], prev)
        body = dump(obj)[:-1]
        d = hashlib.sha256(LINE_TAG + prev + body).digest()
        out.append(body + b',"h":"' + d.hex().encode() + b'"}')
        prev = d
    return out


def kinds(lines: list[bytes]) -> list[str]:
    return [parse(x)["kind"] for x in lines]
