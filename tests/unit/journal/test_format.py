"""docs/FORMAT.md: its worked example is current, and an independent verifier written
from it accepts what the writer produces and rejects tampering."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import independent_verifier as iv
import pytest
from conftest import step

from trainledger.journal import Journal, RunResumed, verify

ROOT = Path(__file__).resolve().parents[3]


def test_format_md_holds_the_generated_example():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "format_example.py")], capture_output=True,
                         text=True, timeout=60, check=True).stdout.strip()
    assert out in (ROOT / "docs" / "FORMAT.md").read_text(), "run: python tools/format_example.py --write"


def test_worked_example_verifies_both_ways(tmp_path):
    j, pub = tmp_path / "example.jsonl", tmp_path / "example.pub"
    subprocess.run([sys.executable, str(ROOT / "tools" / "format_example.py"), "--journal", str(j), "--pub", str(pub)],
                   check=True, timeout=60)
    from trainledger.journal import load_public_key

    r = verify(j, keys=[load_public_key(pub)])
    assert r.events == 3 and r.last_sealed_seq == 1 and r.unsealed_events == 0
    assert iv.verify(j.read_bytes(), iv.parse_pubkey(pub.read_text())) == {
        "events": 3, "last_sealed_seq": 1, "tail": "open"}


def _writer_journal(path, signer, n=300):
    with Journal.create(path, signer=signer, seal_every=17, background=False) as j:
        for i in range(n):
            j.append(step(i, loss=[2.0, math.nan, math.inf, -math.inf, 1e-12][i % 5]))
            if i == 150:
                j.append(RunResumed(reason="test", detail={"note": "λ \"quoted\" \\ \n", "x": math.nan}))


def test_independent_verifier_accepts_writer_output(tmp_path, signer):
    p = tmp_path / "j.jsonl"
    _writer_journal(p, signer)
    ref = verify(p, keys=[signer.public], require_closed=True)
    ind = iv.verify(p.read_bytes(), signer.public.raw)
    assert ind == {"events": ref.events, "last_sealed_seq": ref.last_sealed_seq, "tail": "closed"}


def test_independent_verifier_agrees_on_torn_and_open_tails(tmp_path, signer):
    p = tmp_path / "j.jsonl"
    _writer_journal(p, signer, n=40)
    data = p.read_bytes()
    assert iv.verify(data[:-10], signer.public.raw)["tail"] == "torn"
    cut = data[: data.rfind(b"\n", 0, len(data) - 1) + 1]
    assert iv.verify(cut, signer.public.raw)["tail"] == verify_tail(tmp_path, cut, signer) == "open"


def verify_tail(tmp_path, data, signer):
    q = tmp_path / "cut.jsonl"
    q.write_bytes(data)
    return verify(q, keys=[signer.public], allow_unsealed=True).tail


def test_independent_verifier_rejects_tampering(tmp_path, signer, rng):
    p = tmp_path / "j.jsonl"
    _writer_journal(p, signer, n=60)
    data = bytearray(p.read_bytes())
    for _ in range(40):
        mutated = bytearray(data)
        pos = rng.randrange(len(mutated) - 1)  # the final newline's absence is a torn tail, not tampering
        mutated[pos] = (mutated[pos] + rng.randrange(1, 256)) % 256
        with pytest.raises(iv.Bad):
            out = iv.verify(bytes(mutated), signer.public.raw)
            if out["tail"] != "closed":
                raise iv.Bad("not closed any more")


def test_independent_verifier_follows_certified_keys_and_late_signatures(tmp_path):
    """Format 1.7 from docs/FORMAT.md alone: the golden rank journal (keys certified by the pinned key, two rounds)
    and a journal whose seals were signed in the background agree with the reference verifier; a late signature
    moved to another seal, and a certificate of another issuer, are refused."""
    from slow_token import Token, journal_signed_late

    from trainledger.journal import load_public_key

    g = ROOT / "tests" / "assets" / "golden" / "rank_keys_v1_7.jsonl"
    pub = load_public_key(g.with_suffix(".pub"))
    ref = verify(g, keys=[pub], require_closed=True)
    assert iv.verify(g.read_bytes(), pub.raw) == {"events": ref.events, "last_sealed_seq": ref.last_sealed_seq,
                                                  "tail": "closed"}
    with pytest.raises(iv.Bad, match="another key than the pinned one"):
        iv.verify(g.read_bytes(), Token().public.raw)
    key = Token()
    p = tmp_path / "late.jsonl"
    journal_signed_late(p, key, 60, 7).close()
    ref = verify(p, keys=[key.public], require_closed=True)
    assert ref.kinds["seal_signed"] >= 5
    assert iv.verify(p.read_bytes(), key.public.raw) == {"events": ref.events,
                                                         "last_sealed_seq": ref.last_sealed_seq, "tail": "closed"}
    cut = p.read_bytes().splitlines(keepends=True)
    last_late = max(i for i, ln in enumerate(cut) if b'"seal_signed"' in ln)
    part = b"".join(cut[:last_late + 1])
    rep_part = verify_tail(tmp_path, part, key)
    assert rep_part == "open"
    assert iv.verify(part, key.public.raw)["last_sealed_seq"] == json.loads(cut[last_late])["seal_seq"] - 1
    lines = p.read_bytes().splitlines()
    late = [i for i, ln in enumerate(lines) if b'"seal_signed"' in ln]
    swapped = lines[:late[1]] + [lines[late[0]]] + lines[late[1] + 1:]
    from journal_tools import rechain

    with pytest.raises(iv.Bad, match="not waiting for one"):
        iv.verify(b"\n".join(rechain(swapped)) + b"\n", key.public.raw)
