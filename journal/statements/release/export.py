"""Recording the weights a run ships (``model_exported``): the helper the Recorder and the callbacks call."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainledger.journal.errors import UnsafePath
from trainledger.journal.kinds import ModelExported
from trainledger.journal.paths import read_regular
from trainledger.journal.statements.release.dsse import MAX_BUNDLE_BYTES
from trainledger.journal.statements.release.manifest import PROVENANCE, model_manifest

__all__ = ["record_export", "checkpoint_of", "base_of", "same_as_checkpoint"]


def checkpoint_of(kept: Sequence[Any], step: int | None) -> str | None:
    """The path of the newest recorded checkpoint of ``step`` (None: none of that step)."""
    if step is None:
        return None
    for c in reversed(list(kept)):
        if c.step == step:
            return c.path
    return None


def same_as_checkpoint(files: Sequence[dict[str, Any]], checkpoint: Any) -> list[str]:
    """The exported files (``model_exported.files``) that are byte for byte the checkpoint's: a checkpoint folder's
    file of the same name and digest, or, for a one-file checkpoint, a file whose digest is the checkpoint's."""
    if checkpoint.files is None:
        return sorted(f["file"] for f in files if f["sha256"] == checkpoint.sha256)
    theirs = {(f["file"], f["sha256"]) for f in checkpoint.files}
    return sorted(f["file"] for f in files if (f["file"], f["sha256"]) in theirs)


def record_export(journal: Any, path: str | os.PathLike, *, step: int | None, checkpoint: str | None = None,
                  base: str | None = None, base_release: str | None = None,
                  relative_to: str | os.PathLike | None = None,
                  lineage: list[dict[str, Any]] | None = None) -> ModelExported:
    """Digest the folder at ``path`` as OpenSSF model signing does and append ``model_exported``, durably, then
    seal: the record a release (``trainledger release``) rests on. Release the folder unchanged: any byte changed
    after this is a different model. ``relative_to``: the run folder, to record the path from."""
    p = Path(path)
    m = model_manifest(p)
    shown = str(p)
    if relative_to is not None:
        try:
            shown = p.resolve().relative_to(Path(relative_to).resolve()).as_posix()
        except ValueError:
            shown = str(p)
    ev = ModelExported(path=shown, digest=m.digest, step=step, checkpoint=checkpoint, base=base,
                       base_release=base_release, lineage=lineage or None,
                       files=[{"file": f.path, "bytes": f.size, "sha256": f.sha256} for f in m.files])
    journal.append(ev, durable=True)
    journal.seal(durable=True, signed=True)  # what is read back (or proven) next must be signed already
    return ev


def base_of(folder: str | os.PathLike) -> tuple[str, str | None, list[dict[str, Any]]]:
    """A released model's digest, the run its provenance names, and its own ancestors as that provenance lists
    them (as claimed: ``verify-model`` of the base checks them), for a fine-tune to record as its base."""
    p = Path(folder)
    digest = model_manifest(p).digest
    run, lineage = None, []
    try:  # a regular file of the folder's own, bounded (a link or a FIFO planted there is no claim)
        text = read_regular(p / PROVENANCE, MAX_BUNDLE_BYTES, what="provenance")
    except (FileNotFoundError, UnsafePath):
        text = None
    if text is not None:
        try:
            st = json.loads(base64.b64decode(json.loads(text)["dsseEnvelope"]["payload"]))
            if st["subject"][0]["digest"]["sha256"] == digest:
                run = str(st["predicate"]["runDetails"]["metadata"]["invocationId"])[:200]
                deps = st["predicate"]["buildDefinition"].get("resolvedDependencies", [])
                ancestors = sorted((d for d in deps if d.get("name") == "base-model"),
                                   key=lambda d: int(d.get("annotations", {}).get("generation", 1)))
                lineage = []
                for d in ancestors[:64]:
                    r = d.get("annotations", {}).get("run_id")
                    lineage.append({"digest": str(d["digest"]["sha256"])[:64],
                                    "run_id": None if r is None else str(r)[:200]})
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
            run, lineage = None, []
    return digest, run, lineage
