"""Signed checkpoints: a format 1.3 seal as a C2SP signed note (the thing to publish, and what a witness
cosigns), its verifier key, and opening one under a pinned key."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from trainledger.journal.chain import HEAD_EXTENSION, is_hash_hex, origin, seal_checkpoint
from trainledger.journal.errors import (
    UntrustedKey,
    UsageError,
)
from trainledger.journal.keys import PublicKey
from trainledger.journal.note import (
    Checkpoint,
    NoteError,
    Verifier,
    key_hash,
    note_signature_line,
    open_note,
    parse_checkpoint,
)

__all__ = ["log_verifier", "checkpoint_note", "open_checkpoint", "head_extension", "report_note", "tree_head"]


# ------------------------------------------------------------------ checkpoints as signed notes


def log_verifier(run_id: str, public: PublicKey | bytes) -> Verifier:
    """The signed-note verifier of a run's checkpoints: key name = origin = ``trainledger/<run id>``."""
    raw = public.raw if isinstance(public, PublicKey) else public
    name = origin(run_id)
    return Verifier(name, key_hash(name, raw), raw)


def checkpoint_note(run_id: str, tree_size: int, tree_root: bytes, sealed_hash: bytes, sig: bytes,
                    public: PublicKey | bytes) -> str:
    """A format 1.3 seal as a C2SP signed note: its checkpoint text, a blank line, the signature line."""
    raw = public.raw if isinstance(public, PublicKey) else public
    text = seal_checkpoint(run_id, tree_size, tree_root, tree_size - 1, sealed_hash)
    return text + "\n" + note_signature_line(origin(run_id), raw, sig)


def report_note(r: Any, pub: PublicKey) -> str:
    """The latest seal of a verified journal (``r``: its :class:`~trainledger.journal.verify.VerifyReport`) as a
    signed checkpoint note under ``pub``, the key that signed it; :class:`UsageError` where its seals cannot be one
    (no seal, a format before 1.3, seals signed by rank keys whose certificate a bare note cannot carry)."""
    if r.head is None:
        raise UsageError(f"{r.path}: no seal yet: nothing to publish")
    if r.last_tree_root is None or r.last_seal_sig is None:
        raise UsageError(f"{r.path}: format {r.format_version}: its seals are not checkpoints (signed format "
                         "1.3 journals only)")
    if r.signing_keys and r.key_id not in r.signing_keys:
        raise UsageError(f"{r.path}: its seals are signed by rank keys that key {r.key_id} certified: a bare "
                         "checkpoint note cannot carry the certificate; 'trainledger prove' makes a bundle that does")
    return checkpoint_note(r.run_id, r.last_sealed_seq + 1, bytes.fromhex(r.last_tree_root),
                           bytes.fromhex(r.last_sealed_hash), base64.b64decode(r.last_seal_sig), pub)


def tree_head(path: Any, keys: Sequence[PublicKey], *, require_closed: bool = True) -> str:
    """A journal verified under ``keys`` (closed, unless ``require_closed=False``: then its signed prefix), and its
    latest seal as a signed checkpoint note (what ``trainledger tree-head`` prints)."""
    from trainledger.journal.verify import verify

    r = verify(path, keys=list(keys), require_closed=require_closed, allow_unsealed=not require_closed)
    pub = next((k for k in keys if k.key_id == r.key_id), None)
    if pub is None:
        raise UntrustedKey(f"{path}: signed by key {r.key_id}, which is not pinned", seq=None)
    return report_note(r, pub)


def head_extension(cp: Checkpoint) -> tuple[int, str]:
    heads = [x for x in cp.extensions if x.startswith(HEAD_EXTENSION + " ")]
    if len(heads) != 1:
        raise NoteError("the checkpoint does not name one trainledger chain head")
    seq_s, _, h = heads[0][len(HEAD_EXTENSION) + 1:].partition(":")
    if not seq_s.isdigit() or int(seq_s) != cp.size - 1 or not is_hash_hex(h):
        raise NoteError("the checkpoint's trainledger-head line is not SIZE-1:HASH")
    return int(seq_s), h


def open_checkpoint(note: str, run_id: str | None, keys: Sequence[PublicKey]) -> tuple[Checkpoint, PublicKey]:
    """A run's signed checkpoint, opened under a pinned key: its parsed text and the key that signed it. The
    run id is the one the checkpoint's origin names when ``run_id`` is None."""
    text_end = note.rfind("\n\n")
    if text_end < 0:
        raise NoteError("not a signed note")
    cp = parse_checkpoint(note[:text_end + 1])
    if not cp.origin.startswith("trainledger/"):
        raise NoteError(f"origin {cp.origin[:80]!r} is not a trainledger run's")
    rid = cp.origin[len("trainledger/"):]
    if run_id is not None and rid != run_id:
        raise NoteError(f"the checkpoint is of run {rid[:80]!r}, not {run_id!r}")
    if not keys:
        raise UsageError("no key pinned: pass --pubkey FILE (or set TRAINLEDGER_TRUSTED_KEYS)")
    verifiers = {log_verifier(rid, k): k for k in keys}
    try:
        _, ok = open_note(note, list(verifiers))
    except NoteError as e:
        if "no signature by a pinned key" in str(e):
            raise UntrustedKey(f"the checkpoint of run {rid} is not signed by a pinned key "
                               f"(pinned: {', '.join(k.key_id for k in keys)})", seq=None) from None
        raise
    head_extension(cp)
    return cp, verifiers[ok[0]]
