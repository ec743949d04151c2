"""Trust round 4's small problems, each as its attacker or user met it: a journal cut before the export and padded
with unsigned lines, a relative PKCS#11 module path, a folder the run never recorded, a key of the wrong kind."""

from __future__ import annotations

import json
import os

import pytest
from journal_tools import dump, read_lines, rechain, write_lines

from trainledger.cli import main
from trainledger.journal import Journal, StepObserved
from trainledger.journal.statements.release.export import record_export
from trainledger.training.health.mfu import record_compute


@pytest.fixture
def released(tmp_path, signer, capsys):
    model = tmp_path / "model"
    model.mkdir()
    (model / "w.bin").write_bytes(os.urandom(256))
    j = Journal.create(tmp_path / "journal.jsonl", signer=signer)
    for i in range(3):
        j.append(StepObserved(step=i, loss=1.0))
    record_export(j, model, step=2)
    record_compute(j)
    j.close()
    pub = tmp_path / "trainledger.pub"
    pub.write_text(signer.public.line() + "\n")
    assert main(["keygen", "--release", str(tmp_path / "keys")]) == 0
    assert main(["release", str(model), str(tmp_path / "journal.jsonl"), "--key", str(tmp_path / "keys" /
                 "release.key"), "--pubkey", str(pub)]) == 0
    capsys.readouterr()
    return {"model": model, "journal": tmp_path / "journal.jsonl", "pub": pub, "tmp": tmp_path,
            "release_key": tmp_path / "keys" / "release.key", "release_pub": tmp_path / "keys" / "release.pub"}


def _run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_a_journal_cut_before_the_export_and_padded_is_named_truncated(released, capsys):
    """The journal cut at the export, then padded with unsigned step lines chained as FORMAT.md says, so it is as
    long as before: verify-model --journal says it is cut short (its signed lines end early), never '--from N'."""
    lines = read_lines(released["journal"])
    export = next(i for i, x in enumerate(lines) if b'"model_exported"' in x)
    pad = [dump({"kind": "step_observed", "step": 100 + i, "loss": 0.5, "seq": 0, "ts": 1, "h": "0" * 64})
           for i in range(len(lines) - export)]
    write_lines(released["journal"], rechain(lines[:export] + pad))
    code, out, err = _run(capsys, "verify-model", released["model"], "--release-key", released["release_pub"],
                          "--pubkey", released["pub"], "--journal", released["journal"], "--json")
    res = json.loads(out)
    assert code == 1 and res["reason"] == "truncated" and "--from" not in err + out


def test_a_relative_pkcs11_module_path_is_refused(tmp_path, capsys, monkeypatch):
    """module-path=./x.so would load a library from the folder the command runs in."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.so").write_bytes(b"\x7fELF not a library")
    code, _, err = _run(capsys, "keygen", "--pkcs11", "pkcs11:token=t;object=k?module-path=./x.so",
                        tmp_path / "keys")
    assert code == 2 and "is not an absolute path" in err


def test_a_folder_never_recorded_is_refused_not_a_usage_error(released, capsys):
    other = released["tmp"] / "other"
    other.mkdir()
    (other / "w.bin").write_bytes(b"not the run's")
    code, out, _ = _run(capsys, "release", other, released["journal"], "--key", released["release_key"],
                        "--pubkey", released["pub"], "--json")
    res = json.loads(out.splitlines()[-1])
    assert code == 1 and res["reason"] == "not-recorded"


def test_a_key_of_the_wrong_kind_says_why_in_json(released, capsys):
    code, out, _ = _run(capsys, "verify-model", released["model"], "--release-key", released["pub"],
                        "--pubkey", released["pub"], "--json")
    res = json.loads(out)
    assert code == 2 and res["reason"] == "key-file" and "not a PEM public key" in res["error"]
