"""verify-model and release against hostile folders and files, torch-free (the core install): each is refused
with a one-line reason and the documented exit code, without hanging, reading without bound or leaving the
folder."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from trainledger.journal import Journal, StepObserved
from trainledger.journal.statements.release.attest import release, signature_statement
from trainledger.journal.statements.release.dsse import MAX_BUNDLE_BYTES, sign_statement
from trainledger.journal.statements.release.export import record_export
from trainledger.journal.statements.release.keys import ReleaseKey
from trainledger.journal.statements.release.manifest import model_manifest
from trainledger.training.health.mfu import record_compute


@pytest.fixture
def released(tmp_path, signer):
    """A journal written with the Journal API alone (no torch): steps, an export, the compute total, closed."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(os.urandom(4096))
    (model / "config.json").write_text('{"d": 4}')
    j = Journal.create(tmp_path / "journal.jsonl", signer=signer)
    for i in range(3):
        j.append(StepObserved(step=i, loss=1.0 / (i + 1)))
    record_export(j, model, step=2)
    record_compute(j)
    j.close()
    key = ReleaseKey.generate()
    key.save(tmp_path / "release.key")
    release(model, tmp_path / "journal.jsonl", key, keys=[signer.public])
    pub = tmp_path / "trainledger.pub"
    pub.write_text(signer.public.line() + "\n")
    return {"model": model, "key": key, "pub": pub, "release_pub": tmp_path / "release.pub", "tmp": tmp_path}


def _verify(capsys, r, *extra):
    from trainledger.cli import main

    code = main(["verify-model", str(r["model"]), "--release-key", str(r["release_pub"]), "--pubkey", str(r["pub"]),
                 *map(str, extra)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_the_torch_free_release_verifies(released, capsys):
    code, out, _ = _verify(capsys, released)
    assert code == 0 and "step 2; the weights: not a recorded checkpoint's weights" in out
    assert "the run's last total: every line from it to the run's close is proven" in out


@pytest.mark.parametrize("content, says", [
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    (b"[1, 2]", "not a Sigstore bundle"),
    (b'{"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json", "dsseEnvelope": {"payloadType": '
     b'"application/vnd.in-toto+json", "payload": "%%%", "signatures": [{"sig": "AA=="}]}}', "not base64"),
    (b"\xff\xfe not json", "not JSON"),
    (b"", "not JSON"),
])
def test_a_hostile_signature_is_named_not_a_traceback(released, capsys, content, says):
    (released["model"] / "model.sig").write_bytes(content)
    code, _, err = _verify(capsys, released)
    assert code == 1 and says in err and len(err.strip().splitlines()) == 1


def test_a_signature_too_big_is_refused_before_it_is_read(released, capsys):
    with open(released["model"] / "model.sig", "wb") as f:
        f.truncate(MAX_BUNDLE_BYTES + 10)
    code, _, err = _verify(capsys, released)
    assert code == 1 and "over the" in err


def test_a_symbolic_link_or_a_fifo_in_the_folder_is_refused_without_reading_it(released, capsys, tmp_path):
    secret = tmp_path / "outside.txt"
    secret.write_text("not the model's")
    (released["model"] / "link").symlink_to(secret)
    code, _, err = _verify(capsys, released)
    assert code == 1 and "a symbolic link" in err  # a tampered folder: integrity (1), not usage (2)
    (released["model"] / "link").unlink()
    os.mkfifo(released["model"] / "pipe")  # reading it would hang
    code, _, err = _verify(capsys, released)
    assert code == 1 and "neither a file nor a folder" in err


def test_a_signed_statement_cannot_steer_the_hash_outside_the_folder(released, capsys):
    """Even under the release key, a signature whose ignore list climbs out of the folder is refused."""
    m = model_manifest(released["model"])
    st = signature_statement(m)
    st["predicate"]["serialization"]["ignore_paths"].append("../../etc")
    (released["model"] / "model.sig").write_text(json.dumps(sign_statement(st, released["key"])))
    code, _, err = _verify(capsys, released)
    assert code == 1 and "an ignored path outside the folder" in err


def test_an_unsigned_or_resigned_payload_is_refused(released, capsys):
    sig = json.loads((released["model"] / "model.sig").read_text())
    st = json.loads(base64.b64decode(sig["dsseEnvelope"]["payload"]))
    st["subject"][0]["name"] = "another"
    sig["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(st).encode()).decode()  # the signature is stale
    (released["model"] / "model.sig").write_text(json.dumps(sig))
    code, _, err = _verify(capsys, released)
    assert code == 1 and "does not verify" in err


def test_a_missing_provenance_or_key_file_is_a_usage_error(released, capsys):
    (released["model"] / "model.provenance.json").unlink()
    code, _, err = _verify(capsys, released)
    assert code == 2 and "no provenance" in err
    released["release_pub"] = Path(released["tmp"]) / "nope.pub"
    code, _, err = _verify(capsys, released)
    assert code == 2 and "nope.pub" in err


def test_a_fifo_or_a_link_planted_as_the_signature_is_refused_without_a_hang(released, capsys, tmp_path):
    sig = released["model"] / "model.sig"
    sig.unlink()
    os.mkfifo(sig)  # opening it for reading would block until someone writes
    code, _, err = _verify(capsys, released)
    assert code == 1 and "is not a regular file" in err
    sig.unlink()
    outside = tmp_path / "elsewhere.sig"
    outside.write_text("{}")
    sig.symlink_to(outside)  # a file outside the folder, named as the folder's
    code, _, err = _verify(capsys, released)
    assert code == 1 and "symbolic link" in err


def test_a_base_models_planted_provenance_is_no_claim(tmp_path):
    """A fine-tune records what its base's provenance claims; a link, a nesting bomb or garbage there is no claim
    (the base's digest is still recorded), never read outside the folder or raised."""
    from trainledger.journal.statements.release.export import base_of

    base = tmp_path / "base"
    base.mkdir()
    (base / "weights.bin").write_bytes(b"w")
    outside = tmp_path / "secret.json"
    outside.write_text('{"dsseEnvelope": {"payload": ""}}')
    digest = model_manifest(base).digest
    (base / "model.provenance.json").symlink_to(outside)
    assert base_of(base) == (digest, None, [])
    (base / "model.provenance.json").unlink()
    payload = base64.b64encode(b"[" * 100_000 + b"]" * 100_000).decode()
    (base / "model.provenance.json").write_text(json.dumps({"dsseEnvelope": {"payload": payload}}))
    assert base_of(base) == (digest, None, [])
