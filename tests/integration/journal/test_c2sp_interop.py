"""The team log checked by an implementation that is not trainledger's: golang.org/x/mod's sumdb/note and
sumdb/tlog (the Go team's, from which C2SP's signed-note and tlog-tiles were written down; Debian's
golang-golang-x-mod-dev, built with Debian's Go) open the checkpoint, read every tile through tlog.TileHashReader,
which checks each against the signed root, and prove every entry at its index; the witness's Ed25519
cosignature is checked over the cosignature/v1 message (tests/helpers/c2sp_check/main.go). A changed byte in a
tile, an entry or the checkpoint is refused by it too."""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from trainledger.journal import Signer
from trainledger.journal.note import verifier_key
from trainledger.journal.proofs.tiles import TileLog
from trainledger.journal.statements.publish.orglog import publish
from trainledger.journal.statements.publish.witness_http import HttpWitness, serve_witness

SOURCE = Path(__file__).resolve().parents[2] / "helpers" / "c2sp_check" / "main.go"
GOPATH = Path("/usr/share/gocode")


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    if shutil.which("go") is None or not (GOPATH / "src/golang.org/x/mod/sumdb/tlog").is_dir():
        pytest.skip("Debian's golang-go and golang-golang-x-mod-dev are not installed (tools/setup.sh --browser)")
    out = tmp_path_factory.mktemp("go") / "c2sp_check"
    env = dict(os.environ, GO111MODULE="off", GOPATH=str(GOPATH), GOCACHE=str(out.parent / "cache"), CGO_ENABLED="0")
    subprocess.run(["go", "build", "-o", str(out), str(SOURCE)], check=True, env=env, capture_output=True,
                   timeout=300)
    return out


def test_go_x_mod_reads_every_tile_and_entry_and_the_cosignature(tmp_path, checker):
    log_key, w = Signer.generate(), Signer.generate()
    origin = "example.com/ml-runs"
    log = TileLog.init(tmp_path / "log", origin, log_key)
    log.add([f"trainledger/run-{i}\n{i}\n".encode() for i in range(300)], log_key)  # a full tile and a partial one
    log.add([b"one more"], log_key)
    vkey = verifier_key(origin, log_key.public.raw)
    from trainledger.journal.note import parse_verifier_key

    witness = HttpWitness("witness.example/w1", w, tmp_path / "w.state", [parse_verifier_key(vkey)], ml_dsa=True)
    server = serve_witness(witness, 0)
    try:
        got = publish(tmp_path / "log", [(f"http://127.0.0.1:{server.server_address[1]}", [])], log_key.public.raw,
                      min_interval_s=0)
    finally:
        server.shutdown()
        server.server_close()
    assert got.answers[0].error is None
    wkey = f"witness.example/w1={base64.b64encode(w.public.raw).decode()}"

    def check(*extra):
        return subprocess.run([str(checker), str(tmp_path / "log"), vkey, *extra], capture_output=True, text=True,
                              timeout=120)

    r = check(wkey)
    assert r.returncode == 0 and r.stdout.split() == ["ok", "301", "301", "1"], r.stdout + r.stderr
    for rel, at in [("tile/0/000", 100), ("tile/entries/001.p/45", 5), ("tile/1/000.p/1", 3)]:
        p = tmp_path / "log" / rel
        good = p.read_bytes()
        bad = bytearray(good)
        bad[at] ^= 1
        p.write_bytes(bytes(bad))
        assert check(wkey).returncode == 1, rel
        p.write_bytes(good)
    cp = tmp_path / "log" / "checkpoint"
    good = cp.read_text()
    cp.write_text(good.replace("\n301\n", "\n300\n", 1))
    assert check().returncode == 1
    cp.write_text(good)
    assert check(f"witness.example/w1={base64.b64encode(Signer.generate().public.raw).decode()}").returncode == 1
