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
    from trainledger.journal.hsm import generate_pkcs11_key
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
    with pytest.raises(UsageError, match="no signing back end for awskms"):
        load_signer("awskms:///alias/run")
    from trainledger.journal.hsm import generate_pkcs11_key

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
    from trainledger.journal.keys import KEY_DIR_ENV, generate_pkcs11_key

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
