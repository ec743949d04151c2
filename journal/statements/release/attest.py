"""``trainledger release``: a model folder's OpenSSF model-signing signature (``model.sig``, which the stock
``model_signing verify key`` accepts) and its SLSA v1 provenance (``model.provenance.json``), both Sigstore bundles
signed with the release key, the provenance carrying the run's signed proof that the journal recorded these exact
files (``model_exported``), the checkpoint they came from, the run's configuration and its compute total."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from trainledger.journal.errors import IntegrityError, UsageError
from trainledger.journal.statements.release.dsse import STATEMENT_TYPE, sign_statement
from trainledger.journal.statements.release.keys import ReleaseKey
from trainledger.journal.statements.release.manifest import PROVENANCE, SIGNATURE, ModelManifest, model_manifest
from trainledger.journal.trust import TrustPolicy

__all__ = ["ModelRefused", "SIGNATURE_PREDICATE", "SLSA_PREDICATE", "BUILD_TYPE", "PROOF_MEDIA_TYPE", "ReleaseResult",
           "signature_statement", "provenance_statement", "release", "find_export"]

SIGNATURE_PREDICATE = "https://model_signing/signature/v1.0"
SLSA_PREDICATE = "https://slsa.dev/provenance/v1"
#: what built the model: a training run recorded by trainledger (its journal is the record of the build)
BUILD_TYPE = "urn:trainledger:build-type:training-run:v1"
PROOF_MEDIA_TYPE = "application/vnd.trainledger.proof+json"


class ModelRefused(IntegrityError):
    """The folder is not the model its release says, or not one the run recorded (exit 1); ``reason`` names the
    check that failed."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


def _subject(m: ModelManifest) -> list[dict[str, Any]]:
    return [{"name": m.name, "digest": {"sha256": m.digest}}]


def signature_statement(m: ModelManifest) -> dict[str, Any]:
    """The in-toto statement model signing v1.0 signs: the folder's digest, how it was serialized, every file."""
    return {"_type": STATEMENT_TYPE, "subject": _subject(m), "predicateType": SIGNATURE_PREDICATE,
            "predicate": {"serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                                            "ignore_paths": sorted(m.ignored)},
                          "resources": [{"name": f.path, "algorithm": "sha256", "digest": f.sha256}
                                        for f in m.files]}}


def _rfc3339(ts_ns: int | None) -> str | None:
    if ts_ns is None:
        return None
    return datetime.datetime.fromtimestamp(ts_ns / 1e9, tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _fields(ev: Any) -> dict[str, Any]:
    import msgspec

    return {k: v for k, v in msgspec.to_builtins(ev).items() if k not in ("seq", "ts", "h", "kind")}


def provenance_statement(m: ModelManifest, *, run_id: str, key_id: str, software: dict[str, Any],
                         opened_ts: int | None, finished_ts: int | None, config: Any, manifest_id: str | None,
                         export: Any, proof: dict[str, Any]) -> dict[str, Any]:
    """The SLSA v1 provenance of the folder: built by the run (``builder.id`` names its signing key), its
    external parameters the manifest identity and ``run_configured``, its dependencies the base model it was
    fine-tuned from, and as byproduct the run's proof bundle (``trainledger prove``'s format) for the lines it
    rests on."""
    deps = []
    if export.base is not None:  # the model it was fine-tuned from, then that one's own ancestors (generation 2, ...)
        chain = [{"digest": export.base, "run_id": export.base_release}, *(getattr(export, "lineage", None) or [])]
        for g, anc in enumerate(chain, 1):
            deps.append({"name": "base-model", "digest": {"sha256": anc["digest"]},
                         "annotations": {"run_id": anc.get("run_id"), "generation": g}})
    if manifest_id is not None and manifest_id.startswith("sha256:"):  # the experiment manifest (data, tokenizer)
        deps.append({"name": "experiment-manifest", "digest": {"sha256": manifest_id[len("sha256:"):]}})
    raw = (json.dumps(proof, separators=(",", ":"), sort_keys=True)).encode()
    seqs = {e["seq"]: json.loads(e["line"])["kind"] for e in proof["entries"]}
    return {
        "_type": STATEMENT_TYPE, "subject": _subject(m), "predicateType": SLSA_PREDICATE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"manifest_id": manifest_id,
                                       "run_configured": None if config is None else _fields(config)},
                "internalParameters": {"step": export.step, "checkpoint": export.checkpoint,
                                       "exported_as": export.path},
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {"id": f"urn:trainledger:run-key:{key_id}", "version": dict(software or {})},
                "metadata": {"invocationId": run_id, "startedOn": _rfc3339(opened_ts),
                             "finishedOn": _rfc3339(finished_ts)},
                "byproducts": [{"name": "trainledger-proof", "mediaType": PROOF_MEDIA_TYPE,
                                "digest": {"sha256": hashlib.sha256(raw).hexdigest()},
                                "content": base64.b64encode(raw).decode(),
                                "annotations": {"lines": {str(k): v for k, v in sorted(seqs.items())}}}],
            },
        },
    }


def _tag(ev: Any) -> str | None:
    cfg = getattr(type(ev), "__struct_config__", None)
    return getattr(cfg, "tag", None)


def find_export(events: Iterable[Any], digest: str) -> dict[str, Any]:
    """The lines a release rests on: the last ``model_exported`` of ``digest``, the ``checkpoint_saved`` it names,
    the ``run_configured`` in force, the first ``compute_totaled`` after it, the run's opening and its close."""
    found: dict[str, Any] = {}
    config = None
    checkpoints: dict[str, Any] = {}
    for ev in events:
        tag = _tag(ev)
        if tag == "run_opened":
            found.setdefault("opened", ev)
        elif tag == "run_configured":
            config = ev
        elif tag == "checkpoint_saved":
            checkpoints[ev.path] = ev
        elif tag == "model_exported" and ev.digest == digest:
            found["export"] = ev
            found["config"] = config
            found["checkpoint"] = checkpoints.get(ev.checkpoint) if ev.checkpoint is not None else None
            found.pop("compute", None)
        elif tag == "compute_totaled" and "export" in found and "compute" not in found:
            found["compute"] = ev
        elif tag == "run_closed":
            found["closed"] = ev
    return found


@dataclasses.dataclass
class ReleaseResult:
    manifest: ModelManifest
    signature: Path
    provenance: Path
    run_id: str
    step: int | None
    checkpoint: str | None
    export_seq: int
    tree_size: int

    def to_dict(self) -> dict[str, Any]:
        return {"ok": True, "model": self.manifest.name, "digest": self.manifest.digest,
                "files": len(self.manifest.files), "bytes": self.manifest.bytes, "signature": str(self.signature),
                "provenance": str(self.provenance), "run_id": self.run_id, "step": self.step,
                "checkpoint": self.checkpoint, "export_seq": self.export_seq, "tree_size": self.tree_size}


def _write(path: Path, doc: dict[str, Any]) -> None:
    """``doc`` at ``path``, whole, never through a link planted in the folder (``--out`` may name one the release
    did not make)."""
    from trainledger.journal.paths import write_atomically

    try:
        write_atomically(path, (json.dumps(doc, indent=1) + "\n").encode())
    except OSError as e:
        raise UsageError(f"{path}: cannot write: {e.strerror or e}") from None


def release(model_dir: str | os.PathLike, journal: str | os.PathLike, key: ReleaseKey, *,
            trust: TrustPolicy | None = None, out: str | os.PathLike | None = None,
            progress: Callable[[int], None] | None = None, cosigned: bytes | None = None,
            **trust_options: Any) -> ReleaseResult:
    """Sign ``model_dir`` for release: its digest must be one the journal (verified under ``trust``) recorded in a
    ``model_exported``, followed by the run's ``compute_totaled`` (the run closed). Writes ``model.sig`` and
    ``model.provenance.json`` into ``out`` (default: the model folder). ``cosigned``: a proof bundle whose
    checkpoint witnesses cosigned (``trainledger witness cosign``): the release's proof is made against that
    checkpoint and carries its cosignatures, so ``verify-model --witness-key`` holds it to them. Raises
    :class:`UsageError` naming what is missing."""
    from trainledger.journal.proofs.bundle import closing_seqs, prove
    from trainledger.journal.reader import read_signed_events

    t = TrustPolicy.of(trust, **trust_options)
    if not t.keys:
        raise UsageError("no run key pinned: pass --pubkey FILE (the run's trainledger.pub): a release binds the "
                         "model to a journal whose signer is known")
    m = model_manifest(model_dir, progress=progress)
    if not m.files:
        raise UsageError(f"{model_dir}: no files to release")
    found = find_export(read_signed_events(journal, t.keys), m.digest)
    exp = found.get("export")
    if exp is None:
        raise ModelRefused(f"{journal}: no model_exported of this folder (digest {m.digest[:16]}...): the run did not "
                           "record these files; record the folder as the run writes it (Recorder.record_export, "
                           "the callbacks' export) and release that folder unchanged", "not-recorded")
    comp = found.get("compute")
    if comp is None:
        raise UsageError(f"{journal}: no compute_totaled after the export at seq {exp.seq}: close the run "
                         "(Recorder.close, the end of Trainer.train) before releasing, so the release can show it "
                         "is the run's last model and what it cost")
    opened = found["opened"]
    seqs = [opened.seq, exp.seq, comp.seq]
    for k in ("config", "checkpoint"):
        if found.get(k) is not None:
            seqs.append(found[k].seq)
    size = None
    if cosigned is not None:
        from trainledger.journal.proofs.bundle import parse_bundle

        note = parse_bundle(cosigned).checkpoint
        try:
            size = int(note.split("\n")[1])
        except (IndexError, ValueError):
            raise UsageError("the cosigned bundle's checkpoint is not a checkpoint note") from None
        if max(seqs) >= size:
            raise UsageError(f"the cosigned checkpoint covers {size:,} lines, not the export and compute total (up to "
                             f"seq {max(seqs)}): have a checkpoint of the closed run cosigned")
    closed = found.get("closed")
    if closed is not None and (size is None or closed.seq < size):  # the total shown to be the run's last
        seqs += closing_seqs(comp.seq, closed.seq)
    proof = prove(journal, sorted(set(seqs)), trust=t, tree_size=size).bundle
    if cosigned is not None:
        if not note.startswith(proof["checkpoint"]):
            raise UsageError(f"the cosigned checkpoint is not {journal}'s at {size:,} lines (another run's, or a "
                             "fork's)")
        proof["checkpoint"] = note
    config = found.get("config")
    sig_doc = sign_statement(signature_statement(m), key)
    prov_doc = sign_statement(provenance_statement(
        m, run_id=opened.run_id, key_id=opened.key_id, software=opened.software, opened_ts=opened.ts,
        finished_ts=comp.ts, config=config, manifest_id=getattr(opened, "manifest_id", None), export=exp,
        proof=proof), key)
    dest = Path(out) if out is not None else Path(model_dir)
    dest.mkdir(parents=True, exist_ok=True)
    sig, prov = dest / SIGNATURE, dest / PROVENANCE
    _write(sig, sig_doc)
    _write(prov, prov_doc)
    return ReleaseResult(manifest=m, signature=sig, provenance=prov, run_id=opened.run_id, step=exp.step,
                         checkpoint=exp.checkpoint, export_seq=exp.seq, tree_size=int(proof["checkpoint"].split("\n")[1]))

