#!/usr/bin/env python3
"""Where `verify` spends a line: its parts timed one by one on the real code path, in one process.

    .venv/bin/python tools/bench_verify_parts.py [--events 1000000] [--repeats 3]

Writes a signed journal of ``--events`` step events (the default seal policy, about 1,000 seals per million), reads
it a block at a time as the verifier does (``iter_blocks``), and times, summed over every block: the C block pass
(``scan_block``: seqs, chain hashes, leaves) with the x86 SHA extensions' four lanes and with OpenSSL one message at
a time; the tree's nodes (``hash_range``) both ways; msgspec's ``decode_lines`` and the canonical re-encode
(``encode_lines`` compared byte for byte); verify's way with step lines instead: the C check of their template
(``step_lines``) and their numbers' spelling (one msgspec decode and re-encode of them all); then one process's
whole ``scan_range`` of the file, with that way and with every line decoded and re-encoded, and ``sha256sum`` of it. Medians of ``--repeats``, in ns a line. Needs the C accelerator.
"""

from __future__ import annotations

import argparse
import base64
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from trainledger.journal import Journal, StepObserved, keygen, load_signer
    from trainledger.journal import codec
    from trainledger.journal import scan as _scan
    from trainledger.journal import accel as _accel
    from trainledger.journal.chain import genesis
    from trainledger.journal.reader import read_opening

    fast = _accel.fast
    if fast is None or not hasattr(fast, "scan_block"):
        raise SystemExit("the C accelerator is not built here (or TRAINLEDGER_NO_ACCEL is set): nothing to time")
    with tempfile.TemporaryDirectory(prefix="tl-verify-parts-") as d:
        tmp = Path(d)
        priv, _ = keygen(tmp / "keys")
        path = tmp / "j.jsonl"
        j = Journal.create(path, signer=load_signer(priv), run_id="parts")
        for s in range(args.events):
            j.append_deferred(StepObserved(step=s, loss=3.0 - s * 1e-7, grad_norm=1.0 + (s % 7) * 0.01, lr=1e-3,
                                           step_time_s=0.1, examples=8, tokens=2048, compute_time_s=0.05))
        j.close()
        size = path.stat().st_size
        opened, first_len = read_opening(path, size)

        # the blocks, and what each starts from, as a range from the first line after run_opened and its seal
        blocks = []
        res = _scan.RangeResult(0, size)
        with open(path, "rb", buffering=0) as f:
            for block, _ in _scan.iter_blocks(f, 0, size, res, is_last=True):
                blocks.append(block)
        starts, ends_of, prev, seq = [], [], genesis(opened.run_id), 0
        for b in blocks:
            starts.append((prev, seq))
            bad, ends, prev, _ = fast.scan_block(prev, b, seq, False)
            assert bad == -1, "the written journal does not pass the block pass"
            ends_of.append(ends)
            seq += len(ends) // 4
        lines = seq
        leaves = [fast.scan_block(p, b, s, True)[3] for b, (p, s) in zip(blocks, starts)]
        records = [codec.decode_block(b) for b in blocks]
        assert all(r is not None for r in records[1:-1])
        dec = codec._decoders()[0]
        enc = codec._encoder

        def per_line(fn) -> float:
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) / lines * 1e9

        def scan(lanes: bool):
            fast.sha_ni(lanes)
            for b, (p, s) in zip(blocks, starts):
                fast.scan_block(p, b, s, True)

        def nodes(lanes: bool):
            fast.sha_ni(lanes)
            for lv in leaves:
                fast.hash_range(0, lv)

        def decode():
            for b in blocks:  # each block's records dropped before the next, as the verifier does
                dec.decode_lines(b)

        def reencode():
            for r, b in zip(records, blocks):
                if r is not None:
                    enc.encode_lines(r) == b

        numbers = [fast.step_lines(b, e)[1] for b, e in zip(blocks, ends_of)]

        def template():
            for b, e in zip(blocks, ends_of):
                fast.step_lines(b, e)

        def spelled():
            for n in numbers:
                _scan._numbers_canonical(n)

        had = fast.sha_ni()
        # every signature checked, under the key the journal embeds (ours: we just made it)
        ctx = _scan.ScanContext(opened.run_id, opened.key_id, base64.b64decode(opened.public_key), True, None,
                                tree=_scan.tree_mode(opened.format_version))
        parts = {
            "block pass (scan_block), SHA lanes": lambda: scan(True),
            "block pass (scan_block), OpenSSL": lambda: scan(False),
            "tree nodes (hash_range), SHA lanes": lambda: nodes(True),
            "tree nodes (hash_range), OpenSSL": lambda: nodes(False),
            "decode (decode_lines)": lambda: decode(),
            "canonical re-encode (encode_lines, compared)": lambda: reencode(),
            "step lines' template in C (step_lines)": lambda: template(),
            "their numbers' spelling (one decode, re-encode)": lambda: spelled(),
        }
        got = {k: [] for k in parts}
        whole, plain, sha = [], [], []
        fast_ok = _scan._STEP_LINES_OK

        def scan_range(steps_fast: bool) -> float:
            _scan._STEP_LINES_OK = steps_fast and fast_ok
            try:
                return per_line(lambda: _scan.scan_range(str(path), 0, size, -1, genesis(opened.run_id), ctx, True))
            finally:
                _scan._STEP_LINES_OK = fast_ok

        for _ in range(args.repeats):
            for k, fn in parts.items():
                got[k].append(per_line(fn))
            fast.sha_ni(had)
            whole.append(scan_range(True))
            plain.append(scan_range(False))
            sha.append(per_line(lambda: subprocess.run(["sha256sum", str(path)], capture_output=True, check=True)))
        fast.sha_ni(had)
        print(f"{lines:,} lines, {size / 2**20:.0f} MB; {_accel.describe()}; medians of {args.repeats}, ns a line")
        for k, v in got.items():
            print(f"  {k:48s} {statistics.median(v):7.0f}")
        print(f"  {'whole scan_range, one process':48s} {statistics.median(whole):7.0f}")
        print(f"  {'  the same, every line decoded and re-encoded':48s} {statistics.median(plain):7.0f}")
        print(f"  {'sha256sum of the file':48s} {statistics.median(sha):7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
