"""Keys that never touch a file: an Ed25519 key made inside a real SoftHSM token (Debian's softhsm2, a temporary
token per test) signs the journal's seals through PKCS#11 (python-pkcs11), and the journal verifies under the public
key exported once, exactly as a file-signed one does."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

MODULE = next((p for p in ("/usr/lib/softhsm/libsofthsm2.so", "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so")
               if Path(p).is_file()), None)
pytestmark = pytest.mark.skipif(MODULE is None or shutil.which("softhsm2-util") is None,
                                reason="Debian's softhsm2 is not installed (tools/setup.sh --dev installs it as root)")
pytest.importorskip("pkcs11", reason="python-pkcs11 (the dev and pkcs11 extras)")

from trainledger.journal import Journal, StepObserved, verify  # noqa: E402
from trainledger.journal.errors import KeyFileError, UsageError  # noqa: E402
from trainledger.journal.keys import load_signer  # noqa: E402


@pytest.fixture(scope="module")
def softhsm(tmp_path_factory):
    """One SoftHSM token for the module (its own config and store): the library reads its config once per process,
    so the tests share the token and each uses keys of its own labels."""
    d = tmp_path_factory.mktemp("softhsm")
    (d / "tokens").mkdir()
    conf = d / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {d / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n")
    old = os.environ.get("SOFTHSM2_CONF")
    os.environ["SOFTHSM2_CONF"] = str(conf)
    subprocess.run(["softhsm2-util", "--init-token", "--free", "--label", "tl", "--pin", "1234", "--so-pin", "5678"],
                   check=True, capture_output=True, timeout=60)
    yield conf
    if old is None:
        os.environ.pop("SOFTHSM2_CONF", None)
    else:
        os.environ["SOFTHSM2_CONF"] = old


@pytest.fixture
def token(softhsm, tmp_path, request):
    """``uri(label)``: a pkcs11: URI of a key of this test's own (labels prefixed by the test's name), the PIN in a
    0600 file of its own."""
    pin = tmp_path / "pin"
    pin.write_text("1234\n")
    pin.chmod(0o600)
    prefix = request.node.name[-24:]

    def uri(label: str = "run") -> str:
        return f"pkcs11:token=tl;object={prefix}-{label}?module-path={MODULE}&pin-source=file:{pin}"
    return uri


def test_a_journal_sealed_in_the_token_verifies_under_the_exported_key(token, tmp_path, capsys):
    from trainledger.cli import main

    assert main(["keygen", str(tmp_path / "keys"), "--pkcs11", token()]) == 0
    out = capsys.readouterr().out
    assert "in the token" in out and not (tmp_path / "keys" / "trainledger.key").exists()
    signer = load_signer(token())
    j = Journal.create(tmp_path / "j.jsonl", signer=signer)
    for i in range(100_000):
        j.append(StepObserved(step=i, loss=1.0 / (i + 1)))
    j.close()
    r = verify(tmp_path / "j.jsonl", keys=[signer.public])
    assert r.ok and r.events > 100_000 and r.key_id == signer.key_id
    assert main(["verify", str(tmp_path / "j.jsonl"), "--pubkey", str(tmp_path / "keys" / "trainledger.pub"),
                 "--require-closed"]) == 0
    assert main(["pubkey", token()]) == 0
    assert capsys.readouterr().out.strip().endswith(signer.key_id)
    # no private key bytes anywhere in the folders the run used
    for f in tmp_path.rglob("*"):
        if f.is_file() and "tokens" not in f.parts:
            assert b"PRIVATE KEY" not in f.read_bytes(), f


def test_a_recorder_run_signed_in_the_token_resumes_and_verifies(token, tmp_path):
    torch = pytest.importorskip("torch")
    from trainledger.journal.backends.hsm import generate_pkcs11_key
    from trainledger.training.recorder import Recorder

    pub = generate_pkcs11_key(token())
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        with Recorder(run, key=token(), model=model, optimizer=opt) as rec:
            for step in range(rec.start, 6):
                rec.step(step, float(6 - step))
                if step == 3:
                    rec.checkpoint(step, data_state={"batch": step + 1})
                if step == 4:
                    raise KeyboardInterrupt
    with Recorder(run, key=token(), model=model, optimizer=opt) as rec:
        assert rec.start == 4
        for step in range(rec.start, 6):
            rec.step(step, float(6 - step))
    assert verify(run / "journal.jsonl", keys=[pub], require_closed=True).ok
    for f in run.rglob("*"):
        if f.is_file():
            assert b"PRIVATE KEY" not in f.read_bytes(), f


def test_bad_uris_and_keys_are_one_line_errors(token, tmp_path):
    with pytest.raises(UsageError, match="pin-value is refused"):
        load_signer("pkcs11:token=tl;object=run?pin-value=1234")
    with pytest.raises(UsageError, match="object=LABEL"):
        load_signer("pkcs11:token=tl")
    with pytest.raises(KeyFileError, match="no single Ed25519 private key labelled '.*-nope'"):
        load_signer(token("nope"))
    with pytest.raises(UsageError, match="no signing back end for hashivault"):
        load_signer("hashivault://run-key")
    from trainledger.journal.backends.hsm import generate_pkcs11_key

    generate_pkcs11_key(token("k"))
    with pytest.raises(KeyFileError, match="already holds a key labelled '.*-k'"):
        generate_pkcs11_key(token("k"))
    # a wrong PIN, in a process of its own (a PKCS#11 login is the whole process's once made)
    (tmp_path / "pin").write_text("0000")
    done = subprocess.run([str(Path(os.sys.executable).with_name("trainledger")), "pubkey", token("k")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "cannot open the token (PinIncorrect)" in done.stderr, done.stderr
    assert "0000" not in done.stderr + done.stdout and "pin-source" not in done.stderr
    os.chmod(tmp_path / "pin", 0o644)
    with pytest.raises(KeyFileError, match="readable by others"):
        load_signer(token("k"))


def test_the_demo_command_signs_in_the_token(token, tmp_path, capsys, monkeypatch):
    from trainledger.cli import main
    from trainledger.journal.backends.hsm import generate_pkcs11_key
    from trainledger.journal.keys import KEY_DIR_ENV

    home = tmp_path / "key-home"
    home.mkdir()
    monkeypatch.setenv(KEY_DIR_ENV, str(home))  # where a command would put a key it makes: it makes none here
    pub = generate_pkcs11_key(token("demo"))
    assert main(["demo", str(tmp_path / "run"), "--key", token("demo"), "--steps", "300"]) == 0
    capsys.readouterr()
    assert (tmp_path / "run" / "trainledger.pub").read_text().strip() == pub.line()
    assert main(["verify", str(tmp_path / "run"), "--pubkey", str(tmp_path / "run" / "trainledger.pub"),
                 "--require-closed"]) == 0
    assert list(home.iterdir()) == []
    for f in tmp_path.rglob("*"):
        if f.is_file():
            assert b"PRIVATE KEY" not in f.read_bytes(), f


def test_a_torchrun_recorder_run_signed_by_rank_keys_the_token_certifies(token, tmp_path, capsys):
    """A real 2-rank torchrun DDP job with the Recorder, its key in the token: each rank signs with a key made in
    memory, certified once a round by the token's key (rank 0 alone signs with it); rank 1 is SIGKILLed and the
    restarted round makes new keys and a new certified roster. The folder verifies with only the token's public
    key pinned, and no file the run touched (the run folder, its checkpoints, the home folder) holds a private key."""
    import socket
    import sys

    from trainledger.cli import main
    from trainledger.journal import read_events

    assert main(["keygen", str(tmp_path / "keys"), "--pkcs11", token()]) == 0
    capsys.readouterr()
    run, home = tmp_path / "run", tmp_path / "home"
    home.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1", HOME=str(home))
    env.pop("TORCHELASTIC_RUN_ID", None)
    env.pop("TRAINLEDGER_RUN", None)
    worker = Path(__file__).resolve().parents[2] / "helpers" / "recorder_ddp_worker.py"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--max-restarts=1",
                           "--monitor-interval=0.1", "--master-addr=127.0.0.1", f"--master-port={port}",
                           str(worker), str(run), token(), "20", "14"],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    pub = tmp_path / "keys" / "trainledger.pub"
    token_key = pub.read_text().split()[2]
    for r in (0, 1):
        evs = list(read_events(run / f"rank-{r:05d}.jsonl"))
        certs = [e for e in evs if type(e).__struct_config__.tag == "key_certified"]
        assert [c.round for c in certs] == [0, 1] and len({c.key for c in certs}) == 2, proc.stderr[-4000:]
        assert [e.restart_count for e in evs if type(e).__struct_config__.tag == "rank_joined"] == [0, 1]
        assert evs[0].key_id != token_key  # the rank's own key, not the token's
    assert main(["verify", "--pubkey", str(pub), "--require-closed", str(run)]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 ranks verified" in out and "certificates of the rank keys" in out, out
    assert main(["replay", "--pubkey", str(pub), str(run)]) == 0
    assert capsys.readouterr().out.count("resumed 1") == 2
    for f in [*run.rglob("*"), *home.rglob("*"), *(tmp_path / "keys").rglob("*")]:
        if f.is_file():
            data = f.read_bytes()
            assert b"PRIVATE KEY" not in data and b"BEGIN OPENSSH" not in data, f
    assert not (tmp_path / "keys" / "trainledger.key").exists()
    # the same folder tampered with, rank 1 each time: every failure names the rank
    import shutil

    from journal_tools import read_lines, rechain, write_lines

    from trainledger.journal import Signer
    from trainledger.journal.certify import RankRoster

    def tampered(name, change):
        d = tmp_path / name
        shutil.copytree(run, d)
        change(d / "rank-00001.jsonl")
        assert main(["verify", "--pubkey", str(pub), str(d)]) == 1
        return capsys.readouterr()

    def uncertified(p):  # every seal re-signed by a key no certificate names
        write_lines(p, rechain(read_lines(p), resign=Signer.generate()))
    assert "rank 1: seal at seq" in tampered("uncertified", uncertified).out

    def other_roster(p):  # a rank journal of the same run certified by another key
        other, k = Signer.generate(), Signer.generate()
        run_id = read_events(run / "rank-00000.jsonl").__next__().run_id.rsplit(".", 1)[0]
        roster = RankRoster.sign(other, run=run_id, round=0, keys=[Signer.generate().public, k.public])
        p.unlink()
        with Journal.create(p, signer=k, run_id=f"{run_id}.r00001", certificate=roster.certificate(1)) as j:
            j.append(StepObserved(step=0, loss=1.0))
    out = tampered("other-roster", other_roster).out
    assert "rank 1: " in out and "which is not pinned" in out, out

    def round_zero_only(p):  # rank 1 rolled back to its first round: rank 0 anchored it with round 1's key
        lines = read_lines(p)
        cut = next(i for i, ln in enumerate(lines) if b'"kind":"key_certified"' in ln and b'"round":1' in ln)
        write_lines(p, lines[:cut])
    out = tampered("round-zero", round_zero_only).out
    assert "rank 1: signed by rank key " in out and "but rank 0 recorded at its seq" in out, out


@pytest.mark.parametrize("mode", ["delay", "strict"])
def test_the_token_pulled_out_mid_run_delays_seals_without_losing_a_step_or_fails_closed(tmp_path, mode):
    """A real SoftHSM token taken away mid-run (its folder moved: the library then refuses every call), in a process
    of its own: appends never wait for it and every step reaches the disk, the seals wait for a signature that never
    comes, and the journal verifies up to the last seal the token signed. Under fail_closed_after_s the run stops
    within about that long, in one line."""
    import json
    import sys

    from trainledger.journal import load_public_key

    helper = Path(__file__).resolve().parents[2] / "helpers" / "pulled_token.py"
    proc = subprocess.run([sys.executable, str(helper), str(tmp_path / "w"), mode], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "gave no signature in 1 s" in got["close"]  # a run cannot end signed without its key
    rep = verify(tmp_path / "w" / "journal.jsonl", keys=[load_public_key(tmp_path / "w" / "run.pub")],
                 allow_unsealed=True)
    assert rep.ok and rep.kinds["step_observed"] == got["steps_on_disk"]
    assert rep.last_sealed_seq >= 1000 and rep.unsealed_events >= got["appended"]  # signed before, unsigned after
    if mode == "delay":
        assert got["appended"] == 5000 and got["steps_on_disk"] == 6000 and got["failed"] is None
        assert got["slowest_append_ms"] < 50  # no append waited for the token (a signature attempt alone is ~0.2 ms)
    else:
        assert 0.5 <= got["failed"]["after_s"] < 5 and "fails closed" in got["failed"]["error"]
        assert "no signature from key" in got["failed"]["error"] and got["steps_on_disk"] == 1000 + got["appended"]


def test_a_witness_cosigns_with_its_key_in_the_token(token, tmp_path, capsys):
    """The witness's key in a token too: `witness vkey` and `witness cosign` take the pkcs11: URI, and a verifier
    pinning the printed verifier key counts the cosignature."""
    from trainledger.cli import main
    from trainledger.journal import Signer

    run_key = Signer.generate()
    (tmp_path / "run.pub").write_text(run_key.public.line() + "\n")
    j = Journal.create(tmp_path / "j.jsonl", signer=run_key)
    for i in range(300):
        j.append(StepObserved(step=i, loss=1.0))
    j.close()
    assert main(["keygen", str(tmp_path / "w"), "--pkcs11", token("witness")]) == 0
    capsys.readouterr()
    assert main(["witness", "vkey", "--key", token("witness"), "--name", "w1"]) == 0
    vkey = capsys.readouterr().out.strip()
    assert vkey.startswith("w1+")
    b, cos = tmp_path / "b.json", tmp_path / "cos.json"
    assert main(["prove", str(tmp_path / "j.jsonl"), "--seq", "3", "-o", str(b), "--pubkey",
                 str(tmp_path / "run.pub")]) == 0
    assert main(["witness", "cosign", str(b), "--key", token("witness"), "--name", "w1", "--state",
                 str(tmp_path / "state.json"), "--log-key", str(tmp_path / "run.pub"), "-o", str(cos)]) == 0
    capsys.readouterr()
    assert main(["verify-proof", str(cos), "--pubkey", str(tmp_path / "run.pub"), "--witness-key", vkey]) == 0
    assert "cosigned by w1" in capsys.readouterr().out


def test_a_release_signed_in_the_token_is_accepted_by_model_signing(token, tmp_path, capsys):
    """The release key in a token too (ECDSA P-256, made there by keygen --release --pkcs11): a run signed in the
    token, its model released with the token's release key, and OpenSSF model signing's own verifier (the library)
    and verify-model accept it; no private key in any file."""
    pytest.importorskip("model_signing")
    torch = pytest.importorskip("torch")
    import json

    import model_signing

    from trainledger.cli import main
    from trainledger.training.recorder import Recorder

    assert main(["keygen", str(tmp_path / "keys"), "--pkcs11", token("run")]) == 0
    assert main(["keygen", str(tmp_path / "keys"), "--release", "--pkcs11", token("release")]) == 0
    out = capsys.readouterr().out
    assert "in the token" in out and not list((tmp_path / "keys").glob("*.key"))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = tmp_path / "run"
    with Recorder(run, key=token("run"), model=model, optimizer=opt, release_key=token("release")) as rec:
        for step in range(5):
            loss = ((model(torch.randn(8, 4)) - 1) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(step, loss.item())
        rec.checkpoint(4)
        folder = run / "export"
        folder.mkdir()
        torch.save(model.state_dict(), folder / "weights.pt")
        (folder / "config.json").write_text(json.dumps({"d": 4}))
        rec.record_export(folder)
    assert (folder / "model.sig").is_file()  # released at close with the token's release key
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=tmp_path / "keys" / "release.pub").verify(
        folder, folder / "model.sig")
    assert main(["verify-model", str(folder), "--release-key", str(tmp_path / "keys" / "release.pub"), "--pubkey",
                 str(tmp_path / "keys" / "trainledger.pub"), "--journal", str(run)]) == 0
    for f in [*run.rglob("*"), *(tmp_path / "keys").rglob("*")]:
        if f.is_file():
            assert b"PRIVATE KEY" not in f.read_bytes(), f


def test_a_copy_of_a_software_tokens_folder_and_pin_signs_as_the_run(token, softhsm, tmp_path, capsys):
    """What docs/keys.md says a software token does not protect against: SoftHSM's key is a file of its token folder
    encrypted under the PIN, so a copy of the folder and the PIN file, used with SoftHSM's library elsewhere, signs
    journals that verify under the run's key (a token in hardware cannot be copied so)."""
    import sys

    from trainledger.cli import main

    uri = token("copied")
    assert main(["keygen", str(tmp_path / "keys"), "--pkcs11", uri]) == 0
    capsys.readouterr()
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(softhsm.parent / "tokens", elsewhere / "tokens")
    conf = elsewhere / "softhsm2.conf"
    conf.write_text(f"directories.tokendir = {elsewhere / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n")
    code = ("import sys; from trainledger.journal import Journal, StepObserved; from trainledger.journal.keys import "
            "load_signer\nwith Journal.create(sys.argv[2], signer=load_signer(sys.argv[1])) as j:\n"
            "    j.append(StepObserved(step=0, loss=1.0))\n")
    subprocess.run([sys.executable, "-c", code, uri, str(tmp_path / "forged.jsonl")], check=True, timeout=120,
                   env=dict(os.environ, SOFTHSM2_CONF=str(conf)), capture_output=True)
    from trainledger.journal import load_public_key

    assert verify(tmp_path / "forged.jsonl", keys=[load_public_key(tmp_path / "keys" / "trainledger.pub")]).ok
