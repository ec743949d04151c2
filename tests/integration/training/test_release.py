"""Releasing a model the run recorded: model.sig that OpenSSF model signing's own verifier (library and CLI)
accepts, SLSA provenance bound to the journal, and verify-model's refusals, each with its reason."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import model_signing  # noqa: E402  (the dev extra: its own verifier is the reference for model.sig)

from trainledger.journal.errors import UsageError  # noqa: E402
from trainledger.journal.statements.release.attest import provenance_statement, release  # noqa: E402
from trainledger.journal.statements.release.dsse import ReleaseSignatureError, sign_statement  # noqa: E402
from trainledger.journal.statements.release.keys import ReleaseKey  # noqa: E402
from trainledger.journal.statements.release.manifest import PROVENANCE, model_manifest  # noqa: E402
from trainledger.journal.statements.release.verify import ModelRefused, verify_model  # noqa: E402
from trainledger.training.recorder import Recorder  # noqa: E402


def _train(run: Path, signer, *, exports=(4,), steps: int = 5, seed: int = 0) -> dict[int, Path]:
    """A tiny regression recorded by the Recorder; at each step in ``exports`` its weights are written to a folder
    (safetensors-like: a state dict and a config) and recorded as model_exported."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = {}
    with Recorder(run, signer=signer, model=model, optimizer=opt) as rec:
        for step in range(steps):
            x = torch.randn(8, 4)
            loss = ((model(x) - 1) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            rec.step(step, loss.item())
            if step in exports:
                rec.checkpoint(step)
                folder = run / f"export-{step}"
                folder.mkdir()
                torch.save(model.state_dict(), folder / "weights.pt")
                (folder / "config.json").write_text(json.dumps({"d": 4, "seed": seed}))
                rec.record_export(folder)
                out[step] = folder
    return out


@pytest.fixture
def released(tmp_path, signer):
    run = tmp_path / "run"
    [model] = _train(run, signer).values()
    key = ReleaseKey.generate()
    key.save(tmp_path / "release.key")
    res = release(model, run / "journal.jsonl", key, keys=[signer.public])
    return {"run": run, "model": model, "key": key, "res": res, "tmp": tmp_path}


def test_a_release_is_model_signing_and_verify_model_reads_its_run(released, signer):
    r = released
    assert (r["model"] / "model.sig").is_file() and (r["model"] / PROVENANCE).is_file()
    # OpenSSF model signing's own verifier, the library and the CLI, with the release key's public half
    model_signing.verifying.Config().use_elliptic_key_verifier(public_key=r["tmp"] / "release.pub").verify(
        r["model"], r["model"] / "model.sig")
    cli = Path(sys.executable).with_name("model_signing")
    done = subprocess.run([str(cli), "verify", "key", "--signature", str(r["model"] / "model.sig"), "--public_key",
                           str(r["tmp"] / "release.pub"), str(r["model"])], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    # its digest is model signing's own
    ms = model_signing.hashing.Config().set_ignored_paths(paths=["model.sig", PROVENANCE]).hash(r["model"])
    assert {rd.identifier: rd.digest.digest_hex for rd in ms.resource_descriptors()} == \
        {f.path: f.sha256 for f in model_manifest(r["model"]).files}
    v = verify_model(r["model"], release_keys=[r["key"].public], run_keys=[signer.public],
                     journal=r["run"] / "journal.jsonl")
    assert (v.step, v.final, v.run_id, v.checkpoint["path"]) == (4, True, r["res"].run_id,
                                                                  "checkpoints/step-000000004.pt")
    assert v.compute["steps"] == 5 and v.compute["last_step"] == 4 and v.journal["events"] > v.tree_size - 1


@pytest.mark.parametrize("tamper, reason", [
    (lambda m: (m / "config.json").write_text('{"d": 5}'), "changed-file"),
    (lambda m: (m / "config.json").rename(m / "config2.json"), "renamed-file"),
    (lambda m: (m / "config.json").unlink(), "missing-file"),
    (lambda m: (m / "notes.txt").write_text("hi"), "extra-file"),
])
def test_a_changed_renamed_missing_or_extra_file_is_refused_by_name(released, signer, tamper, reason):
    tamper(released["model"])
    with pytest.raises(ModelRefused) as e:
        verify_model(released["model"], release_keys=[released["key"].public], run_keys=[signer.public])
    assert e.value.reason == reason
    with pytest.raises(ValueError):  # model signing agrees there is something wrong
        model_signing.verifying.Config().use_elliptic_key_verifier(
            public_key=released["tmp"] / "release.pub").verify(released["model"], released["model"] / "model.sig")


def test_keys_not_pinned_or_not_the_signers_are_refused(released, signer):
    with pytest.raises(UsageError, match="no release key pinned"):
        verify_model(released["model"], release_keys=[], run_keys=[signer.public])
    with pytest.raises(ReleaseSignatureError, match="not a pinned release key"):
        verify_model(released["model"], release_keys=[ReleaseKey.generate().public], run_keys=[signer.public])
    from trainledger.journal import Signer
    from trainledger.journal.errors import UntrustedKey

    with pytest.raises(UntrustedKey):
        verify_model(released["model"], release_keys=[released["key"].public], run_keys=[Signer.generate().public])


def test_the_provenance_of_another_model_or_run_is_refused(released, signer, tmp_path):
    r = released
    # another run's release, beside these weights
    from trainledger.journal import Signer

    other_signer = Signer.generate()
    [other] = _train(tmp_path / "other", other_signer, seed=1).values()
    release(other, tmp_path / "other" / "journal.jsonl", r["key"], keys=[other_signer.public])
    shutil.copy(other / PROVENANCE, r["model"] / PROVENANCE)
    with pytest.raises(ModelRefused) as e:
        verify_model(r["model"], release_keys=[r["key"].public], run_keys=[signer.public, other_signer.public])
    assert e.value.reason == "another-model"
    # a provenance for these files whose proof is of the other run (signed by the release key's holder)
    prov = json.loads((other / PROVENANCE).read_text())
    st = json.loads(__import__("base64").b64decode(prov["dsseEnvelope"]["payload"]))
    proof = json.loads(__import__("base64").b64decode(st["predicate"]["runDetails"]["byproducts"][0]["content"]))
    m = model_manifest(r["model"])
    exp = type("E", (), {"base": None, "base_release": None, "step": 4, "checkpoint": None, "path": "x"})()
    forged = provenance_statement(m, run_id=r["res"].run_id, key_id=signer.public.key_id, software={},
                                  opened_ts=None, finished_ts=None, config=None, manifest_id=None, export=exp,
                                  proof=proof)
    (r["model"] / PROVENANCE).write_text(json.dumps(sign_statement(forged, r["key"])))
    with pytest.raises(ModelRefused) as e:
        verify_model(r["model"], release_keys=[r["key"].public], run_keys=[signer.public, other_signer.public])
    assert e.value.reason == "another-run"


def test_an_earlier_export_passed_off_as_the_final_model_is_refused(tmp_path, signer):
    run = tmp_path / "run"
    folders = _train(run, signer, exports=(2, 4))
    key = ReleaseKey.generate()
    release(folders[2], run / "journal.jsonl", key, keys=[signer.public])
    with pytest.raises(ModelRefused, match="went on to step 4") as e:
        verify_model(folders[2], release_keys=[key.public], run_keys=[signer.public])
    assert e.value.reason == "not-final"
    v = verify_model(folders[2], release_keys=[key.public], run_keys=[signer.public], allow_intermediate=True)
    assert (v.step, v.final) == (2, False)


def test_a_journal_forked_or_cut_short_after_the_release_is_refused(released, signer, tmp_path):
    from journal_tools import dump, parse, read_lines, rechain, write_lines

    r = released
    j = r["run"] / "journal.jsonl"
    lines = read_lines(j)
    exp_seq = r["res"].export_seq
    forked = tmp_path / "forked.jsonl"
    i = next(k for k, ln in enumerate(lines) if parse(ln)["kind"] == "step_observed")
    obj = parse(lines[i])
    obj["loss"] = obj["loss"] * 0.5  # history rewritten, re-signed with the run's own key
    write_lines(forked, rechain(lines[:i] + [dump(obj)] + lines[i + 1:], resign=signer))
    with pytest.raises(ModelRefused) as e:
        verify_model(r["model"], release_keys=[r["key"].public], run_keys=[signer.public], journal=forked)
    assert e.value.reason == "fork"
    cut = tmp_path / "cut.jsonl"
    write_lines(cut, rechain(lines[:exp_seq - 1], resign=signer))
    with pytest.raises(ModelRefused) as e:
        verify_model(r["model"], release_keys=[r["key"].public], run_keys=[signer.public], journal=cut)
    assert e.value.reason == "truncated"


def test_a_folder_the_run_did_not_record_is_not_released(tmp_path, signer):
    run = tmp_path / "run"
    [model] = _train(run, signer).values()
    (model / "config.json").write_text("{}")
    from trainledger.journal.statements.release.attest import ModelRefused

    with pytest.raises(ModelRefused, match="no model_exported of this folder") as e:  # a refusal: exit 1, not usage
        release(model, run / "journal.jsonl", ReleaseKey.generate(), keys=[signer.public])
    assert e.value.reason == "not-recorded" and e.value.exit_code == 1


def test_the_commands_end_to_end(tmp_path, signer, capsys):
    from trainledger.cli import main

    run = tmp_path / "run"
    [model] = _train(run, signer).values()
    pub = tmp_path / "trainledger.pub"
    pub.write_text(signer.public.line() + "\n")
    assert main(["keygen", "--release", str(tmp_path / "keys"), "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    assert made["kind"] == "ecdsa-p256" and (tmp_path / "keys" / "release.pub").is_file()
    assert main(["release", str(model), str(run), "--key", str(tmp_path / "keys" / "release.key"),
                 "--pubkey", str(pub), "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["step"] == 4
    assert main(["verify-model", str(model), "--release-key", str(tmp_path / "keys" / "release.pub"),
                 "--pubkey", str(pub), "--journal", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK ") and ("step 4; the weights: converted or merged from checkpoint "
                                      "checkpoints/step-000000004.pt, as the run recorded: none of its files") in out
    assert "verified and replayed" in out
    # published: the run's checkpoint in a team log (a policy of quorum none: the log's own signature suffices)
    from trainledger.journal import keygen

    log_priv, _ = keygen(tmp_path / "logkey")
    assert main(["log", "init", str(tmp_path / "log"), "--origin", "example.com/ml-runs", "--key", str(log_priv)]) == 0
    assert main(["log", "add", str(tmp_path / "log"), str(run), "--pubkey", str(pub), "--key", str(log_priv)]) == 0
    assert main(["log", "prove", str(tmp_path / "log"), str(run), "--pubkey", str(pub), "-o",
                 str(tmp_path / "run.tlog-proof")]) == 0
    policy = tmp_path / "p.policy"
    policy.write_text(f"log {(tmp_path / 'log' / 'log.vkey').read_text().strip()}\nquorum none\n")
    capsys.readouterr()
    assert main(["verify-model", str(model), "--release-key", str(tmp_path / "keys" / "release.pub"),
                 "--pubkey", str(pub), "--policy", str(policy), "--log-proof", str(tmp_path / "run.tlog-proof")]) == 0
    assert "PUBLISHED" in capsys.readouterr().out
    from trainledger.journal import Signer
    from trainledger.journal.note import verifier_key

    other = tmp_path / "other.policy"  # another log's key: not published under it
    other.write_text(f"log {verifier_key('example.com/ml-runs', Signer.generate().public.raw)}\nquorum none\n")
    assert main(["verify-model", str(model), "--release-key", str(tmp_path / "keys" / "release.pub"),
                 "--pubkey", str(pub), "--policy", str(other), "--log-proof", str(tmp_path / "run.tlog-proof")]) == 1
    assert "NOT PUBLISHED" in capsys.readouterr().out
    (model / "weights.pt").write_bytes(b"not the weights")
    assert main(["verify-model", str(model), "--release-key", str(tmp_path / "keys" / "release.pub"),
                 "--pubkey", str(pub), "--json"]) == 1
    fail = json.loads(capsys.readouterr().out)
    assert fail["ok"] is False and "changed: weights.pt" in fail["error"] and fail["reason"] == "changed-file"


def test_replay_checks_each_export_and_names_a_doctored_one(released, signer, tmp_path):
    from journal_tools import dump, parse, read_lines, rechain, write_lines

    from trainledger.audit import replay

    r = released
    rec = replay(r["run"] / "journal.jsonl", keys=[signer.public])
    assert rec.ok and [(e["step"], e["checkpoint"]) for e in rec.exports] == [(4, "checkpoints/step-000000004.pt")]
    assert any("converted or merged weights" in n for n in rec.notes)
    lines = read_lines(r["run"] / "journal.jsonl")
    i = r["res"].export_seq
    obj = parse(lines[i])
    obj["files"][0]["sha256"] = "00" * 32
    bad = tmp_path / "bad.jsonl"
    write_lines(bad, rechain(lines[:i] + [dump(obj)] + lines[i + 1:], resign=signer))
    rec = replay(bad, keys=[signer.public])
    assert not rec.ok and [d["kind"] for d in rec.differences] == ["model_exported"]


def test_the_provenance_is_a_dsse_envelope_the_in_toto_reference_code_verifies(released):
    """Debian's archive has no cosign: the provenance's envelope is checked with securesystemslib's DSSE (the in-toto
    reference code), its statement with in-toto's attestation library, its predicate as SLSA v1 provenance."""
    import base64

    from google.protobuf import json_format
    from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
    from in_toto_attestation.v1 import statement, statement_pb2
    from securesystemslib.dsse import Envelope
    from securesystemslib.signer import SSlibKey

    bundle = json.loads((released["model"] / PROVENANCE).read_text())
    env = bundle["dsseEnvelope"]
    key = SSlibKey(keyid="", keytype="ecdsa", scheme="ecdsa-sha2-nistp256",
                   keyval={"public": (released["tmp"] / "release.pub").read_text()})
    assert "" in Envelope.from_dict(env).verify([key], 1)
    st = json.loads(base64.b64decode(env["payload"]))
    statement.Statement.copy_from_pb(json_format.ParseDict(st, statement_pb2.Statement())).validate()
    pv = json_format.ParseDict(st["predicate"], provenance_pb2.Provenance())
    assert pv.run_details.metadata.invocation_id == released["res"].run_id
    assert st["subject"][0]["digest"]["sha256"] == model_manifest(released["model"]).digest
    tampered = dict(env, payload=base64.b64encode(base64.b64decode(env["payload"]) + b" ").decode())
    with pytest.raises(Exception):
        Envelope.from_dict(tampered).verify([key], 1)


def test_the_recorder_releases_its_export_when_it_closes_and_a_fine_tune_names_its_base(tmp_path, signer):
    key = ReleaseKey.generate()
    key.save(tmp_path / "release.key")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    base = tmp_path / "base-model"
    with Recorder(tmp_path / "run", signer=signer, model=model, optimizer=opt, release_key=tmp_path / "release.key") \
            as rec:
        rec.step(0, 1.0)
        base.mkdir()
        torch.save(model.state_dict(), base / "weights.pt")
        rec.record_export(base)
    v = verify_model(base, release_keys=[key.public], run_keys=[signer.public])
    tuned = tmp_path / "tuned-model"
    with Recorder(tmp_path / "run2", signer=signer, model=model, optimizer=opt, release_key=tmp_path / "release.key") \
            as rec:
        rec.step(0, 0.5)
        tuned.mkdir()
        torch.save({"w": torch.ones(2)}, tuned / "weights.pt")
        rec.record_export(tuned, base_model=base)
    t = verify_model(tuned, release_keys=[key.public], run_keys=[signer.public])
    assert t.base == {"digest": v.digest, "run_id": v.run_id, "lineage": []} and t.run_id != v.run_id
    # a fine-tune of the fine-tune names its whole lineage, nearest first
    again = tmp_path / "again-model"
    with Recorder(tmp_path / "run3", signer=signer, model=model, optimizer=opt, release_key=tmp_path / "release.key") \
            as rec:
        rec.step(0, 0.25)
        again.mkdir()
        torch.save({"w": torch.zeros(2)}, again / "weights.pt")
        rec.record_export(again, base_model=tuned)
    a = verify_model(again, release_keys=[key.public], run_keys=[signer.public])
    assert a.base == {"digest": t.digest, "run_id": t.run_id, "lineage": [{"digest": v.digest, "run_id": v.run_id}]}
    from trainledger.cli import main

    pub = tmp_path / "k.pub"
    pub.write_text(signer.public.line() + "\n")
    assert main(["verify-model", str(again), "--release-key", str(tmp_path / "release.pub"), "--pubkey", str(pub)]) == 0


def test_a_witness_cosigned_release_and_a_fork_that_cannot_carry_the_cosignature(released, signer, tmp_path):
    """The witness cosigns the closed run's checkpoint; the release carries the cosignature and verify-model holds
    it to the pinned witness. A fork of the run (history rewritten, re-signed) cannot borrow that cosignature, and
    released without one it fails the quorum."""
    from journal_tools import dump, parse, read_lines, rechain, write_lines

    from trainledger.journal import Signer
    from trainledger.journal.proofs.bundle import prove
    from trainledger.journal.note import NoteError, cosigner_key, parse_verifier_key
    from trainledger.journal.proofs.witness import Witness

    r = released
    j = r["run"] / "journal.jsonl"
    w_key = Signer.generate()
    vkey = parse_verifier_key(cosigner_key("w1", w_key.public.raw))
    bundle = prove(j, [0], keys=[signer.public]).bundle
    _, note = Witness(tmp_path / "w.json", "w1", w_key._key).add(json.dumps(bundle).encode(), [signer.public])
    cosigned = json.dumps(dict(bundle, checkpoint=note)).encode()
    release(r["model"], j, r["key"], keys=[signer.public], cosigned=cosigned)
    v = verify_model(r["model"], release_keys=[r["key"].public], run_keys=[signer.public], witnesses=[vkey], quorum=1)
    assert [n for n, _ in v.witnesses] == ["w1"]
    # the fork: the same run, its first step's loss rewritten, re-signed by the run's own key
    lines = read_lines(j)
    i = next(k for k, ln in enumerate(lines) if parse(ln)["kind"] == "step_observed")
    obj = parse(lines[i])
    obj["loss"] = 0.0
    fork = tmp_path / "fork.jsonl"
    write_lines(fork, rechain(lines[:i] + [dump(obj)] + lines[i + 1:], resign=signer))
    with pytest.raises(UsageError, match="another run's, or a fork's"):
        release(r["model"], fork, r["key"], keys=[signer.public], cosigned=cosigned)
    release(r["model"], fork, r["key"], keys=[signer.public])
    with pytest.raises(NoteError, match="fewer than the quorum"):
        verify_model(r["model"], release_keys=[r["key"].public], run_keys=[signer.public], witnesses=[vkey], quorum=1)


def test_an_export_whose_file_digest_is_no_sha256_fails_verification_not_replay(released, signer, tmp_path):
    """Even signed by the run's own key, a model_exported whose file digest is not 64 hex digits is a schema error
    that verify names at its line, never a traceback in replay's rehash."""
    from journal_tools import dump, parse, read_lines, rechain, write_lines

    from trainledger.audit import replay
    from trainledger.journal.errors import SchemaError

    r = released
    lines = read_lines(r["run"] / "journal.jsonl")
    i = r["res"].export_seq
    obj = parse(lines[i])
    obj["files"][0]["sha256"] = "not-a-digest"
    bad = tmp_path / "bad.jsonl"
    write_lines(bad, rechain(lines[:i] + [dump(obj)] + lines[i + 1:], resign=signer))
    with pytest.raises(SchemaError) as e:
        replay(bad, keys=[signer.public])
    assert e.value.seq == i
