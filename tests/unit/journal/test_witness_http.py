"""The witness side of the C2SP witness protocol (journal/statements/publish/witness_http.py): every answer the spec
defines, driven one by one; the state on disk before a 200 and never rolled back; ML-DSA-44 and Ed25519
cosignatures that verify; and the HTTP layer's own refusals."""

from __future__ import annotations

import base64
import json
import urllib.request

import pytest

from trainledger.journal import Signer
from trainledger.journal.merkle import consistency_proof, leaf_hash, root
from trainledger.journal.note import (Verifier, checkpoint_text, check_cosignatures, key_hash, note_signature_line,
                                      parse_verifier_key)
from trainledger.journal.statements.publish.witness_http import HttpWitness, add_checkpoint, serve_witness

ORIGIN = "example.com/ml-runs"
LOG = Signer.generate()
LOG_V = Verifier(ORIGIN, key_hash(ORIGIN, LOG.public.raw), LOG.public.raw)
LEAVES = [leaf_hash(f"run {i}".encode()) for i in range(10)]


def _note(size: int, leaves=LEAVES, signer=LOG, origin=ORIGIN) -> str:
    text = checkpoint_text(origin, size, root(leaves[:size]))
    return text + "\n" + note_signature_line(origin, signer.public.raw, signer.sign(text.encode()))


def _body(old: int, proof, note: str) -> bytes:
    return (f"old {old}\n" + "".join(base64.b64encode(h).decode() + "\n" for h in proof) + "\n" + note).encode()


@pytest.fixture
def witness(tmp_path):
    return HttpWitness("witness.example/w1", Signer.generate(), tmp_path / "w.state", [LOG_V], ml_dsa=True,
                       clock=lambda: 1_800_000_000.5)


def test_every_answer_the_spec_defines(witness, tmp_path):
    w = witness
    # 200 on a first view, old 0 and no proof: an Ed25519 and an ML-DSA-44 cosignature, timestamped, both verifying
    status, ctype, body = w.add_checkpoint(_body(0, [], _note(4)))
    assert status == 200 and body.count("\u2014 witness.example/w1 ") == 2
    keys = [parse_verifier_key(v) for v in w.vkeys()]
    assert [k.sig_type for k in keys] == [0x04, 0x06]
    assert [ts for _, ts in check_cosignatures(_note(4) + body, keys)] == [1_800_000_000, 1_800_000_000]
    assert json.loads((tmp_path / "w.state").read_text())[ORIGIN]["size"] == 4  # on disk before it answered
    # 409 with text/x.tlog.size: an old size that is not the one it holds
    assert w.add_checkpoint(_body(0, [], _note(6))) == (409, "text/x.tlog.size", "4\n")
    assert w.add_checkpoint(_body(5, consistency_proof(LEAVES[:6], 5), _note(6)))[:2] == (409, "text/x.tlog.size")
    # 422: a consistency proof that does not hold
    bad = [bytes(32)] * len(consistency_proof(LEAVES[:6], 4))
    assert w.add_checkpoint(_body(4, bad, _note(6)))[0] == 422
    # 200: the right proof; the state moves to 6
    assert w.add_checkpoint(_body(4, consistency_proof(LEAVES[:6], 4), _note(6)))[0] == 200
    # 409: the same size with another root (a fork), even signed by the log's own key
    other = [leaf_hash(b"forged")] + LEAVES[1:]
    assert w.add_checkpoint(_body(6, [], _note(6, other))) == (409, "text/x.tlog.size", "6\n")
    # 200 again for the same checkpoint (nothing new, a fresh cosignature)
    assert w.add_checkpoint(_body(6, [], _note(6)))[0] == 200
    # 400: an old size above the checkpoint's; a proof from size 0; a body that does not parse; > 63 proof lines
    assert w.add_checkpoint(_body(7, [], _note(6)))[0] == 400
    assert w.add_checkpoint(_body(0, [bytes(32)], _note(6)))[0] == 400
    assert w.add_checkpoint(b"old 04\n\n" + _note(6).encode())[0] == 400
    assert w.add_checkpoint(b"6\n\n" + _note(6).encode())[0] == 400
    assert w.add_checkpoint(_body(6, [bytes(32)] * 64, _note(6)))[0] == 400
    # 404: an origin it follows no log for; 403: no signature by the log's key verifies
    assert w.add_checkpoint(_body(0, [], _note(3, origin="elsewhere.example/log")))[0] == 404
    assert w.add_checkpoint(_body(6, [], _note(6, signer=Signer.generate())))[0] == 403
    # nothing refused moved the state
    assert json.loads((tmp_path / "w.state").read_text())[ORIGIN]["size"] == 6


def test_over_http_with_its_own_refusals(witness):
    server = serve_witness(witness, 0)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert add_checkpoint(url, 0, [], _note(3))[0] == 200
        assert add_checkpoint(url, 0, [], _note(5))[:3] == (409, "text/x.tlog.size", "3\n")
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        conn.putrequest("POST", "/add-checkpoint")  # a body announced too large: refused before any of it is read
        conn.putheader("Content-Length", str(10 ** 9))
        conn.endheaders()
        assert conn.getresponse().status == 413
        conn.close()
        for path, data, method, want in [("/other", b"old 0\n\n", "POST", 404),
                                         ("/add-checkpoint", None, "GET", 404)]:
            req = urllib.request.Request(url + path, data=data, method=method)
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(req, timeout=10)
            assert e.value.code == want
            e.value.close()
    finally:
        server.shutdown()
        server.server_close()
