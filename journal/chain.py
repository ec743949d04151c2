"""Hash chain and seal messages (format v1; docs/FORMAT.md is the reference).

- ``h[-1] = SHA-256("trainledger/v1/genesis\\0" || run_id)``
- ``h[n]  = SHA-256("trainledger/v1/line\\0" || h[n-1] || P[n])`` where ``P[n]``
  is line n exactly as written, up to (not including) its ``,"h":`` member.
- a seal at seq n signs ``"trainledger/v1/seal\\0" || u16be(len(run_id)) ||
  run_id || u64be(n-1) || h[n-1]`` with Ed25519 (formats 1.0 to 1.2);
- from format 1.3 a seal at seq n signs the C2SP checkpoint text of the RFC 6962
  tree over lines 0..n-1 instead (:func:`seal_checkpoint`).

Hashes are raw 32-byte digests here and lowercase hex in the file.
"""

from __future__ import annotations

import hashlib
import re

from trainledger.journal.errors import UsageError

__all__ = ["GENESIS_TAG", "LINE_TAG", "SEAL_TAG", "genesis", "link", "seal_message", "check_run_id", "origin",
           "seal_checkpoint", "has_tree", "format_at_least", "is_hash_hex", "HEAD_EXTENSION"]

#: The extension line of a seal's checkpoint that names the chain head it also seals.
HEAD_EXTENSION = "trainledger-head"

GENESIS_TAG = b"trainledger/v1/genesis\x00"
LINE_TAG = b"trainledger/v1/line\x00"
SEAL_TAG = b"trainledger/v1/seal\x00"

RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}\Z")


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is 1-128 characters of ``[A-Za-z0-9._:-]``; raise ``UsageError`` otherwise."""
    if not isinstance(run_id, str) or not RUN_ID_RE.match(run_id):
        raise UsageError(f"run id {run_id!r}: use 1-128 characters from A-Z a-z 0-9 . _ : -, starting with a letter or digit")
    return run_id


def genesis(run_id: str) -> bytes:
    """``h[-1]``: binds the chain to its run id."""
    return hashlib.sha256(GENESIS_TAG + run_id.encode()).digest()


def link(prev: bytes, prefix: bytes) -> bytes:
    """``h[n]`` from ``h[n-1]`` and the line's bytes before its hash member."""
    return hashlib.sha256(LINE_TAG + prev + prefix).digest()


def seal_message(run_id: str, sealed_seq: int, sealed_hash: bytes) -> bytes:
    """The exact bytes an Ed25519 seal signs."""
    rid = run_id.encode()
    return SEAL_TAG + len(rid).to_bytes(2, "big") + rid + sealed_seq.to_bytes(8, "big") + sealed_hash


def origin(run_id: str) -> str:
    """The checkpoint origin (and signed-note key name) of a run's journal: ``trainledger/<run id>``."""
    return "trainledger/" + run_id


def seal_checkpoint(run_id: str, tree_size: int, tree_root: bytes, sealed_seq: int, sealed_hash: bytes) -> str:
    """The text a format 1.3 seal signs: a C2SP tlog-checkpoint (origin, tree size, base64 root) with one
    extension line, ``trainledger-head <seq>:<hash hex>``, the chain head the seal also covers."""
    from trainledger.journal.note import checkpoint_text

    return checkpoint_text(origin(run_id), tree_size, tree_root, (f"{HEAD_EXTENSION} {sealed_seq}:{sealed_hash.hex()}",))


def is_hash_hex(x: object) -> bool:
    """Whether ``x`` is a hash as the journal writes one: 64 lowercase hex digits."""
    return type(x) is str and len(x) == 64 and not x.strip("0123456789abcdef")


def format_at_least(version: str | None, want: tuple[int, int]) -> bool:
    """Whether a journal's ``format_version`` (``MAJOR.MINOR``) is ``want`` or later; False when it is malformed."""
    try:
        major, minor = (int(x) for x in (version or "").split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= want


def has_tree(format_version: str | None) -> bool:
    """Whether a journal of this format version carries tree heads in its seals (1.3 and later)."""
    return format_at_least(format_version, (1, 3))
