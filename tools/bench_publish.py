#!/usr/bin/env python3
"""What publishing costs (docs/publishing.md), each beside its floor in one run (medians; a shared machine: compare
the ratios, not the absolute figures):

    .venv/bin/python tools/bench_publish.py --out docs/bench/publish.txt

1. the team log: appending runs in batches (what 'log add' does under its lock: read the log back and check it,
   write the tiles, sign) and reading a log whole and checked (what a reader and 'log prove' pay), against hashing
   the same entries once (SHA-256 of every entry: the floor of any check);
2. a witness round trip over loopback (HTTP, the consistency proof checked, the state fsynced, the cosignature
   made): Ed25519 alone, and with ML-DSA-44 too;
3. a proof of logging held to a policy (what 'verify --policy' adds per journal, beyond verifying the journal);
4. COSE: a receipt made and checked;
5. RFC 3161: a token checked offline (needs Debian's openssl for a real authority; skipped without it).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _median_ms(fn, n: int) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return statistics.median(out)


def team_log(tmp: Path, lines: list[str], entries: int) -> None:
    from trainledger.journal import Signer
    from trainledger.journal.proofs.tiles import TileLog

    key = Signer.generate()
    log = TileLog.init(tmp / "log", "example.com/ml-runs", key)
    data = [(f"trainledger/run-{i:06d}\n{i + 1}\n" + "A" * 43 + "=\ntrainledger-head 0:" + "0" * 64 + "\n\n"
             "\u2014 trainledger/run " + "B" * 88 + "\n").encode() for i in range(entries)]
    batch = 100
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, entries, batch):
        log.add(data[i:i + batch], key)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    lines.append(f"1. team log: {entries:,} entries added in batches of {batch} ({entries // batch} adds, each reading "
                 f"and checking the whole log first): {wall:.2f} s wall, {cpu:.2f} s CPU; the last add "
                 f"{_median_ms(lambda: log.add([b'one more ' + os.urandom(8)], key), 3):.0f} ms")
    read = _median_ms(lambda: log.read(key.public.raw), 3)
    floor = _median_ms(lambda: [hashlib.sha256(b"\0" + d).digest() for d in data], 5)
    size = sum(p.stat().st_size for p in (tmp / "log").rglob("*") if p.is_file())
    lines.append(f"   reading it whole and checked ({entries + 3:,} entries, {size / 1e6:.1f} MB of tiles and bundles): "
                 f"{read:.0f} ms, against {floor:.0f} ms to hash every entry once ({read / floor:.1f}x)")


def witness(tmp: Path, lines: list[str]) -> None:
    from trainledger.journal import Signer
    from trainledger.journal.merkle import consistency_proof, leaf_hash, root
    from trainledger.journal.note import Verifier, checkpoint_text, key_hash, note_signature_line
    from trainledger.journal.statements.publish.witness_http import HttpWitness, add_checkpoint, serve_witness

    log = Signer.generate()
    origin = "example.com/ml-runs"
    v = Verifier(origin, key_hash(origin, log.public.raw), log.public.raw)
    leaves = [leaf_hash(str(i).encode()) for i in range(400)]

    def note(n: int) -> str:
        text = checkpoint_text(origin, n, root(leaves[:n]))
        return text + "\n" + note_signature_line(origin, log.public.raw, log.sign(text.encode()))

    notes = {n: note(n) for n in range(1, 400)}
    for ml in (False, True):
        w = HttpWitness("witness.example/w", Signer.generate(), tmp / f"w{ml}.state", [v], ml_dsa=ml)
        server = serve_witness(w, 0)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        add_checkpoint(url, 0, [], notes[1])
        at = [1]

        def one() -> None:
            old, new = at[0], at[0] + 1
            status, _, _ = add_checkpoint(url, old, consistency_proof(leaves[:new], old), notes[new])
            assert status == 200, status
            at[0] = new

        ms = _median_ms(one, 100)
        server.shutdown()
        server.server_close()
        lines.append(f"2. witness round trip over loopback ({'Ed25519 + ML-DSA-44' if ml else 'Ed25519'}): "
                     f"{ms:.1f} ms median of 100 (HTTP, proof checked, state fsynced, cosigned)")


def proof_and_cose(tmp: Path, lines: list[str]) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from trainledger.journal import Journal, Signer
    from trainledger.journal.events import StepObserved
    from trainledger.journal.merkle import inclusion_proof, leaf_hash, root
    from trainledger.journal.note import verifier_key
    from trainledger.journal.proofs.cose import receipt, verify_receipt
    from trainledger.journal.proofs.policy import parse_policy
    from trainledger.journal.statements.publish.orglog import add_runs, check_published, prove
    from trainledger.journal.proofs.tiles import TileLog
    from trainledger.journal.verify import verify

    run, logk = Signer.generate(), Signer.generate()
    jp = tmp / "run" / "journal.jsonl"
    j = Journal.create(jp, signer=run, background=False)
    for i in range(10_000):
        j.append(StepObserved(step=i, loss=1.0 / (i + 1)))
    j.close()
    TileLog.init(tmp / "plog", "example.com/ml-runs", logk)
    add_runs(tmp / "plog", [jp], [run.public], logk)
    ((_, text),) = prove(tmp / "plog", [jp], [run.public], logk.public.raw)
    (tmp / "run" / "journal.tlog-proof").write_text(text)
    policy = parse_policy(f"log {verifier_key('example.com/ml-runs', logk.public.raw)}\nquorum none\n".encode())
    held = _median_ms(lambda: check_published(jp, [run.public], policy), 5)
    alone = _median_ms(lambda: verify(jp, keys=[run.public]), 5)
    lines.append(f"3. verify --policy on a 10,000-event journal: the proof of logging held {held:.0f} ms (it verifies "
                 f"the journal once more, to hold it to the entry), the journal's own verify {alone:.0f} ms")
    entries = [os.urandom(64) for _ in range(1024)]
    leaves = [leaf_hash(e) for e in entries]
    r = root(leaves)
    path = inclusion_proof(leaves, 700)
    made = _median_ms(lambda: receipt(700, 1024, path, r, run), 200)
    data = receipt(700, 1024, path, r, run)
    pub = Ed25519PublicKey.from_public_bytes(run.public.raw)
    checked = _median_ms(lambda: verify_receipt(data, entries[700], pub), 200)
    lines.append(f"4. COSE receipt (a tree of 1,024, 10 path hashes, EdDSA): made {made * 1e3:.0f} us, checked "
                 f"{checked * 1e3:.0f} us; {len(data)} bytes")


def rfc3161(tmp: Path, lines: list[str]) -> None:
    if shutil.which("openssl") is None:
        lines.append("5. RFC 3161: skipped (no openssl here for a real authority)")
        return
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    from openssl_tsa import OpensslTsa

    from trainledger.journal.proofs.timestamp import load_certificates, request, verify_token

    tsa = OpensslTsa(tmp / "tsa")
    url = tsa.start()
    note = "trainledger/r\n9\n" + "A" * 43 + "=\n\n\u2014 trainledger/r x\n"
    try:
        asked = _median_ms(lambda: request(url, note), 10)
        token = request(url, note)
    finally:
        tsa.stop()
    ca = load_certificates((tmp / "tsa" / "ca.crt").read_bytes())
    checked = _median_ms(lambda: verify_token(token, note, ca), 200)
    lines.append(f"5. RFC 3161: a token from openssl ts behind loopback {asked:.0f} ms (mostly openssl starting); "
                 f"checked offline {checked * 1e3:.0f} us (RSA-2048 signer, a P-256 CA); {len(token)} bytes")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=10_000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from bench_report import finish, header

    lines = header("bench_publish.py")
    with tempfile.TemporaryDirectory(prefix="tl-bench-publish-") as d:
        tmp = Path(d)
        for part in (team_log, witness, proof_and_cose, rfc3161):
            if part is team_log:
                part(tmp, lines, args.entries)
            else:
                part(tmp, lines)
            print(lines[-1], flush=True)
    return finish(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
