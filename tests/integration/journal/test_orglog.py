"""The organisation log end to end (docs/publishing.md): two runs added with 'trainledger log add', the folder served
by 'trainledger log serve' and read back over HTTP, two witnesses run as their own processes ('trainledger witness
serve', loopback, their own keys; one with ML-DSA-44) cosigning it through 'log publish', a policy's quorum met,
the witnesses' state surviving a restart, and a forked log refused by the witness and caught by the quorum."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from trainledger.cli import main
from trainledger.journal import Journal, keygen, load_signer
from trainledger.journal.note import parse_verifier_key
from trainledger.journal.proofs.policy import check_checkpoint, parse_policy
from trainledger.journal.proofs.tiles import read_log
from trainledger.journal.statements.publish.witness_http import add_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from conftest import step  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(path: Path, signer, n: int) -> Path:
    j = Journal.create(path, signer=signer, seal_every=4, background=False)
    for i in range(n):
        j.append(step(i))
    j.close()
    return path


def _start(args: list[str], ready: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "trainledger", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    line = p.stdout.readline()
    assert ready in line, (line, p.stderr.read() if p.poll() is not None else "")
    return p


@pytest.fixture
def world(tmp_path):
    keys = {n: keygen(tmp_path / "keys" / n) for n in ("run", "log", "w1", "w2")}
    run = load_signer(keys["run"][0])
    runs = [_run(tmp_path / "a" / "journal.jsonl", run, 9).parent, _run(tmp_path / "b" / "journal.jsonl", run, 5).parent]
    procs: list[subprocess.Popen] = []
    yield tmp_path, keys, runs, procs
    for p in procs:
        _stop(p)


def _stop(p: subprocess.Popen) -> None:
    p.terminate()
    p.wait(timeout=10)
    p.stdout.close()
    p.stderr.close()


def test_runs_published_cosigned_and_a_fork_refused(world, capsys):
    tmp, keys, runs, procs = world
    logdir = tmp / "log"
    assert main(["log", "init", str(logdir), "--origin", "example.com/ml-runs", "--key", str(keys["log"][0])]) == 0
    log_vkey = (logdir / "log.vkey").read_text().strip()
    assert main(["log", "add", str(logdir), *map(str, runs), "--pubkey", str(keys["run"][1]),
                 "--key", str(keys["log"][0])]) == 0
    assert main(["log", "add", str(logdir), str(runs[0]), "--pubkey", str(keys["run"][1]),
                 "--json"]) == 0  # added again (its key found where 'log init' noted it): already there, unchanged
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(out)["entries"][0] == {"journal": str(runs[0] / "journal.jsonl"), "index": 0, "new": False}
    from trainledger.journal.keys import key_home

    remembered = json.loads((key_home() / "logs.json").read_text())
    assert remembered[(logdir / "log.vkey").read_text().strip()] == str(keys["log"][0].resolve())
    assert not any(p.name.startswith(".key") for p in logdir.iterdir())  # nothing in the folder names a key file
    (key_home() / "logs.json").write_text("{}")
    assert main(["log", "add", str(logdir), str(runs[0]), "--pubkey", str(keys["run"][1])]) == 2
    assert "'log init' was not given this log's key on this account" in capsys.readouterr().err

    # the folder over HTTP, read and checked as any client would: two entries, each a run's signed checkpoint
    port = _free_port()
    procs.append(_start(["log", "serve", str(logdir), "--port", str(port)], "serving"))
    base = f"http://127.0.0.1:{port}/"

    def fetch(rel: str) -> bytes:
        with urllib.request.urlopen(base + rel, timeout=10) as r:
            return r.read()

    view = read_log(fetch, parse_verifier_key(log_vkey))
    assert view.checkpoint.size == 2 and all(e.startswith(b"trainledger/") for e in view.entries)
    with pytest.raises(urllib.error.HTTPError):  # nothing but the checkpoint and tiles, nothing outside the folder
        fetch("log.vkey")
    with pytest.raises(urllib.error.HTTPError):
        fetch("tile/../../keys/log/trainledger.key")

    # two witnesses, their own processes and keys, w2 also ML-DSA-44
    urls, vkeys = [], {}
    for name, extra in (("w1", []), ("w2", ["--ml-dsa"])):
        wport = _free_port()
        p = _start(["witness", "serve", "--key", str(keys[name][0]), "--name", f"witness.example/{name}",
                    "--state", str(tmp / f"{name}.state"), "--log", log_vkey, "--port", str(wport), *extra],
                   "witness")
        vkeys[name] = [p.stdout.readline().strip() for _ in range(1 + len(extra))]
        procs.append(p)
        urls.append(f"http://127.0.0.1:{wport}")
    assert parse_verifier_key(vkeys["w2"][1]).sig_type == 0x06
    policy = tmp / "team.policy"
    policy.write_text(f"log {log_vkey}\n"
                      f"witness w1 {vkeys['w1'][0]} {urls[0]}\n"
                      f"witness w2pq {vkeys['w2'][1]} {urls[1]}\n"
                      "group both all w1 w2pq\nquorum both\n")
    assert main(["log", "publish", str(logdir), "--policy", str(policy), "--min-interval", "0"]) == 0
    said = capsys.readouterr().out
    assert said.count("cosigned  http://") == 2 and "quorum met: both: 2 of 2" in said
    served = fetch("checkpoint").decode()
    cp, q = check_checkpoint(parse_policy(policy.read_bytes()), served)
    assert cp.size == 2 and q.met and set(q.witnesses) == {"w1", "w2pq"} and all(q.witnesses.values())

    # a third run; within the minute, publishing another checkpoint is refused (the rate witnesses admit)
    c = _run(tmp / "c" / "journal.jsonl", load_signer(keys["run"][0]), 3).parent
    assert main(["log", "add", str(logdir), str(c), "--pubkey", str(keys["run"][1]), "--key",
                 str(keys["log"][0])]) == 0
    assert main(["log", "publish", str(logdir), "--policy", str(policy)]) == 2
    assert "witnesses admit about one a minute" in capsys.readouterr().err
    # restart w1 on its state: it remembers size 2 and takes the consistency proof to 3
    _stop(procs[1])
    wport = int(urls[0].rsplit(":", 1)[1])
    procs[1] = _start(["witness", "serve", "--key", str(keys["w1"][0]), "--name", "witness.example/w1",
                       "--state", str(tmp / "w1.state"), "--log", log_vkey, "--port", str(wport)], "witness")
    procs[1].stdout.readline()
    assert main(["log", "publish", str(logdir), "--policy", str(policy), "--min-interval", "0"]) == 0
    assert json.loads((tmp / "w1.state").read_text())["example.com/ml-runs"]["size"] == 3

    # a fork: the same origin and key, another history of size 4 (its second entry another run's), shown to w1 as
    # the extension of the size 3 it holds -> 422; as a first view (old 0) -> 409 naming the size it holds; the
    # quorum is not met on the forked checkpoint
    fork = tmp / "fork"
    assert main(["log", "init", str(fork), "--origin", "example.com/ml-runs", "--key", str(keys["log"][0])]) == 0
    d = _run(tmp / "d" / "journal.jsonl", load_signer(keys["run"][0]), 2).parent
    assert main(["log", "add", str(fork), str(runs[0]), str(d), str(c), str(runs[1]), "--pubkey",
                 str(keys["run"][1]), "--key", str(keys["log"][0])]) == 0
    from trainledger.journal.merkle import consistency_proof
    from trainledger.journal.proofs.tiles import TileLog

    forked = TileLog(fork).read(load_signer(keys["log"][0]).public.raw)
    status, _, _ = add_checkpoint(urls[0], 3, consistency_proof(forked.leaves, 3), forked.note)
    assert status == 422
    status, ctype, body = add_checkpoint(urls[0], 0, [], forked.note)
    assert (status, ctype, body) == (409, "text/x.tlog.size", "3\n")
    assert main(["log", "publish", str(fork), "--policy", str(policy), "--min-interval", "0"]) == 1
    said = capsys.readouterr().out
    assert "REFUSED" in said and "quorum NOT met" in said


def test_verify_with_a_policy_says_whether_a_run_is_published(world, capsys):
    """log prove writes each run's C2SP tlog-proof beside its journal (the entry carried as its extra line); verify
    --policy then holds the run to it offline: published once the quorum cosigned; a run added after the last
    publish proves only under the unwitnessed checkpoint, NOT published until the next publish; a proof with a
    flipped hash, or another run's proof, fails; a run with no proof is NOT published (exit 1)."""
    tmp, keys, runs, procs = world
    logdir, run_pub = tmp / "log", str(keys["run"][1])
    main(["log", "init", str(logdir), "--origin", "example.com/ml-runs", "--key", str(keys["log"][0])])
    log_vkey = (logdir / "log.vkey").read_text().strip()
    main(["log", "add", str(logdir), str(runs[0]), "--pubkey", run_pub, "--key", str(keys["log"][0])])
    wport = _free_port()
    procs.append(_start(["witness", "serve", "--key", str(keys["w1"][0]), "--name", "witness.example/w1",
                         "--state", str(tmp / "w1.state"), "--log", log_vkey, "--port", str(wport), "--ml-dsa"],
                        "witness"))
    w1 = [procs[-1].stdout.readline().strip() for _ in range(2)]
    policy = tmp / "team.policy"
    policy.write_text(f"log {log_vkey}\nwitness pq {w1[1]} http://127.0.0.1:{wport}\nquorum pq\n")
    assert main(["log", "publish", str(logdir), "--policy", str(policy)]) == 0
    main(["log", "add", str(logdir), str(runs[1]), "--pubkey", run_pub, "--key", str(keys["log"][0])])
    assert main(["log", "prove", str(logdir), *map(str, runs), "--pubkey", run_pub]) == 0
    capsys.readouterr()
    proof_a = runs[0] / "journal.tlog-proof"
    assert proof_a.read_text().startswith("c2sp.org/tlog-proof@v1\nextra ")

    def verify(run, *extra):
        code = main(["verify", str(run), "--pubkey", run_pub, "--policy", str(policy), *extra])
        return code, capsys.readouterr().out

    code, out = verify(runs[0])
    assert code == 0 and "PUBLISHED" in out and "entry 0 of example.com/ml-runs" in out and "quorum met" in out
    code, out = verify(runs[1])  # added after the publish: under the log's own, uncosigned checkpoint
    assert code == 1 and "NOT PUBLISHED" in out and "quorum NOT met" in out
    assert main(["log", "publish", str(logdir), "--policy", str(policy), "--min-interval", "0"]) == 0
    main(["log", "prove", str(logdir), str(runs[1]), "--pubkey", run_pub])
    capsys.readouterr()
    assert verify(runs[1])[0] == 0
    # another run's proof for this run: its entry is not this journal's checkpoint
    code, out = verify(runs[1], "--log-proof", str(proof_a))
    assert code == 1 and "not of this run" in out
    # one inclusion hash flipped
    lines = proof_a.read_text().split("\n")
    i = next(k for k, x in enumerate(lines) if x.startswith("index ")) + 1
    if i < len(lines) and lines[i]:
        import base64

        h = bytearray(base64.b64decode(lines[i]))
        h[0] ^= 1
        lines[i] = base64.b64encode(bytes(h)).decode()
    else:  # a tree of one leaf has no inclusion hash: flip the index instead
        lines[i - 1] = "index 1"
    bad = tmp / "bad.tlog-proof"
    bad.write_text("\n".join(lines))
    assert verify(runs[0], "--log-proof", str(bad))[0] == 1
    c = _run(tmp / "c" / "journal.jsonl", load_signer(keys["run"][0]), 3).parent
    code, out = verify(c)
    assert code == 1 and "no proof of logging" in out
    # a proof bundle of some of run a's lines, against the checkpoint the log holds: published (verify-proof); a
    # bundle against an earlier seal of the run is not that checkpoint, and says so
    main(["prove", str(runs[0] / "journal.jsonl"), "--seq", "2", "-o", str(tmp / "a.json"), "--pubkey", run_pub])
    from trainledger.journal.proofs.timestamp import seal_notes

    first = min(seal_notes(runs[0] / "journal.jsonl", [load_signer(keys["run"][0]).public]))
    assert main(["prove", str(runs[0] / "journal.jsonl"), "--seq", "0", "--tree-size", str(first), "-o",
                 str(tmp / "a5.json"), "--pubkey", run_pub]) == 0
    capsys.readouterr()
    assert main(["verify-proof", str(tmp / "a.json"), "--pubkey", run_pub, "--policy", str(policy),
                 "--log-proof", str(proof_a)]) == 0
    assert "PUBLISHED" in capsys.readouterr().out
    assert main(["verify-proof", str(tmp / "a5.json"), "--pubkey", run_pub, "--policy", str(policy),
                 "--log-proof", str(proof_a)]) == 1
    assert "not the one this proves against" in capsys.readouterr().out


def test_receipts_in_cose_for_a_journals_lines_and_for_the_logs_entries(world, capsys):
    """prove --cose writes each proven line's RFC 9942 receipt and the checkpoint as a COSE_Sign1 statement, signed
    with the run's key; log prove --cose-key the same for each run's entry in the team log, signed with the log's
    key. Each checks here and under pycose with the root its own proof gives; another line does not."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from pycose.keys import OKPKey
    from pycose.messages import Sign1Message

    from trainledger.journal.proofs.cose import verify_receipt, verify_statement

    tmp, keys, runs, _ = world
    jp = runs[0] / "journal.jsonl"
    assert main(["prove", str(jp), "--seq", "3", "--seq", "5", "-o", str(tmp / "b.json"), "--pubkey",
                 str(keys["run"][1]), "--cose", "--cose-key", str(keys["run"][0])]) == 0
    out = tmp / "b.cose"  # beside the bundle, by default
    capsys.readouterr()
    run_pub = Ed25519PublicKey.from_public_bytes(load_signer(keys["run"][0]).public.raw)
    lines = jp.read_bytes().split(b"\n")
    for seq in (3, 5):
        data = (out / f"line-{seq}.receipt.cose").read_bytes()
        index, size, r = verify_receipt(data, lines[seq], run_pub)
        assert index == seq
        msg = Sign1Message.decode(data)
        msg.key = OKPKey(crv="ED25519", x=load_signer(keys["run"][0]).public.raw)
        assert msg.verify_signature(detached_payload=r)
        with pytest.raises(Exception):
            verify_receipt(data, lines[seq + 1], run_pub)
    assert verify_statement((out / "checkpoint.cose").read_bytes(), run_pub) == json.loads(
        (tmp / "b.json").read_text())["checkpoint"]

    logdir = tmp / "log"
    main(["log", "init", str(logdir), "--origin", "example.com/ml-runs", "--key", str(keys["log"][0])])
    main(["log", "add", str(logdir), *map(str, runs), "--pubkey", str(keys["run"][1]), "--key", str(keys["log"][0])])
    assert main(["log", "prove", str(logdir), *map(str, runs), "--pubkey", str(keys["run"][1]), "--cose-key",
                 str(keys["log"][0])]) == 0
    log_pub = Ed25519PublicKey.from_public_bytes(load_signer(keys["log"][0]).public.raw)
    from trainledger.journal.proofs.tlogproof import parse_proof

    for i, run in enumerate(runs):
        entry = parse_proof((run / "journal.tlog-proof").read_text()).extra
        assert verify_receipt((run / "journal.receipt.cose").read_bytes(), entry, log_pub)[:2] == (i, 2)


def test_a_publish_state_file_someone_else_wrote_is_refused_in_one_line(world, capsys):
    """.witnesses.json lies in the log folder, which anyone may write: not JSON, or sizes that are not sizes, is a
    one-line usage error (exit 2) naming the file, never a traceback."""
    tmp, keys, _, _ = world
    logdir = tmp / "log"
    main(["log", "init", str(logdir), "--origin", "example.com/ml-runs", "--key", str(keys["log"][0])])
    for junk in ("{not json", '{"sizes": {"http://w": [1]}}', '{"sizes": {}, "time": "soon"}', "[]"):
        (logdir / ".witnesses.json").write_text(junk)
        capsys.readouterr()
        assert main(["log", "publish", str(logdir), "--witness", "http://127.0.0.1:9"]) == 2
        out, err = capsys.readouterr()
        assert "not a publish state file" in err and "Traceback" not in out + err


@pytest.mark.parametrize("rel", ["log.vkey", "checkpoint", ".cosigned-checkpoint"])
def test_a_log_file_that_is_not_utf8_is_refused_in_one_line(world, capsys, rel):
    """Found by mutating a log folder at random: a byte that is not UTF-8 in the log's verifier key or checkpoints
    ended 'log prove' in a traceback. Each is a bad note now: one line naming the file, exit 1."""
    tmp, keys, runs, _ = world
    logdir = tmp / "log"
    main(["log", "init", str(logdir), "--origin", "example.com/ml-runs", "--key", str(keys["log"][0])])
    main(["log", "add", str(logdir), str(runs[0]), "--pubkey", str(keys["run"][1]), "--key", str(keys["log"][0])])
    (logdir / rel).write_bytes((logdir / "checkpoint").read_bytes()[:30] + b"\xff\n")
    capsys.readouterr()
    assert main(["log", "prove", str(logdir), str(runs[0]), "--pubkey", str(keys["run"][1])]) == 1
    out, err = capsys.readouterr()
    assert f"{rel}: not a" in out + err and "not UTF-8 text" in out + err and "Traceback" not in out + err
    assert len((out + err).strip().splitlines()) == 1
