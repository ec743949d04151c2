"""The preflight state machine on the tiny model: a blocked gate stops it, a complete one passes every gate."""

from __future__ import annotations

import json

import msgspec
from manifest_fixtures import base, write

from trainledger.journal import Journal, Signer, read_events, verify
from trainledger.training.audit.approval import sign_approval
from trainledger.cli import main
from trainledger.training.kinds import PreflightCompleted, PreflightGate
from trainledger.training.experiment.manifest import load_manifest
from trainledger.training.experiment.preflight import GATES, authority_gate, run_preflight


LEAD = Signer.generate()  # the research lead's own key
PINNED = {"research-lead": [LEAD.public]}  # the team's trusted-approvers file


def template_ok(m, root):
    return True, "raw-token template, identity tokenizer, no mask: nothing to misalign"


def test_without_a_template_check_it_stops_blocked_and_later_gates_are_not_run(tmp_path, signer, keypair, capsys):
    p = write(tmp_path, base())
    j = tmp_path / "pf.jsonl"
    assert main(["preflight", str(p), "--journal", str(j), "--key", str(keypair[1])]) == 1
    out = capsys.readouterr().out
    assert "status: experiment-specified-blocked-before-training at template_compat" in out
    verify(j, keys=[signer.public], require_closed=True)
    gates = [e for e in read_events(j) if isinstance(e, PreflightGate)]
    assert [g.gate for g in gates] == list(GATES)
    assert [g.status for g in gates] == ["passed", "passed", "blocked"] + ["not_run"] * 7
    assert all(g.reason == "not run: the preflight stopped at template_compat" and g.measured == {}
               for g in gates[3:])
    done = [e for e in read_events(j) if isinstance(e, PreflightCompleted)]
    assert done[0].stopped_at == "template_compat" and done[0].manifest_id == load_manifest(p).identity


def test_a_full_preflight_passes_every_gate_with_measurements(tmp_path, signer):
    p = write(tmp_path, base())
    m = load_manifest(p)
    with Journal.create(tmp_path / "pf.jsonl", signer=signer, manifest_id=m.identity) as j:
        r = run_preflight(m, tmp_path, j, template_check=template_ok, approvers=PINNED,
                          approval=sign_approval(LEAD, authority="research-lead", manifest_id=m.identity))
    assert r.status == "ready-to-train", [(g.gate, g.status, g.reason) for g in r.gates]
    g = {x.gate: x for x in r.gates}
    assert g["smoke"].measured["supervised_tokens"] == 2 * 2 * 16  # microbatch x data-parallel x seq_len
    assert g["overfit"].measured["drop"] >= 0.5 and g["overfit"].measured["last_loss"] < 1.0
    assert g["save_load"].measured["contents"] == sorted(
        ["model", "optimizer", "scheduler", "scaler", "rng", "sampler", "counters", "accumulation", "manifest_id"])
    assert g["resume_equivalence"].measured["max_abs_diff"] == 0.0
    assert len(g["resource_probe"].measured["grid"]) == 4
    assert all(h["cases"] > 0 for h in g["eval_dry_run"].measured["hooks"].values())
    events = [e for e in read_events(tmp_path / "pf.jsonl") if isinstance(e, PreflightGate)]
    assert [e.status for e in events] == ["passed"] * len(GATES)


def test_authority_is_never_implied(tmp_path, signer):
    """Only a decision signed by the approver's own, pinned key passes; anything anyone could write fails."""
    p = write(tmp_path, base())
    m = load_manifest(p)
    mallory = Signer.generate()
    forged = sign_approval(mallory, authority="research-lead", manifest_id=m.identity)
    cases = [
        (None, PINNED, "blocked", "awaiting a decision"),
        (sign_approval(LEAD, authority="research-lead", manifest_id=m.identity), None, "blocked", "no trusted approvers"),
        (sign_approval(LEAD, authority="research-lead", manifest_id="sha256:" + "0" * 64), PINNED, "failed",
         "not this manifest"),
        (sign_approval(LEAD, authority="intern", manifest_id=m.identity), PINNED, "failed", "not an approver"),
        (sign_approval(LEAD, authority="research-lead", manifest_id=m.identity, decision="reject", note="budget"),
         PINNED, "failed", "decided 'reject': budget"),
        (forged, PINNED, "failed", "not pinned for 'research-lead'"),  # signed, but by someone else's key
        (msgspec.structs.replace(forged, public_key=LEAD.public.b64, key_id=LEAD.key_id), PINNED, "failed",
         "does not verify"),  # the lead's public key pasted over mallory's signature
    ]
    for approval, approvers, status, why in cases:  # the gate itself, case by case
        r = authority_gate(m, approval, approvers)
        assert r.status == status and why in r.reason, r.reason
    # ...and one whole preflight per outcome, to show the machine stops there and says so.
    for approval, status in ((None, "blocked"), (forged, "failed")):
        with Journal.create(tmp_path / f"pf-{status}.jsonl", signer=signer) as j:
            r = run_preflight(m, tmp_path, j, template_check=template_ok, approval=approval, approvers=PINNED)
        assert r.stopped_at == "authority" and r.gates[-1].status == status
        assert r.status == f"experiment-specified-{status}-before-training at authority"


def test_replay_rechecks_the_signed_approval(tmp_path, signer):
    """A journal whose authority gate passed without a valid signed approval is named by replay."""
    from trainledger.training.kinds import PreflightGate
    from trainledger.audit import replay

    ident = "sha256:" + "1" * 64
    good = sign_approval(LEAD, authority="research-lead", manifest_id=ident)
    p = tmp_path / "pf.jsonl"
    with Journal.create(p, signer=signer, manifest_id=ident) as j:
        j.append(PreflightGate(gate="authority", status="passed", reason="ok", manifest_id=ident,
                               measured={"approval": good.to_dict()}))
        j.append(PreflightGate(gate="authority", status="passed", reason="approved, trust me", manifest_id=ident))
        j.append(PreflightGate(gate="authority", status="passed", reason="ok", manifest_id=ident,
                               measured={"approval": {**good.to_dict(), "note": "edited after signing"}}))
    rec = replay(p, keys=[signer.public])
    assert [(d["seq"], d["detail"].split(", but ")[1][:30]) for d in rec.differences] == [
        (3, "it records no signed approval"), (4, "its approval does not hold: th")]


def test_approve_then_preflight_from_the_cli(tmp_path, capsys, keypair):
    from trainledger.journal import keygen

    p = write(tmp_path, base())
    lead_key, lead_pub = keygen(tmp_path / "lead")
    approvers = tmp_path / "approvers.txt"
    approvers.write_text("# name key\nresearch-lead " + lead_pub.read_text())
    assert main(["approve", str(p), "--key", str(lead_key), "--as", "research-lead", "-o",
                 str(tmp_path / "ok.json")]) == 0
    assert main(["approve", str(p), "--key", str(lead_key), "--as", "intern"]) == 2
    (tmp_path / "unsigned.json").write_text(json.dumps({"authority": "research-lead", "manifest_id": "x",
                                                        "decision": "approve"}))
    assert main(["preflight", str(p), "--journal", str(tmp_path / "u.jsonl"), "--key", str(keypair[1]),
                 "--approval", str(tmp_path / "unsigned.json")]) == 2
    assert "not a signed approval" in capsys.readouterr().err


def test_a_changed_data_file_fails_lineage(tmp_path, signer):
    p = write(tmp_path, base())
    (tmp_path / "data" / "train.bin").write_bytes(b"\x01" * 100)
    m = load_manifest(p)
    with Journal.create(tmp_path / "pf.jsonl", signer=signer) as j:
        r = run_preflight(m, tmp_path, j, template_check=template_ok)
    assert r.status == "experiment-specified-failed-before-training at data_lineage"
    assert "has digest" in r.gates[1].reason


def test_cli_preflight_prints_json_and_an_old_folder_key_is_named(tmp_path, capsys):
    """--json: one object with the status and every gate; a folder holding 0.1.0's preflight.key keeps signing
    with it (its journals stay one key's) and is told to move it."""
    import json

    from trainledger.journal import keygen

    d = base()
    d["batch"]["accumulation"] = 8
    p = write(tmp_path, d)
    assert main(["preflight", str(p), "--journal", str(tmp_path / "a.jsonl"), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["status"].endswith("at schema") and len(out["gates"]) == 10
    assert out["gates"][0] == {**out["gates"][0], "gate": "schema", "status": "failed"}
    old = tmp_path / "old"
    old.mkdir()
    q = write(old, d)
    keygen(old, name="preflight")
    assert main(["preflight", str(q), "--journal", str(old / "b.jsonl")]) == 1
    assert "a private key inside the folder" in capsys.readouterr().err
    from trainledger.journal import load_public_key
    verify(old / "b.jsonl", keys=[load_public_key(old / "preflight.pub")], require_closed=True)


def test_cli_records_a_failed_schema_gate_and_keeps_its_key(tmp_path, capsys):
    """A manifest with error findings still gets its journal (schema failed, the rest not run); a second
    preflight in the same folder signs with the same key instead of replacing it."""
    d = base()
    d["batch"]["accumulation"] = 8
    p = write(tmp_path, d)
    assert main(["preflight", str(p), "--journal", str(tmp_path / "a.jsonl")]) == 1
    pub = (tmp_path / "preflight.pub").read_text()
    assert "status: experiment-specified-failed-before-training at schema" in capsys.readouterr().out
    gates = [e for e in read_events(tmp_path / "a.jsonl") if isinstance(e, PreflightGate)]
    assert [g.status for g in gates] == ["failed"] + ["not_run"] * 9 and "E_EFFECTIVE_BATCH" in str(gates[0].measured)
    assert main(["preflight", str(p), "--journal", str(tmp_path / "b.jsonl")]) == 1
    assert (tmp_path / "preflight.pub").read_text() == pub
    assert not list(tmp_path.rglob("*.key"))   # the private key is kept outside the folder
    from trainledger.journal import load_public_key
    for name in ("a.jsonl", "b.jsonl"):
        verify(tmp_path / name, keys=[load_public_key(tmp_path / "preflight.pub")], require_closed=True)
    (tmp_path / "bad.yaml").write_text("label: [unclosed\n")
    assert main(["preflight", str(tmp_path / "bad.yaml")]) == 2  # unreadable input: a usage error, as for validate
    assert "not valid YAML" in capsys.readouterr().err
