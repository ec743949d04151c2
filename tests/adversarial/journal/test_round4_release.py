"""Trust round 4, the release: an attacker who can write the release folder (no key), and a holder of only the
release key, against ``release`` and ``verify-model``. Each attack is written the way an outsider would write it:
the public commands, the files they write and the formats the docs give (a DSSE envelope re-signed with the
release key's PEM through ``cryptography``, not trainledger's signer)."""

from __future__ import annotations

import base64
import json
import os
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from trainledger.cli import main
from trainledger.journal import Journal, StepObserved
from trainledger.training.kinds import CheckpointSaved, RunConfigured
from trainledger.journal.paths import file_sha256
from trainledger.journal.statements.release.export import record_export
from trainledger.training.health.mfu import record_compute


@pytest.fixture
def run(tmp_path, signer):
    """A closed run (the Journal API, no torch): configured, three steps, a checkpoint whose bytes are the exported
    weights' and a config beside them, the export, the compute total; the release key from ``keygen --release``."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    weights = os.urandom(4096)
    (run / "checkpoints" / "step-2.bin").write_bytes(weights)
    model = run / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(weights)
    (model / "config.json").write_text('{"d": 4}')
    j = Journal.create(run / "journal.jsonl", signer=signer)
    j.append(RunConfigured(n_params=1000, n_layer=2, n_head=2, head_dim=8, seq_len=16))
    for i in range(3):
        j.append(StepObserved(step=i, loss=1.0 / (i + 1), tokens=64))
    digest, size = file_sha256(run / "checkpoints" / "step-2.bin")
    j.append(CheckpointSaved(step=2, path="checkpoints/step-2.bin", bytes=size, sha256=digest, contents=["model"],
                             duration_s=0.01), durable=True)
    record_export(j, model, step=2, checkpoint="checkpoints/step-2.bin", relative_to=run)
    record_compute(j)
    j.close()
    pub = tmp_path / "trainledger.pub"
    pub.write_text(signer.public.line() + "\n")
    assert main(["keygen", "--release", str(tmp_path / "keys")]) == 0
    return {"run": run, "model": model, "pub": pub, "key": tmp_path / "keys" / "release.key",
            "release_pub": tmp_path / "keys" / "release.pub", "tmp": tmp_path}


def _release(r, capsys, *extra):
    code = main(["release", str(r["model"]), str(r["run"] / "journal.jsonl"), "--key", str(r["key"]),
                 "--pubkey", str(r["pub"]), *map(str, extra)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def _verify(r, capsys, *extra, folder=None):
    code = main(["verify-model", str(folder or r["model"]), "--release-key", str(r["release_pub"]),
                 "--pubkey", str(r["pub"]), *map(str, extra)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def _resign(path: Path, key_pem: Path, edit) -> None:
    """The release key holder's forgery: decode the DSSE payload, edit the in-toto statement, sign DSSE's PAE again
    with ECDSA P-256 / SHA-256 (the Sigstore bundle keeps its key hint)."""
    bundle = json.loads(path.read_text())
    st = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    edit(st)
    payload = json.dumps(st).encode()
    ptype = bundle["dsseEnvelope"]["payloadType"].encode()
    pae = b"DSSEv1 %d %s %d %s" % (len(ptype), ptype, len(payload), payload)
    key = serialization.load_pem_private_key(key_pem.read_bytes(), password=None)
    sig = key.sign(pae, ec.ECDSA(hashes.SHA256()))
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(payload).decode()
    bundle["dsseEnvelope"]["signatures"] = [{"sig": base64.b64encode(sig).decode(), "keyid": ""}]
    path.write_text(json.dumps(bundle))


def test_release_out_writes_through_no_link_planted_in_the_folder(run, capsys):
    """An attacker who can write the --out folder plants links at every name release might write: the files the
    links lead to are untouched, and release writes its own files."""
    out = run["tmp"] / "out"
    out.mkdir()
    victim = run["tmp"] / "victim.txt"
    victim.write_text("the operator's file")
    for name in ("model.sig.tmp", "model.provenance.json.tmp", ".model.sig.tmp", "model.sig"):
        (out / name).symlink_to(victim)
    code, _, err = _release(run, capsys, "--out", out)
    assert code == 0, err
    assert victim.read_text() == "the operator's file"
    for name in ("model.sig", "model.provenance.json"):
        assert (out / name).is_file() and not (out / name).is_symlink()
        json.loads((out / name).read_text())
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]  # nothing half-written


def test_a_release_verifies_and_says_the_weights_are_the_checkpoints_bytes_or_converted(run, capsys):
    assert _release(run, capsys)[0] == 0
    code, out, _ = _verify(run, capsys)
    assert code == 0 and "byte-identical" not in out  # config.json is not in the checkpoint
    assert "converted or merged from checkpoint checkpoints/step-2.bin, as the run recorded: 1 of its 2 files are " \
           "that checkpoint's bytes (weights.bin)" in out
    code, out, _ = _verify(run, capsys, "--json")
    w = json.loads(out)["weights"]
    assert code == 0 and w["relation"] == "converted" and w["same_files"] == ["weights.bin"]
    assert json.loads(out)["closed"] is True


def test_a_release_of_a_checkpoints_own_bytes_says_byte_identical(run, capsys, signer, tmp_path):
    """An export of exactly the checkpoint's bytes (a one-file checkpoint and a one-file model)."""
    r = tmp_path / "r2"
    (r / "model").mkdir(parents=True)
    (r / "model" / "weights.bin").write_bytes(b"w" * 1000)
    j = Journal.create(r / "journal.jsonl", signer=signer)
    j.append(StepObserved(step=0, loss=1.0))
    digest, size = file_sha256(r / "model" / "weights.bin")
    j.append(CheckpointSaved(step=0, path="ck.bin", bytes=size, sha256=digest, contents=["model"], duration_s=0.0))
    record_export(j, r / "model", step=0, checkpoint="ck.bin")
    record_compute(j)
    j.close()
    assert main(["release", str(r / "model"), str(r / "journal.jsonl"), "--key", str(run["key"]),
                 "--pubkey", str(run["pub"])]) == 0
    capsys.readouterr()
    code, out, _ = _verify(run, capsys, folder=r / "model")
    assert code == 0 and "the weights: byte-identical to checkpoint ck.bin (all 1 files are its bytes)" in out


@pytest.mark.parametrize("field, edit", [
    ("internalParameters", lambda p: p["buildDefinition"]["internalParameters"].update(step=1)),
    ("checkpoint", lambda p: p["buildDefinition"]["internalParameters"].update(checkpoint="checkpoints/best.bin")),
    ("run_configured", lambda p: p["buildDefinition"]["externalParameters"]["run_configured"].update(
        n_params=7_000_000_000)),
    ("run_configured", lambda p: p["buildDefinition"]["externalParameters"].update(run_configured=None)),
    ("resolvedDependencies", lambda p: p["buildDefinition"]["resolvedDependencies"].append(
        {"name": "base-model", "digest": {"sha256": "ab" * 32}, "annotations": {"run_id": "llama", "generation": 1}})),
    ("manifest_id", lambda p: p["buildDefinition"]["externalParameters"].update(manifest_id="sha256:" + "cd" * 32)),
    ("builder", lambda p: p["runDetails"]["builder"]["version"].update(trainledger="9.9")),
    ("metadata", lambda p: p["runDetails"]["metadata"].update(startedOn="2020-01-01T00:00:00.000000Z")),
    ("buildType", lambda p: p["buildDefinition"].update(buildType="https://example.com/other")),
])
def test_provenance_fields_rewritten_under_the_release_key_are_refused_by_name(run, capsys, field, edit):
    """A holder of the release key edits a field SLSA tooling reads and signs the provenance again: every field
    trainledger writes must be the proven lines', so verify-model refuses it, naming the field."""
    assert _release(run, capsys)[0] == 0
    _resign(run["model"] / "model.provenance.json", run["key"], lambda st: edit(st["predicate"]))
    code, out, _ = _verify(run, capsys, "--json")
    res = json.loads(out)
    assert code == 1 and res["reason"] == "provenance-mismatch" and field in res["error"]


def test_a_run_configured_not_in_force_is_caught_against_the_journal(run, capsys, signer, tmp_path):
    """The release key holder proves an earlier run_configured (anyone can prove any line) and states it: the
    proof alone cannot tell, the journal can (verify-model --journal)."""
    r = tmp_path / "r3"
    (r / "model").mkdir(parents=True)
    (r / "model" / "w.bin").write_bytes(b"x" * 100)
    j = Journal.create(r / "journal.jsonl", signer=signer)
    j.append(RunConfigured(loss_window=32))
    j.append(StepObserved(step=0, loss=1.0))
    j.append(RunConfigured(loss_window=48))  # the one in force at the export
    j.append(StepObserved(step=1, loss=1.0))
    record_export(j, r / "model", step=1)
    record_compute(j)
    j.close()
    assert main(["release", str(r / "model"), str(r / "journal.jsonl"), "--key", str(run["key"]),
                 "--pubkey", str(run["pub"])]) == 0
    capsys.readouterr()
    # the forgery: a proof of the first configuration instead (trainledger prove), the provenance made from it
    prov = r / "model" / "model.provenance.json"
    st = json.loads(base64.b64decode(json.loads(prov.read_text())["dsseEnvelope"]["payload"]))
    proof = json.loads(base64.b64decode(st["predicate"]["runDetails"]["byproducts"][0]["content"]))
    configs = [json.loads(line)["seq"] for line in (r / "journal.jsonl").read_text().splitlines()
               if json.loads(line)["kind"] == "run_configured"]
    seqs = sorted({e["seq"] for e in proof["entries"]} - {configs[1]} | {configs[0]})
    assert main(["prove", str(r / "journal.jsonl"), *sum((["--seq", str(s)] for s in seqs), []), "--pubkey",
                 str(run["pub"]), "--out", str(tmp_path / "p.json")]) == 0
    capsys.readouterr()
    forged = json.loads((tmp_path / "p.json").read_text())
    raw = json.dumps(forged, separators=(",", ":"), sort_keys=True).encode()

    def edit(st):
        import hashlib

        p = st["predicate"]
        p["buildDefinition"]["externalParameters"]["run_configured"]["loss_window"] = 32
        b = p["runDetails"]["byproducts"][0]
        b["content"] = base64.b64encode(raw).decode()
        b["digest"]["sha256"] = hashlib.sha256(raw).hexdigest()
        b["annotations"]["lines"] = {str(e["seq"]): json.loads(e["line"])["kind"] for e in forged["entries"]}
    _resign(prov, run["key"], edit)
    code, out, err = _verify(run, capsys, folder=r / "model")
    assert code == 0, err  # the proof holds and the provenance is what it proves...
    code, out, _ = _verify(run, capsys, "--journal", r / "journal.jsonl", "--json", folder=r / "model")
    res = json.loads(out)
    assert code == 1 and res["reason"] == "config-not-in-force" and f"seq {configs[1]}" in res["error"]  # ...the journal tells


def test_a_huge_file_planted_in_a_released_folder_is_named_before_it_is_read(run, capsys):
    """A 64 GiB sparse file beside the weights: 'extra' at once, nothing hashed (reading it would take minutes)."""
    assert _release(run, capsys)[0] == 0
    with open(run["model"] / "planted.bin", "wb") as f:
        f.truncate(64 << 30)
    t0 = time.process_time()
    code, _, err = _verify(run, capsys)
    assert code == 1 and "extra: planted.bin" in err
    assert time.process_time() - t0 < 20  # CPU, not wall: hashing 64 GiB takes minutes of it
    (run["model"] / "planted.bin").unlink()
    with open(run["model"] / "weights.bin", "r+b") as f:  # a signed file grown to 64 GiB: its size is named
        f.truncate(64 << 30)
    code, _, err = _verify(run, capsys)
    assert code == 1 and "changed: weights.bin (68,719,476,736 bytes, the run recorded 4,096" in err


def test_a_renamed_file_is_still_named_a_rename(run, capsys):
    assert _release(run, capsys)[0] == 0
    os.rename(run["model"] / "weights.bin", run["model"] / "weights2.bin")
    code, _, err = _verify(run, capsys)
    assert code == 1 and "renamed: weights.bin is now weights2.bin" in err


def test_a_total_followed_by_another_is_not_called_the_runs_last(run, capsys, signer, tmp_path):
    """Two totals after the export (record_compute is public): the release rests on the first, and verify-model
    does not call it the run's last, though every line to the close is proven."""
    r = tmp_path / "r4"
    (r / "model").mkdir(parents=True)
    (r / "model" / "w.bin").write_bytes(b"y" * 64)
    j = Journal.create(r / "journal.jsonl", signer=signer)
    j.append(StepObserved(step=0, loss=1.0))
    record_export(j, r / "model", step=0)
    record_compute(j)
    record_compute(j)
    j.close()
    assert main(["release", str(r / "model"), str(r / "journal.jsonl"), "--key", str(run["key"]),
                 "--pubkey", str(run["pub"])]) == 0
    capsys.readouterr()
    code, out, _ = _verify(run, capsys, "--json", folder=r / "model")
    assert code == 0 and json.loads(out)["closed"] is False
