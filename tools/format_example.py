#!/usr/bin/env python3
"""Regenerate the worked example of docs/FORMAT.md (a three-event journal and its hashes).

    .venv/bin/python tools/format_example.py            # print the example
    .venv/bin/python tools/format_example.py --write    # rewrite it inside docs/FORMAT.md
    .venv/bin/python tools/format_example.py --journal OUT.jsonl --pub OUT.pub   # write the files

Everything is fixed (key seed, run id, timestamps, host) so the bytes are
reproducible; Ed25519 signatures are deterministic (RFC 8032). The lines are
built with the same codec and chain functions the writer uses, and
tests/unit/journal/test_format.py checks that FORMAT.md holds exactly this output
and that both the reference and an independent verifier accept it.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from trainledger.journal.chain import GENESIS_TAG, LINE_TAG, genesis, origin, seal_checkpoint
from trainledger.journal.merkle import leaf_hash, node_hash
from trainledger.journal.note import key_hash
from trainledger.journal.codec import encode_event
from trainledger.journal.events import FORMAT_VERSION, RunOpened, Seal, StepObserved
from trainledger.journal.keys import Signer

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- example:begin (tools/format_example.py) -->", "<!-- example:end -->"
RUN_ID = "example-run"
TS = [1764374400000000000, 1764374400250000000, 1764374400250100000]


def build() -> tuple[list[bytes], Signer, list[str]]:
    signer = Signer(Ed25519PrivateKey.from_private_bytes(bytes(range(32))))
    notes: list[str] = []
    prev = genesis(RUN_ID)
    notes.append(f'h[-1] = SHA-256("{GENESIS_TAG[:-1].decode()}\\0" || "{RUN_ID}")\n      = {prev.hex()}')
    events = [
        RunOpened(format_version=FORMAT_VERSION, run_id=RUN_ID, key_id=signer.key_id, public_key=signer.public.b64,
                  host="example-host", pid=4242, software={"trainledger": "0.1.0"}),
        StepObserved(step=0, loss=2.5, grad_norm=float("nan"), lr=0.0003, tokens=4096),
        None,  # the seal, built once the head is known
    ]
    lines = []
    for seq, ev in enumerate(events):
        if ev is None:
            leaves = [leaf_hash(x) for x in lines]
            for i, lh in enumerate(leaves):
                notes.append(f"leaf[{i}] = SHA-256(0x00 || line {i})\n        = {lh.hex()}")
            root = node_hash(*leaves)  # two leaves: the root is their node
            notes.append(f"root of the tree of size {seq} = SHA-256(0x01 || leaf[0] || leaf[1])\n        = {root.hex()}")
            text = seal_checkpoint(RUN_ID, seq, root, seq - 1, prev)
            sig = signer.sign(text.encode())
            notes.append("the checkpoint text the seal signs, then its signed note (C2SP signed-note: the key name is "
                         f"the origin, the key hash {key_hash(origin(RUN_ID), signer.public.raw):08x}):\n\n" + text
                         + f"\n\u2014 {origin(RUN_ID)} "
                         + base64.b64encode(key_hash(origin(RUN_ID), signer.public.raw).to_bytes(4, "big") + sig).decode())
            ev = Seal(sealed_seq=seq - 1, sealed_hash=prev.hex(), key_id=signer.key_id,
                      sig=base64.b64encode(sig).decode(), tree_size=seq, tree_root=root.hex())
        prefix = encode_event(ev)[:-1] + b',"seq":%d,"ts":%d' % (seq, TS[seq])
        h = hashlib.sha256(LINE_TAG + prev + prefix).digest()
        notes.append(f"h[{seq}] = SHA-256(\"{LINE_TAG[:-1].decode()}\\0\" || h[{seq - 1}] || P[{seq}])\n      = {h.hex()}")
        lines.append(prefix + b',"h":"' + h.hex().encode() + b'"}')
        prev = h
    return lines, signer, notes


def render() -> str:
    lines, signer, notes = build()
    out = [BEGIN, "", "Private key: the Ed25519 seed `000102…1e1f` (bytes 0 to 31; never use it for anything real).", "",
           "Public key file (`trainledger.pub`):", "", "```", signer.public.line(), "```", "",
           "The journal, three lines:", "", "```"]
    out += [x.decode() for x in lines]
    out += ["```", "", "Hashes, the tree and the checkpoint the seal signs:", "", "```"]
    out += notes
    out += ["```", "", END]
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="rewrite the example inside docs/FORMAT.md")
    ap.add_argument("--journal", help="also write the example journal to this file")
    ap.add_argument("--pub", help="also write the example public key to this file")
    args = ap.parse_args()
    text = render()
    if args.journal:
        lines, signer, _ = build()
        Path(args.journal).write_bytes(b"\n".join(lines) + b"\n")
        if args.pub:
            Path(args.pub).write_text(signer.public.line() + "\n")
    if args.write:
        doc = ROOT / "docs" / "FORMAT.md"
        old = doc.read_text()
        a, b = old.index(BEGIN), old.index(END) + len(END)
        doc.write_text(old[:a] + text + old[b:])
        print(f"updated {doc}")
    elif not args.journal:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
