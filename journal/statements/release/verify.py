"""``trainledger verify-model``: a released model folder checked offline against its signature and provenance,
the run's key and (optionally) the run's journal. Every refusal names its reason; nothing here runs code from the
folder or reads outside it."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trainledger.journal.errors import IntegrityError, UsageError
from trainledger.journal.keys import PublicKey
from trainledger.journal.statements.release.attest import (PROOF_MEDIA_TYPE, SIGNATURE_PREDICATE, SLSA_PREDICATE,
                                                ModelRefused, provenance_statement)
from trainledger.journal.paths import open_regular
from trainledger.journal.statements.release.dsse import MAX_BUNDLE_BYTES, ReleaseSignatureError, open_bundle
from trainledger.journal.statements.release.export import same_as_checkpoint
from trainledger.journal.statements.release.keys import ReleasePublicKey
from trainledger.journal.proofs.bundle import proven_to_close
from trainledger.journal.text import first_difference
from trainledger.journal.statements.release.manifest import (IGNORED, PROVENANCE, SIGNATURE, FileDigest, ManifestError,
                                                  model_listing, model_manifest, root_digest)

__all__ = ["ModelVerified", "ModelRefused", "verify_model"]


@dataclasses.dataclass
class ModelVerified:
    """What a released folder was established to be."""

    model: str
    digest: str
    files: int
    bytes: int
    release_key: str
    run_id: str
    run_key: str
    step: int | None
    checkpoint: dict[str, Any] | None
    head: str
    tree_size: int
    compute: dict[str, Any]
    final: bool
    witnesses: list[tuple[str, int]]
    base: dict[str, Any] | None
    #: how the released files relate to the checkpoint the run recorded (:func:`weights_relation`)
    weights: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: whether the proof shows the compute total is the run's last (every line from it to ``run_closed`` proven)
    closed: bool = False
    journal: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["witnesses"] = [{"name": n, "timestamp": t} for n, t in self.witnesses]
        return {"ok": True, **d}


def _read(path: Path, what: str) -> bytes:
    """At most MAX_BUNDLE_BYTES + 1 bytes of a regular file (a FIFO, a device or a link planted in the folder is
    refused, never opened for a blocking read); open_bundle names one that is too big."""
    try:
        fd = open_regular(path, what=what)
    except FileNotFoundError:
        raise UsageError(f"{path}: no {what} (trainledger release writes it beside the weights, or give its path)") \
            from None
    try:
        out = bytearray()
        while len(out) <= MAX_BUNDLE_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_BUNDLE_BYTES + 1 - len(out)))
            if not chunk:
                break
            out += chunk
        return bytes(out)
    except OSError as e:
        raise UsageError(f"{path}: the {what} cannot be read ({e.strerror or e})") from None
    finally:
        os.close(fd)


def _fail(msg: str, reason: str) -> ModelRefused:
    return ModelRefused(msg, reason)


def _some(paths: list[str]) -> str:
    return ", ".join(paths[:5]) + (" ..." if len(paths) > 5 else "")


def _missing(paths: list[str]) -> ModelRefused:
    return _fail(f"missing: {_some(paths)} (signed, not in the folder)", "missing-file")


def _extra(paths: list[str]) -> ModelRefused:
    return _fail(f"extra: {_some(paths)} (in the folder, not signed)", "extra-file")


def _compare_names(expected: list[FileDigest], listing: dict[str, int]) -> None:
    """The folder's names against the signed ones, before any file is read: an extra or a missing file is named at
    once (a rename, the same bytes under another name, waits for the digests: :func:`_compare`)."""
    want = {f.path for f in expected}
    missing = sorted(want - set(listing))
    extra = sorted(set(listing) - want)
    if missing and not extra:
        raise _missing(missing)
    if extra and not missing:
        raise _extra(extra)


def _compare_sizes(recorded: list[dict[str, Any]], listing: dict[str, int]) -> None:
    """Each file's size against the one the run recorded (``model_exported.files``), before it is read; a file
    not signed whose size is no missing file's is named at once (only a file that may be a signed one renamed
    is left for the digests to tell)."""
    sizes = {f["file"]: f["bytes"] for f in recorded}
    for name, want in sizes.items():
        got = listing.get(name)
        if got is not None and got != want:
            raise _fail(f"changed: {name} ({got:,} bytes, the run recorded {want:,}; its bytes are not the signed "
                        "ones)", "changed-file")
    missing = {want for name, want in sizes.items() if name not in listing}
    extra = sorted(p for p in listing if p not in sizes and listing[p] not in missing)
    if extra:
        raise _extra(extra)


def _compare(expected: list[FileDigest], actual: list[FileDigest]) -> None:
    want = {f.path: f.sha256 for f in expected}
    got = {f.path: f.sha256 for f in actual}
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    changed = sorted(p for p in set(want) & set(got) if want[p] != got[p])
    if missing and extra and {want[p] for p in missing} & {got[p] for p in extra}:
        moved = [(p, q) for p in missing for q in extra if want[p] == got[q]]
        raise _fail(f"renamed: {moved[0][0]} is now {moved[0][1]} (the signature names every file by its path)",
                    "renamed-file")
    if changed:
        raise _fail(f"changed: {_some(changed)} (its bytes are not the signed ones)", "changed-file")
    if missing:
        raise _missing(missing)
    if extra:
        raise _extra(extra)


def weights_relation(exp: Any, ck: dict[str, Any] | None) -> dict[str, Any]:
    """Whether the released files are byte for byte a recorded checkpoint's (``identical``), converted from one the
    export names (``converted``: some or none of its files are that checkpoint's bytes: a format conversion, a
    merge, a quantisation), named but not proven (``unproven``), or from no recorded checkpoint (``none``), with the
    sentence ``verify-model`` prints. Said plainly in the text and ``--json`` alike."""
    n = len(exp.files)
    if exp.checkpoint is None:
        return {"relation": "none", "checkpoint": None, "same_files": [],
                "says": "not a recorded checkpoint's weights: neither byte-identical to nor converted from a "
                        "checkpoint the run recorded"}
    if ck is None:
        return {"relation": "unproven", "checkpoint": exp.checkpoint, "same_files": [],
                "says": f"named as from checkpoint {exp.checkpoint}, whose record the release does not prove"}
    same = ck["same_files"]
    if len(same) == n:
        return {"relation": "identical", "checkpoint": ck["path"], "same_files": same,
                "says": f"byte-identical to checkpoint {ck['path']} (all {n} files are its bytes)"}
    part = (f"{len(same)} of its {n} files are that checkpoint's bytes ({', '.join(same[:3])}"
            f"{' ...' if len(same) > 3 else ''})") if same else "none of its files are that checkpoint's bytes"
    return {"relation": "converted", "checkpoint": ck["path"], "same_files": same,
            "says": f"converted or merged from checkpoint {ck['path']}, as the run recorded: {part}"}


def _signed_files(st: dict[str, Any], where: str) -> tuple[list[FileDigest], str, list[str]]:
    if st.get("predicateType") != SIGNATURE_PREDICATE:
        raise ReleaseSignatureError(f"{where}: predicate {str(st.get('predicateType'))[:60]!r}, not a model "
                                    f"signing signature ({SIGNATURE_PREDICATE})")
    try:
        pred = st["predicate"]
        ser = pred["serialization"]
        if ser.get("method") != "files" or ser.get("hash_type") != "sha256":
            raise ReleaseSignatureError(f"{where}: serialization {ser.get('method')}/{ser.get('hash_type')}; this "
                                        "verifier reads files/sha256")
        files = [FileDigest(str(r["name"]), -1, str(r["digest"]).lower()) for r in pred["resources"]
                 if r["algorithm"] == "sha256"]
        [subject] = st["subject"]
        digest = str(subject["digest"]["sha256"])
        ignore = [str(x) for x in ser.get("ignore_paths", [])]
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ReleaseSignatureError(f"{where}: not a model signing v1.0 statement (subject, serialization, "
                                    "resources)") from None
    if root_digest(files) != digest:
        raise ReleaseSignatureError(f"{where}: the signed resources do not hash to the signed digest")
    for p in ignore:
        if p.startswith("/") or ".." in Path(p).parts:
            raise ReleaseSignatureError(f"{where}: an ignored path outside the folder ({p[:60]})")
    return files, digest, ignore


def _same_json(a: Any, b: Any) -> bool:
    """Two JSON leaves alike: equal and of one type, or equal numbers (an int and a float of one value)."""
    if type(a) is type(b):
        return a == b
    numbers = (int, float)
    return isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) \
        and not isinstance(b, bool) and a == b


def _held_to_proof(pst: dict[str, Any], prov_path: Path, actual: Any, by_kind: dict[str, list[Any]], exp: Any,
                   comp: Any, raw: bytes) -> None:
    """Every field of the provenance that ``release`` writes must be the one the proven lines give (SLSA tooling
    reads these fields, not trainledger's printout): the provenance is rebuilt from the proof's ``run_opened``, the
    ``run_configured`` before the export, the export and the compute total, and compared whole. A field edited and
    re-signed with the release key is refused by name."""
    import json

    opened = by_kind.get("run_opened", [])
    if not opened:
        raise _fail(f"{prov_path}: the run's proof holds no run_opened: the provenance's run, key, software and start "
                    "are not proven", "provenance-unproven")
    configs = [c for c in by_kind.get("run_configured", []) if c.seq < exp.seq]
    try:
        proof = json.loads(raw)
    except ValueError:
        raise ReleaseSignatureError(f"{prov_path}: the proof byproduct is not JSON") from None
    o = opened[0]
    want = provenance_statement(actual, run_id=o.run_id, key_id=o.key_id, software=o.software, opened_ts=o.ts,
                                finished_ts=comp.ts, config=configs[-1] if configs else None,
                                manifest_id=getattr(o, "manifest_id", None), export=exp, proof=proof)
    for part in ("predicateType", "predicate"):
        diff = first_difference(pst.get(part), want[part], _same_json, part)
        if diff is not None:
            raise _fail(f"{prov_path}: the provenance's {diff[:120]} is not what the run's proven lines say (a field "
                        "edited and signed again): refused", "provenance-mismatch")


def verify_model(model_dir: str | os.PathLike, *, release_keys: Sequence[ReleasePublicKey],
                 run_keys: Sequence[PublicKey], witnesses: Sequence[Any] = (), quorum: int = 0,
                 signature: str | os.PathLike | None = None, provenance: str | os.PathLike | None = None,
                 journal: str | os.PathLike | None = None, allow_intermediate: bool = False,
                 progress: Callable[[int], None] | None = None,
                 replay: Callable[[Any, Sequence[PublicKey]], Any] | None = None) -> ModelVerified:
    """Check ``model_dir`` (see the module). ``journal``: the run's journal, verified and held to the release's
    signed tree; ``replay(path, keys)`` (``trainledger.audit.replay``) replays it too. Raises :class:`ModelRefused`
    or :class:`ReleaseSignatureError` (integrity, exit 1) naming the reason, :class:`UsageError` (exit 2) for a
    missing file or key."""
    from trainledger.journal.proofs.bundle import verify_bundle

    root = Path(model_dir)
    if not root.is_dir():
        raise UsageError(f"{root}: not a folder")
    if not release_keys:
        raise UsageError("no release key pinned: pass --release-key FILE (the release key's .pub, from whoever "
                         "released the model)")
    if not run_keys:
        raise UsageError("no run key pinned: pass --pubkey FILE (the run's trainledger.pub)")
    sig_path = Path(signature) if signature is not None else root / SIGNATURE
    prov_path = Path(provenance) if provenance is not None else root / PROVENANCE
    st, rkey = open_bundle(_read(sig_path, "model signature"), list(release_keys), str(sig_path))
    signed, digest, ignore = _signed_files(st, str(sig_path))
    ignored = set(IGNORED) | set(ignore)
    try:  # names and sizes first, nothing read: a file planted in the folder is named before any byte is hashed
        listing = model_listing(root, ignored=ignored)
    except ManifestError as e:
        raise _fail(f"{e} (not the released folder)", "not-a-file") from None
    _compare_names(signed, listing)
    pst, _ = open_bundle(_read(prov_path, "provenance"), [rkey], str(prov_path))
    if pst.get("predicateType") != SLSA_PREDICATE:
        raise ReleaseSignatureError(f"{prov_path}: predicate {str(pst.get('predicateType'))[:60]!r}, not SLSA "
                                    f"provenance ({SLSA_PREDICATE})")
    try:
        [subj] = pst["subject"]
        prov_digest = subj["digest"]["sha256"]
        details = pst["predicate"]["runDetails"]
        run_id = details["metadata"]["invocationId"]
        [proof_rd] = [b for b in details["byproducts"] if b.get("mediaType") == PROOF_MEDIA_TYPE]
        raw = base64.b64decode(proof_rd["content"], validate=True)
    except (KeyError, TypeError, ValueError, binascii.Error):
        raise ReleaseSignatureError(f"{prov_path}: not a trainledger provenance (subject, runDetails.metadata, one "
                                    "proof byproduct)") from None
    if prov_digest != digest:
        raise _fail(f"{prov_path}: the provenance is of another model (digest {str(prov_digest)[:16]}..., the "
                    f"signature's {digest[:16]}...)", "another-model")
    if hashlib.sha256(raw).hexdigest() != proof_rd.get("digest", {}).get("sha256"):
        raise ReleaseSignatureError(f"{prov_path}: the proof byproduct does not match its digest")
    res = verify_bundle(raw, list(run_keys), witnesses=list(witnesses), quorum=quorum)
    if res.run_id != run_id:
        raise _fail(f"{prov_path}: the provenance names run {str(run_id)[:60]}, its proof is of run {res.run_id}",
                    "another-run")
    by_kind: dict[str, list[Any]] = {}
    for ev in res.events:
        by_kind.setdefault(type(ev).__struct_config__.tag, []).append(ev)
    exports = [e for e in by_kind.get("model_exported", []) if e.digest == digest]
    if not exports:
        raise _fail(f"{prov_path}: the run's proof holds no model_exported of this folder (the journal never "
                    "recorded these files)", "another-model")
    exp = exports[-1]
    _compare_sizes(exp.files, listing)  # a file of another size is named before it is read
    try:
        actual = model_manifest(root, ignored=ignored, progress=progress)
    except ManifestError as e:  # a file that changed, or became a link, while the folder was read
        raise _fail(f"{e} (not the released folder)", "not-a-file") from None
    _compare(signed, list(actual.files))  # the same files and digests: the folder's digest is the signed one
    computes = [c for c in by_kind.get("compute_totaled", []) if c.seq > exp.seq]
    if not computes:
        raise _fail(f"{prov_path}: no compute_totaled after the export at seq {exp.seq} in the run's proof: nothing "
                    "shows this is the run's last model", "no-compute")
    comp = computes[0]
    _held_to_proof(pst, prov_path, actual, by_kind, exp, comp, raw)
    final = exp.step is None or comp.last_step is None or exp.step >= comp.last_step
    if not final and not allow_intermediate:
        raise _fail(f"the export of step {exp.step} is passed off as the run's model, but the run went on to step "
                    f"{comp.last_step} (--allow-intermediate to accept an intermediate model)", "not-final")
    ck = None
    if exp.checkpoint is not None:
        cks = [c for c in by_kind.get("checkpoint_saved", []) if c.path == exp.checkpoint and c.seq < exp.seq]
        if cks:
            c = cks[-1]
            ck = {"path": c.path, "step": c.step, "sha256": c.sha256, "same_files": same_as_checkpoint(exp.files, c)}
    weights = weights_relation(exp, ck)
    base = None
    if exp.base is not None:
        base = {"digest": exp.base, "run_id": exp.base_release, "lineage": list(exp.lineage or [])}
    out = ModelVerified(model=actual.name, digest=actual.digest, files=len(actual.files), bytes=actual.bytes,
                        release_key=rkey.key_id, run_id=res.run_id, run_key=res.key_id, step=exp.step,
                        checkpoint=ck, head=res.head, tree_size=res.tree_size,
                        compute={"steps": comp.steps, "tokens": comp.tokens, "flops": comp.flops,
                                 "last_step": comp.last_step},
                        final=final, witnesses=list(res.witnesses), base=base, weights=weights,
                        closed=proven_to_close(res.events, comp.seq) and comp is computes[-1])
    if journal is not None:
        out.journal = _against_journal(journal, run_keys, res, exp, replay, by_kind)
    return out


def _against_journal(journal: str | os.PathLike, run_keys: Sequence[PublicKey], res: Any, exp: Any,
                     replay: Any, by_kind: dict[str, list[Any]]) -> dict[str, Any]:
    """The run's journal verified (and replayed, given ``replay``), holding the proof's tree: the journal reaches the
    export, its tree at the proof's size has the proof's root (else a fork, or a journal cut short), and the
    ``run_configured`` the provenance names is the one in force at the export (a proof can hold any line; only
    the journal shows none came between)."""
    from trainledger.journal.proofs.bundle import consistency
    from trainledger.journal.verify import verify

    rec = replay(journal, run_keys) if replay is not None else None
    v = rec.verify if rec is not None else verify(journal, keys=list(run_keys), allow_unsealed=True)
    if v.run_id != res.run_id:
        raise _fail(f"{journal}: the journal of run {v.run_id}, not of run {res.run_id}", "another-run")
    if v.events <= exp.seq:
        raise _fail(f"{journal}: the journal ends at seq {v.events - 1}, before the export at seq {exp.seq} (cut "
                    "short)", "truncated")
    try:
        c = consistency(journal, res.tree_size, keys=list(run_keys)).bundle
    except IntegrityError as e:
        raise _fail(f"{journal}: its signed tree does not extend the release's ({e})", "fork") from None
    except UsageError:  # its last signed tree is smaller than the release's: lines after it are not signed
        raise _fail(f"{journal}: its signed lines end before the {res.tree_size:,} the release's proof covers (cut "
                    "short, or padded with lines no seal signs)", "truncated") from None
    from_root = c.get("consistency", {}).get("from_root")
    if from_root != res.root:
        raise _fail(f"{journal}: a fork: the journal's tree of {res.tree_size:,} lines has another root than the "
                    "one the release's proof was signed against", "fork")
    from trainledger.journal.reader import read_signed_events

    in_force = None
    for ev in read_signed_events(journal, list(run_keys)):
        if ev.seq >= exp.seq:
            break
        if type(ev).__struct_config__.tag == "run_configured":
            in_force = ev.seq
    proven = [c.seq for c in by_kind.get("run_configured", []) if c.seq < exp.seq]
    if in_force != (proven[-1] if proven else None):
        raise _fail(f"{journal}: the configuration in force at the export is the run_configured at seq {in_force}, "
                    f"the provenance names {'the one at seq ' + str(proven[-1]) if proven else 'none'}",
                    "config-not-in-force")
    return {"path": str(journal), "replayed": rec is not None, "ok": rec.ok if rec is not None else True,
            "differences": len(rec.differences) if rec is not None else 0, "events": v.events, "head": v.head}
