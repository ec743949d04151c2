"""Documents others read (journal/statements/bom, docs/bom.md): each of the four formats written by 'trainledger bom'
from the main job's signed golden journal and from a pre-train + fine-tune lifecycle, accepted by its format's
stock validator (cyclonedx-python-lib's CycloneDX 1.6 schema, SPDX's spdx-python-model, huggingface_hub's model
card parser, in-toto-attestation's Statement), checked by 'verify-bom', and refused with the field named after any
figure in it is edited; a pack's fact, a proof's byte and a run replay disagrees with are refused too."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from pathlib import Path

import pytest

from trainledger.cli import main
from trainledger.journal import Journal, Signer, StepObserved
from trainledger.journal.errors import IntegrityError
from trainledger.journal.keys import keygen, load_signer, trusted_keys
from trainledger.journal.kinds import ModelExported
from trainledger.journal.statements.bom.document import BomRefused, check, pack_path
from trainledger.journal.statements.bom.formats import FORMATS, split_card
from trainledger.journal.statements.release.manifest import FileDigest, root_digest
from trainledger.training.health.flops import FlopConfig
from trainledger.training.health.mfu import record_compute
from trainledger.training.health.monitor import TrainingHealthMonitor
from trainledger.training.kinds import ComputeTotaled, ConfigLogged, DeviceSampled, EvaluationRecorded

from tests.helpers.compute_runs import write_run_folder

GOLDEN = Path(__file__).resolve().parents[2] / "assets" / "golden"
OPTS = dict(background=False, seal_every=64)
SHAPE = FlopConfig(n_params=1_000_000, n_layer=2, n_head=4, head_dim=16, seq_len=64)


def _export(j, seed: str, base: str | None = None) -> str:
    files = [{"file": "model.safetensors", "bytes": 10, "sha256": hashlib.sha256(seed.encode()).hexdigest()}]
    digest = root_digest(FileDigest(f["file"], f["bytes"], f["sha256"]) for f in files)
    j.append(ModelExported(path="export", digest=digest, files=files, base=base), durable=True)
    return digest


def _run(path: Path, signer: Signer, run_id: str, *, steps: int, base: str | None = None, seed: str) -> str:
    with Journal.create(path, signer=signer, run_id=run_id, **OPTS) as j:
        j.append(ConfigLogged(config={"lr": 3e-4, "batch_size": 8, "optimizer": "adamw"}, source="wandb.config"))
        m = TrainingHealthMonitor(journal=j, flop_config=SHAPE, peak_flops_per_sec=1e12, peak_source="given")
        for s in range(steps):
            m.observe_step(s, 3.0 - 0.001 * s, grad_norm=1.0, step_time_s=0.01, tokens=512)
            if s % 10 == 0:
                j.append(DeviceSampled(device=0, power_w=300.0, energy_mj=3_000_000 * s))
        j.append(EvaluationRecorded(hook="heldout", role="target", step=steps - 1, checkpoint="ckpt",
                                    checkpoint_sha256="0" * 64, metrics={"loss": 2.75, "accuracy": 0.5}, cases=128,
                                    cases_sha256="1" * 64, cases_path="cases.jsonl"))
        digest = _export(j, seed, base)
        record_compute(j)
    return digest


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The main job's golden ladder journal and a lifecycle: a pre-training run that exports a model and a
    fine-tune of that model, each with energy samples, a configuration and an evaluation."""
    d = tmp_path_factory.mktemp("bom")
    for ext in ("jsonl", "pub"):
        shutil.copy(GOLDEN / f"ladder_closed_v1_7.{ext}", d / f"ladder.{ext}")
    keygen(d, name="k")  # the lifecycle's run key: it issues the lifecycle's documents too
    keygen(d, name="release")  # a release team's key, which issues the main job's documents
    s = load_signer(d / "k.key")
    base = _run(d / "pretrain.jsonl", s, "pretrain", steps=60, seed="base weights")
    _run(d / "finetune.jsonl", s, "finetune", steps=30, base=base, seed="tuned weights")
    # a distributed run's folder: two rank journals under keys the run key certified, energy on each rank
    keygen(d, name="dist")
    write_run_folder(d / "dist", load_signer(d / "dist.key"), run="dist", world=2, steps=40)
    return d


#: (the runs, their key, the key that issues the documents)
SOURCES = {"main job": (["ladder.jsonl"], "ladder.pub", "release"),
           "lifecycle": (["pretrain.jsonl", "finetune.jsonl"], "k.pub", "k"),
           "run folder": (["dist"], "dist.pub", "dist")}


def _pins(world: Path, source: str) -> list[str]:
    _, pub, issuer = SOURCES[source]
    return ["--pubkey", str(world / pub), "--pubkey", str(world / f"{issuer}.pub")]


def _keys(world: Path, source: str) -> list:
    return trusted_keys(_pins(world, source)[1::2])


def _write(world: Path, source: str, fmt: str, capsys) -> Path:
    runs, pub, issuer = SOURCES[source]
    out = world / f"{source.replace(' ', '_')}.{fmt}"
    assert main(["bom", *[str(world / r) for r in runs], "--pubkey", str(world / pub), "--key",
                 str(world / f"{issuer}.key"), "--format", fmt, "-o", str(out)]) == 0
    capsys.readouterr()
    return out


def _validate(fmt: str, path: Path) -> None:
    """The format's own validator from the package registry accepts the document."""
    text = path.read_text()
    if fmt == "cyclonedx":
        from cyclonedx.schema import SchemaVersion
        from cyclonedx.validation.json import JsonStrictValidator

        assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    elif fmt == "spdx":
        import spdx_python_model

        model, objset = spdx_python_model.load(path)
        model.JSONLDSerializer().write(objset, io.BytesIO())  # checks every required property and count
        assert len(list(objset.foreach_type(model.ai_AIPackage))) == 1
    elif fmt == "hf-card":
        from huggingface_hub import ModelCard

        card = ModelCard(text)
        meta, _ = split_card(text)
        assert card.data.to_dict()["trainledger"]["run"]
        assert len(card.data.eval_results or []) == len(meta.get("model-index", [{}])[0].get("results", []))
    else:
        from google.protobuf import json_format
        from in_toto_attestation.v1 import statement_pb2
        from in_toto_attestation.v1.statement import Statement

        Statement.copy_from_pb(json_format.Parse(text, statement_pb2.Statement())).validate()


def _pointer_path(pointer: str) -> str:
    """A JSON pointer as verify-bom names a field: ``/a/0/b`` is ``a[0].b``."""
    out = ""
    for part in pointer.lstrip("/").split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        out += f"[{part}]" if part.isdigit() else f".{part}"
    return out.lstrip(".")


def _edit(fmt: str, data: bytes, pointer: str) -> bytes:
    """The document with the figure at ``pointer`` changed (a number by one part in a million, a string by a digit)."""
    if fmt == "hf-card":
        meta, body = split_card(data.decode())
        doc = meta
    else:
        doc = json.loads(data)
    parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.lstrip("/").split("/")]
    cur = doc
    for p in parts[:-1]:
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    k = int(parts[-1]) if isinstance(cur, list) else parts[-1]
    v = cur[k]
    if isinstance(v, bool):
        cur[k] = not v
    elif isinstance(v, (int, float)):
        cur[k] = v * 1.000001 + 1
    else:
        cur[k] = ("1" if not v.startswith("1") else "2") + v[1:]
    if fmt == "hf-card":
        return ("---\n" + json.dumps(doc, indent=2, ensure_ascii=False) + "\n---\n" + body).encode()
    return (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode()


@pytest.mark.parametrize("source", sorted(SOURCES))
def test_every_format_validates_verifies_and_names_each_edited_figure(world, source, capsys):
    key = [Signer.generate().public]  # not the run's: every proof refused
    keys = _keys(world, source)
    for fmt in FORMATS:
        if source == "run folder" and fmt == "intoto-eval":  # no verdict, no evaluation: nothing to state
            assert main(["bom", str(world / "dist"), *_pins(world, source)[:2], "--key", str(world / "dist.key"),
                         "--format", fmt, "-o", str(world / "empty.intoto")]) == 2
            assert "would state nothing" in capsys.readouterr().err
            continue
        out = _write(world, source, fmt, capsys)
        _validate(fmt, out)
        assert main(["verify-bom", str(out), *_pins(world, source)]) == 0
        assert f"OK    {out}" in capsys.readouterr().out
        # the runs' key alone: every figure holds; an issuer not pinned is said (and refused on demand)
        by_run_key = SOURCES[source][1] == f"{SOURCES[source][2]}.pub"
        assert main(["verify-bom", str(out), "--pubkey", str(world / SOURCES[source][1])]) == 0
        assert ("NOT ISSUED" in capsys.readouterr().out) is not by_run_key
        assert main(["verify-bom", str(out), "--pubkey", str(world / SOURCES[source][1]),
                     "--require-issued"]) == (0 if by_run_key else 1)
        capsys.readouterr()
        pack = json.loads(pack_path(out).read_text())
        data = out.read_bytes()
        assert pack["links"], fmt
        for link in pack["links"]:  # every figure, edited, is refused by its field
            with pytest.raises(BomRefused) as e:
                check(_edit(fmt, data, link["at"]), pack_path(out).read_bytes(), keys)
            assert e.value.where == _pointer_path(link["at"]), (fmt, link)
        with pytest.raises(IntegrityError):
            check(data, pack_path(out).read_bytes(), key)
        if fmt == "hf-card":  # the prose is rendered from the metadata: a figure edited there is named as the body
            meta_part, body = data.decode().split("\n---\n", 1)
            with pytest.raises(BomRefused) as e:
                check((meta_part + "\n---\n" + body.replace("| ", "| 9", 1)).encode(), pack_path(out).read_bytes(),
                      keys)
            assert e.value.where == "body"
        # the CLI names the field in one line and exits 1
        edited = world / f"edited.{fmt}"
        edited.write_bytes(_edit(fmt, data, pack["links"][0]["at"]))
        shutil.copy(pack_path(out), pack_path(edited))
        assert main(["verify-bom", str(edited), *_pins(world, source)]) == 1
        line = capsys.readouterr().out
        assert line.startswith(f"FAIL  {edited}: the document's {_pointer_path(pack['links'][0]['at'])} is not")


def test_the_lifecycle_states_each_activitys_energy_and_the_base_model(world, capsys):
    cdx = json.loads(_write(world, "lifecycle", "cyclonedx", capsys).read_text())
    card = cdx["metadata"]["component"]["modelCard"]
    energy = card["considerations"]["environmentalConsiderations"]["energyConsumptions"]
    assert [e["activity"] for e in energy] == ["training", "fine-tuning"]
    # the counter rose 3,000,000 mJ every 10 steps: 15 kJ over the pre-training's 60 steps, 6 kJ over the 30 of the
    # fine-tune (samples at steps 0-50 and 0-20)
    assert [e["activityEnergyCost"]["value"] for e in energy] == [150_000.0 / 3.6e6, 60_000.0 / 3.6e6]
    props = {p["name"]: p["value"] for p in card["properties"]}
    assert props["trainledger:hyperparameter:lr"] == "0.0003" and "trainledger:base_model_sha256" in props
    # a run folder's energy is every rank's: each rank's counter rose 1,000,000 mJ a sample, 3 rises each
    dist = json.loads(_write(world, "run folder", "cyclonedx", capsys).read_text())["metadata"]["component"]
    (e,) = dist["modelCard"]["considerations"]["environmentalConsiderations"]["energyConsumptions"]
    assert e["activityEnergyCost"]["value"] == 2 * 3 * 1_000.0 / 3.6e6
    intoto = json.loads(_write(world, "lifecycle", "intoto-eval", capsys).read_text())
    assert {c["assuranceLevel"] for c in intoto["predicate"]["claims"]} == {"self_attested"}
    ladder = json.loads(_write(world, "main job", "intoto-eval", capsys).read_text())
    claims = ladder["predicate"]["claims"]
    assert claims and {c["assuranceLevel"] for c in claims} == {"reproduced"}  # gate verdicts replay recomputes
    assert [c["passed"] for c in claims if c["metric"] == "final_loss"] == [True, False]


def test_a_pack_that_lies_or_a_run_replay_disagrees_with_is_refused(world, tmp_path, capsys):
    out = _write(world, "lifecycle", "cyclonedx", capsys)
    keys = _keys(world, "lifecycle")
    pack = json.loads(pack_path(out).read_text())
    pack["facts"][0]["value"] = 1.0
    with pytest.raises(BomRefused, match="the pack's fact"):
        check(out.read_bytes(), json.dumps(pack).encode(), keys)
    pack = json.loads(pack_path(out).read_text())
    pack["links"][0]["at"] = "/metadata/timestamp"  # a link that points a reader at another field
    with pytest.raises(BomRefused, match="links"):
        check(out.read_bytes(), json.dumps(pack).encode(), keys)
    # a proven line changed (the compute total's tokens): its proof no longer holds
    pack = json.loads(pack_path(out).read_text())
    entries = pack["bundles"][0]["entries"]
    k = next(i for i, e in enumerate(entries) if '"kind":"compute_totaled"' in e["line"])
    entries[k]["line"] = entries[k]["line"].replace('"tokens":', '"tokens":1', 1)
    with pytest.raises(IntegrityError) as e:
        check(out.read_bytes(), json.dumps(pack).encode(), keys)
    assert not isinstance(e.value, BomRefused) and "journal 0 of the pack" in str(e.value)
    # a document whose pack carries no issuance: every figure holds, but nobody issued it
    pack = json.loads(pack_path(out).read_text())
    issued = pack["issued"]
    pack["issued"] = None
    bare = tmp_path / "bare.cyclonedx"
    bare.write_bytes(out.read_bytes())
    pack_path(bare).write_text(json.dumps(pack))
    assert check(bare.read_bytes(), pack_path(bare).read_bytes(), keys).issued_by is None
    assert main(["verify-bom", str(bare), *_pins(world, "lifecycle")]) == 0
    assert "NOT ISSUED no pinned key issued it: it carries no document_issued" in capsys.readouterr().out
    assert main(["verify-bom", str(bare), *_pins(world, "lifecycle"), "--require-issued"]) == 1
    assert "every figure holds, but no pinned key issued it" in capsys.readouterr().out
    # another document's issuance (the SPDX one's) over this one: not the document issued
    spdx = json.loads(pack_path(_write(world, "lifecycle", "spdx", capsys)).read_text())
    pack["issued"] = spdx["issued"]
    with pytest.raises(BomRefused, match="not the one issued"):
        check(out.read_bytes(), json.dumps(pack).encode(), keys)
    pack["issued"] = issued
    assert check(out.read_bytes(), json.dumps(pack).encode(), keys).issued_by is not None
    # a signed total that the steps do not give: replay disagrees, and no document is written
    s = Signer.generate()
    with Journal.create(tmp_path / "lie.jsonl", signer=s, run_id="lie", **OPTS) as j:
        TrainingHealthMonitor(journal=j, flop_config=SHAPE)
        for step in range(5):
            j.append(StepObserved(step=step, loss=2.0, tokens=512))
        j.append(ComputeTotaled(steps=5, tokens=10 ** 9, flops=1e25), durable=True)
    (tmp_path / "lie.pub").write_text(s.public.line() + "\n")
    assert main(["bom", str(tmp_path / "lie.jsonl"), "--pubkey", str(tmp_path / "lie.pub"), "--format", "spdx",
                 "--key", str(world / "k.key"), "-o", str(tmp_path / "lie.spdx")]) == 1
    assert "replay differs" in capsys.readouterr().err and not (tmp_path / "lie.spdx").exists()


@pytest.mark.parametrize("name", [["a", "list"], {"a": 1}, 7, None])
def test_a_pack_whose_fact_names_are_not_names_is_refused_in_one_line(world, tmp_path, capsys, name):
    """Found by mutating packs at random: a fact named by a list ended verify-bom in a traceback (unhashable)."""
    out = _write(world, "lifecycle", "spdx", capsys)
    pack = json.loads(pack_path(out).read_text())
    pack["facts"][0]["name"] = name
    pack_path(out).write_text(json.dumps(pack))
    assert main(["verify-bom", str(out), *_pins(world, "lifecycle")]) == 1
    got = capsys.readouterr()
    assert got.out.startswith("FAIL") and "the pack's fact" in got.out and len(got.out.splitlines()) == 1
    assert "Traceback" not in got.err


def test_an_unpinned_issuer_is_named_no_longer_than_a_key_id(world, tmp_path, capsys):
    """The key id an issuance names, when no pinned key is it, is the pack's word: shown escaped and cut to a key
    id's 16 characters, and the document is NOT ISSUED."""
    out = _write(world, "lifecycle", "intoto-eval", capsys)
    pack = json.loads(pack_path(out).read_text())
    pack["issued"]["key_id"] = "\x1b[2J" + "f" * 200
    pack_path(out).write_text(json.dumps(pack))
    assert main(["verify-bom", str(out), *_pins(world, "lifecycle")]) == 0
    said = capsys.readouterr().out
    assert "NOT ISSUED" in said and "\x1b" not in said and "\\x1b[2J" in said and "f" * 17 not in said


def test_without_key_the_runs_own_key_issues_it_if_this_user_keeps_it(world, tmp_path, monkeypatch, capsys):
    """bom with no --key: the private key of a pinned key in the user's key folder issues the document (where the
    run that wrote it keeps it); none there: the document is written, proven, and said not issued."""
    monkeypatch.setenv("TRAINLEDGER_KEY_DIR", str(world))  # holds k.key, the lifecycle's run key
    runs = [str(world / r) for r in SOURCES["lifecycle"][0]]
    out = tmp_path / "found.spdx"
    assert main(["bom", *runs, "--pubkey", str(world / "k.pub"), "--format", "spdx", "-o", str(out)]) == 0
    assert f"issued by key {load_signer(world / 'k.key').public.key_id}" in capsys.readouterr().out
    assert main(["verify-bom", str(out), "--pubkey", str(world / "k.pub"), "--require-issued"]) == 0
    monkeypatch.setenv("TRAINLEDGER_KEY_DIR", str(tmp_path / "empty"))
    out = tmp_path / "bare.spdx"
    assert main(["bom", *runs, "--pubkey", str(world / "k.pub"), "--format", "spdx", "-o", str(out)]) == 0
    assert "NOT ISSUED" in capsys.readouterr().out
    assert main(["verify-bom", str(out), "--pubkey", str(world / "k.pub")]) == 0
    assert main(["verify-bom", str(out), "--pubkey", str(world / "k.pub"), "--require-issued"]) == 1


def test_a_run_not_closed_after_its_total_is_refused(tmp_path, capsys):
    """A document states a run's last compute total, which only a journal closed after it shows: an open one is
    refused in one line, and nothing is written."""
    s = Signer.generate()
    j = Journal.create(tmp_path / "open.jsonl", signer=s, run_id="open", **OPTS)
    TrainingHealthMonitor(journal=j, flop_config=SHAPE)
    for step in range(5):
        j.append(StepObserved(step=step, loss=2.0, tokens=512))
    record_compute(j)
    j.suspend()  # stopped, not closed: more steps could follow
    (tmp_path / "k.pub").write_text(s.public.line() + "\n")
    assert main(["bom", str(tmp_path / "open.jsonl"), "--pubkey", str(tmp_path / "k.pub"), "--format", "cyclonedx",
                 "-o", str(tmp_path / "doc.cdx")]) == 1
    err = capsys.readouterr().err
    assert "not followed by its run_closed" in err and "Traceback" not in err
    assert not (tmp_path / "doc.cdx").exists()


def test_a_documents_journal_linked_out_of_the_run_folder_is_refused(world, tmp_path, capsys):
    """Whoever can write the run folder cannot make bom write elsewhere: a documents journal that is a link leading
    out of the folder (dangling, or to another run's documents journal) is refused, and its target left as it was."""
    run = tmp_path / "run"
    run.mkdir()
    for ext in ("jsonl", "pub"):
        shutil.copy(world / f"ladder.{ext}", run / f"ladder.{ext}")
    elsewhere = tmp_path / "elsewhere.jsonl"
    (run / "ladder.documents.jsonl").symlink_to(elsewhere)
    args = ["bom", str(run / "ladder.jsonl"), "--pubkey", str(run / "ladder.pub"), "--key", str(world / "release.key"),
            "--format", "cyclonedx", "-o", str(tmp_path / "doc.cdx")]
    assert main(args) == 1
    assert "outside" in capsys.readouterr().err and not elsewhere.exists()
    elsewhere.write_bytes(b"kept\n")
    assert main(args) == 1
    assert elsewhere.read_bytes() == b"kept\n" and not (tmp_path / "doc.cdx").exists()


def test_a_pack_whose_text_of_what_it_does_not_prove_was_changed_is_refused(world, capsys):
    """Held as the compute statement's is: a reader of the pack itself would take that text's word."""
    out = _write(world, "lifecycle", "cyclonedx", capsys)
    pack = json.loads(pack_path(out).read_text())
    pack["not_proven"] = "nothing: every figure is true"
    pack_path(out).write_text(json.dumps(pack))
    assert main(["verify-bom", str(out), *_pins(world, "lifecycle")]) == 1
    assert "what it does not prove is not the one trainledger writes" in capsys.readouterr().out
